"""Fake (meta) implementations of the ``torch.ops.rvv_attn`` operators that return a tensor.

``torch.compile`` traces a graph with fake tensors: it needs to know the shape,
dtype and strides an operator returns without running it. Operators that only
write their arguments and return nothing need no fake (torch derives one);
among rvv-attn's, ``flash_attn_varlen_func`` and the fp8 conversions return
a tensor. Their argument checks stay in C++ and run when the compiled graph
runs.

The ``sgl_kernel`` names (``import rvv_attn.sglang``) get no fake here:
SGLang's CPU graph runner registers its own with
``torch.library.register_fake("sgl_kernel::<name>")``, which raises if one
exists already.
"""

from __future__ import annotations

import torch

__all__ = ["FAKES"]


def _flash_attn_varlen_func(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
) -> torch.Tensor:
    # The kernel returns a new dense [Tq, H, Dv] tensor in q's dtype.
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


def _fp8_e4m3_quantize(src: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    # A new contiguous tensor of src's shape.
    return src.new_empty(src.shape, dtype=torch.float8_e4m3fn)


def _fp8_e4m3_dequantize(src: torch.Tensor, scale: float = 1.0, dtype: torch.dtype | None = None) -> torch.Tensor:
    return src.new_empty(src.shape, dtype=dtype or torch.float32)


#: Operator name (``rvv_attn::...``) -> its fake implementation.
FAKES = {
    "rvv_attn::flash_attn_varlen_func": _flash_attn_varlen_func,
    "rvv_attn::fp8_e4m3_quantize": _fp8_e4m3_quantize,
    "rvv_attn::fp8_e4m3_dequantize": _fp8_e4m3_dequantize,
}

for _name, _fake in FAKES.items():
    torch.library.register_fake(_name, _fake)
