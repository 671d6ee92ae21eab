"""tessera.vllm.KVCacheManager: the name vLLM v1's scheduler constructs (vllm_plugin.py rebinds
it), with vLLM's keyword arguments. It is a factory: it builds

- a ``OneGroupManager`` (``_vllm_one_group.py``) for a model with one KV-cache group
  (DeepSeek-V2/V3/V3.2 MLA), over a Tessera RequestManager;
- a ``HybridManager`` (``_vllm_hybrid.py``) for a model with several groups (DeepSeek-V4's
  sliding windows, or any ``kv_cache_groups`` given), over one shared Tessera block pool with
  vLLM's hybrid coordinator's rules (ADR 0028).

Both subclass ``_vllm_kvbase.ManagerBase`` (the common arguments, stats, events, the block pool
view) and are registered as virtual subclasses of ``KVCacheManager``, so
``isinstance(m, KVCacheManager)`` holds for either. Neither kind branches on the other; the
modules import downwards only (common <- kvbase <- one group, hybrid <- this module).
"""

import abc

from . import _core
from ._vllm_hybrid import HybridManager
from ._vllm_one_group import OneGroupManager


def _preset_is_hybrid(model):
    """Whether the preset `model` has sliding windows (several groups); False for anything the
    one-group manager will refuse itself, in its order of checks (an unknown preset, a non-str)."""
    if not isinstance(model, str):
        return False
    try:
        return bool(_core._model_layers(model)["hybrid"])
    except ValueError:
        return False


class KVCacheManager(abc.ABC):
    """vLLM v1's KVCacheManager over Tessera (the module's doc; docs/PYTHON.md). Keyword arguments
    only, vLLM's: ``num_gpu_blocks`` (vLLM's, its null block included: Tessera's pool holds
    ``num_gpu_blocks - 1`` blocks), ``block_size`` (tokens per block of group 0),
    ``max_model_len``, ``model`` (a Tessera preset, default "deepseek-v3"), ``enable_caching``,
    ``log_stats``, ``enable_kv_cache_events``, ``max_requests``, ``max_num_batched_tokens``,
    ``use_eagle`` (False), ``hash_block_size``, ``dcp_world_size``/``pcp_world_size`` (1),
    ``block_reuse`` ("release-order", vLLM's, or "free-first") and ``kv_cache_groups`` (a list of
    ``{"block_size", "sliding_window"}``, group 0 full attention: the hybrid manager). A preset
    with sliding windows gets the hybrid manager with vLLM's groups for it
    (``deepseek_v4_kv_cache_groups``); any other, the one-group manager."""

    def __new__(cls, **kwargs):
        if kwargs.get("kv_cache_groups") is not None or _preset_is_hybrid(kwargs.get("model", "deepseek-v3")):
            return HybridManager(**kwargs)
        return OneGroupManager(**kwargs)


KVCacheManager.register(OneGroupManager)
KVCacheManager.register(HybridManager)
