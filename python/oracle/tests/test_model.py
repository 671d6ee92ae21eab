"""The oracle's forward: weight checks, the cache's lossy records, naive attention, the indexer."""

import math
import unittest

import numpy as np
import torch

from oracle import model as om
from oracle import numerics as nm
from oracle.tests import weightgen

_WEIGHTS = {}


def weights(model, seed=7):
    if (model, seed) not in _WEIGHTS:
        _WEIGHTS[(model, seed)] = weightgen.generate(model, seed)
    return _WEIGHTS[(model, seed)]


def oracle(model="tiny-mla", fmt="mla-bf16", seed=7):
    t, m = weights(model, seed)
    return om.Oracle(model, fmt, t, m)


class GeneratorTest(unittest.TestCase):
    def test_splitmix64_known_answer(self):
        # SplitMix64 seeded with 0: the first outputs (Vigna's reference splitmix64.c).
        got = [int(v) for v in weightgen.draws(0, 0, 3)]
        self.assertEqual(got, [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F])
        self.assertEqual(int(weightgen.draws(0, 2, 1)[0]), got[2])  # any window of the stream

    def test_values_and_determinism(self):
        t, m = weights("tiny-dsa")
        self.assertEqual(m, {"model": "tiny-dsa", "seed": "7", "format": "tessera-tiny-v1"})
        self.assertEqual(list(t)[:2], ["embed.weight", "layers.0.attn_norm.weight"])
        # ADR 0017's order: each layer's indexer tensors right after its ffn.w2; norm and head last.
        self.assertEqual(list(t)[-1], "head.weight")
        self.assertEqual(list(t).index("layers.0.attn.indexer.wq_b.weight"), list(t).index("layers.0.ffn.w2.weight") + 1)
        w = t["layers.1.attn.wkv_b.weight"]
        self.assertLess(np.abs(w).max(), 1 / math.sqrt(512))
        self.assertGreater(np.abs(w).max(), 0.99 / math.sqrt(512))
        n = t["layers.2.attn.kv_norm.weight"]
        self.assertTrue(((n > 0.9) & (n < 1.1)).all())
        self.assertLess(np.abs(t["layers.0.attn.indexer.k_norm.bias"]).max(), 0.1)
        again, _ = weightgen.generate("tiny-dsa", 7)
        self.assertTrue(all(np.array_equal(t[k], again[k]) for k in t))
        other, _ = weightgen.generate("tiny-dsa", 8)
        self.assertFalse(np.array_equal(t["embed.weight"], other["embed.weight"]))


class WeightCheckTest(unittest.TestCase):
    def refused(self, tensors, meta, *words, model="tiny-mla"):
        with self.assertRaises(ValueError) as cm:
            om.check_weights(model, tensors, meta)
        for w in words:
            self.assertIn(w, str(cm.exception))

    def test_refusals(self):
        t, m = weights("tiny-mla")
        om.check_weights("tiny-mla", t, m)
        self.refused({k: v for k, v in t.items() if k != "layers.2.ffn.w3.weight"}, m,
                     "layers.2.ffn.w3.weight", "missing")
        bad = dict(t, **{"head.weight": np.zeros((256, 128), np.float32)})
        self.refused(bad, m, "head.weight", "shape")
        nan = t["norm.weight"].copy()
        nan[3] = np.nan
        self.refused(dict(t, **{"norm.weight": nan}), m, "norm.weight", "non-finite")
        self.refused(dict(t, extra=np.zeros(1, np.float32)), m, "'extra'")
        self.refused(t, dict(m, model="tiny-dsa"), "__metadata__.model")
        self.refused(t, dict(m, format="v0"), "__metadata__.format")
        self.refused(t, m, "model", model="tiny-v9")
        td, md = weights("tiny-dsa")
        self.refused(t, dict(m, model="tiny-dsa"), "indexer", model="tiny-dsa")  # mla file lacks them
        with self.assertRaises(ValueError):
            om.Oracle("tiny-dsa", "mla-fp16", td, md)


class CacheTest(unittest.TestCase):
    def test_bf16_record(self):
        g = torch.Generator().manual_seed(1)
        c, k_pe = torch.randn(512, generator=g), torch.randn(64, generator=g)
        cache = om.LatentCache("mla-bf16", 1, 512, 64)
        cache.append(0, c, k_pe)
        self.assertEqual(len(cache.records[0][0]), 1152)
        rc, rk = cache.read(0, [0])
        self.assertTrue(torch.equal(rc[0], nm.bf16_round(c)))
        self.assertTrue(torch.equal(rk[0], nm.bf16_round(k_pe)))
        self.assertFalse(torch.equal(rc[0], c))  # the lossy step is there

    def test_fp8_record(self):
        g = torch.Generator().manual_seed(2)
        c, k_pe = torch.randn(512, generator=g) * 3, torch.randn(64, generator=g)
        c[128:256] = 0.0  # an all-zero tile: scale FLT_MIN, as vLLM writes it (ADR 0033)
        cache = om.LatentCache("fp8_ds_mla", 1, 512, 64)
        cache.append(0, c, k_pe)
        rec = bytes(cache.records[0][0])
        self.assertEqual(len(rec), 656)
        scales = np.frombuffer(rec[512:528], dtype="<f4")
        self.assertEqual(scales[1], np.float32(nm.FLT_MIN))
        for t in (0, 2, 3):
            tile = c[t * 128 : (t + 1) * 128]
            self.assertEqual(scales[t], np.float32(tile.abs().max().item()) / np.float32(448))
            self.assertEqual(max(b & 0x7F for b in rec[t * 128 : (t + 1) * 128]), 0x7E)  # amax -> 448
        rc, rk = cache.read(0, [0])
        want = torch.cat([nm.e4m3_round(c[t * 128 : (t + 1) * 128] / torch.tensor(scales[t])) * torch.tensor(scales[t])
                          for t in range(4)])
        self.assertTrue(torch.equal(rc[0], want))
        self.assertTrue(torch.equal(rk[0], nm.bf16_round(k_pe)))
        rel = ((rc[0] - c).abs() / c.abs().clamp(min=1e-3)).max().item()
        self.assertGreater(rel, 0.0)
        # at most half the widest quantum (32 between 256 and 448) times the scale
        self.assertLessEqual((rc[0] - c).abs().max().item(), 16 * float(scales.max()))

    def test_flip_changes_one_byte(self):
        cache = om.LatentCache("fp8_ds_mla", 2, 512, 64)
        cache.append(1, torch.ones(512), torch.ones(64))
        before = bytes(cache.records[1][0])
        cache.flip(1, 0, 515)
        after = bytes(cache.records[1][0])
        self.assertEqual([i for i in range(656) if before[i] != after[i]], [515])
        self.assertEqual(before[515] ^ after[515], 1)
        with self.assertRaises(ValueError):
            cache.flip(1, 0, 656)


class AttentionTest(unittest.TestCase):
    def direct(self, o, l, q, positions):
        """Absorbed MLA in float64, one key at a time: an independent route to the same output."""
        C, KPE = o.cache.read(l, positions)
        C, KPE, q = C.double(), KPE.double(), q.double()
        w = o.w[f"layers.{l}.attn.wkv_b.weight"].double().view(4, 128, 512)
        out = []
        for h in range(4):
            q_lat = w[h, :64].T @ q[h, :64]
            s = [(q_lat @ C[t] + q[h, 64:] @ KPE[t]).item() / math.sqrt(128) for t in range(len(positions))]
            m = max(s)
            e = [math.exp(x - m) for x in s]
            z = sum(e)
            acc = torch.zeros(512, dtype=torch.float64)
            for t in range(len(positions)):
                acc += e[t] / z * C[t]
            out.append(w[h, 64:] @ acc)
        return torch.cat(out)

    def test_naive_equals_direct(self):
        for fmt in om.KV_FORMATS:
            o = oracle("tiny-mla", fmt)
            for tok in (5, 9, 200, 17, 3, 3, 41):
                o.step(tok)
            q = torch.randn(4, 128, generator=torch.Generator().manual_seed(3))
            for l, positions in ((0, list(range(7))), (3, [0, 2, 6])):
                got = o.attend(l, q, positions).double()
                want = self.direct(o, l, q, positions)
                err = (got - want).abs().max().item() / want.abs().max().item()
                self.assertLess(err, 1e-5, f"{fmt} layer {l}")

    def test_first_token_attends_only_itself(self):
        o = oracle()
        o.step(11)
        C, _ = o.cache.read(2, [0])
        w = o.w["layers.2.attn.wkv_b.weight"].view(4, 128, 512)
        q = torch.randn(4, 128, generator=torch.Generator().manual_seed(4))
        want = torch.cat([w[h, 64:] @ C[0] for h in range(4)])
        torch.testing.assert_close(o.attend(2, q, [0]), want, rtol=1e-5, atol=1e-6)

    def test_causal_and_own_token_included(self):
        o = oracle()
        for tok in (4, 5, 6, 7):
            o.step(tok)
        for p in range(4):
            self.assertEqual(o.selected[p], [list(range(p + 1))] * 4)

    def test_float64_evaluation(self):
        a, b = oracle(), om.Oracle("tiny-mla", "mla-bf16", *weights("tiny-mla"), dtype=torch.float64)
        la, lb = a.step(9), b.step(9)
        self.assertEqual(lb.dtype, torch.float64)
        self.assertLess((la.double() - lb).abs().max().item(), 1e-3)

    def test_attention_reads_the_cached_bytes(self):
        o = oracle("tiny-mla", "mla-bf16")
        for tok in (1, 2, 3):
            o.step(tok)
        q = torch.randn(4, 128, generator=torch.Generator().manual_seed(5))
        before = o.attend(0, q, [0, 1, 2])
        o.cache.flip(0, 1, 1)  # exponent bit of c[0] at position 1
        self.assertFalse(torch.equal(o.attend(0, q, [0, 1, 2]), before))

    def test_fp8_pages_change_the_logits_a_little(self):
        a, b = oracle("tiny-mla", "mla-bf16"), oracle("tiny-mla", "fp8_ds_mla")
        for tok in (1, 2, 3, 4):
            la, lb = a.step(tok), b.step(tok)
        d = (la - lb).abs().max().item()
        self.assertGreater(d, 0.0)
        self.assertLess(d, 0.1 * la.abs().max().item())


class IndexerTest(unittest.TestCase):
    def test_topk_ties_prefer_lower_positions(self):
        s = torch.tensor([1.0, 3.0, 3.0, 2.0, 3.0, -0.0, 0.0])
        self.assertEqual(om.topk_positions(s, 2), [1, 2])
        self.assertEqual(om.topk_positions(s, 4), [1, 2, 3, 4])
        self.assertEqual(om.topk_positions(s, 6), [0, 1, 2, 3, 4, 5])
        self.assertEqual(om.topk_positions(s, 10), list(range(7)))

    def test_selection(self):
        o = oracle("tiny-dsa", "fp8_ds_mla")
        toks, _ = om.greedy(o, [1, 2, 3], 68)  # positions 0..69
        self.assertEqual(o.selected[10][0], list(range(11)))  # fewer than 64 keys: all of them
        self.assertEqual(o.selected[63][3], list(range(64)))
        last = o.selected[-1]
        for l in range(4):
            self.assertEqual(len(last[l]), 64)
            self.assertIn(len(o.selected) - 1, last[l] + [len(o.selected) - 1])
        # Some layer dropped a key at the last step, so top-k selection really restricted attention.
        self.assertTrue(any(len(set(range(70)) - set(last[l])) == 6 for l in range(4)))

    def test_selection_matches_float64_scores(self):
        o = oracle("tiny-dsa", "mla-bf16")
        om.greedy(o, [1, 2, 3], 70)
        # Recompute layer 0's scores at the last position in float64 from the same cached keys.
        pos = o.pos - 1
        h = o.w["embed.weight"][o.tokens[-1]]
        x = nm.rms_norm(h, o.w["layers.0.attn_norm.weight"], 1e-6)
        qr = nm.rms_norm(o.w["layers.0.attn.wq_a.weight"] @ x, o.w["layers.0.attn.q_norm.weight"], 1e-6)
        p = "layers.0.attn.indexer."
        iq = (o.w[p + "wq_b.weight"] @ qr).view(4, 128)
        iq = torch.cat([nm.rope_half(iq[:, :64], pos, 1e4), iq[:, 64:]], 1)
        iq = (iq.double() @ nm.hadamard(128).double().T) / math.sqrt(128)
        keys = o.icache.read(0).double()
        wj = (o.w[p + "weights_proj.weight"] @ x).double() / math.sqrt(4) / math.sqrt(128)
        score = (torch.relu(keys @ iq.T) * wj).sum(1)
        order = sorted(range(len(score)), key=lambda t: (-score[t].item(), t))
        # At the cut either a clear gap, or exact zeros (relu of every head's dot product), which
        # the tie rule orders by position.
        a, b = score[order[63]].item(), score[order[64]].item()
        self.assertTrue(a - b > 1e-6 or a == b == 0.0, (a, b))
        self.assertEqual(o.selected[-1][0], sorted(order[:64]))


if __name__ == "__main__":
    unittest.main()
