"""Independent reference implementations in plain torch (float64 math).

Nothing here calls the kernels; tests compare the kernels against these.
"""

from __future__ import annotations

import torch


def write_kv(k_buffer: torch.Tensor, v_buffer: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             loc: torch.Tensor) -> None:
    """What decode_set_kv_buffer must do, by plain indexing."""
    for b, slot in enumerate(loc.tolist()):
        k_buffer[slot] = key[b]
        v_buffer[slot] = value[b]
