"""vLLM-shaped adapters over Tessera (docs/PYTHON.md, "Engine adapters"; ADR 0024).

- ``KVCacheManager``: the method surface vLLM v1's scheduler calls on its KV-cache manager,
  with vLLM's semantics, over a Tessera ``RequestManager`` (one KV-cache group) or, for
  DeepSeek-V4's several groups, over one Tessera block pool with vLLM's hybrid coordinator's
  rules (ADR 0028; ``deepseek_v4_kv_cache_groups`` gives vLLM's group layout for a preset).
- ``TesseraConnector`` (also ``Connector``): a vLLM v1 KV connector over Tessera's tiers, which
  vLLM's ``KVConnectorFactory`` loads with ``kv_connector_module_path="tessera.vllm"`` (a
  ``KVConnectorBase_V1`` and ``SupportsHMA`` subclass when vLLM is importable; ADR 0030).
"""

from ._vllm_common import (  # noqa: F401
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheBlocks,
    PrefixCacheStats,
    event_classes,
    identity_salt,
)
from ._vllm_connector import (  # noqa: F401
    HAVE_VLLM,
    BlockTransfer,
    Connector,
    ConnectorMetadata,
    KVConnectorRole,
    TesseraConnector,
    TesseraConnectorStats,
    TesseraKVEvents,
)
from ._vllm_hybrid import deepseek_v4_kv_cache_groups  # noqa: F401
from ._vllm_manager import KVCacheManager  # noqa: F401

__all__ = ["AllBlocksCleared", "BlockRemoved", "BlockStored", "BlockTransfer", "Connector", "ConnectorMetadata",
           "HAVE_VLLM", "KVConnectorRole", "TesseraConnector", "TesseraConnectorStats",
           "TesseraKVEvents", "event_classes",
           "KVCacheBlocks", "KVCacheManager", "PrefixCacheStats", "deepseek_v4_kv_cache_groups", "identity_salt"]
