"""A vLLM general plugin (entry point ``vllm.general_plugins``, setup.py) that makes vLLM's
scheduler build ``tessera.vllm.KVCacheManager`` instead of its own — opt-in: it does nothing
unless ``TESSERA_VLLM_KV_CACHE_MANAGER=1``. ``TESSERA_VLLM_MODEL`` names the Tessera preset
(default ``deepseek-v3``).

vLLM has no option that chooses a KV-cache manager; its scheduler
(``vllm/v1/core/sched/scheduler.py`` at 9aaf83ef) calls the name ``KVCacheManager`` it imported,
with keyword arguments ``kv_cache_config``, ``max_model_len``, ``max_num_batched_tokens``,
``enable_caching``, ``use_eagle``, ``log_stats``, ``enable_kv_cache_events``, ``dcp_world_size``,
``pcp_world_size``, ``hash_block_size``, ``metrics_collector``. ``register`` rebinds that name in the
scheduler's module to ``from_vllm_config``, which takes those arguments. vLLM's loader may run a
plugin several times in one process: registering again changes nothing.
"""

import os
import sys

ENV = "TESSERA_VLLM_KV_CACHE_MANAGER"
SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"


def from_vllm_config(*, kv_cache_config, max_model_len, max_num_batched_tokens=None, enable_caching=True,
                     use_eagle=False, log_stats=False, enable_kv_cache_events=False, dcp_world_size=1,
                     pcp_world_size=1, hash_block_size=None, metrics_collector=None):
    """tessera.vllm.KVCacheManager from the arguments vLLM's scheduler passes its own."""
    from .vllm import KVCacheManager
    groups = list(kv_cache_config.kv_cache_groups)
    if not groups:
        raise ValueError("kv_cache_config.kv_cache_groups: empty (a model without KV cache)")
    specs = [g.kv_cache_spec for g in groups]
    extra = {}
    if len(groups) > 1:
        extra["kv_cache_groups"] = [{"block_size": s.block_size, "sliding_window": getattr(s, "sliding_window", None)}
                                    for s in specs]
    return KVCacheManager(num_gpu_blocks=kv_cache_config.num_blocks, block_size=specs[0].block_size,
                          max_model_len=max_model_len, model=os.environ.get("TESSERA_VLLM_MODEL", "deepseek-v3"),
                          enable_caching=enable_caching, log_stats=log_stats,
                          enable_kv_cache_events=enable_kv_cache_events,
                          max_num_batched_tokens=max_num_batched_tokens, use_eagle=use_eagle,
                          hash_block_size=hash_block_size if len(groups) > 1 else None,
                          dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size, **extra)


def register():
    """The entry point vLLM's plugin loader calls. Returns True when the manager was swapped."""
    if os.environ.get(ENV, "") != "1":
        return False
    mod = sys.modules.get(SCHEDULER_MODULE)
    if mod is None:
        import importlib
        mod = importlib.import_module(SCHEDULER_MODULE)
    if getattr(mod.KVCacheManager, "__name__", "") != from_vllm_config.__name__:
        mod._vllm_kv_cache_manager = mod.KVCacheManager  # vLLM's own, kept for a caller that wants it
        mod.KVCacheManager = from_vllm_config
    return True
