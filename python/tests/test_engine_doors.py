"""The engine doors (ADR 0030): Tessera's vLLM connector and SGLang storage backend loaded the way
the engines' factories load them (module path + class name from the engine's configuration
strings, a base-class check, the engine's constructor arguments) and driven in the order the
engines' schedulers and workers call them, with torch tensors of the engines' real dtypes
(bf16 MLA caches, uint8 fp8_ds_mla records, DeepSeek-V4's per-group caches) and vLLM's role enum;
every KV byte compared bit-exact. Keys carry the model, revision, tenant, cache_salt, LoRA and
multimodal identity; SGLang namespaces are kept whole."""
import ctypes
import importlib
import json
import os
import tempfile
import threading
import unittest
from types import SimpleNamespace
from unittest import mock

import torch

import tessera.sglang as tsg
import tessera.vllm as tv
from tessera import _vllm_base, _vllm_common, _vllm_connector

SECRET = "engine-doors-secret-0123456789abcdef"
BS = 16


def vllm_config(extra, model="deepseek-ai/DeepSeek-V3", revision=None):
    """The fields of vLLM's VllmConfig a connector reads, from the JSON of --kv-transfer-config."""
    ktc = json.loads(json.dumps({"kv_connector": "TesseraConnector", "kv_connector_module_path": "tessera.vllm",
                                 "kv_role": "kv_both", "kv_connector_extra_config": extra}))
    return SimpleNamespace(kv_transfer_config=SimpleNamespace(**ktc), cache_config=SimpleNamespace(block_size=BS),
                           model_config=SimpleNamespace(model=model, revision=revision),
                           scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=False))


def load_vllm_connector(config, role):
    """What vLLM's KVConnectorFactory does with kv_connector_module_path (factory.py
    get_connector_class, create_connector): import, getattr, the HMA check, construct."""
    ktc = config.kv_transfer_config
    cls = getattr(importlib.import_module(ktc.kv_connector_module_path), ktc.kv_connector)
    base = _vllm_base if not tv.HAVE_VLLM else importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.base")
    assert issubclass(cls, base.KVConnectorBase_V1) and issubclass(cls, base.SupportsHMA)
    return cls(config, role, None)


class Request:
    """The fields of vLLM's v1 Request a connector reads."""

    def __init__(self, rid, tokens, cache_salt=None, lora=None, mm=(), prompt_embeds=None):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.cache_salt = cache_salt
        self.lora_request = lora
        self.mm_features = list(mm)
        self.prompt_embeds = prompt_embeds
        self.num_computed_tokens = 0

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def mla_caches(layers, blocks, kind):
    g = torch.Generator().manual_seed(7)
    if kind == "bf16":  # vLLM's default MLA cache: [blocks, block, 576] bf16
        return {"model.layers.%d.self_attn.attn" % i: torch.randn(blocks, BS, 576, generator=g).to(torch.bfloat16)
                for i in range(layers)}
    if kind == "fp8_ds_mla":  # 656-byte records as uint8
        return {"model.layers.%d.self_attn.attn" % i: torch.randint(0, 256, (blocks, BS, 656), generator=g,
                                                                     dtype=torch.uint8) for i in range(layers)}
    # DeepSeek-V4: per-group caches with pages of their own sizes
    return {"layers.0.attn.swa": torch.randint(0, 256, (blocks, BS, 584), generator=g, dtype=torch.uint8),
            "layers.0.attn.c4": torch.randn(blocks, BS, 512, generator=g).to(torch.bfloat16),
            "layers.1.attn.c128": torch.randint(0, 256, (blocks, BS, 656), generator=g, dtype=torch.uint8),
            "layers.1.attn.indexer": torch.randn(blocks, BS, 132, generator=g).to(torch.bfloat16)}


class Engine:
    """One vLLM engine: a scheduler-role and a worker-role connector, as vLLM builds them."""

    # The order vLLM's v1 Scheduler and GPU worker call a connector in one step (Scheduler.__init__,
    # schedule(), update_from_output(); KVConnectorModelRunnerMixin; the attention layers' hooks).
    def __init__(self, config, caches):
        self.sched = load_vllm_connector(config, tv.KVConnectorRole.SCHEDULER)
        self.worker = load_vllm_connector(config, tv.KVConnectorRole.WORKER)
        self.sched.bind_gpu_block_pool(object())
        self.worker.register_kv_caches(caches)
        self.kv = caches
        self.calls = []

    def step(self, req, block_ids, local_tokens):
        s, w = self.sched, self.worker
        s.on_new_request(req)
        ext, is_async = s.get_num_new_matched_tokens(req, local_tokens)
        s.update_state_after_alloc(req, (list(block_ids),), ext)
        out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id=req.request_id,
                                                                  block_ids=(list(block_ids),),
                                                                  num_computed_tokens=local_tokens + ext)],
                              scheduled_cached_reqs=None,
                              num_scheduled_tokens={req.request_id: req.num_tokens - local_tokens - ext})
        meta = s.build_connector_meta(out)
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace())
        for name in sorted(self.kv):
            w.wait_for_layer_load(name)
            w.save_kv_layer(name, self.kv[name], None)
        w.wait_for_save()
        sending, recving = w.get_finished(set())
        if is_async and not recving:  # vLLM asks again each step until the load is reported
            w.wait_for_transfers()
            sending, recving = w.get_finished(set())
        errors = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        s.update_connector_output(SimpleNamespace(finished_sending=sending, finished_recving=recving,
                                                  kv_cache_events=w.get_kv_connector_kv_cache_events()))
        s.get_kv_connector_stats()
        self.delayed, _ = s.request_finished(req, (list(block_ids),))
        if self.delayed:  # vLLM keeps the blocks; the next steps' get_finished name the request once sent
            w.wait_for_transfers()
            self.sent = w.get_finished({req.request_id})[0]
        return ext, is_async, recving, errors


def page_bytes(t, b):
    return t[b].reshape(-1).view(torch.uint8).clone()


# vLLM's KVConnectorBase_V1 members at 28be48fa9 (read with vLLM's own class loaded: ADR 0030).
VLLM_BASE_MEMBERS = [
    "__init__", "_get_connector_metadata", "bind_connector_metadata", "bind_gpu_block_pool", "build_connector_meta",
    "build_connector_worker_meta", "build_kv_connector_stats", "build_prom_metrics", "clear_connector_metadata",
    "get_block_ids_with_load_errors", "get_finished", "get_finished_count", "get_handshake_metadata",
    "get_kv_connector_kv_cache_events", "get_kv_connector_stats", "get_num_new_matched_tokens",
    "get_required_kvcache_layout", "handle_preemptions", "has_connector_metadata", "on_new_request",
    "prefer_cross_layer_blocks", "register_cross_layers_kv_cache", "register_kv_caches", "request_finished",
    "requires_piecewise_for_cudagraph", "reset_cache", "role", "save_kv_layer", "set_host_xfer_buffer_ops",
    "set_xfer_handshake_metadata", "shutdown", "start_load_kv", "take_events", "update_connector_output",
    "update_state_after_alloc", "wait_for_layer_load", "wait_for_save"]
VLLM_ABSTRACT = ["build_connector_meta", "get_num_new_matched_tokens", "save_kv_layer", "start_load_kv",
                 "update_state_after_alloc", "wait_for_layer_load", "wait_for_save"]


def assert_equal_pages(test, doc, caches, names):
    """Each page pair the trace names ("expect_equal_pages": engine A's block, engine B's) holds
    the same bytes in every cache of `names`."""
    want = doc["expect_equal_pages"]
    for n in names:
        for a, b in zip(want["A"], want["B"]):
            test.assertTrue(torch.equal(page_bytes(caches["A"][n], a), page_bytes(caches["B"][n], b)), (n, a, b))


class VllmDoor(unittest.TestCase):
    def test_stand_in_base_has_vllms_members(self):
        b = _vllm_base.KVConnectorBase_V1
        names = sorted(n for n, v in vars(b).items() if callable(v) or isinstance(v, (property, classmethod)))
        self.assertEqual(names, VLLM_BASE_MEMBERS)
        self.assertEqual(sorted(b.__abstractmethods__), VLLM_ABSTRACT)
        self.assertEqual([(r.name, r.value) for r in _vllm_base.KVConnectorRole], [("SCHEDULER", 0), ("WORKER", 1)])
        self.assertEqual(sorted(tv.TesseraConnector.__abstractmethods__), [])


    def setUp(self):
        self.extra = {"tessera_tiers": [{"kind": "host", "capacity_bytes": 64 << 20}], "tessera_secret": SECRET}

    def share(self, kind, async_load=False, layers=3, tiers=None, async_save=False):
        from tessera._core import RecordTiers
        tiers = tiers or RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
        extra = dict(self.extra, tessera_async_load=async_load, tessera_async_save=async_save)
        a = Engine(vllm_config(extra), mla_caches(layers, 12, kind))
        b = Engine(vllm_config(extra), {n: torch.zeros_like(t) for n, t in mla_caches(layers, 12, kind).items()})
        for e in (a, b):
            e.sched._tiers = e.worker._tiers = tiers
        tokens = list(range(1000, 1000 + 4 * BS + 3))
        ext, _, _, errors = a.step(Request("r", tokens), [0, 1, 2, 3, 4], 0)
        self.assertEqual((ext, errors), (0, set()))
        self.assertEqual(a.worker.stats["saved_blocks"], 4)
        self.assertEqual((a.delayed, getattr(a, "sent", None)), (True, {"r"}) if async_save else (False, None))
        ext, is_async, recving, errors = b.step(Request("r2", tokens), [7, 9, 2, 11, 5], 0)
        self.assertEqual((ext, is_async, errors), (4 * BS, async_load, set()))
        self.assertEqual(recving, {"r2"} if async_load else None)
        for n in a.kv:
            for src, dst in zip([0, 1, 2, 3], [7, 9, 2, 11]):
                self.assertTrue(torch.equal(page_bytes(a.kv[n], src), page_bytes(b.kv[n], dst)), (n, src))
            self.assertEqual(a.kv[n].dtype, b.kv[n].dtype)

    def test_loaded_by_the_factory_path_with_the_role_enum(self):
        c = load_vllm_connector(vllm_config(self.extra), tv.KVConnectorRole.WORKER)
        self.assertIs(c.role, tv.KVConnectorRole.WORKER)
        self.assertEqual(c.reset_cache(), True)
        self.assertIsNone(c.get_kv_connector_stats())  # nothing happened yet
        c.stats["loaded_blocks"] += 3
        got = c.get_kv_connector_stats()
        self.assertIsInstance(got, tv.TesseraConnectorStats)
        agg = tv.TesseraConnector.build_kv_connector_stats(got.data).aggregate(got)
        self.assertEqual(agg.reduce()["loaded_blocks"], 6)
        self.assertFalse(agg.is_empty())
        self.assertIsNone(c.get_kv_connector_stats())  # the interval's counts were reported
        self.assertIsInstance(c, tv.TesseraConnector)
        with self.assertRaisesRegex(ValueError, "role"):
            tv.TesseraConnector(vllm_config(self.extra), "leader")

    def test_bf16_cache_every_byte(self):
        self.share("bf16")

    def test_fp8_ds_mla_uint8_records_every_byte(self):
        self.share("fp8_ds_mla")

    def test_deepseek_v4_per_group_caches_every_byte(self):
        self.share("v4", layers=0)

    def test_asynchronous_load_reported_by_get_finished(self):
        self.share("bf16", async_load=True)

    def test_bf16_through_disk_and_a_real_redis_server(self):
        from tessera._core import RecordTiers
        with tempfile.TemporaryDirectory() as d:
            self.share("bf16", tiers=RecordTiers([{"kind": "disk", "dir": d}]))
        from redis_support import RedisServer
        r = RedisServer()
        try:
            self.share("v4", layers=0, tiers=RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": r.port,
                                                           "secret": SECRET.encode()}]))
            self.assertGreater(r.command("DBSIZE"), 0)
        finally:
            r.close()

    def test_secret_from_a_file_and_from_the_environment(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "secret")
            with open(path, "w") as f:
                f.write(SECRET + "\n")
            base = {"tessera_tiers": self.extra["tessera_tiers"]}
            a = tv.TesseraConnector(vllm_config(dict(base, tessera_secret_file=path)), tv.KVConnectorRole.SCHEDULER)
            os.environ["TESSERA_DOORS_TEST_SECRET"] = SECRET
            try:
                b = tv.TesseraConnector(vllm_config(dict(base, tessera_secret_env="TESSERA_DOORS_TEST_SECRET")),
                                        tv.KVConnectorRole.SCHEDULER)
            finally:
                del os.environ["TESSERA_DOORS_TEST_SECRET"]
            self.assertEqual(a._secret, SECRET.encode())
            self.assertEqual(b._secret, SECRET.encode())
            for bad, key in (({"tessera_secret_file": os.path.join(d, "none")}, "tessera_secret_file"),
                             ({"tessera_secret_env": "TESSERA_NO_SUCH_VAR_X"}, "tessera_secret_env"),
                             ({"tessera_secret": "short"}, "tessera_secret"),
                             ({"tessera_secret": SECRET, "tessera_secert_file": path}, "tessera_secert_file"),
                             ({"tessera_secret": SECRET, "tessera_async_load": "yes"}, "tessera_async_load"),
                             ({"tessera_secret": SECRET, "tessera_tiers": [{"kind": "tape"}]}, "tessera_tiers")):
                cfg = dict(base, **bad)
                with self.assertRaisesRegex((ValueError, TypeError), key):
                    tv.TesseraConnector(vllm_config(cfg), tv.KVConnectorRole.SCHEDULER)

    def test_keys_carry_model_revision_tenant_salt_lora_and_images(self):
        from tessera._core import RecordTiers
        tiers = RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
        tokens = list(range(5 * BS))
        img = SimpleNamespace(mm_hash="img-a", identifier="img-a", mm_position=SimpleNamespace(offset=2 * BS,
                                                                                              length=BS))

        def conn(model="deepseek-ai/DeepSeek-V3", revision=None, **extra):
            c = tv.TesseraConnector(vllm_config(dict(self.extra, **extra), model, revision),
                                    tv.KVConnectorRole.SCHEDULER)
            c._tiers = tiers
            return c

        writer = conn()
        req = Request("w", tokens, mm=[img])
        keys = writer._keys_for(req).keys
        tiers.put(keys, [b"x"] * len(keys), 1)
        self.assertEqual(conn().get_num_new_matched_tokens(Request("a", tokens, mm=[img]), 0)[0], 4 * BS)
        # Another model (R1 beside V3), another weights revision, another tenant: nothing.
        self.assertEqual(conn("deepseek-ai/DeepSeek-R1").get_num_new_matched_tokens(Request("b", tokens), 0)[0], 0)
        self.assertEqual(conn(revision="v2").get_num_new_matched_tokens(Request("c", tokens, mm=[img]), 0)[0], 0)
        self.assertEqual(conn(tessera_tenant="bob").get_num_new_matched_tokens(Request("d", tokens, mm=[img]),
                                                                              0)[0], 0)
        # cache_salt and a LoRA adapter: nothing; another image: only the blocks before it.
        self.assertEqual(conn().get_num_new_matched_tokens(Request("e", tokens, cache_salt="bob", mm=[img]), 0)[0],
                         0)
        lora = SimpleNamespace(lora_name="sql", lora_int_id=1)
        self.assertEqual(conn().get_num_new_matched_tokens(Request("f", tokens, lora=lora, mm=[img]), 0)[0], 0)
        other = SimpleNamespace(mm_hash="img-b", identifier="img-b", mm_position=img.mm_position)
        self.assertEqual(conn().get_num_new_matched_tokens(Request("g", tokens, mm=[other]), 0)[0], 2 * BS)
        # Prompt embeddings (vLLM keys them too): other embeddings behind the same ids, nothing.
        import torch
        embeds = torch.arange(12, dtype=torch.float32).reshape(3, 4)
        emb_writer = Request("h", tokens, mm=[img], prompt_embeds=embeds)
        emb_keys = writer._keys_for(emb_writer).keys
        tiers.put(emb_keys, [b"x"] * len(emb_keys), 1)
        self.assertEqual(conn().get_num_new_matched_tokens(Request("i", tokens, mm=[img], prompt_embeds=embeds.clone()),
                                                           0)[0], 4 * BS)
        self.assertEqual(conn().get_num_new_matched_tokens(Request("j", tokens, mm=[img], prompt_embeds=embeds + 1),
                                                           0)[0], 0)


DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "engine_doors")


def _has_ref(v):
    if isinstance(v, dict):
        return v.get("$", "set") != "set" or any(_has_ref(x) for x in v.values())
    if isinstance(v, list):
        return any(_has_ref(x) for x in v)
    return False


def _enc(v):
    """A call's result as the trace writes it (sets as {"$": "set"}, tuples as lists)."""
    if isinstance(v, (set, frozenset)):
        return {"$": "set", "items": sorted(v)}
    if isinstance(v, (list, tuple)):
        return [_enc(x) for x in v]
    return v


class CudaStandIn:
    """What vLLM's worker hands register_kv_caches for a CUDA cache, as torch's attributes answer
    for it (is_cuda, device, shape, dtype, data_ptr, element_size, numel, is_contiguous), over the
    memory of a CPU tensor. Anything that would copy the pages through torch (indexing, .cpu(),
    .numpy(), .to(), .copy_(), .view(), .reshape()) is recorded and fails."""

    is_cuda = True

    def __init__(self, host):
        self.host, self.touched = host, []
        self.shape, self.dtype, self.device = host.shape, host.dtype, torch.device("cuda", 0)

    def data_ptr(self):
        return self.host.data_ptr()

    def element_size(self):
        return self.host.element_size()

    def numel(self):
        return self.host.numel()

    def is_contiguous(self):
        return True

    def _copy(self, *a, **k):
        raise AssertionError("a CUDA tensor's pages were copied through torch")

    def __getitem__(self, i):
        self.touched.append("__getitem__")
        self._copy()

    def __getattr__(self, name):
        if name in ("cpu", "numpy", "to", "copy_", "view", "reshape", "tolist", "contiguous"):
            self.touched.append(name)
            return self._copy
        raise AttributeError(name)


class HostStaging:
    """The interface of tessera._core.CudaStaging (add, read, write) over host addresses: checks,
    without a device, that the connector moves a CUDA tensor's pages only through it."""

    def __init__(self, device, staging_bytes):
        self.device, self.staging_bytes, self.regions, self.reads, self.writes = device, staging_bytes, [], 0, 0

    def add(self, address, nbytes, name):
        self.regions.append((address, nbytes, name))
        return len(self.regions) - 1

    def read(self, region, offset, n):
        address, nbytes, _ = self.regions[region]
        assert offset + n <= nbytes and n <= self.staging_bytes // 2
        self.reads += 1
        return ctypes.string_at(address + offset, n)

    def write(self, region, offset, data):
        address, nbytes, _ = self.regions[region]
        data = bytes(data)
        assert offset + len(data) <= nbytes
        self.writes += 1
        ctypes.memmove(address + offset, data, len(data))


def core_has_cuda_device():
    from tessera import _core
    return _core.CUDA_BUILT and _core.cuda_device_count() > 0


class VllmCuda(unittest.TestCase):
    """register_kv_caches / save / load of CUDA tensors: staged device <-> pinned host through
    Tessera's CUDA module (tessera._core.CudaStaging), never copied through torch; CPU tensors on
    the torch/numpy path."""

    def setUp(self):
        self.extra = {"tessera_tiers": [{"kind": "host", "capacity_bytes": 1 << 20}], "tessera_secret": SECRET}

    def pair(self, kind, extra, wrap):
        from tessera._core import RecordTiers
        tiers = RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
        src = mla_caches(0 if kind == "v4" else 2, 12, kind)
        dst = {n: torch.zeros_like(t) for n, t in src.items()}
        a = Engine(vllm_config(extra), {n: wrap(t) for n, t in src.items()})
        b = Engine(vllm_config(extra), {n: wrap(t) for n, t in dst.items()})
        for e in (a, b):
            e.sched._tiers = e.worker._tiers = tiers
            self.addCleanup(e.worker.shutdown)
        tokens = list(range(300, 300 + 4 * BS + 3))
        a.step(Request("r", tokens), [0, 1, 2, 3, 4], 0)
        self.assertEqual(b.step(Request("s", tokens), [7, 9, 2, 11, 5], 0)[0], 4 * BS)
        for n in src:
            for s_, d_ in zip([0, 1, 2, 3], [7, 9, 2, 11]):
                self.assertTrue(torch.equal(page_bytes(src[n], s_), page_bytes(dst[n], d_)), (kind, n, s_))
        return a, b

    @unittest.skipIf(core_has_cuda_device(), "a CUDA device exists: the refusal is for machines without one")
    def test_a_cuda_tensor_without_a_device_is_refused_naming_it_and_never_copied(self):
        w = load_vllm_connector(vllm_config(self.extra), tv.KVConnectorRole.WORKER)
        cpu = mla_caches(1, 4, "bf16")
        w.register_kv_caches(cpu)
        stand_in = CudaStandIn(torch.zeros(4, BS, 576, dtype=torch.bfloat16))
        with self.assertRaisesRegex(ValueError, r"^kv_caches\['layers.9.attn'\] \(a CUDA tensor on cuda:0\): "
                                    r"(Tessera's CUDA module cannot stage it: device: no CUDA device|"
                                    r"this Tessera was built without its CUDA module)"):
            w.register_kv_caches(dict(cpu, **{"layers.9.attn": stand_in}))
        self.assertEqual(stand_in.touched, [])  # never indexed nor copied through torch
        self.assertEqual(sorted(w._caches), sorted(cpu))  # nothing registered
        self.assertEqual(w._cuda_pages, {})
        with mock.patch.object(_vllm_connector, "_cuda_built", lambda: False):  # a build without nvcc
            with self.assertRaisesRegex(ValueError, r"^kv_caches\['layers.9.attn'\] \(a CUDA tensor on cuda:0\): "
                                        r"this Tessera was built without its CUDA module"):
                w.register_kv_caches({"layers.9.attn": stand_in})
        self.assertEqual(stand_in.touched, [])

    def test_cuda_tensors_take_the_cuda_module_path_every_byte(self):
        made = []

        def staging(device, staging_bytes):
            made.append(HostStaging(device, staging_bytes))
            return made[-1]

        stand_ins = []

        def wrap(t):
            stand_ins.append(CudaStandIn(t))
            return stand_ins[-1]

        with mock.patch.object(_vllm_connector, "_new_cuda_staging", staging), \
                mock.patch.object(_vllm_connector, "_cuda_built", lambda: True):
            for kind in ("bf16", "fp8_ds_mla", "v4"):
                for asynchronous in (False, True):
                    made.clear()
                    extra = dict(self.extra, tessera_async_save=asynchronous, tessera_async_load=asynchronous)
                    a, b = self.pair(kind, extra, wrap)
                    self.assertEqual([m.device for m in made], [0, 0])  # one staging per connector and device
                    pages = len(a.kv) * 4
                    self.assertEqual((made[0].reads, made[0].writes, made[1].reads, made[1].writes),
                                     (pages, 0, 0, pages), (kind, asynchronous))
        self.assertEqual([s.touched for s in stand_ins if s.touched], [])

    def test_a_cuda_kv_layer_other_than_the_registered_cache_is_refused(self):
        with mock.patch.object(_vllm_connector, "_new_cuda_staging", HostStaging), \
                mock.patch.object(_vllm_connector, "_cuda_built", lambda: True):
            w = load_vllm_connector(vllm_config(self.extra), tv.KVConnectorRole.WORKER)
            w.register_kv_caches({"l0": CudaStandIn(torch.zeros(4, BS, 576, dtype=torch.bfloat16))})
            with self.assertRaisesRegex(ValueError, "kv_layer: a CUDA tensor that is not the registered cache of "
                                                    "layer 'l0'"):
                w._page_of("l0", CudaStandIn(torch.zeros(4, BS, 576, dtype=torch.bfloat16)), 0)

    @unittest.skipUnless(core_has_cuda_device(), "no CUDA device (tessera._core.cuda_device_count() is 0, or this "
                         "Tessera was built without its CUDA module): the device staging runs where one exists")
    def test_cuda_staging_round_trip_through_device_memory(self):
        from tessera import _core
        cudart = ctypes.CDLL(next(line.split()[-1] for line in open("/proc/self/maps") if "libcudart" in line))
        ptr = ctypes.c_void_p()
        self.assertEqual(cudart.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(1 << 20)), 0)
        self.addCleanup(cudart.cudaFree, ptr)
        host = mla_caches(1, 12, "bf16")["model.layers.0.self_attn.attn"]
        self.assertEqual(cudart.cudaMemcpy(ptr, ctypes.c_void_p(host.data_ptr()),
                                           ctypes.c_size_t(host.numel() * 2), 1), 0)  # host to device
        st = _core.CudaStaging(0, 1 << 16)
        r = st.add(ptr.value, host.numel() * 2, "l0")
        page = BS * 576 * 2
        self.assertEqual(st.read(r, 3 * page, page), bytes(page_bytes(host, 3).numpy()))
        st.write(r, 5 * page, bytes(page_bytes(host, 1).numpy()))
        self.assertEqual(st.read(r, 5 * page, page), bytes(page_bytes(host, 1).numpy()))
        self.assertEqual(st.stats["blocks"], 3)
        with self.assertRaisesRegex(ValueError, "offset"):
            st.read(r, 12 * page, page)

    @unittest.skipUnless(torch.cuda.is_available() and core_has_cuda_device(),
                         "no CUDA device for torch (torch.cuda.is_available() is False: Debian's python3-torch has "
                         "no CUDA) or for Tessera's CUDA module")
    def test_torch_cuda_caches_staged_through_the_cuda_module_every_byte(self):
        for kind in ("bf16", "fp8_ds_mla", "v4"):
            for asynchronous in (False, True):
                extra = dict(self.extra, tessera_async_save=asynchronous, tessera_async_load=asynchronous)
                src = mla_caches(0 if kind == "v4" else 2, 12, kind)
                a = Engine(vllm_config(extra), {n: t.cuda() for n, t in src.items()})
                b = Engine(vllm_config(extra), {n: torch.zeros_like(t).cuda() for n, t in src.items()})
                from tessera._core import RecordTiers
                tiers = RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
                for e in (a, b):
                    e.sched._tiers = e.worker._tiers = tiers
                    self.addCleanup(e.worker.shutdown)
                tokens = list(range(300, 300 + 4 * BS + 3))
                a.step(Request("r", tokens), [0, 1, 2, 3, 4], 0)
                self.assertEqual(b.step(Request("s", tokens), [7, 9, 2, 11, 5], 0)[0], 4 * BS)
                for n in src:
                    self.assertTrue(torch.equal(a.kv[n][[0, 1, 2, 3]].cpu(), b.kv[n][[7, 9, 2, 11]].cpu()), (kind, n))
                    self.assertIn(n, b.worker._cuda_pages)
                self.assertGreater(b.worker._cuda_pages[sorted(src)[0]][0].stats["blocks"], 0)


class GatedTiers:
    """RecordTiers whose put/get wait for `gate` (set: open): shows which calls return before the
    tiers are written or read."""

    def __init__(self, tiers):
        self.tiers, self.gate, self.entered = tiers, threading.Event(), threading.Event()

    def contains(self, keys):
        return self.tiers.contains(keys)

    def put(self, keys, payloads, fmt):
        self.entered.set()
        self.gate.wait(30)
        return self.tiers.put(keys, payloads, fmt)

    def get(self, keys):
        self.entered.set()
        self.gate.wait(30)
        return self.tiers.get(keys)


class VllmAsync(unittest.TestCase):
    """Asynchronous saves and loads (tessera_async_save, tessera_async_load): the tiers are written
    and read on the connector's own threads, off vLLM's forward path; get_finished names the
    requests as vLLM expects; KV events for what the connector stored and lost."""

    def setUp(self):
        from tessera._core import RecordTiers
        self.host = RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
        self.extra = {"tessera_tiers": [{"kind": "host", "capacity_bytes": 1 << 20}], "tessera_secret": SECRET,
                      "tessera_async_save": True, "tessera_async_load": True}
        self.tokens = list(range(2000, 2000 + 4 * BS + 3))

    def engine(self, caches, tiers):
        e = Engine(vllm_config(self.extra), caches)
        e.sched._tiers = e.worker._tiers = tiers
        self.addCleanup(e.worker.shutdown)
        return e

    def forward(self, e, req, block_ids, local=0):
        """The scheduler's and worker's calls of one step, up to wait_for_save (vLLM's order)."""
        s, w = e.sched, e.worker
        ext, is_async = s.get_num_new_matched_tokens(req, local)
        s.update_state_after_alloc(req, (list(block_ids),), ext)
        meta = s.build_connector_meta(SimpleNamespace(
            scheduled_new_reqs=[SimpleNamespace(req_id=req.request_id, block_ids=(list(block_ids),),
                                                num_computed_tokens=local + ext)],
            scheduled_cached_reqs=None, num_scheduled_tokens={req.request_id: req.num_tokens - local - ext}))
        w.bind_connector_metadata(meta)
        w.start_load_kv(SimpleNamespace())
        for n in sorted(e.kv):
            w.wait_for_layer_load(n)
            w.save_kv_layer(n, e.kv[n], None)
        w.wait_for_save()
        return ext, is_async, meta

    def test_saves_leave_the_forward_path_and_get_finished_names_the_request(self):
        gated = GatedTiers(self.host)
        a = self.engine(mla_caches(3, 12, "bf16"), gated)
        req = Request("r", self.tokens)
        self.forward(a, req, [0, 1, 2, 3, 4])  # returns while the tier write waits at the gate
        self.assertTrue(gated.entered.wait(30))
        self.assertEqual(a.worker.stats["saved_blocks"], 0)
        a.worker.clear_connector_metadata()
        self.assertEqual(a.sched.request_finished(req, [0, 1, 2, 3, 4]), (True, None))  # vLLM keeps the blocks
        self.assertEqual(a.worker.get_finished({"r"}), (None, None))  # still writing
        self.assertEqual(a.worker.get_finished(set()), (None, None))
        gated.gate.set()
        a.worker.wait_for_transfers()
        self.assertEqual(a.worker.get_finished(set()), ({"r"}, None))  # named in an earlier call's set
        self.assertEqual(a.worker.get_finished({"r"}), (None, None))  # once
        self.assertEqual(a.worker.stats["saved_blocks"], 4)
        self.assertEqual(self.host.contains(a.sched._keys_for(req).keys), [True] * 4)

    def test_async_save_then_async_load_every_byte_through_host_disk_and_a_real_redis_server(self):
        from redis_support import RedisServer
        from tessera._core import RecordTiers
        with tempfile.TemporaryDirectory() as d:
            r = RedisServer()
            try:
                for tiers in (self.host, RecordTiers([{"kind": "disk", "dir": d}]),
                              RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": r.port,
                                            "secret": SECRET.encode()}])):
                    for kind in ("bf16", "fp8_ds_mla", "v4"):
                        self.share(tiers, kind)
                self.assertGreater(r.command("DBSIZE"), 0)
            finally:
                r.close()

    def share(self, tiers, kind):
        src = mla_caches(0 if kind == "v4" else 3, 12, kind)
        a = self.engine(src, tiers)
        b = self.engine({n: torch.zeros_like(t) for n, t in src.items()}, GatedTiers(tiers))
        tokens = [kind.__hash__() % 1000 + i for i in range(4 * BS + 3)]
        self.forward(a, Request("a", tokens), [0, 1, 2, 3, 4])
        a.worker.shutdown()  # drains: every queued block written before it returns
        self.assertEqual(a.worker.stats["saved_blocks"], 4, kind)
        ext, is_async, _ = self.forward(b, Request("b", tokens), [7, 9, 2, 11, 5])
        self.assertEqual((ext, is_async), (4 * BS, True))
        self.assertTrue(b.worker._tiers.entered.wait(30))  # start_load_kv returned; the read waits
        self.assertEqual(b.worker.get_finished(set()), (None, None))
        b.worker._tiers.gate.set()
        b.worker.wait_for_transfers()
        self.assertEqual(b.worker.get_finished(set()), (None, {"b"}))
        self.assertEqual(b.worker.get_block_ids_with_load_errors(), set())
        for n in src:
            for s_, d_ in zip([0, 1, 2, 3], [7, 9, 2, 11]):
                self.assertTrue(torch.equal(page_bytes(a.kv[n], s_), page_bytes(b.kv[n], d_)), (kind, n, s_))

    def test_handle_preemptions_waits_for_the_preempted_requests_saves(self):
        gated = GatedTiers(self.host)
        a = self.engine(mla_caches(2, 12, "bf16"), gated)
        self.forward(a, Request("r", self.tokens), [0, 1, 2, 3, 4])
        a.worker.clear_connector_metadata()
        meta = a.sched.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=None,
                                                            num_scheduled_tokens={}, preempted_req_ids={"r"}))
        self.assertEqual(meta.preempted, ["r"])
        done = threading.Event()
        t = threading.Thread(target=lambda: (a.worker.handle_preemptions(meta), done.set()))
        t.start()
        a.worker.handle_preemptions(SimpleNamespace(preempted=["other"]))  # nothing of its own pending
        self.assertFalse(done.wait(0.3))  # the preempted request's blocks are still being read
        gated.gate.set()
        t.join(30)
        self.assertTrue(done.is_set())
        self.assertEqual(a.worker.stats["saved_blocks"], 4)

    def preempt_reload_abort(self, report_load_before_abort):
        """A request saved asynchronously, preempted, admitted again through an asynchronous load,
        then aborted; the frees vLLM's Scheduler (28be48fa9) makes from the connector's answers:
        finish_requests delays the free of a WAITING_FOR_REMOTE_KVS request whose load it has not
        seen finished (and _free_request for a connector answering True); _update_from_kv_xfer_finished
        frees on each finished_recving of a finished request and on each finished_sending."""
        a = self.engine(mla_caches(2, 12, "bf16"), self.host)
        req = Request("r", self.tokens)
        self.forward(a, req, [0, 1, 2, 3, 4])
        a.worker.clear_connector_metadata()
        a.worker.wait_for_transfers()
        self.assertEqual(a.worker.stats["saved_blocks"], 4)
        meta = a.sched.build_connector_meta(SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=None,
                                                            num_scheduled_tokens={}, preempted_req_ids={"r"}))
        a.worker.bind_connector_metadata(meta)
        a.worker.handle_preemptions(meta)
        a.worker.clear_connector_metadata()
        gated = GatedTiers(self.host)
        a.worker._tiers = gated
        s, w = a.sched, a.worker
        self.assertEqual(s.get_num_new_matched_tokens(req, 0), (4 * BS, True))  # WAITING_FOR_REMOTE_KVS
        s.update_state_after_alloc(req, ([6, 7, 8, 9, 10],), 4 * BS)
        w.bind_connector_metadata(s.build_connector_meta(SimpleNamespace(
            scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={})))
        w.start_load_kv(SimpleNamespace())
        outputs = []
        if report_load_before_abort:
            gated.gate.set()
            w.wait_for_transfers()
        outputs.append(w.get_finished(set()))
        w.clear_connector_metadata()
        seen_recv = any(o[1] and "r" in o[1] for o in outputs)
        for o in outputs:
            s.update_connector_output(SimpleNamespace(finished_sending=o[0], finished_recving=o[1]))
        delay, _ = s.request_finished(req, ([6, 7, 8, 9, 10],))  # the abort
        frees = 0 if (delay or not seen_recv) else 1
        after = []
        for finished in ({"r"}, set(), set()):  # the next steps: finished_req_ids names it once
            w.bind_connector_metadata(s.build_connector_meta(SimpleNamespace(
                scheduled_new_reqs=[], scheduled_cached_reqs=None, num_scheduled_tokens={})))
            gated.gate.set()
            w.wait_for_transfers()
            after.append(w.get_finished(finished))
            w.clear_connector_metadata()
        for sent, recv in after:
            frees += len((sent or set()) & {"r"}) + len((recv or set()) & {"r"})
        self.assertEqual(frees, 1, (delay, outputs, after))
        self.assertEqual(w.stats["loaded_blocks"], 4)
        return delay, outputs + after

    def test_a_request_saved_preempted_reloaded_asynchronously_and_aborted_is_freed_once(self):
        delay, outs = self.preempt_reload_abort(report_load_before_abort=False)
        self.assertFalse(delay)  # vLLM delays it itself and frees it on finished_recving
        self.assertEqual([o for o in outs if o != (None, None)], [(None, {"r"})])

    def test_aborted_after_its_reload_was_reported_it_is_reported_sent_once(self):
        delay, outs = self.preempt_reload_abort(report_load_before_abort=True)
        self.assertTrue(delay)  # vLLM waits for finished_sending
        self.assertEqual([o for o in outs if o != (None, None)], [(None, {"r"}), ({"r"}, None)])

    def test_shutdown_drains_the_queued_saves(self):
        gated = GatedTiers(self.host)
        a = self.engine(mla_caches(2, 12, "bf16"), gated)
        req = Request("r", self.tokens)
        self.forward(a, req, [0, 1, 2, 3, 4])
        self.assertTrue(gated.entered.wait(30))
        done = threading.Event()
        t = threading.Thread(target=lambda: (a.worker.shutdown(), done.set()))
        t.start()
        self.assertFalse(done.wait(0.3))  # the write is held: shutdown waits for it
        gated.gate.set()
        t.join(30)
        self.assertTrue(done.is_set())
        self.assertEqual(a.worker.stats["saved_blocks"], 4)
        self.assertEqual(self.host.contains(a.sched._keys_for(req).keys), [True] * 4)
        with self.assertRaisesRegex(RuntimeError, "shut down"):
            a.worker.wait_for_save()  # nothing is queued after shutdown

    def test_a_failing_tier_write_is_counted_and_the_request_still_reported_sent(self):
        def put(keys, payloads, fmt):
            raise OSError("disk gone")
        a = self.engine(mla_caches(2, 12, "bf16"),
                        SimpleNamespace(contains=self.host.contains, get=self.host.get, put=put))
        req = Request("r", self.tokens)
        self.forward(a, req, [0, 1, 2, 3, 4])
        a.worker.clear_connector_metadata()
        self.assertEqual(a.sched.request_finished(req, []), (True, None))
        a.worker.wait_for_transfers()
        self.assertEqual(a.worker.get_finished({"r"}), ({"r"}, None))  # vLLM frees the blocks
        self.assertEqual((a.worker.stats["saved_blocks"], a.worker.stats["save_failures"]), (0, 4))
        self.assertIsNone(a.worker.get_kv_connector_kv_cache_events())  # nothing stored, no event

    def test_events_for_stored_and_lost_blocks(self):
        BlockStored, BlockRemoved, _ = _vllm_common.event_classes()
        tp = [self.engine(mla_caches(2, 12, "bf16"), self.host) for _ in range(2)]  # one scheduler, two TP workers
        req = Request("r", self.tokens, lora=SimpleNamespace(lora_name="sql", lora_int_id=3))
        _, _, meta = self.forward(tp[0], req, [0, 1, 2, 3, 4])
        w1 = tp[1].worker
        w1.bind_connector_metadata(meta)
        w1.start_load_kv(None)
        for n in sorted(tp[1].kv):
            w1.save_kv_layer(n, tp[1].kv[n], None)
        w1.wait_for_save()
        outs = []
        for e in tp:
            e.worker.wait_for_transfers()
            outs.append(e.worker.get_kv_connector_kv_cache_events())
        self.assertIsNone(tp[0].worker.get_kv_connector_kv_cache_events())  # taken
        merged = outs[0]  # as vLLM's KVOutputAggregator merges the workers'
        merged.add_events(outs[1].get_all_events())
        merged.increment_workers(1)
        tp[0].sched.update_connector_output(SimpleNamespace(finished_sending=None, finished_recving=None,
                                                            kv_cache_events=merged))
        events = list(tp[0].sched.take_events())
        keys = tp[0].sched._keys_for(req).keys
        self.assertEqual([type(e) for e in events], [BlockStored] * 4)
        self.assertEqual([e.block_hashes for e in events], [[k] for k in keys])
        self.assertEqual([e.parent_block_hash for e in events], [None] + keys[:3])
        self.assertEqual([e.token_ids for e in events], [self.tokens[i * BS:(i + 1) * BS] for i in range(4)])
        self.assertEqual({(e.block_size, e.medium, e.lora_id, e.lora_name) for e in events},
                         {(BS, "TESSERA", 3, "sql")})
        self.assertEqual(list(tp[0].sched.take_events()), [])
        # A block the tiers lost: the load reports it and a BlockRemoved names it.
        b = self.engine({n: torch.zeros_like(t) for n, t in tp[0].kv.items()}, self.host)
        b.sched._tiers = b.worker._tiers = SimpleNamespace(contains=self.host.contains, put=self.host.put,
                                                           get=lambda ks: [None] + list(self.host.get(ks[1:])))
        self.forward(b, Request("s", self.tokens, lora=req.lora_request), [5, 6, 7, 8, 9])
        b.worker.wait_for_transfers()
        self.assertEqual(b.worker.get_finished(set()), (None, {"s"}))
        self.assertEqual(b.worker.get_block_ids_with_load_errors(), {5})
        b.sched.update_connector_output(SimpleNamespace(kv_cache_events=b.worker.get_kv_connector_kv_cache_events()))
        (removed,) = [e for e in b.sched.take_events() if isinstance(e, BlockRemoved)]
        self.assertEqual((removed.block_hashes, removed.medium), ([keys[0]], "TESSERA"))

    def test_sync_mode_unchanged_and_events_too(self):
        extra = dict(self.extra, tessera_async_save=False, tessera_async_load=False)
        e = Engine(vllm_config(extra), mla_caches(2, 12, "bf16"))
        e.sched._tiers = e.worker._tiers = self.host
        self.forward(e, Request("r", self.tokens), [0, 1, 2, 3, 4])
        self.assertEqual(e.worker.stats["saved_blocks"], 4)  # written before wait_for_save returned
        self.assertEqual(e.sched.request_finished(Request("r", self.tokens), []), (False, None))
        self.assertEqual(len(e.worker.get_kv_connector_kv_cache_events().get_all_events()), 4)
        e.worker.shutdown()
        with self.assertRaisesRegex(ValueError, "tessera_async_save"):
            tv.TesseraConnector(vllm_config(dict(extra, tessera_async_save="yes")), tv.KVConnectorRole.WORKER)


class VllmCallTrace(unittest.TestCase):
    """Replays tests/data/engine_doors/vllm_connector.calls.json — the calls connectors created by
    vLLM's own KVConnectorFactory received, in its scheduler/worker order (recorded outside the
    repo; docs/ENGINES.md, "Engine doors") — on Tessera's connector over each tier kind, every
    recorded result compared and every page of engine B's loaded blocks bit-exact with A's."""

    def replay(self, tiers):
        with open(os.path.join(DATA, "vllm_connector.calls.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["format"], "tessera-engine-door-calls/1")
        shape, names = doc["kv_caches"]["shape"], doc["kv_caches"]["layers"]
        g = torch.Generator().manual_seed(3)
        caches = {"A": {n: torch.randn(*shape, generator=g).to(torch.bfloat16) for n in names},
                  "B": {n: torch.zeros(*shape, dtype=torch.bfloat16) for n in names}}
        conns, reqs, metas = {}, {}, {}
        for e in ("A", "B"):
            for role in ("scheduler", "worker"):
                c = tv.TesseraConnector(vllm_config({"tessera_secret": SECRET, "tessera_tiers": [
                    {"kind": "host", "capacity_bytes": 1 << 20}]}, doc["model"]), tv.KVConnectorRole[role.upper()])
                c._tiers = tiers
                conns[(e, role)] = c

        def dec(v, e, call, args):
            if isinstance(v, dict) and "$" in v:
                kind = v["$"]
                if kind == "request":
                    return reqs.setdefault((e, v["id"]), Request(v["id"], v["tokens"]))
                if kind == "metadata":
                    return metas[e]
                if kind == "kv_layer":
                    return caches[e][args[0]] if call == "save_kv_layer" else None
                if kind == "set":
                    return set(v["items"])
                return object()
            if isinstance(v, dict):
                out = {k: dec(x, e, call, args) for k, x in v.items()}
                if call == "register_kv_caches":
                    return {k: caches[e][k] for k in v}
                return out if all(isinstance(k, str) and k in reqs_ids for k in v) else SimpleNamespace(**out)
            if isinstance(v, list):
                return [dec(x, e, call, args) for x in v]
            return v

        reqs_ids = {c["args"][0]["id"] for c in doc["calls"] if c["call"] == "on_new_request"}
        for i, c in enumerate(doc["calls"]):
            e, conn = c["engine"], conns[(c["engine"], c["role"])]
            args = [dec(a, e, c["call"], c["args"]) for a in c["args"]]
            got = getattr(conn, c["call"])(*args)
            if c["call"] == "build_connector_meta":
                metas[e] = got
            if not _has_ref(c["result"]):
                self.assertEqual(_enc(got), c["result"], (i, c["call"]))
        assert_equal_pages(self, doc, caches, names)
        return len(doc["calls"])

    def test_host(self):
        from tessera._core import RecordTiers
        self.assertEqual(self.replay(RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])), 46)

    def test_disk(self):
        from tessera._core import RecordTiers
        with tempfile.TemporaryDirectory() as d:
            self.replay(RecordTiers([{"kind": "disk", "dir": d}]))

    def test_redis_and_redis_cluster(self):
        from redis_support import RedisCluster, RedisServer
        from tessera._core import RecordTiers
        r = RedisServer()
        try:
            self.replay(RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": r.port,
                                      "secret": SECRET.encode()}]))
        finally:
            r.close()
        c = RedisCluster()
        try:
            self.replay(RecordTiers([{"kind": "redis_cluster", "seeds": c.seeds(), "secret": SECRET.encode()}]))
            self.assertGreater(sum(c.dbsizes()), 0)
        finally:
            c.close()


class VllmSchedulerTrace(unittest.TestCase):
    """Replays tests/data/engine_doors/vllm_scheduler.calls.json — every call vLLM's own v1 Scheduler
    and a worker driven in KVConnectorModelRunnerMixin's order made on connectors built by vLLM's
    KVConnectorFactory, with asynchronous saves and loads (recorded outside the repo; the trace's
    "about" says what was stubbed) — over each tier kind: every recorded result (get_finished's
    sent/received ids, request_finished's delayed free, take_events' BlockStored events, the
    matched tokens, the stats) compared, and every page of B's blocks bit-exact with A's."""

    def replay(self, tiers):
        with open(os.path.join(DATA, "vllm_scheduler.calls.json")) as f:
            doc = json.load(f)
        self.assertEqual((doc["format"], doc["engine_commit"][:9]), ("tessera-engine-door-calls/1", "28be48fa9"))
        shape, names = doc["kv_caches"]["shape"], doc["kv_caches"]["layers"]
        g = torch.Generator().manual_seed(3)
        caches = {"A": {n: torch.randn(*shape, generator=g).to(torch.bfloat16) for n in names},
                  "B": {n: torch.zeros(*shape, dtype=torch.bfloat16) for n in names}}
        extra = dict(doc["extra_config"], tessera_secret=SECRET,
                     tessera_tiers=[{"kind": "host", "capacity_bytes": 1 << 20}])
        conns, reqs, last = {}, {}, {}
        for e in ("A", "B"):
            for role in ("scheduler", "worker"):
                c = tv.TesseraConnector(vllm_config(extra, doc["model"]), tv.KVConnectorRole[role.upper()])
                c._tiers = tiers
                conns[(e, role)] = c

        def ids(v):
            return None if v is None else tuple(list(x) for x in v)

        def dec(v, e, call, args):
            if isinstance(v, list):
                return [dec(x, e, call, args) for x in v]
            if not isinstance(v, dict):
                return v
            kind = v.get("$")
            if kind == "request":
                r = reqs.setdefault((e, v["id"]), Request(v["id"], v["tokens"]))
                r.all_token_ids = list(v["tokens"])  # vLLM appends the sampled tokens
                return r
            if kind in ("metadata", "events"):
                return last[(e, kind)]
            if kind == "kv_layer":
                return caches[e][args[0]]
            if kind == "set":
                return set(v["items"])
            if kind == "blocks":
                return SimpleNamespace(get_block_ids=lambda b=v["ids"]: tuple(list(x) for x in b))
            if kind == "scheduler_output":
                c = v["scheduled_cached_reqs"]
                return SimpleNamespace(
                    scheduled_new_reqs=[SimpleNamespace(req_id=n["req_id"], block_ids=ids(n["block_ids"]),
                                                        num_computed_tokens=n["num_computed_tokens"])
                                        for n in v["scheduled_new_reqs"]],
                    scheduled_cached_reqs=SimpleNamespace(
                        req_ids=c["req_ids"], resumed_req_ids=set(c["resumed_req_ids"]),
                        new_block_ids=[ids(b) for b in c["new_block_ids"]], num_computed_tokens=c["num_computed_tokens"]),
                    num_scheduled_tokens=v["num_scheduled_tokens"], preempted_req_ids=set(v["preempted_req_ids"]),
                    finished_req_ids=set(v["finished_req_ids"]))
            if kind == "connector_output":
                return SimpleNamespace(finished_sending=dec(v["finished_sending"], e, call, args),
                                       finished_recving=dec(v["finished_recving"], e, call, args),
                                       kv_cache_events=None if v["kv_cache_events"] is None else last[(e, "events")])
            if kind == "object":
                return object()
            return {k: dec(x, e, call, args) for k, x in v.items()}

        stored = 0
        for i, c in enumerate(doc["calls"]):
            e, conn = c["engine"], conns[(c["engine"], c["role"])]
            if c["call"] == "register_kv_caches":
                args = [{n: caches[e][n] for n in c["args"][0]}]
            else:
                args = [dec(a, e, c["call"], c["args"]) for a in c["args"]]
            got = getattr(conn, c["call"])(*args)
            want = c["result"]
            if c["call"] == "build_connector_meta":
                last[(e, "metadata")] = got
            elif c["call"] == "get_kv_connector_kv_cache_events":
                last[(e, "events")] = got
                self.assertEqual(None if got is None else len(got.get_all_events()),
                                 None if want is None else want["n"])
            elif c["call"] == "take_events":
                got = [[type(x).__name__, x.block_size, len(x.token_ids), x.medium] for x in got]
                stored += len(got)
                self.assertEqual(got, want, (i, c["call"]))
            elif c["call"] == "get_kv_connector_stats":
                self.assertEqual(None if got is None else got.data, None if want is None else want["data"], i)
            elif not _has_ref(want):
                self.assertEqual(_enc(got), want, (i, c["call"]))
        self.assertEqual(stored, 3)
        assert_equal_pages(self, doc, caches, names)
        return len(doc["calls"])

    def test_host(self):
        from tessera._core import RecordTiers
        self.assertEqual(self.replay(RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])), 119)

    def test_disk_and_a_real_redis_server(self):
        from redis_support import RedisServer
        from tessera._core import RecordTiers
        with tempfile.TemporaryDirectory() as d:
            self.replay(RecordTiers([{"kind": "disk", "dir": d}]))
        r = RedisServer()
        try:
            self.replay(RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": r.port,
                                      "secret": SECRET.encode()}]))
            self.assertEqual(r.command("DBSIZE"), 3)
        finally:
            r.close()


class HostPool:
    """The part of SGLang's MLA host pool (pool_host/mla.py) a storage backend reads, with its
    page_first layout: kv_buffer [size, layers, 1, dim] of the pool's dtype."""

    def __init__(self, pages, page_size, layers, dim, dtype, seed, layout="page_first"):
        g = torch.Generator().manual_seed(seed)
        self.page_size, self.layer_num, self.kv_cache_dim, self.dtype, self.layout = page_size, layers, dim, dtype, layout
        shape = (pages * page_size, layers, 1, dim) if layout == "page_first" else (layers, pages * page_size, 1, dim)
        self.kv_buffer = (torch.randn(*shape, generator=g).to(dtype) if dtype != torch.uint8 else
                          torch.randint(0, 256, shape, generator=g, dtype=torch.uint8))

    def get_data_page(self, index, flat=True):
        p = (self.kv_buffer[index:index + self.page_size] if self.layout == "page_first" else
             self.kv_buffer[:, index:index + self.page_size])
        return p.flatten() if flat else p

    def get_dummy_flat_data_page(self):
        return torch.zeros(self.layer_num * self.page_size * self.kv_cache_dim, dtype=self.dtype)

    def set_from_flat_data_page(self, index, data):
        if self.layout == "page_first":
            self.kv_buffer[index:index + self.page_size] = data.reshape(self.page_size, self.layer_num, 1,
                                                                       self.kv_cache_dim)
        else:
            self.kv_buffer[:, index:index + self.page_size] = data.reshape(self.layer_num, self.page_size, 1,
                                                                          self.kv_cache_dim)


def storage_config(extra, model="moonshotai/Kimi-K2", mla=True, tp_rank=0):
    return SimpleNamespace(tp_rank=tp_rank, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                           is_mla_model=mla, enable_storage_metrics=False, is_page_first_layout=True,
                           model_name=model, tp_lcm_size=None, should_split_heads=False, extra_config=extra)


def load_sglang_backend(config):
    """What SGLang's StorageBackendFactory does for backend "dynamic" (_create_dynamic_backend,
    _load_backend_class): the three required fields, import, getattr, the subclass check, and
    backend_class(storage_config, kwargs)."""
    extra = config.extra_config
    for k in ("backend_name", "module_path", "class_name"):
        assert k in extra, k
    cls = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    if tsg.HAVE_SGLANG:
        from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as Base
        assert issubclass(cls, Base)
    return cls(config, {})


class SglangCallTrace(unittest.TestCase):
    """Replays tests/data/engine_doors/sglang_hicache.calls.json — the calls backends created by
    SGLang's own StorageBackendFactory received in HiCacheController's order (recorded outside the
    repo) — over each tier kind: every result compared, the pages rank 1 read bit-exact with
    rank 0's."""

    def replay(self, tiers):
        with open(os.path.join(DATA, "sglang_hicache.calls.json")) as f:
            doc = json.load(f)
        self.assertEqual(doc["format"], "tessera-engine-door-calls/1")
        dtypes = {"bfloat16": torch.bfloat16, "uint8": torch.uint8}
        pools = {t: HostPool(p["pages"], p["page_size"], p["layers"], p["dim"], dtypes[p["dtype"]], 11 + i)
                 for i, (t, p) in enumerate(sorted(doc["pools"].items()))}
        for t in pools:
            if t.startswith("B."):
                pools[t].kv_buffer.zero_()
        extra = dict(doc["extra_config"], tessera_secret=SECRET, tessera_tiers=[{"kind": "host", "capacity_bytes": 1}])
        backends = {}
        for e, rank in (("A", 0), ("B", 1)):
            cfg = SimpleNamespace(**dict(doc["storage_config"], tp_rank=rank, extra_config=extra))
            backends[e] = load_sglang_backend(cfg)
            backends[e]._tiers = tiers

        def dec(v):
            if isinstance(v, dict) and "$" in v:
                k = v["$"]
                if k == "indices":
                    return torch.tensor(v["items"], dtype=torch.int64)
                if k == "pool":
                    return pools[v["id"]]
                if k == "transfer":
                    return SimpleNamespace(name=v["name"], keys=v["keys"], hit_policy=v["hit_policy"],
                                           host_indices=None if v["host_indices"] is None else
                                           torch.tensor(v["host_indices"], dtype=torch.int64))
                if k == "extra_info":
                    return SimpleNamespace(prefix_keys=v["prefix_keys"], extra_info=None)
                raise AssertionError("unknown reference %r" % k)
            if isinstance(v, list):
                return [dec(x) for x in v]
            return v

        for i, c in enumerate(doc["calls"]):
            got = getattr(backends[c["engine"]], c["call"])(*[dec(a) for a in c["args"]])
            if hasattr(got, "kv_hit_pages"):
                got = {"kv_hit_pages": got.kv_hit_pages, "extra_pool_hit_pages": got.extra_pool_hit_pages}
            self.assertEqual(got, c["result"], (i, c["call"]))
        for a, ia, b, ib, n in doc["expect_equal_rows"]:
            self.assertTrue(torch.equal(pools[a].kv_buffer[ia:ia + n].view(torch.uint8),
                                        pools[b].kv_buffer[ib:ib + n].view(torch.uint8)), (a, b))
        return len(doc["calls"])

    def test_host(self):
        from tessera._core import RecordTiers
        self.assertEqual(self.replay(RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])), 11)

    def test_disk_redis_and_redis_cluster(self):
        from redis_support import RedisCluster, RedisServer
        from tessera._core import RecordTiers
        with tempfile.TemporaryDirectory() as d:
            self.replay(RecordTiers([{"kind": "disk", "dir": d}]))
        r = RedisServer()
        try:
            self.replay(RecordTiers([{"kind": "redis", "host": "127.0.0.1", "port": r.port,
                                      "secret": SECRET.encode()}]))
        finally:
            r.close()
        c = RedisCluster()
        try:
            self.replay(RecordTiers([{"kind": "redis_cluster", "seeds": c.seeds(), "secret": SECRET.encode()}]))
        finally:
            c.close()


class SglangDoor(unittest.TestCase):
    def extra(self, **more):
        return dict({"backend_name": "tessera", "module_path": "tessera.sglang", "class_name": "HiCacheStorage",
                     "interface_v1": 1, "tessera_tiers": [{"kind": "host", "capacity_bytes": 64 << 20}],
                     "tessera_secret": SECRET}, **more)

    def pair(self, **more):
        from tessera._core import RecordTiers
        tiers = RecordTiers([{"kind": "host", "capacity_bytes": 64 << 20}])
        a, b = load_sglang_backend(storage_config(self.extra(**more))), load_sglang_backend(
            storage_config(self.extra(**more), tp_rank=1))
        a._tiers = b._tiers = tiers
        return a, b

    def test_v1_host_pool_pages_bf16_and_uint8_every_byte(self):
        for dtype, dim, layout in ((torch.bfloat16, 576, "page_first"), (torch.uint8, 656, "page_first"),
                                   (torch.bfloat16, 576, "layer_first")):
            a, b = self.pair()
            pa = HostPool(8, 64, 4, dim, dtype, 1, layout)
            pb = HostPool(8, 64, 4, dim, dtype, 2, layout)
            a.register_mem_pool_host(pa)
            b.register_mem_pool_host(pb)  # another TP rank: MLA's one copy serves it
            idx = torch.arange(2 * 64, 5 * 64)
            self.assertEqual(a.batch_set_v1(["h1", "h2", "h3"], idx), [True] * 3)
            self.assertEqual(b.batch_exists(["h1", "h2", "h3", "h4"]), 3)
            dst = torch.arange(5 * 64, 8 * 64)
            self.assertEqual(b.batch_get_v1(["h1", "h2", "h3"], dst), [True] * 3)
            for i in range(3):
                self.assertTrue(torch.equal(pa.get_data_page((2 + i) * 64).view(torch.uint8),
                                            pb.get_data_page((5 + i) * 64).view(torch.uint8)), (dtype, layout, i))
            self.assertEqual(b.batch_get_v1(["h1", "nope"], dst[:128]), [True, False])

    def test_v2_indexer_and_window_pools(self):
        a, b = self.pair()
        kv_a, kv_b = HostPool(4, 64, 2, 576, torch.bfloat16, 3), HostPool(4, 64, 2, 576, torch.bfloat16, 4)
        ix_a, ix_b = HostPool(4, 64, 2, 132, torch.uint8, 5), HostPool(4, 64, 2, 132, torch.uint8, 6)
        sw_a, sw_b = HostPool(4, 64, 1, 584, torch.uint8, 7), HostPool(4, 64, 1, 584, torch.uint8, 8)
        for s, kv, ix, sw in ((a, kv_a, ix_a, sw_a), (b, kv_b, ix_b, sw_b)):
            s.register_mem_pool_host(kv)
            s.register_mem_host_pool_v2(ix, "indexer")
            s.register_mem_host_pool_v2(sw, "swa")
        keys = ["p0", "p1", "p2"]
        idx = torch.arange(0, 3 * 64)
        T = SimpleNamespace
        self.assertEqual(a.batch_set_v1(keys, idx), [True] * 3)
        res = a.batch_set_v2([T(name="indexer", keys=keys, host_indices=idx),
                              T(name="swa", keys=keys[-1:], host_indices=idx[-64:])])
        self.assertEqual(res, {"indexer": [True] * 3, "swa": [True]})
        r = b.batch_exists_v2(keys, [T(name="indexer", keys=None, hit_policy="all_pages"),
                                     T(name="swa", keys=keys[-1:], hit_policy="trailing_pages")])
        self.assertEqual((r.kv_hit_pages, r.extra_pool_hit_pages), (3, {"indexer": 3, "swa": 1}))
        r = b.batch_exists_v2(keys, [T(name="swa", keys=["p1"], hit_policy="trailing_pages")])
        self.assertEqual(r.kv_hit_pages, 0)  # the window state of p1 was never stored
        got = b.batch_get_v2([T(name="indexer", keys=keys, host_indices=idx + 64),
                              T(name="swa", keys=keys[-1:], host_indices=idx[:64])])
        self.assertEqual(got, {"indexer": [True, True, True], "swa": [True]})
        self.assertTrue(torch.equal(ix_a.kv_buffer[:192], ix_b.kv_buffer[64:256]))
        self.assertTrue(torch.equal(sw_a.kv_buffer[128:192], sw_b.kv_buffer[:64]))

    def test_namespaces_and_tenants_kept_whole(self):
        from tessera._core import RecordTiers
        tiers = RecordTiers([{"kind": "host", "capacity_bytes": 8 << 20}])
        page = torch.arange(64 * 576).to(torch.bfloat16)

        def backend(model="m", **more):
            s = load_sglang_backend(storage_config(self.extra(**more), model=model))
            s._tiers = tiers
            return s

        backend(tessera_namespace="fleet-01-deepseek-v3").set("k", page)
        self.assertTrue(backend(tessera_namespace="fleet-01-deepseek-v3").exists("k"))
        self.assertFalse(backend(tessera_namespace="fleet-01-kimi-k2").exists("k"))
        self.assertFalse(backend(tessera_namespace="fleet-01-deepseek-v3", tessera_tenant="bob").exists("k"))
        self.assertFalse(backend("m2", tessera_namespace="fleet-01-deepseek-v3").exists("k"))
        long_a, long_b = "n" * 250 + "a", "n" * 250 + "b"
        backend(tessera_namespace=long_a).set("k", page)
        self.assertFalse(backend(tessera_namespace=long_b).exists("k"))

    def test_v1_pages_through_a_redis_cluster_every_byte(self):
        from redis_support import RedisCluster
        c = RedisCluster()
        try:
            extra = self.extra(tessera_tiers=[{"kind": "redis_cluster", "seeds": c.seeds()}])
            a = load_sglang_backend(storage_config(extra))
            b = load_sglang_backend(storage_config(extra, tp_rank=1))
            pa, pb = HostPool(4, 64, 4, 576, torch.bfloat16, 9), HostPool(4, 64, 4, 576, torch.bfloat16, 10)
            a.register_mem_pool_host(pa)
            b.register_mem_pool_host(pb)
            idx = torch.arange(0, 2 * 64)
            self.assertEqual(a.batch_set_v1(["c0", "c1"], idx), [True, True])
            self.assertEqual(b.batch_get_v1(["c0", "c1"], idx + 128), [True, True])
            self.assertTrue(torch.equal(pa.kv_buffer[:128].view(torch.int16), pb.kv_buffer[128:256].view(torch.int16)))
            self.assertEqual(sum(n.command("DBSIZE") for n in c.nodes), 2)
        finally:
            c.close()

    def test_bad_extra_config_names_the_key(self):
        for bad, key in (({"tessera_tiers": "host"}, "tessera_tiers"), ({"tessera_secret": None,
                                                                         "tessera_secret_env": 5},
                                                                        "tessera_secret_env"),
                         ({"tessera_tenant": 7}, "tessera_tenant"), ({"tessera_teir": 1}, "tessera_teir")):
            with self.assertRaisesRegex((ValueError, TypeError), key):
                load_sglang_backend(storage_config(self.extra(**bad)))


if __name__ == "__main__":
    unittest.main()
