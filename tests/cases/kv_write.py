"""decode_set_kv_buffer cases: new K/V rows and the slots they go to."""

from __future__ import annotations

import torch

import opcall
import rvv_attn
from cases.noise import unit_normal

OP = rvv_attn.ops.decode_set_kv_buffer


def make_case(batch, heads_kv, head_dim, head_dim_v, dtype, slots=64, strided=False, seed=0):
    g = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return unit_normal(*shape, generator=g, dtype=dtype)

    k_buffer, v_buffer = randn(slots, heads_kv, head_dim), randn(slots, heads_kv, head_dim_v)
    key, value = randn(batch, heads_kv, head_dim), randn(batch, heads_kv, head_dim_v)
    if strided:
        # Views whose outer strides are not those of a dense tensor, inside
        # NaN-filled base tensors that opcall checks: a cache carved out of a
        # wider pool and new K/V sliced from a fused tensor.
        k_buffer = opcall.embed(k_buffer, lead=(0, 1, 2), trail=(0, 0, 1))
        v_buffer = opcall.embed(v_buffer, lead=(0, 0, 0), trail=(0, 0, 5))
        key = opcall.embed(key, lead=(0, 0, 0), trail=(0, 0, head_dim_v))
        value = opcall.embed(value, lead=(0, 0, 0), step=(2, 1, 1))
    else:
        # Contiguous caches with a sentinel slot before and after.
        k_buffer, v_buffer = opcall.embed(k_buffer, lead=(1, 0, 0)), opcall.embed(v_buffer, lead=(1, 0, 0))
    loc = torch.randperm(slots, generator=g)[:batch].to(torch.int64)
    return k_buffer, v_buffer, key, value, loc


def write(args: dict) -> dict:
    """decode_set_kv_buffer through opcall: only the loc rows of the caches may change."""
    return opcall.call(
        OP,
        args,
        {
            "k_buffer": opcall.rows(args["k_buffer"], args["loc"]),
            "v_buffer": opcall.rows(args["v_buffer"], args["loc"]),
        },
    )
