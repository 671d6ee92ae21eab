"""Tessera: the KV-cache ledger and request manager for MLA models, from Python.

The C++ core is the extension module ``tessera._core``; this package re-exports it and adds
thin Python conveniences. The API is documented in docs/PYTHON.md.
"""

import json as _json

from . import _core
from ._core import (  # noqa: F401  (re-exported)
    STATUS_NAMES,
    Admission,
    DataLossError,
    KvEvent,
    OutOfBlocksError,
    PageBuffer,
    RequestManager,
    StepResult,
    TesseraError,
    TieredStore,
    TierIOError,
    models,
    mounts,
)

__all__ = [
    "STATUS_NAMES",
    "Admission",
    "DataLossError",
    "KvEvent",
    "PageBuffer",
    "RequestManager",
    "StepResult",
    "TieredStore",
    "OutOfBlocksError",
    "TesseraError",
    "TierIOError",
    "ledger",
    "models",
    "mounts",
]


def ledger(model=None, *, config=None, context=None, batch=1, kv_format=None, indexer_format=None,
           block_tokens=None, tp=1, dcp=1, spec_tokens=0, include_mtp=False, engine="tessera",
           kernel="flashmla", swa_strategy="recompute", prefill_chunk=8192):
    """The ledger of one configuration as a dict: the same document, field for field and figure
    for figure, as ``tessera ledger --format json`` with the same options (the CLI's option
    ``--kv-format`` is ``kv_format`` here). ``context`` and ``prefill_chunk`` take an int or a
    string such as ``"128k"``. Errors: ValueError naming the argument."""
    text = _core.ledger_json(model=model, config=config, context=context, batch=batch, kv_format=kv_format,
                             indexer_format=indexer_format, block_tokens=block_tokens, tp=tp, dcp=dcp,
                             spec_tokens=spec_tokens, include_mtp=include_mtp, engine=engine, kernel=kernel,
                             swa_strategy=swa_strategy, prefill_chunk=prefill_chunk)
    return _json.loads(text)
