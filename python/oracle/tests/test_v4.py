"""tiny-v4 (ADR 0018): the oracle's MX numerics, v4-fp8 records, and the compressor, window and sink
math, each against a direct float64 computation written here from the definitions."""

import copy
import math
import unittest

import numpy as np
import torch

from oracle import numerics as nm
from oracle import v4
from oracle.tests import weightgen

E2M1_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]


def e2m1_value_from_bits(code):
    """OCP MX E2M1: bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa; exponent 0 subnormal."""
    s = -1.0 if code & 8 else 1.0
    e, m = (code >> 1) & 3, code & 1
    return s * (m * 0.5 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1))


def e2m1_brute(x):
    """Nearest grid value by search; ties to the even code (mantissa bit 0); saturating at 6."""
    a = min(abs(x), 6.0)
    best = min(range(8), key=lambda i: (abs(E2M1_GRID[i] - a), i % 2))
    return math.copysign(E2M1_GRID[best], x)


def pow2_ceil_code(x):
    """UE8M0 code of the smallest 2^k >= x by search over k, clamped to 0..254."""
    if x <= 2.0**-127:
        return 0
    for k in range(-127, 128):
        if 2.0**k >= x:
            return k + 127
    return 254


def rope64(x, pos, theta, inverse=False):
    """Interleaved RoPE in float64 via complex numbers: pair i rotated by pos * theta^(-2i/n)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[-1]
    ang = pos * theta ** (-2.0 * np.arange(n // 2) / n)
    # the oracle rounds cos/sin to float (ADR 0017); do the same so the comparison is tight
    rot = np.cos(ang).astype(np.float32).astype(np.float64) + 1j * np.sin(ang).astype(np.float32).astype(np.float64)
    z = (x[..., 0::2] + 1j * x[..., 1::2]) * (np.conj(rot) if inverse else rot)
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


class MxNumericsTest(unittest.TestCase):
    def test_e2m1_against_brute_force(self):
        xs = [i / 16.0 for i in range(-128, 129)] + [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.5, 7.0, 100.0]
        xs += list(np.random.default_rng(1).uniform(-8, 8, 2000).astype(np.float32))
        got = nm.e2m1_round(torch.tensor(xs, dtype=torch.float32)).tolist()
        for x, g in zip(xs, got):
            self.assertEqual(g, e2m1_brute(float(x)), f"e2m1({x})")
        # ties: to the even mantissa bit
        self.assertEqual(nm.e2m1_round(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])).tolist(),
                         [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0])
        special = nm.e2m1_round(torch.tensor([math.inf, -math.inf, -0.0, -0.1]))
        self.assertEqual(special.tolist(), [6.0, -6.0, 0.0, 0.0])
        self.assertTrue(all(math.copysign(1, v) == -1 for v in special[2:].tolist()))

    def test_e2m1_codes_and_packing(self):
        for code in range(16):
            self.assertEqual(nm.e2m1_decode_nibbles(torch.tensor([code])).item(), e2m1_value_from_bits(code))
        vals = torch.tensor([e2m1_value_from_bits(c) for c in range(16)])
        self.assertEqual(nm.e2m1_encode(vals).tolist(), list(range(16)))
        packed = nm.pack_nibbles(torch.tensor([0x1, 0x2, 0xF, 0x8]))
        self.assertEqual(packed, bytes([0x21, 0x8F]))  # element 2i in the low nibble
        self.assertEqual(nm.unpack_nibbles(packed).tolist(), [0x1, 0x2, 0xF, 0x8])

    def test_ue8m0_ceil(self):
        one_up = float(np.nextafter(np.float32(1), np.float32(2)))
        cases = [1.0, one_up, 0.75, 0.5, 1e-4, 3.0, 448.0, 2.0**-126, 2.0**-127, 2.0**-130, 1e38, 3e38]
        for x in cases:
            self.assertEqual(nm.ue8m0_ceil(np.float32(x)), pow2_ceil_code(float(np.float32(x))), x)
        self.assertEqual(nm.ue8m0_ceil(1e-4), 114)  # 2^-13
        for x, code in ((0.0, 0), (-1.0, 0), (math.inf, 254), (math.nan, 255)):
            self.assertEqual(nm.ue8m0_ceil(x), code, x)
        self.assertEqual(nm.ue8m0_value(127), 1.0)
        self.assertTrue(math.isnan(nm.ue8m0_value(255)))

    def test_mxfp4_scale_and_record(self):
        self.assertEqual(nm.mxfp4_scale_code(torch.full((32,), 6.0)), 127)  # 6 * fl(1/6) rounds to 1
        self.assertEqual(nm.mxfp4_scale_code(torch.full((32,), 6.01)), 128)
        self.assertEqual(nm.mxfp4_scale_code(torch.zeros(32)), 1)  # floor 6 * 2^-126 -> 2^-126
        g = torch.Generator().manual_seed(3)
        x = torch.randn(128, generator=g) * torch.tensor([0.01, 1.0, 30.0, 1e-3]).repeat_interleave(32)
        rec = nm.encode_mxfp4(x)
        self.assertEqual(len(rec), 68)
        back = nm.decode_mxfp4(rec, 128)
        self.assertTrue(torch.equal(back, nm.fp4_round_blocks(x)))  # the query's rounding is the same
        for b in range(4):
            blk = x[32 * b : 32 * b + 32].double()
            amax = float(np.float32(blk.abs().max()))
            scale = 2.0 ** (pow2_ceil_code(float(np.float32(np.float32(max(amax, 6 * 2.0**-126)) * np.float32(1 / 6)))) - 127)
            self.assertEqual(rec[64 + b], pow2_ceil_code(scale))
            want = [e2m1_brute(float(np.float32(v / scale))) * scale for v in blk.tolist()]
            self.assertEqual(back[32 * b : 32 * b + 32].tolist(), want)


class V4Fp8RecordTest(unittest.TestCase):
    def test_layout_and_rounding(self):
        g = torch.Generator().manual_seed(5)
        nope = torch.randn(448, generator=g) * torch.tensor([1e-3, 0.01, 0.5, 1, 10, 300, 0]).repeat_interleave(64)
        rope = torch.randn(64, generator=g)
        rec = nm.encode_v4fp8(nope, rope)
        self.assertEqual(len(rec), 584)
        self.assertEqual(rec[583], 0)  # pad byte
        row = nm.decode_v4fp8(rec)
        for t in range(7):
            tile = nope[64 * t : 64 * t + 64].double()
            s = max(float(np.float32(np.float32(tile.abs().max()) / np.float32(448))), float(np.float32(1e-4)))
            code = pow2_ceil_code(s)
            self.assertEqual(rec[576 + t], code, f"tile {t}")
            scale = 2.0 ** (code - 127)
            want = nm.e4m3_round(torch.tensor([v / scale for v in tile.tolist()], dtype=torch.float32)).double() * scale
            self.assertEqual(row[64 * t : 64 * t + 64].tolist(), want.tolist(), f"tile {t}")
        self.assertEqual(rec[576 + 6], 114)  # all-zero tile: 2^-13 (the 1e-4 floor)
        self.assertEqual(row[448:].tolist(), nm.bf16_round(rope).tolist())
        self.assertEqual(rec[448:450], nm.bf16_bits(rope[:1]).astype("<u2").tobytes())

    def test_scale_floor_and_power_of_two(self):
        for amax, code in ((448.0, 127), (449.0, 128), (224.0, 126), (0.0448, 114), (0.01, 114)):
            tile = torch.zeros(448)
            tile[0] = amax
            self.assertEqual(nm.encode_v4fp8(tile, torch.zeros(64))[576], code, amax)


class V4MathTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tensors, cls.meta = weightgen.generate(v4.MODEL, 7)

    def test_compress_against_a_direct_softmax(self):
        g = torch.Generator().manual_seed(9)
        d = 16
        for r, rows in ((4, 4), (4, 8), (8, 8)):
            c = v4.coff(r)
            k = torch.randn(rows, c * d, generator=g)
            s = torch.randn(rows, c * d, generator=g) * 3
            got = v4.compress(k, s, r, d)
            K, S = k.double().numpy(), s.double().numpy()
            for col in range(d):
                if r == 4:  # previous group's first half (when present), then own group's second half
                    pairs = [(S[t, col], K[t, col]) for t in range(rows - 4)]
                    pairs += [(S[t, d + col], K[t, d + col]) for t in range(rows - 4, rows)]
                else:
                    pairs = [(S[t, col], K[t, col]) for t in range(rows)]
                m = max(p[0] for p in pairs)
                z = sum(math.exp(p[0] - m) for p in pairs)
                want = sum(math.exp(p[0] - m) / z * p[1] for p in pairs)
                self.assertAlmostEqual(got[col].item(), want, delta=1e-5, msg=f"r {r} rows {rows} col {col}")

    def test_compressor_entries_against_direct_float64(self):
        o = v4.V4Oracle(self.tensors, self.meta)
        g = torch.Generator().manual_seed(11)
        xs = [torch.randn(256, generator=g) for _ in range(12)]
        sk, ss = [], []
        pre = "layers.1.attn.compressor."
        W = {n: self.tensors[pre + n].astype(np.float64) for n in ("wkv.weight", "wgate.weight", "ape", "norm.weight")}
        for p, x in enumerate(xs):
            e = o._compressor(pre, x, p, 4, 512, sk, ss, 64, 160000.0)
            if (p + 1) % 4:
                self.assertIsNone(e)
                continue
            grp = (p + 1) // 4 - 1
            X = [xx.double().numpy() for xx in xs]
            kk = [W["wkv.weight"] @ X[t] for t in range(p + 1)]
            lg = [W["wgate.weight"] @ X[t] + W["ape"][t % 4] for t in range(p + 1)]
            own = range(4 * grp, 4 * grp + 4)
            prev = range(4 * grp - 4, 4 * grp) if grp else range(0)
            L = np.array([lg[t][:512] for t in prev] + [lg[t][512:] for t in own])
            V = np.array([kk[t][:512] for t in prev] + [kk[t][512:] for t in own])
            wts = np.exp(L - L.max(axis=0))
            pooled = (wts / wts.sum(axis=0) * V).sum(axis=0)
            normed = pooled / np.sqrt(np.mean(pooled**2) + 1e-6) * W["norm.weight"]
            want = np.concatenate([normed[:448], rope64(normed[448:], 4 * grp, 160000.0)])
            err = np.abs(e.double().numpy() - want).max()
            self.assertLess(err, 1e-4, f"group {grp}")

    def test_rope_forward_and_inverse(self):
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
        for pos in (0, 1, 127, 4000):
            f = v4.rope(x, pos, 160000.0)
            np.testing.assert_allclose(f.double().numpy(), rope64(x.double().numpy(), pos, 160000.0), atol=2e-6)
            b = v4.rope(f, pos, 160000.0, inverse=True)
            np.testing.assert_allclose(b.numpy(), x.numpy(), atol=2e-6)
        y = torch.randn(512)
        t = v4.rope_tail(y, 5, 1e4, 64)
        self.assertTrue(torch.equal(t[:448], y[:448]))
        self.assertFalse(torch.equal(t[448:], y[448:]))

    def test_sink_attention_against_direct_float64(self):
        g = torch.Generator().manual_seed(4)
        q, rows = torch.randn(4, 512, generator=g), torch.randn(20, 512, generator=g)
        for sink in (torch.tensor([0.5, -0.9, 3.0, 40.0]), torch.full((4,), -math.inf)):
            got = v4.sink_attention(q, rows, sink, 512).double().numpy()
            Q, R = q.double().numpy(), rows.double().numpy()
            for h in range(4):
                s = R @ Q[h] / math.sqrt(512)
                m = s.max()  # the sink is not in the max
                a = np.exp(s - m) / (np.exp(s - m).sum() + math.exp(sink[h].item() - m))
                np.testing.assert_allclose(got[h], a @ R, rtol=2e-5, atol=1e-6)
        # without the sink (-inf) it is the plain softmax; with one it differs
        plain = torch.softmax((q @ rows.T) / math.sqrt(512), dim=1) @ rows
        self.assertTrue(torch.allclose(v4.sink_attention(q, rows, torch.full((4,), -math.inf), 512), plain, atol=1e-6))
        self.assertFalse(torch.allclose(v4.sink_attention(q, rows, torch.zeros(4), 512), plain, atol=1e-3))

    def test_topk_ties_to_the_lower_entry(self):
        self.assertEqual(v4.topk_entries(torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0]), 2), [1, 2])
        self.assertEqual(v4.topk_entries(torch.tensor([0.0, 0.0, 0.0]), 8), [0, 1, 2])

    def test_window_entries_and_selection_counts(self):
        o = v4.V4Oracle(self.tensors, self.meta)
        n = 140
        for p in range(n):
            o.step((7 * p + 1) % 256)
        for l, r in enumerate(v4.CONFIG["ratios"]):
            self.assertEqual(len(o.layers[l].entries), n // r if r else 0, l)
            self.assertEqual(len(o.layers[l].ientries), n // 4 if r == 4 else 0, l)
        for p, per_layer in enumerate(o.selected):
            for l, r in enumerate(v4.CONFIG["ratios"]):
                if r == 4:
                    self.assertEqual(len(per_layer[l]), min(8, (p + 1) // 4), (p, l))
                else:
                    self.assertIsNone(per_layer[l])

    def test_window_is_the_last_w_positions(self):
        o = v4.V4Oracle(self.tensors, self.meta)
        for p in range(20):
            o.step(p + 1)
        base = copy.deepcopy(o).step(5)  # position 20 reads window rows 5..20
        for row, changes in ((4, False), (5, True)):
            c = copy.deepcopy(o)
            c.layers[0].window[row][576] ^= 0x01  # tile 0's scale exponent: 64 values x2 or /2
            self.assertEqual(not torch.equal(c.step(5), base), changes, f"window row {row}")

    def test_attention_layer_against_direct_float64(self):
        # Steps 1, 5, 6, 7 for each layer kind at position 44 (CSA: 11 entries, top 8 attended),
        # recomputed in float64 over the rows the oracle cached (their bytes are tested above).
        o = v4.V4Oracle(self.tensors, self.meta)
        for p in range(44):
            o.step((5 * p + 3) % 256)
        x = torch.randn(256, generator=torch.Generator().manual_seed(8))
        X = x.double().numpy()
        for l, r in enumerate(v4.CONFIG["ratios"]):
            c = copy.deepcopy(o)
            got, chosen = c._attention(l, x, 44)
            W = {k[len(f"layers.{l}.attn."):]: v.astype(np.float64) for k, v in self.tensors.items()
                 if k.startswith(f"layers.{l}.attn.")}
            theta = 1e4 if r == 0 else 160000.0

            def rms(v, w=None):
                out = v / np.sqrt(np.mean(v * v, axis=-1, keepdims=True) + 1e-6)
                return out if w is None else out * w

            qr = rms(W["wq_a.weight"] @ X, W["q_norm.weight"])
            q = rms((W["wq_b.weight"] @ qr).reshape(4, 512))
            q = np.concatenate([q[:, :448], rope64(q[:, 448:], 44, theta)], axis=1)
            L = c.layers[l]
            ids = [] if r == 0 else (chosen if r == 4 else list(range(len(L.entries))))
            if r == 4:
                self.assertEqual(len(ids), 8)
            rows = np.stack([nm.decode_v4fp8(rec).double().numpy() for rec in L.window[29:45]]
                            + [nm.decode_v4fp8(L.entries[i]).double().numpy() for i in ids])
            o_heads = []
            for h in range(4):
                sc = rows @ q[h] / math.sqrt(512)
                m = sc.max()
                a = np.exp(sc - m) / (np.exp(sc - m).sum() + math.exp(W["attn_sink"][h] - m))
                oh = a @ rows
                o_heads.append(np.concatenate([oh[:448], rope64(oh[448:], 44, theta, inverse=True)]))
            y = []
            for g in range(2):  # heads 2g, 2g+1 through wo_a rows 64g .. 64g + 63
                y.append(W["wo_a.weight"][64 * g : 64 * g + 64] @ np.concatenate(o_heads[2 * g : 2 * g + 2]))
            want = W["wo_b.weight"] @ np.concatenate(y)
            err = np.abs(got.double().numpy() - want).max() / np.abs(want).max()
            self.assertLess(err, 1e-4, f"layer {l}")

    def test_every_layer_kind_reads_its_records(self):
        # Flipped scale bytes of the entries of the HCA layer (2) or of a CSA layer (1, 3) change
        # later logits; flipped indexer key scales too (every record of the layer: the CSA layers
        # read only their selected entries).
        o = v4.V4Oracle(self.tensors, self.meta)
        for p in range(132):
            o.step(p % 256)
        base = copy.deepcopy(o).step(9)
        for kind, layer in (("entry", 2), ("entry", 1), ("entry", 3), ("indexer", 1)):
            c = copy.deepcopy(o)
            recs = c.layers[layer].entries if kind == "entry" else c.layers[layer].ientries
            for rec in recs:
                rec[576 if kind == "entry" else 64] ^= 0x01
            self.assertFalse(torch.equal(c.step(9), base), (kind, layer))


if __name__ == "__main__":
    unittest.main()
