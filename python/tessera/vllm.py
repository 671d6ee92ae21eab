"""vLLM-shaped adapters over Tessera (docs/PYTHON.md, "Engine adapters"; ADR 0024).

- ``KVCacheManager``: the method surface vLLM v1's scheduler calls on its KV-cache manager,
  with vLLM's semantics, over a Tessera ``RequestManager`` (one KV-cache group) or, for
  DeepSeek-V4's several groups, over one Tessera block pool with vLLM's hybrid coordinator's
  rules (ADR 0028; ``deepseek_v4_kv_cache_groups`` gives vLLM's group layout for a preset).
- ``Connector``: the shape of vLLM's ``KVConnectorBase_V1`` over Tessera's tiers.
"""

from ._vllm_connector import BlockTransfer, Connector, ConnectorMetadata  # noqa: F401
from ._vllm_common import (  # noqa: F401
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheBlocks,
    PrefixCacheStats,
    identity_salt,
)
from ._vllm_hybrid import deepseek_v4_kv_cache_groups  # noqa: F401
from ._vllm_manager import KVCacheManager  # noqa: F401

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "BlockTransfer", "Connector", "ConnectorMetadata",
           "KVCacheBlocks", "KVCacheManager", "PrefixCacheStats", "deepseek_v4_kv_cache_groups", "identity_salt"]
