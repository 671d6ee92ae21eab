"""The oracle's own number formats and building blocks, against their definitions."""

import math
import os
import unittest

import numpy as np
import torch

from oracle import numerics as nm


def f32(values):
    return torch.tensor(values, dtype=torch.float32)


def e4m3_brute(x: float) -> float:
    """Nearest finite E4M3FN value by search over all codes; ties go to the even code; saturating."""
    if math.isnan(x):
        return math.nan
    table = nm.e4m3_decode_table().tolist()
    a = min(abs(x), 448.0)
    best = None
    for code in range(0x7F):  # non-negative finite codes 0x00..0x7E
        d = abs(table[code] - a)
        if best is None or d < best[0] or (d == best[0] and code % 2 == 0):
            best = (d, code)
    return math.copysign(table[best[1]], x)


class E4M3Test(unittest.TestCase):
    def test_known_values(self):
        cases = {
            448.0: 448.0,          # max finite, code 0x7E
            449.0: 448.0,          # saturation
            464.0: 448.0,          # would round up to 480, which the format lacks
            1e30: 448.0,
            math.inf: 448.0,       # no infinity: saturate
            -math.inf: -448.0,
            -500.0: -448.0,
            2.0**-9: 2.0**-9,      # min subnormal, code 0x01
            2.0**-10: 0.0,         # half the min subnormal: tie, to even (0)
            3 * 2.0**-10: 2.0**-8,  # 1.5 x min subnormal: tie between codes 1 and 2, to even (2)
            2.0**-6: 2.0**-6,      # min normal, code 0x08
            7 * 2.0**-9: 7 * 2.0**-9,  # max subnormal
            1.0625: 1.0,           # tie between 1.0 (m=0) and 1.125 (m=1): even
            1.1875: 1.25,          # tie between 1.125 (m=1) and 1.25 (m=2): even
            1.07: 1.125,
            17.0: 16.0,            # tie at quantum 2: even
            19.0: 20.0,
            240.0: 240.0,
            -0.0: -0.0,
            -(2.0**-11): -0.0,     # rounds to zero, keeps its sign
        }
        got = nm.e4m3_round(f32(list(cases))).tolist()
        for (x, want), g in zip(cases.items(), got):
            self.assertEqual(g, want, f"e4m3({x})")
            self.assertEqual(math.copysign(1, g), math.copysign(1, want), f"sign of e4m3({x})")
        self.assertTrue(math.isnan(nm.e4m3_round(f32([math.nan])).item()))

    def test_codes(self):
        x = f32([448.0, -448.0, 2.0**-9, 0.0, -0.0, math.nan, 1.0, 2.0**-6, 500.0])
        self.assertEqual(nm.e4m3_encode(x).tolist(), [0x7E, 0xFE, 0x01, 0x00, 0x80, 0x7F, 0x38, 0x08, 0x7E])
        table = nm.e4m3_decode_table()
        self.assertEqual(table[0x7E].item(), 448.0)
        self.assertEqual(table[0x01].item(), 2.0**-9)
        self.assertTrue(math.isnan(table[0x7F].item()) and math.isnan(table[0xFF].item()))
        self.assertEqual(math.copysign(1, table[0x80].item()), -1.0)

    def test_every_code_round_trips(self):
        codes = torch.tensor([c for c in range(256) if c not in (0x7F, 0xFF)], dtype=torch.uint8)
        values = nm.e4m3_decode(codes)
        self.assertTrue(torch.equal(nm.e4m3_round(values), values))
        self.assertEqual(nm.e4m3_encode(values).tolist(), codes.tolist())
        self.assertEqual(sorted(set(values.abs().tolist())), sorted(set(values.abs().tolist())))
        self.assertEqual(len(set(values[:0x7F].tolist())), 0x7F)  # 127 distinct non-negative values

    def test_matches_brute_force(self):
        rng = np.random.default_rng(1)
        table = nm.e4m3_decode_table()[:0x7F].tolist()
        mids = [(a + b) / 2 for a, b in zip(table, table[1:])]  # exact ties
        near = [np.nextafter(np.float32(m), np.float32(np.inf)) for m in mids]
        near += [np.nextafter(np.float32(m), np.float32(0)) for m in mids]
        rand = list(np.float32(2.0) ** rng.uniform(-12, 9.5, 3000).astype(np.float32))
        xs = [float(v) for v in mids + near + rand]
        xs += [-v for v in xs]
        got = nm.e4m3_round(f32(xs)).tolist()
        for x, g in zip(xs, got):
            self.assertEqual(g, e4m3_brute(x), f"e4m3({x!r})")


class Bf16Test(unittest.TestCase):
    def test_matches_bit_level_rne(self):
        rng = np.random.default_rng(2)
        bits = rng.integers(0, 2**32, 200000, dtype=np.uint64).astype(np.uint32)
        x = bits.view(np.float32)
        finite = np.isfinite(x)
        bits, x = bits[finite], x[finite]
        lsb = (bits >> 16) & 1
        want = ((bits.astype(np.uint64) + 0x7FFF + lsb) >> 16).astype(np.uint64)
        got = nm.bf16_bits(torch.from_numpy(x.copy())).astype(np.uint64)
        np.testing.assert_array_equal(got, want & 0xFFFF)

    def test_ties_to_even(self):
        x = f32([1 + 2.0**-8, 1 + 3 * 2.0**-8, -(1 + 2.0**-8), 1 + 2.0**-8 + 2.0**-20])
        self.assertEqual(nm.bf16_round(x).tolist(), [1.0, 1 + 2.0**-6, -1.0, 1 + 2.0**-7])

    def test_bits_round_trip(self):
        x = f32([1.5, -2.25, 0.0, 3.0e38])
        self.assertTrue(torch.equal(nm.bf16_from_bits(nm.bf16_bits(x)), nm.bf16_round(x)))


class Fp8ScaleTest(unittest.TestCase):
    def test_rules(self):
        self.assertEqual(nm.fp8_scale(0.0), np.float32(nm.FLT_MIN))  # vLLM's all-zero tile (ADR 0033)
        self.assertEqual(nm.fp8_scale(448.0), np.float32(1.0))
        self.assertEqual(nm.fp8_scale(1.0), np.float32(1.0) / np.float32(448.0))
        self.assertEqual(nm.fp8_scale(1e-40), np.float32(nm.FLT_MIN))  # amax/448 below FLT_MIN


GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "..", "tests", "data", "golden", "indexer_fp8_v32.txt")


def indexer_golden():
    """(bf16 key, record) pairs of tests/data/golden/indexer_fp8_v32.txt (PROVENANCE.md there)."""
    out = []
    with open(GOLDEN) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "token":
                bits = np.frombuffer(bytes.fromhex(w[5]), dtype="<u2").astype(np.uint32) << np.uint32(16)
                out.append((torch.from_numpy(bits.view(np.float32).copy()), bytes.fromhex(w[7])))
    return out


class IndexerFp8Test(unittest.TestCase):
    def test_scale_rules(self):
        self.assertEqual(nm.indexer_fp8_scale(0.0, "ue8m0"), np.float32(2.0**-22))  # 1e-4 / 448 -> 2^-22
        self.assertEqual(nm.indexer_fp8_scale(0.0, "amax"), np.float32(np.float32(1e-4) / np.float32(448)))
        self.assertEqual(nm.indexer_fp8_scale(3.5, "ue8m0"), np.float32(2.0**-7))  # exactly a power of two
        self.assertEqual(nm.indexer_fp8_scale(3.6, "ue8m0"), np.float32(2.0**-6))
        with self.assertRaisesRegex(ValueError, "scale_fmt"):
            nm.indexer_fp8_scale(1.0, "e8m0")

    def test_records_equal_vllms_and_deepseeks(self):
        """The golden records: vLLM's _ue8m0_reference (what its CUDA writer computes) and DeepSeek-V3.2-Exp's
        act_quant with the config's scale_fmt "ue8m0" wrote the same bytes; the oracle must too."""
        golden = indexer_golden()
        self.assertEqual(len(golden), 8)
        for t, (key, rec) in enumerate(golden):
            self.assertEqual(nm.encode_indexer_fp8(key, "ue8m0"), rec, f"token {t}")
        # amax/448 (the old rule, 1.0 for zero) differs: the scale of the all-zero and the 1e-6 keys at least.
        differ = [t for t, (key, rec) in enumerate(golden) if nm.encode_indexer_fp8(key, "amax") != rec]
        self.assertGreaterEqual(len(differ), 2)


class RopeTest(unittest.TestCase):
    def test_position_zero_is_identity(self):
        x = torch.randn(3, 64, generator=torch.Generator().manual_seed(3))
        self.assertTrue(torch.equal(nm.rope_interleaved(x, 0, 10000.0), x))
        self.assertTrue(torch.equal(nm.rope_half(x, 0, 10000.0), x))

    def test_rotation_preserves_pair_norms(self):
        x = torch.randn(64, generator=torch.Generator().manual_seed(4), dtype=torch.float32)
        for p in (1, 7, 100, 4095, 131071):
            y = nm.rope_interleaved(x, p, 10000.0)
            pn_x = x[0::2] ** 2 + x[1::2] ** 2
            pn_y = y[0::2] ** 2 + y[1::2] ** 2
            torch.testing.assert_close(pn_y, pn_x, rtol=1e-5, atol=1e-6)
            y2 = nm.rope_half(x, p, 10000.0)
            torch.testing.assert_close(y2[:32] ** 2 + y2[32:] ** 2, x[:32] ** 2 + x[32:] ** 2, rtol=1e-5, atol=1e-6)
            self.assertFalse(torch.equal(y, x))

    def test_angle_of_each_pair(self):
        p, theta = 5, 10000.0
        for i in (0, 1, 17, 31):
            x = torch.zeros(64)
            x[2 * i] = 1.0
            y = nm.rope_interleaved(x, p, theta)
            ang = p * theta ** (-2.0 * i / 64)
            self.assertAlmostEqual(y[2 * i].item(), math.cos(ang), places=6)
            self.assertAlmostEqual(y[2 * i + 1].item(), math.sin(ang), places=6)
            rest = torch.cat([y[: 2 * i], y[2 * i + 2 :]])
            self.assertTrue(torch.equal(rest, torch.zeros(62)))  # other pairs untouched

    def test_half_split_is_a_permutation_of_interleaved(self):
        x = torch.randn(64, generator=torch.Generator().manual_seed(5))
        perm = torch.tensor([j for i in range(32) for j in (i, i + 32)])  # half layout -> interleaved
        y_half = nm.rope_half(x, 9, 10000.0)
        y_int = nm.rope_interleaved(x[perm], 9, 10000.0)
        self.assertTrue(torch.equal(y_half[perm], y_int))

    def test_relative_position(self):
        # <R(p) a, R(p+d) b> depends on d only.
        g = torch.Generator().manual_seed(6)
        a, b = torch.randn(64, generator=g, dtype=torch.float64), torch.randn(64, generator=g, dtype=torch.float64)
        d1 = nm.rope_interleaved(a.float(), 3, 1e4) @ nm.rope_interleaved(b.float(), 10, 1e4)
        d2 = nm.rope_interleaved(a.float(), 50, 1e4) @ nm.rope_interleaved(b.float(), 57, 1e4)
        self.assertAlmostEqual(d1.item(), d2.item(), places=4)


class HadamardTest(unittest.TestCase):
    def test_orthonormal(self):
        for n in (1, 2, 8, 128):
            h = nm.hadamard(n).to(torch.float64)
            self.assertTrue(torch.equal(h @ h.T, n * torch.eye(n, dtype=torch.float64)))
            x = torch.randn(5, n, generator=torch.Generator().manual_seed(n), dtype=torch.float32)
            y = nm.hadamard_transform(x)
            torch.testing.assert_close(y.norm(dim=1), x.norm(dim=1), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(nm.hadamard_transform(y), x, rtol=1e-5, atol=1e-5)  # self-inverse

    def test_entries(self):
        h = nm.hadamard(128)
        for i, j in ((0, 0), (1, 1), (3, 5), (127, 127), (64, 65), (100, 27)):
            self.assertEqual(h[i, j].item(), (-1.0) ** bin(i & j).count("1"))

    def test_rejects_non_power_of_two(self):
        with self.assertRaises(ValueError):
            nm.hadamard(96)


class NormTest(unittest.TestCase):
    def test_rms_and_layer_norm(self):
        g = torch.Generator().manual_seed(7)
        v, w, b = (torch.randn(128, generator=g) for _ in range(3))
        vd, wd, bd = v.double(), w.double(), b.double()
        want = vd / torch.sqrt((vd**2).mean() + 1e-6) * wd
        torch.testing.assert_close(nm.rms_norm(v, w, 1e-6).double(), want, rtol=1e-5, atol=1e-6)
        want = (vd - vd.mean()) / torch.sqrt(vd.var(unbiased=False) + 1e-6) * wd + bd
        torch.testing.assert_close(nm.layer_norm(v, w, b, 1e-6).double(), want, rtol=1e-5, atol=1e-6)

    def test_softmax_and_silu(self):
        s = f32([1000.0, 999.0, -5.0])  # subtracting the max keeps exp finite
        p = nm.softmax(s)
        self.assertTrue(torch.isfinite(p).all())
        self.assertAlmostEqual(p.sum().item(), 1.0, places=6)
        self.assertAlmostEqual(p[0].item() / p[1].item(), math.e, places=4)
        self.assertAlmostEqual(nm.silu(f32([2.0])).item(), 2.0 / (1 + math.exp(-2.0)), places=6)


if __name__ == "__main__":
    unittest.main()
