"""The calls a row times: the rvv-attn operator over a paged cache, and torch's SDPA over the same K/V.

Caches hold exactly the shape's tokens in shuffled slots (a paged cache after
some churn). They are filled by repeating a small random block: filling
hundreds of MiB with random numbers would cost more than the measurement,
and the kernels do the same work whatever the values. Decode's new token is
the one its slot already holds, so every timed call sees the same cache.

The SDPA side is what a plain-torch backend does (SGLang's
torch_native_backend): gather the sequence's K/V rows from the cache
(``index_select``), dequantize int8 rows to the query's dtype, then
``scaled_dot_product_attention`` with ``enable_gqa`` (extend with the causal
mask over prefix + new keys). Its time includes the gather: that is part of
attending over a paged cache in torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .. import ops
from .shapes import Shape

STATIC_SCALE = 0.02
FP8_SCALE = 0.05  # fp8 codes ~N(0, 1) * 20 (most of e4m3's range), values ~N(0, 1)
# Slots per random block the caches are filled from.
FILL_BLOCK = 256
DECODE_SPLITS = 8


@dataclass
class Calls:
    """A shape's two timed calls; both write only their outputs (and the cache rows they rewrite unchanged)."""

    rvv: Callable[[], None]
    sdpa: Callable[[], None]
    rvv_output: torch.Tensor  # what each call leaves: the tests compare the two
    sdpa_output: torch.Tensor


def _filled(shape: tuple[int, ...], dtype: str, g: torch.Generator) -> torch.Tensor:
    """A tensor of ``shape`` (slots first) filled by repeating FILL_BLOCK random slots."""
    block = (min(FILL_BLOCK, shape[0]), *shape[1:])
    if dtype == "int8":
        small = torch.randint(-127, 128, block, generator=g, dtype=torch.int8)
    elif dtype == "scale":
        small = torch.rand(block, generator=g) * 0.02 + 0.01
    elif dtype == "fp8":
        small = (torch.randn(block, generator=g) * 20).to(torch.float8_e4m3fn)
    else:
        small = torch.randn(block, generator=g).bfloat16()
    copies = -(-shape[0] // block[0])
    return small.repeat(copies, *([1] * (len(shape) - 1)))[: shape[0]].contiguous()


@dataclass
class Cache:
    k: torch.Tensor
    v: torch.Tensor  # MLA: a view of k's first Dv columns
    k_scale: torch.Tensor | None  # int8: [slots, H_kv] float32
    v_scale: torch.Tensor | None

    def dequantized(self, idx: torch.Tensor, static: float | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``idx`` of K and V in bfloat16, as a plain-torch backend gathers them: [tokens, H_kv, D]."""
        k, v = self.k.index_select(0, idx), self.v.index_select(0, idx)
        if k.dtype == torch.float8_e4m3fn:
            return (k.float() * static).bfloat16(), (v.float() * static).bfloat16()
        if self.k_scale is None:
            return k, v
        if static is not None:
            return (k.float() * static).bfloat16(), (v.float() * static).bfloat16()
        ks, vs = self.k_scale.index_select(0, idx), self.v_scale.index_select(0, idx)
        return (k.float() * ks[..., None]).bfloat16(), (v.float() * vs[..., None]).bfloat16()


def make_cache(shape: Shape, slots: int, g: torch.Generator) -> Cache:
    h = shape.heads
    kind = shape.dtype if shape.dtype in ("bf16", "fp8") else "int8"
    if h.v_in_k:
        k = _filled((slots, h.heads_kv, h.head_dim), kind, g)
        v = k[..., : h.head_dim_v]
    else:
        k = _filled((slots, h.heads_kv, h.head_dim), kind, g)
        v = _filled((slots, h.heads_kv, h.head_dim_v), kind, g)
    if kind in ("bf16", "fp8"):
        return Cache(k, v, None, None)
    return Cache(k, v, _filled((slots, h.heads_kv), "scale", g), _filled((slots, h.heads_kv), "scale", g))


def _token_map(shape: Shape, tokens: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """req_to_token rows over shuffled slots (``tokens`` per sequence), the pool indices, and the slot count."""
    slots = shape.batch * tokens
    perm = torch.randperm(slots, generator=g)
    req_to_token = perm.reshape(shape.batch, tokens).to(torch.int32).contiguous()
    return req_to_token, torch.arange(shape.batch, dtype=torch.int64), slots


def _static_scale(shape: Shape) -> float | None:
    """The cache's scale as the SDPA side needs it: a number when static (fp8 too), None when dynamic or bf16."""
    return {"int8-static": STATIC_SCALE, "fp8": FP8_SCALE}.get(shape.dtype)


def decode_calls(shape: Shape, g: torch.Generator) -> Calls:
    h, b, s = shape.heads, shape.batch, shape.seq
    req_to_token, pools, slots = _token_map(shape, s, g)
    cache = make_cache(shape, slots, g)
    loc = req_to_token[:, s - 1].to(torch.int64)
    query = torch.randn(b, h.heads, h.head_dim, generator=g).bfloat16()
    output = torch.empty(b, h.heads, h.head_dim_v, dtype=torch.bfloat16)
    logits = torch.empty(b, h.heads, DECODE_SPLITS, h.head_dim_v + 1)
    seq_lens = torch.full((b,), s, dtype=torch.int64)
    sm_scale = 1.0 / math.sqrt(h.head_dim)
    window = shape.window or -1
    if shape.dtype == "bf16":
        # The new token is what its slot holds: rewriting it changes nothing a later call reads.
        key = cache.k[loc].clone()
        value = key[..., : h.head_dim_v] if h.v_in_k else cache.v[loc].clone()
        args = (query, cache.k, cache.v, output, key, value, loc, logits, req_to_token, pools, seq_lens)

        def rvv() -> None:
            ops.decode_attention_cpu(*args, sm_scale, 0.0, False, window, None, None)

    elif shape.dtype == "fp8":
        # As SGLang calls it: its pool has written the new token, so key = value = None.
        args = (query, cache.k, cache.v, output, None, None, loc, logits, req_to_token, pools, seq_lens)

        def rvv() -> None:
            ops.decode_attention_fp8_cpu(*args, sm_scale, 0.0, FP8_SCALE, FP8_SCALE, False, window, None, None)

    else:
        # Float rows, quantized and stored by the call (with dynamic scales, into the scale buffers) each time.
        key = torch.randn(b, h.heads_kv, h.head_dim, generator=g).bfloat16()
        value = torch.randn(b, h.heads_kv, h.head_dim_v, generator=g).bfloat16()
        scale = STATIC_SCALE if shape.dtype == "int8-static" else float("nan")
        args = (query, cache.k, cache.v, output, key, value, loc, logits, req_to_token, pools, seq_lens)

        def rvv() -> None:
            ops.decode_attention_int8_cpu(
                *args, sm_scale, 0.0, cache.k_scale, cache.v_scale, scale, scale, False, window, None, None
            )

    attended = shape.attended()
    rows = [req_to_token[i, s - attended :].to(torch.int64) for i in range(b)]
    static = _static_scale(shape)
    sdpa_out = torch.empty_like(output)

    def sdpa() -> None:
        for i in range(b):
            k, v = cache.dequantized(rows[i], static)
            out = torch.nn.functional.scaled_dot_product_attention(
                query[i].unsqueeze(1), k.transpose(0, 1), v.transpose(0, 1), scale=sm_scale, enable_gqa=True
            )
            sdpa_out[i] = out.squeeze(1)

    return Calls(rvv, sdpa, output, sdpa_out)


def extend_calls(shape: Shape, g: torch.Generator) -> Calls:
    h, b, p, n = shape.heads, shape.batch, shape.prefix, shape.new
    req_to_token, pools, slots = _token_map(shape, p + n, g)
    cache = make_cache(shape, slots, g)
    q = torch.randn(b * n, h.heads, h.head_dim, generator=g).bfloat16()
    k_new = torch.randn(b * n, h.heads_kv, h.head_dim, generator=g).bfloat16()
    v_new = k_new[..., : h.head_dim_v] if h.v_in_k else torch.randn(b * n, h.heads_kv, h.head_dim_v, generator=g)
    v_new = v_new.bfloat16()
    o = torch.empty(b * n, h.heads, h.head_dim_v, dtype=torch.bfloat16)
    seq_lens = torch.full((b,), p + n, dtype=torch.int64)
    ext_lens = torch.full((b,), n, dtype=torch.int64)
    starts = torch.arange(b, dtype=torch.int64) * n
    sm_scale = 1.0 / math.sqrt(h.head_dim)
    common = (q, k_new, v_new, o, cache.k, cache.v, req_to_token, pools, seq_lens, ext_lens, starts, n, sm_scale, 0.0)
    if shape.dtype == "bf16":

        def rvv() -> None:
            ops.extend_attention_cpu(*common)

    elif shape.dtype == "fp8":

        def rvv() -> None:
            ops.extend_attention_fp8_cpu(*common, FP8_SCALE, FP8_SCALE)

    else:
        scale = STATIC_SCALE if shape.dtype == "int8-static" else float("nan")

        def rvv() -> None:
            ops.extend_attention_int8_cpu(*common, cache.k_scale, cache.v_scale, scale, scale)

    # New token i sees the prefix and new tokens 0..i.
    allowed = torch.arange(p + n).unsqueeze(0) <= (p + torch.arange(n)).unsqueeze(1)
    prefixes = [req_to_token[i, :p].to(torch.int64) for i in range(b)]
    static = _static_scale(shape)
    sdpa_out = torch.empty_like(o)

    def sdpa() -> None:
        for i in range(b):
            rows = slice(i * n, (i + 1) * n)
            k_old, v_old = cache.dequantized(prefixes[i], static)
            k = torch.cat([k_old, k_new[rows]]).transpose(0, 1)
            v = torch.cat([v_old, v_new[rows]]).transpose(0, 1)
            out = torch.nn.functional.scaled_dot_product_attention(
                q[rows].transpose(0, 1), k, v, attn_mask=allowed, scale=sm_scale, enable_gqa=True
            )
            sdpa_out[rows] = out.transpose(0, 1)

    return Calls(rvv, sdpa, o, sdpa_out)


def make_calls(shape: Shape, seed: int = 0) -> Calls:
    g = torch.Generator().manual_seed(seed)
    return decode_calls(shape, g) if shape.op == "decode" else extend_calls(shape, g)
