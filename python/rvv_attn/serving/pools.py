"""Memory pools in SGLang's shape: request rows (``req_to_token``) and paged K/V token slots.

``ReqToTokenPool`` owns ``req_to_token`` ``[max_reqs, max_context_len]``
(int32, as SGLang keeps it): row ``r`` lists, in order, the cache slots of
the tokens of the request that holds row ``r``. ``KVPool`` owns, per layer,
``k_buffer`` ``[size, H_kv, D]`` and ``v_buffer`` ``[size, H_kv, Dv]``;
``Int8KVPool`` holds int8 codes and per-layer float32 scale buffers
``[size, H_kv]``. Allocation hands out indices and free takes them back;
freed slots are handed out again first, so the token maps of later requests
are fragmented, as in a long-running server. Running out is an error that
changes nothing, never a silent overwrite.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import torch

__all__ = ["PoolExhaustedError", "ReqToTokenPool", "KVPool", "Int8KVPool", "Int8Scales", "make_kv_pool"]

FLOAT_CACHE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class PoolExhaustedError(RuntimeError):
    """An allocation asked for more rows or slots than are free; nothing was allocated."""


class _FreeList:
    """Free indices of one pool; freed indices are reused first (LIFO), which fragments the token maps."""

    def __init__(self, size: int, what: str, order: Iterable[int] | None = None) -> None:
        self.size = size
        self.what = what
        self._free: deque[int] = deque(range(size) if order is None else order)
        self._used = [False] * size

    @property
    def available(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n < 0:
            raise ValueError(f"cannot allocate {n} {self.what}")
        if n > len(self._free):
            raise PoolExhaustedError(
                f"out of {self.what}: {n} requested, {len(self._free)} free of {self.size}; "
                "finish or free requests first, or make the pool larger"
            )
        taken = [self._free.popleft() for _ in range(n)]
        for i in taken:
            self._used[i] = True
        return taken

    def free(self, indices: Iterable[int]) -> None:
        indices = list(indices)
        # Check everything before changing anything: a bad free must not corrupt the list.
        seen = set()
        for i in indices:
            if not 0 <= i < self.size:
                raise ValueError(f"cannot free {self.what} {i}: outside [0, {self.size})")
            if not self._used[i] or i in seen:
                raise ValueError(f"cannot free {self.what} {i}: it is not allocated (double free?)")
            seen.add(i)
        for i in reversed(indices):
            self._used[i] = False
            self._free.appendleft(i)


class ReqToTokenPool:
    """Rows of ``req_to_token`` (int32 ``[max_reqs, max_context_len]``), one per running request."""

    def __init__(self, max_reqs: int, max_context_len: int) -> None:
        if max_reqs < 1 or max_context_len < 1:
            raise ValueError(f"max_reqs = {max_reqs} and max_context_len = {max_context_len} must be >= 1")
        self.max_reqs = max_reqs
        self.max_context_len = max_context_len
        self.req_to_token = torch.zeros(max_reqs, max_context_len, dtype=torch.int32)
        self._rows = _FreeList(max_reqs, "request rows")

    @property
    def available(self) -> int:
        return self._rows.available

    def alloc(self, n: int = 1) -> list[int]:
        return self._rows.alloc(n)

    def free(self, rows: int | Iterable[int]) -> None:
        self._rows.free([rows] if isinstance(rows, int) else rows)


class KVPool:
    """Per-layer float K/V buffers over ``size`` token slots, with slot allocation."""

    is_int8 = False

    def __init__(
        self,
        size: int,
        num_layers: int,
        heads_kv: int,
        head_dim: int,
        head_dim_v: int,
        dtype: torch.dtype,
        shuffle_seed: int | None = None,
    ) -> None:
        if dtype not in self._buffer_dtypes():
            raise ValueError(f"{type(self).__name__}: dtype {dtype} is not one of {self._buffer_dtypes()}")
        if min(size, num_layers, heads_kv, head_dim, head_dim_v) < 1:
            raise ValueError(
                f"pool sizes must be >= 1: size={size}, num_layers={num_layers}, "
                f"heads_kv={heads_kv}, head_dim={head_dim}, head_dim_v={head_dim_v}"
            )
        self.size, self.num_layers = size, num_layers
        self.heads_kv, self.head_dim, self.head_dim_v = heads_kv, head_dim, head_dim_v
        self.dtype = dtype
        self.k_buffers = [torch.zeros(size, heads_kv, head_dim, dtype=dtype) for _ in range(num_layers)]
        self.v_buffers = [torch.zeros(size, heads_kv, head_dim_v, dtype=dtype) for _ in range(num_layers)]
        order = None
        if shuffle_seed is not None:
            # A server that has run for a while hands out scattered slots; so can a fresh pool.
            order = torch.randperm(size, generator=torch.Generator().manual_seed(shuffle_seed)).tolist()
        self._slots = _FreeList(size, "KV cache token slots", order)

    @staticmethod
    def _buffer_dtypes() -> tuple[torch.dtype, ...]:
        return FLOAT_CACHE_DTYPES

    @property
    def available(self) -> int:
        return self._slots.available

    def alloc(self, n: int) -> torch.Tensor:
        """``n`` free slots as an int64 tensor (SGLang's ``out_cache_loc`` dtype)."""
        return torch.tensor(self._slots.alloc(n), dtype=torch.int64)

    def free(self, slots: torch.Tensor | Iterable[int]) -> None:
        slots = slots.tolist() if isinstance(slots, torch.Tensor) else list(slots)
        self._slots.free(slots)
        self._on_free(slots)

    def _on_free(self, slots: list[int]) -> None:
        pass

    def key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k_buffers[layer_id]

    def value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v_buffers[layer_id]


@dataclass(frozen=True)
class Int8Scales:
    """Static scales (finite, > 0) or NaN for per-token (dynamic) scales, for K and V independently."""

    k_scale: float = math.nan
    v_scale: float = math.nan

    @classmethod
    def dynamic(cls) -> Int8Scales:
        return cls()

    def __post_init__(self) -> None:
        for name in ("k_scale", "v_scale"):
            value = getattr(self, name)
            if not (math.isnan(value) or (math.isfinite(value) and value > 0)):
                raise ValueError(f"{name} = {value} must be a finite static scale > 0, or NaN for per-token scales")


class Int8KVPool(KVPool):
    """int8 K/V buffers plus per-layer float32 scale buffers ``[size, H_kv]``.

    In dynamic mode a slot's scale is written with its codes; the buffers
    start as NaN and freed slots go back to NaN, so reading a slot that holds
    no token is refused by the operators instead of returning stale data.
    """

    is_int8 = True

    def __init__(
        self,
        size: int,
        num_layers: int,
        heads_kv: int,
        head_dim: int,
        head_dim_v: int,
        scales: Int8Scales = Int8Scales(),
        shuffle_seed: int | None = None,
    ) -> None:
        super().__init__(size, num_layers, heads_kv, head_dim, head_dim_v, torch.int8, shuffle_seed)
        self.scales = scales
        self.k_scale_buffers = [torch.full((size, heads_kv), math.nan) for _ in range(num_layers)]
        self.v_scale_buffers = [torch.full((size, heads_kv), math.nan) for _ in range(num_layers)]

    @staticmethod
    def _buffer_dtypes() -> tuple[torch.dtype, ...]:
        return (torch.int8,)

    def _on_free(self, slots: list[int]) -> None:
        index = torch.tensor(slots, dtype=torch.int64)
        for buf in (*self.k_scale_buffers, *self.v_scale_buffers):
            buf[index] = math.nan


def make_kv_pool(
    kv_cache: str,
    size: int,
    num_layers: int,
    heads_kv: int,
    head_dim: int,
    head_dim_v: int,
    dtype: torch.dtype,
    static_scales: Int8Scales | None = None,
    shuffle_seed: int | None = None,
) -> KVPool:
    """The pool for a ``kv_cache`` kind: ``float`` (the model's dtype), ``int8-dynamic`` or ``int8-static``
    (with ``static_scales``)."""
    if kv_cache == "float":
        return KVPool(size, num_layers, heads_kv, head_dim, head_dim_v, dtype, shuffle_seed)
    if kv_cache == "int8-dynamic":
        return Int8KVPool(size, num_layers, heads_kv, head_dim, head_dim_v, Int8Scales.dynamic(), shuffle_seed)
    if kv_cache == "int8-static":
        if static_scales is None or math.isnan(static_scales.k_scale) or math.isnan(static_scales.v_scale):
            raise ValueError(f"kv_cache = 'int8-static' needs finite static K and V scales, got {static_scales}")
        return Int8KVPool(size, num_layers, heads_kv, head_dim, head_dim_v, static_scales, shuffle_seed)
    raise ValueError(f"kv_cache = {kv_cache!r}: choose float, int8-dynamic or int8-static")
