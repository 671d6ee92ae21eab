"""The "pattern" writer's bytes (python/src/bind_manager.cc, docs/PYTHON.md), computed here
independently with numpy so that tests can check every byte a manager holds."""

import numpy as np


def record(group, layer, position, plane, size):
    """Byte i of plane `plane` of the record of token `position` in (group, layer)."""
    a = position * 131 + layer * 31 + group * 7 + plane * 3
    return ((a + np.arange(size, dtype=np.uint64)) % 251).astype(np.uint8)
