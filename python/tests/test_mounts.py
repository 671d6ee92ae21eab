"""tessera.mounts: upstream kernels' arguments as torch tensors over a manager's pages (ADR 0035):
shapes, strides and dtypes; zero-copy (the tensors alias the pool: a write through the pool is
seen through the tensor, and the tensor keeps the manager alive); refusals naming the argument;
the CPU reference in the kernels' terms; and the example of docs/ATTENTION.md, run as it is."""

import gc
import math
import os
import re
import unittest

import numpy as np

import tessera

try:
    import torch
except ImportError:  # the package does not need torch; these tests do
    torch = None

mounts = tessera.mounts


def manager(model, kv_format=None, lengths=(), capacity=32, seed=1, **kw):
    m = tessera.RequestManager(model, kv_format=kv_format, capacity_blocks=capacity, max_requests=8, **kw)
    ids, base = [], 1
    for i, n in enumerate(lengths):
        p = list(range(base, base + n))
        base += n
        r = m.admit(p).request_id
        mounts.append_random(m, r, p, seed=seed * 100 + i)
        ids.append(r)
    return m, ids


def address(t, *index):
    """The address of element `index` (leading dims) of a tensor."""
    off = sum(i * s for i, s in zip(index, t.stride()))
    return t.data_ptr() + off * t.element_size()


def np_address(a):
    return a.__array_interface__["data"][0]


@unittest.skipIf(torch is None, "torch is not installed")
class FlashMlaDenseTest(unittest.TestCase):
    def test_shapes_strides_dtypes(self):
        m, ids = manager("tiny-mla", "mla-bf16", (1, 64, 65, 200))
        a = mounts.flash_mla_dense(m, ids, 2)
        self.assertEqual(set(a), {"k_cache", "block_table", "cache_seqlens", "head_dim_v"})
        k = a["k_cache"]
        self.assertEqual(k.dtype, torch.bfloat16)
        self.assertEqual(tuple(k.shape), (32, 64, 1, 576))
        self.assertEqual(k.stride(), (4 * 64 * 576, 576, 576, 1))  # 4 layers' pages per block
        self.assertEqual(a["block_table"].dtype, torch.int32)
        self.assertEqual(tuple(a["block_table"].shape), (4, 4))
        self.assertEqual(a["cache_seqlens"].tolist(), [1, 64, 65, 200])
        self.assertEqual(a["head_dim_v"], 512)
        for i, r in enumerate(ids):
            table = m.block_table(r)
            need = -(-a["cache_seqlens"][i].item() // 64)
            self.assertEqual(a["block_table"][i, :need].tolist(), table[:need].tolist())
            self.assertTrue(all(x == -1 for x in a["block_table"][i, need:].tolist()))

    def test_views_are_the_managers_records(self):
        m, ids = manager("tiny-mla", "mla-bf16", (70, 130))
        a = mounts.flash_mla_dense(m, ids, 1)
        for i, r in enumerate(ids):
            for p in (0, 63, 64, m.tokens(r) - 1):
                block = int(a["block_table"][i, p // 64])
                rec = m.record(r, 0, 1, p)[0]
                self.assertEqual(address(a["k_cache"], block, p % 64), np_address(rec))
                self.assertTrue(np.array_equal(a["k_cache"][block, p % 64, 0].view(torch.int16).numpy().view(np.uint8),
                                               rec[:1152]))

    def test_aliases_the_pool_and_keeps_it_alive(self):
        m = tessera.RequestManager("tiny-mla", kv_format="mla-bf16", capacity_blocks=8)
        p = list(range(1, 11))
        r = m.admit(p).request_id
        mounts.append_random(m, r, p, seed=3)
        a = mounts.flash_mla_dense(m, [r], 3)
        block = int(a["block_table"][0, 0])
        page = m.page(block, 0, 3)  # writable: the block is being filled by this request only
        self.assertTrue(page.flags.writeable)
        page[5 * 1152: 5 * 1152 + 2] = [0x80, 0x3F]  # bf16 1.0 as token 5's latent[0]
        self.assertEqual(a["k_cache"][block, 5, 0, 0].item(), 1.0)
        a["k_cache"][block, 5, 0, 1] = -2.0  # and the other way: bf16 -2.0 is 0xC000
        self.assertEqual(page[5 * 1152 + 2: 5 * 1152 + 4].tolist(), [0x00, 0xC0])
        k = a["k_cache"]
        del a, page, m
        gc.collect()
        self.assertEqual(k[block, 5, 0, 0].item(), 1.0)  # the tensor holds the manager

    def test_pending_token(self):
        m, ids = manager("tiny-mla", "mla-bf16", (64,))
        with self.assertRaisesRegex(ValueError, "tokens"):
            mounts.flash_mla_dense(m, ids, 0, pending=1)
        m.allocate(ids[0], 1)
        a = mounts.flash_mla_dense(m, ids, 0, pending=1)
        self.assertEqual(a["cache_seqlens"].tolist(), [65])

    def test_refusals(self):
        m, ids = manager("tiny-mla", "fp8_ds_mla", (10,))
        with self.assertRaisesRegex(ValueError, "^kv_format: .*mla-bf16"):
            mounts.flash_mla_dense(m, ids, 0)
        m, ids = manager("tiny-mla", "mla-bf16", (10,), block_tokens=128)
        with self.assertRaisesRegex(ValueError, "^block_tokens: 128 .*64"):
            mounts.flash_mla_dense(m, ids, 0)
        m, ids = manager("tiny-mla", "mla-bf16", (10,))
        with self.assertRaisesRegex(ValueError, "^layer"):
            mounts.flash_mla_dense(m, ids, 4)
        with self.assertRaisesRegex(ValueError, "^request_ids"):
            mounts.flash_mla_dense(m, [ids[0] + 5], 0)
        with self.assertRaisesRegex(ValueError, "^requests"):
            mounts.flash_mla_dense(m, [], 0)
        with self.assertRaises(TypeError):
            mounts.flash_mla_dense(m, ids, "0")
        u = tessera.RequestManager("tiny-mla", kv_format="mla-bf16", capacity_blocks=8, backed=False)
        p = list(range(1, 11))
        r = u.admit(p).request_id
        u.append(r, p)
        with self.assertRaisesRegex(ValueError, "^backed"):
            mounts.flash_mla_dense(u, [r], 0)


@unittest.skipIf(torch is None, "torch is not installed")
class FlashMlaSparseTest(unittest.TestCase):
    def test_indices_of_the_indexer_topk(self):
        m, ids = manager("tiny-dsa", "fp8_ds_mla", (5, 300))
        rng = np.random.default_rng(0)
        sel = [mounts.reference_indexer_topk(m, r, 1, rng.standard_normal((4, 128)), rng.standard_normal(4))
               for r in ids]
        self.assertEqual([len(s) for s in sel], [5, 64])  # min(index_topk 64, tokens)
        a = mounts.flash_mla_sparse(m, ids, 1, sel)
        k = a["k_cache"]
        self.assertEqual((k.dtype, tuple(k.shape), k.stride()), (torch.uint8, (32, 64, 1, 656), (4 * 64 * 656, 656, 656, 1)))
        self.assertEqual(tuple(a["indices"].shape), (2, 1, 64))
        self.assertEqual(a["indices"].dtype, torch.int32)
        self.assertEqual(a["topk_length"].tolist(), [5, 64])
        self.assertTrue(a["is_fp8_kvcache"])
        for i, r in enumerate(ids):
            table = m.block_table(r)
            for k_, p in enumerate(sel[i]):
                idx = int(a["indices"][i, 0, k_])
                self.assertEqual(idx, int(table[p // 64]) * 64 + p % 64)
                self.assertEqual(address(k, idx // 64, idx % 64), np_address(m.record(r, 0, 1, int(p))[0]))
            self.assertTrue((a["indices"][i, 0, len(sel[i]):] == -1).all())

    def test_refusals(self):
        m, ids = manager("tiny-dsa", "fp8_ds_mla", (10,))
        with self.assertRaisesRegex(ValueError, "^selected"):
            mounts.flash_mla_sparse(m, ids, 0, [[10]])
        with self.assertRaisesRegex(ValueError, "^selected"):
            mounts.flash_mla_sparse(m, ids, 0, [[1], [2]])
        with self.assertRaisesRegex(ValueError, "^topk"):
            mounts.flash_mla_sparse(m, ids, 0, [[1, 2, 3]], topk=2)
        with self.assertRaises(TypeError):
            mounts.flash_mla_sparse(m, ids, 0, "1")
        b, bids = manager("tiny-dsa", "mla-bf16", (10,))
        with self.assertRaisesRegex(ValueError, "^kv_format"):
            mounts.flash_mla_sparse(b, bids, 0, [[1]])


@unittest.skipIf(torch is None, "torch is not installed")
class FlashInferTest(unittest.TestCase):
    def test_ckv_and_kpe_are_views_of_the_same_records(self):
        m, ids = manager("tiny-mla", "mla-bf16", (1, 64, 65, 200))
        a = mounts.flashinfer_mla(m, ids, 1)
        plan, run = a["plan"], a["run"]
        ckv, kpe = run["ckv_cache"], run["kpe_cache"]
        self.assertEqual((ckv.dtype, tuple(ckv.shape), ckv.stride()), (torch.bfloat16, (32, 64, 512), (4 * 64 * 576, 576, 1)))
        self.assertEqual((kpe.dtype, tuple(kpe.shape), kpe.stride()), (torch.bfloat16, (32, 64, 64), (4 * 64 * 576, 576, 1)))
        self.assertEqual(kpe.data_ptr() - ckv.data_ptr(), 1024)
        self.assertEqual(plan["qo_indptr"].tolist(), [0, 1, 2, 3, 4])
        self.assertEqual(plan["kv_indptr"].tolist(), [0, 1, 2, 4, 8])
        self.assertEqual(plan["kv_len_arr"].tolist(), [1, 64, 65, 200])
        self.assertEqual((plan["page_size"], plan["head_dim_ckv"], plan["head_dim_kpe"]), (64, 512, 64))
        self.assertEqual(plan["kv_data_type"], torch.bfloat16)
        for i, r in enumerate(ids):
            pages = plan["kv_indices"][plan["kv_indptr"][i]:plan["kv_indptr"][i + 1]].tolist()
            self.assertEqual(pages, m.block_table(r)[:len(pages)].tolist())
        a = mounts.flashinfer_mla(m, ids, 0, q_len=1)
        with self.assertRaisesRegex(ValueError, "^q_len"):
            mounts.flashinfer_mla(m, ids, 0, q_len=2)  # the first request holds one token
        f, fids = manager("tiny-mla", "fp8_ds_mla", (10,))
        with self.assertRaisesRegex(ValueError, "^kv_format: .*kpe_scale"):
            mounts.flashinfer_mla(f, fids, 0)


@unittest.skipIf(torch is None, "torch is not installed")
class DeepSeekV4Test(unittest.TestCase):
    def test_compressed_entries_as_model1_blocks(self):
        m, ids = manager("tiny-v4", None, (300, 700), indexer_format="indexer-mxfp4")
        for layer, per_block, stride in ((1, 64, 74880), (2, 2, 1728)):
            a = mounts.v4_compressed_entries(m, ids, layer) if layer == 2 else \
                mounts.v4_compressed_entries(m, ids, layer, [list(range(75)), [0, 174, 64]])
            k = a["k_cache"]
            self.assertEqual((k.dtype, tuple(k.shape), k.stride()), (torch.uint8, (32, per_block, 1, 584), (stride, 584, 584, 1)))
            lengths = a["topk_length"].tolist()
            self.assertEqual(lengths, [2, 5] if layer == 2 else [75, 3])
            for i, r in enumerate(ids):
                table = m.block_table(r)
                entries = range(lengths[i]) if layer == 2 else ([*range(75)], [0, 174, 64])[i]
                for kk, e in enumerate(entries):
                    idx = int(a["indices"][i, 0, kk])
                    self.assertEqual(idx, int(table[e // per_block]) * per_block + e % per_block)
                    data, scales = m.entry(r, layer, False, e)
                    base = address(k, idx // per_block)
                    self.assertEqual(base + (idx % per_block) * 576, np_address(data))
                    self.assertEqual(base + per_block * 576 + (idx % per_block) * 8, np_address(scales))

    def test_refusals(self):
        m, ids = manager("tiny-v4", None, (100,))
        with self.assertRaisesRegex(ValueError, "^window: .*16-byte"):
            mounts.v4_window(m, 0)
        with self.assertRaisesRegex(ValueError, "^layer"):
            mounts.v4_compressed_entries(m, ids, 0)  # window-only
        with self.assertRaisesRegex(ValueError, "^selected"):
            mounts.v4_compressed_entries(m, ids, 2)  # 100 tokens: no complete HCA entry
        with self.assertRaisesRegex(ValueError, "^selected"):
            mounts.v4_compressed_entries(m, ids, 1, [[25]])  # entries 0..24


@unittest.skipIf(torch is None, "torch is not installed")
class ReferenceTest(unittest.TestCase):
    def test_reference_decode_over_the_views(self):
        """The dense decode written out in torch over the FlashMLA view equals Tessera's reference."""
        m, ids = manager("tiny-mla", "mla-bf16", (65, 300))
        a = mounts.flash_mla_dense(m, ids, 0)
        g = torch.Generator().manual_seed(0)
        for i, r in enumerate(ids):
            n = int(a["cache_seqlens"][i])
            blocks = a["block_table"][i, :-(-n // 64)].long()
            kv = a["k_cache"][blocks].reshape(-1, 576)[:n].float()
            q = torch.randn(4, 576, generator=g)
            s = q @ kv.T * 0.1
            o = torch.softmax(s, -1) @ kv[:, :512]
            out, lse = mounts.reference_decode(m, r, 0, q[:, :512].numpy(), q[:, 512:].numpy(), softmax_scale=0.1)
            self.assertLess(float((o - torch.from_numpy(out)).abs().max()), 1e-5)
            self.assertLess(float((torch.logsumexp(s, -1) - torch.from_numpy(lse)).abs().max()), 1e-4)

    def test_reference_argument_checks(self):
        m, ids = manager("tiny-mla", "mla-bf16", (10,))
        q, qp = np.zeros((4, 512), np.float32), np.zeros((4, 64), np.float32)
        with self.assertRaisesRegex(ValueError, "^q_lat"):
            mounts.reference_decode(m, ids[0], 0, np.zeros((4, 500)), qp, softmax_scale=0.1)
        with self.assertRaisesRegex(ValueError, "^q_pe"):
            mounts.reference_decode(m, ids[0], 0, q, qp[:2], softmax_scale=0.1)
        with self.assertRaisesRegex(ValueError, "^softmax_scale"):
            mounts.reference_decode(m, ids[0], 0, q, qp, softmax_scale=-1.0)
        with self.assertRaises(TypeError):
            mounts.reference_decode(m, ids[0], 0, q, qp, softmax_scale="x")
        with self.assertRaisesRegex(ValueError, "^positions"):
            mounts.reference_decode(m, ids[0], 0, q, qp, softmax_scale=0.1, positions=[10])
        with self.assertRaisesRegex(ValueError, "^index_n_heads"):
            mounts.reference_indexer_topk(m, ids[0], 0, np.zeros((4, 128)), np.zeros(4))
        v, vids = manager("tiny-v4", None, (40,))
        with self.assertRaisesRegex(ValueError, "^entries"):
            mounts.reference_v4_decode(v, vids[0], 1, np.zeros((4, 512)), np.zeros(4), rope_theta=1e4)
        with self.assertRaisesRegex(ValueError, "^kv_format"):
            bad = tessera.RequestManager("tiny-mla", kv_format="mla-fp16", capacity_blocks=8)
            r = bad.admit([1, 2]).request_id
            mounts.append_random(bad, r, [1, 2])


@unittest.skipIf(torch is None, "torch is not installed")
class DocExampleTest(unittest.TestCase):
    def test_the_example_in_docs_runs(self):
        """docs/ATTENTION.md's FlashMLA example, run as it is: without FlashMLA and a GPU it takes
        its CPU reference path, which asserts agreement with Tessera's reference decode."""
        source = os.environ.get("TESSERA_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "..", "..")
        with open(os.path.join(source, "docs", "ATTENTION.md"), encoding="utf-8") as f:
            text = f.read()
        blocks = re.findall(r"<!-- example: flash_mla -->\n```python\n(.*?)```", text, re.S)
        self.assertEqual(len(blocks), 1)
        scope = {}
        exec(compile(blocks[0], "docs/ATTENTION.md", "exec"), scope)
        self.assertIn(scope["path"], ("flash_mla", "cpu reference"))
        self.assertLess(scope["max_err"], scope["tol"])


if __name__ == "__main__":
    unittest.main()
