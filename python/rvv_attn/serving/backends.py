"""Attention backends in SGLang's shape: the model's attention layers call ``forward`` with the batch.

``RVVAttnBackend`` runs the ``torch.ops.rvv_attn`` operators;
``TorchNativeBackend`` computes the same attention with plain torch ops (the
comparison point). Both take ``q`` ``[T, H, D]``, ``k`` ``[T, H_kv, D]``,
``v`` ``[T, H_kv, Dv]`` for the batch's ``T`` new tokens and return
``[T, H * Dv]``. ``save_kv_cache=False`` (as in speculative verification)
leaves the cache exactly as it was: the new tokens still attend to
themselves, read from ``k``/``v``.

Per layer, a sliding window and attention sinks (gpt-oss): the layer's
``sliding_window_size`` follows SGLang's RadixAttention, the number of
*previous* tokens a query sees besides its own (-1: no window), so the query
at position p sees keys p - w .. p. The operators count the query's own key
in their ``sliding_window_size`` W (p - W + 1 .. p), so ``RVVAttnBackend``
passes w + 1, as SGLang's CPU backend does (``operator_window``). ``sinks``
(``[H]``, float32 or the model's dtype) add exp(sink - max) to each head's
softmax denominator and nothing to its numerator.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from .batch import ForwardBatch, ForwardMode
from .pools import Int8KVPool, KVPool

__all__ = [
    "AttentionLayer",
    "AttentionBackend",
    "RVVAttnBackend",
    "TorchNativeBackend",
    "BACKENDS",
    "BackendUnavailableError",
    "make_backend",
    "operator_window",
]


class BackendUnavailableError(RuntimeError):
    """The requested backend cannot run in this installation."""


@dataclass(frozen=True)
class AttentionLayer:
    """What a backend needs to know about one attention layer (SGLang's RadixAttention fields)."""

    layer_id: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    v_head_dim: int
    scaling: float
    logit_cap: float = 0.0
    # Previous tokens a query sees besides its own (SGLang's convention; HF's ``sliding_window`` - 1); -1: all.
    sliding_window_size: int = -1
    sinks: torch.Tensor | None = field(default=None, compare=False, repr=False)  # [num_heads], one per query head

    def __post_init__(self) -> None:
        if self.sliding_window_size < -1:
            raise ValueError(
                f"layer {self.layer_id}: sliding_window_size = {self.sliding_window_size} must be >= 0 "
                "(previous tokens a query sees), or -1 for no window"
            )
        if self.sinks is not None and (self.sinks.shape != (self.num_heads,) or not self.sinks.is_floating_point()):
            raise ValueError(
                f"layer {self.layer_id}: sinks must be a floating-point tensor of shape "
                f"[{self.num_heads}] (one per query head), got {self.sinks.dtype} "
                f"{list(self.sinks.shape)}"
            )


def operator_window(layer: AttentionLayer) -> int:
    """The operators' ``sliding_window_size`` for ``layer``: keys seen *including* the query's own, so the
    layer's window + 1 (as SGLang's CPU backend passes it), or -1 when the layer has no window."""
    return layer.sliding_window_size + 1 if layer.sliding_window_size >= 0 else -1


class AttentionBackend:
    """``init_forward_metadata`` once per batch, then ``forward`` once per layer."""

    name = "base"

    def __init__(self, num_heads: int, v_head_dim: int) -> None:
        self.num_heads = num_heads
        self.v_head_dim = v_head_dim

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        pass

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        if batch.forward_mode is ForwardMode.DECODE:
            return self.forward_decode(q, k, v, layer, batch, save_kv_cache)
        return self.forward_extend(q, k, v, layer, batch, save_kv_cache)

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        raise NotImplementedError

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer: AttentionLayer,
        batch: ForwardBatch,
        save_kv_cache: bool = True,
    ) -> torch.Tensor:
        raise NotImplementedError


def _int8_scales(pool: KVPool) -> tuple[float, float]:
    assert isinstance(pool, Int8KVPool)
    return pool.scales.k_scale, pool.scales.v_scale


def _options(layer: AttentionLayer, batch: ForwardBatch) -> tuple:
    """SGLang main's four trailing operator arguments, as its CPU backend passes them on every call:
    is_cross_attn, sliding_window_size, encoder_lens (None for a decoder-only batch), sinks."""
    return False, operator_window(layer), batch.encoder_lens, layer.sinks


def _call_int8(op, args, pool, layer, batch, save_kv_cache: bool) -> None:
    """An int8 operator with the layer's scale buffers and scales; the batch's cache rows restored afterwards
    when the cache must not keep them (the int8 operators always store their new tokens)."""
    restore = (
        contextlib.nullcontext() if save_kv_cache else _cache_rows_restored(pool, layer.layer_id, batch.out_cache_loc)
    )
    with restore:
        op(
            *args,
            pool.k_scale_buffers[layer.layer_id],
            pool.v_scale_buffers[layer.layer_id],
            *_int8_scales(pool),
            *_options(layer, batch),
        )


@contextlib.contextmanager
def _cache_rows_restored(pool: KVPool, layer_id: int, slots: torch.Tensor) -> Iterator[None]:
    """Put back, after the block, what ``slots`` of one layer held before it.

    The int8 operators quantize and store their new tokens as part of their
    contract; with ``save_kv_cache=False`` the backend undoes that. The slots
    are the batch's own (``out_cache_loc``), so no other request reads them
    meanwhile.
    """
    buffers = [pool.k_buffers[layer_id], pool.v_buffers[layer_id]]
    if isinstance(pool, Int8KVPool):
        buffers += [pool.k_scale_buffers[layer_id], pool.v_scale_buffers[layer_id]]
    saved = [buf[slots].clone() for buf in buffers]
    try:
        yield
    finally:
        for buf, rows in zip(buffers, saved):
            buf[slots] = rows


@dataclass
class _RVVMetadata:
    attn_logits: torch.Tensor | None = None  # decode: float32 [B, H, num_kv_splits, Dv + 1]
    # Decode run as a one-token extend (save_kv_cache=False on a float cache, where the extend
    # operator attends to the new token without writing it):
    one_token_lens: torch.Tensor | None = None
    one_token_starts: torch.Tensor | None = None


class RVVAttnBackend(AttentionBackend):
    """Attention through ``torch.ops.rvv_attn`` (decode, extend, KV write; float and int8 caches)."""

    name = "rvv"
    REQUIRED_OPS = (
        "decode_attention_cpu",
        "extend_attention_cpu",
        "decode_set_kv_buffer",
        "decode_attention_int8_cpu",
        "extend_attention_int8_cpu",
    )

    def __init__(self, num_heads: int, v_head_dim: int, num_kv_splits: int = 8, ops_namespace: str = "rvv_attn"):
        super().__init__(num_heads, v_head_dim)
        if num_kv_splits < 1:
            raise ValueError(f"num_kv_splits = {num_kv_splits} must be >= 1")
        self.num_kv_splits = num_kv_splits
        namespace = getattr(torch.ops, ops_namespace)
        missing = [op for op in self.REQUIRED_OPS if not hasattr(namespace, op)]
        if missing:
            raise BackendUnavailableError(
                f"attention backend 'rvv' needs torch.ops.{ops_namespace}.{missing[0]}, which is not registered "
                f"(missing: {', '.join(missing)}): the rvv-attn operator library is not loaded or predates them. "
                "Build and install it (`./ci/nox -s test-host` on this machine, or the riscv64 wheel), "
                "or choose the backend 'torch_native'"
            )
        self.ops = namespace
        self.metadata = _RVVMetadata()

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        meta = _RVVMetadata()
        if batch.forward_mode is ForwardMode.DECODE:
            # Scratch of the split-KV decode: per split a partial output and its log-sum-exp.
            meta.attn_logits = torch.empty(
                batch.batch_size, self.num_heads, self.num_kv_splits, self.v_head_dim + 1, dtype=torch.float32
            )
            meta.one_token_lens = torch.ones(batch.batch_size, dtype=torch.int32)
            meta.one_token_starts = torch.arange(batch.batch_size, dtype=torch.int32)
        self.metadata = meta

    def forward_extend(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        out = q.new_empty(q.shape[0], layer.num_heads, layer.v_head_dim)
        k_buffer, v_buffer = pool.key_buffer(layer.layer_id), pool.value_buffer(layer.layer_id)
        args = (
            q,
            k,
            v,
            out,
            k_buffer,
            v_buffer,
            batch.req_to_token_pool.req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.extend_seq_lens,
            batch.extend_start_loc,
            batch.max_len_extend,
            layer.scaling,
            layer.logit_cap,
        )
        if pool.is_int8:
            _call_int8(self.ops.extend_attention_int8_cpu, args, pool, layer, batch, save_kv_cache)
        else:
            if save_kv_cache:
                self.ops.decode_set_kv_buffer(k_buffer, v_buffer, k, v, batch.out_cache_loc)
            self.ops.extend_attention_cpu(*args, *_options(layer, batch))
        return out.view(q.shape[0], -1)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        meta = self.metadata
        out = q.new_empty(q.shape[0], layer.num_heads, layer.v_head_dim)
        k_buffer, v_buffer = pool.key_buffer(layer.layer_id), pool.value_buffer(layer.layer_id)
        req_to_token = batch.req_to_token_pool.req_to_token
        if not save_kv_cache and not pool.is_int8:
            # The decode operator always stores the new token; the extend operator reads it from k/v.
            self.ops.extend_attention_cpu(
                q,
                k,
                v,
                out,
                k_buffer,
                v_buffer,
                req_to_token,
                batch.req_pool_indices,
                batch.seq_lens,
                meta.one_token_lens,
                meta.one_token_starts,
                1,
                layer.scaling,
                layer.logit_cap,
                *_options(layer, batch),
            )
            return out.view(q.shape[0], -1)
        args = (
            q,
            k_buffer,
            v_buffer,
            out,
            k,
            v,
            batch.out_cache_loc,
            meta.attn_logits,
            req_to_token,
            batch.req_pool_indices,
            batch.seq_lens,
            layer.scaling,
            layer.logit_cap,
        )
        if pool.is_int8:
            _call_int8(self.ops.decode_attention_int8_cpu, args, pool, layer, batch, save_kv_cache)
        else:
            self.ops.decode_attention_cpu(*args, *_options(layer, batch))
        return out.view(q.shape[0], -1)


# ---- the torch-native comparison point ---------------------------------------------------------


def quantize_rows(x: torch.Tensor, static_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``[..., D]`` to int8 codes and float32 scales ``[...]`` as the int8 cache stores them.

    Static: ``clamp(round(x / s), -127, 127)``. Dynamic (NaN): ``s = max|x| / 127`` per row, 1.0 for an
    all-zero row. Division in float32, rounding half to even (torch.round).
    """
    xf = x.float()
    if math.isnan(static_scale):
        scale = xf.abs().amax(dim=-1) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    else:
        scale = torch.full(xf.shape[:-1], static_scale, dtype=torch.float32)
    return torch.round(xf / scale[..., None]).clamp(-127, 127).to(torch.int8), scale


class TorchNativeBackend(AttentionBackend):
    """The same attention with torch ops: gather each sequence's K/V and compute softmax(q k^T) v in float32."""

    name = "torch_native"

    def _store(self, pool: KVPool, layer_id: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        if isinstance(pool, Int8KVPool):
            for buf, scale_buf, x, s in (
                (pool.k_buffers, pool.k_scale_buffers, k, pool.scales.k_scale),
                (pool.v_buffers, pool.v_scale_buffers, v, pool.scales.v_scale),
            ):
                codes, scales = quantize_rows(x, s)
                buf[layer_id][slots] = codes
                if math.isnan(s):
                    scale_buf[layer_id][slots] = scales
        else:
            pool.k_buffers[layer_id][slots] = k
            pool.v_buffers[layer_id][slots] = v

    @staticmethod
    def _load(pool: KVPool, layer_id: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``slots`` as float32 (int8 codes times their scale)."""
        k, v = pool.k_buffers[layer_id][slots].float(), pool.v_buffers[layer_id][slots].float()
        if isinstance(pool, Int8KVPool):
            ks, vs = pool.scales.k_scale, pool.scales.v_scale
            k = k * (pool.k_scale_buffers[layer_id][slots][..., None] if math.isnan(ks) else ks)
            v = v * (pool.v_scale_buffers[layer_id][slots][..., None] if math.isnan(vs) else vs)
        return k, v

    @staticmethod
    def _attend(
        q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, layer: AttentionLayer, first_position: int
    ) -> torch.Tensor:
        """q ``[n, H, D]`` (positions first_position..+n) over keys/values ``[L, H_kv, *]`` (positions 0..L-1),
        causal, within the layer's window, with its sinks; float32."""
        group = layer.num_heads // layer.num_kv_heads
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # [H, L, D]
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = q.float().transpose(0, 1) @ keys.transpose(1, 2) * layer.scaling  # [H, n, L]
        if layer.logit_cap > 0:
            scores = layer.logit_cap * torch.tanh(scores / layer.logit_cap)
        n, length = q.shape[0], keys.shape[1]
        key_pos = torch.arange(length)[None, :]
        query_pos = (first_position + torch.arange(n))[:, None]
        visible = key_pos <= query_pos
        if layer.sliding_window_size >= 0:
            visible &= key_pos >= query_pos - layer.sliding_window_size  # w previous tokens and itself
        scores = scores.masked_fill(~visible, float("-inf"))
        if layer.sinks is None:
            weights = torch.softmax(scores, dim=-1)
        else:
            # A sink is one more logit per head that takes part in the normalization and weighs no value.
            sink = layer.sinks.float()[:, None, None].expand(layer.num_heads, n, 1)
            weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return (weights @ values).transpose(0, 1)  # [n, H, Dv]

    @staticmethod
    def _decoder_row(batch: ForwardBatch, b: int) -> torch.Tensor:
        """Sequence ``b``'s decoder slots: its pool row after the encoder's tokens (none in a decoder-only batch)."""
        enc = int(batch.encoder_lens[b]) if batch.encoder_lens is not None else 0
        return batch.req_to_token_pool.req_to_token[int(batch.req_pool_indices[b]), enc:].long()

    def forward_extend(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        out = torch.empty(q.shape[0], layer.num_heads, layer.v_head_dim, dtype=torch.float32)
        for b in range(batch.batch_size):
            start, ext = int(batch.extend_start_loc[b]), int(batch.extend_seq_lens[b])
            prefix = int(batch.extend_prefix_lens[b])
            rows = slice(start, start + ext)
            cached_k, cached_v = self._load(pool, layer.layer_id, self._decoder_row(batch, b)[:prefix])
            # The chunk's own keys come from k/v, unquantized (as the extend operators read them).
            keys = torch.cat([cached_k, k[rows].float()])
            values = torch.cat([cached_v, v[rows].float()])
            out[rows] = self._attend(q[rows], keys, values, layer, prefix)
        if save_kv_cache:
            self._store(pool, layer.layer_id, batch.out_cache_loc, k, v)
        return out.to(q.dtype).view(q.shape[0], -1)

    def forward_decode(self, q, k, v, layer, batch, save_kv_cache=True):
        pool = batch.token_to_kv_pool
        if save_kv_cache:
            self._store(pool, layer.layer_id, batch.out_cache_loc, k, v)
        out = torch.empty(q.shape[0], layer.num_heads, layer.v_head_dim, dtype=torch.float32)
        for b in range(batch.batch_size):
            length = int(batch.seq_lens[b])
            slots = self._decoder_row(batch, b)[:length]
            if save_kv_cache:
                # The new token as the cache holds it (quantized in an int8 cache), like the decode operators.
                keys, values = self._load(pool, layer.layer_id, slots)
            else:
                cached_k, cached_v = self._load(pool, layer.layer_id, slots[:-1])
                keys, values = torch.cat([cached_k, k[b : b + 1].float()]), torch.cat([cached_v, v[b : b + 1].float()])
            out[b : b + 1] = self._attend(q[b : b + 1], keys, values, layer, length - 1)
        return out.to(q.dtype).view(q.shape[0], -1)


BACKENDS: dict[str, Callable[..., AttentionBackend]] = {
    "rvv": RVVAttnBackend,
    "torch_native": TorchNativeBackend,
}


def make_backend(name: str, num_heads: int, v_head_dim: int, **options) -> AttentionBackend:
    """The backend called ``name`` ("rvv" or "torch_native")."""
    if name not in BACKENDS:
        raise ValueError(f"unknown attention backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name](num_heads, v_head_dim, **options)
