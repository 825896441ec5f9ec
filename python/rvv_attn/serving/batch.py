"""The forward batch: what one model step runs over, as indices and lengths into the pools.

Dtypes are SGLang's: ``req_pool_indices``, ``seq_lens``, ``out_cache_loc``
and ``positions`` int64; ``extend_seq_lens``, ``extend_prefix_lens`` and
``extend_start_loc`` int32 (``req_to_token`` itself is int32).

``prepare_extend`` and ``prepare_decode`` allocate the new tokens' cache
slots and record them in ``req_to_token`` (the scheduler's job in SGLang),
checking everything first: when they raise, the pools are as they were.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .pools import KVPool, ReqToTokenPool

__all__ = ["ForwardMode", "ForwardBatch", "prepare_extend", "prepare_decode"]


class ForwardMode(enum.Enum):
    EXTEND = "extend"  # prefill, or a chunk of it over a cached prefix
    DECODE = "decode"  # one new token per sequence


@dataclass
class ForwardBatch:
    forward_mode: ForwardMode
    batch_size: int
    req_pool_indices: torch.Tensor  # [B] int64: each sequence's row of req_to_token
    seq_lens: torch.Tensor  # [B] int64: tokens in the cache after this step (prefix + new)
    out_cache_loc: torch.Tensor  # [T] int64: cache slots of the new tokens, sequence after sequence
    positions: torch.Tensor  # [T] int64: position of each new token in its sequence (for rotary embedding)
    req_to_token_pool: ReqToTokenPool
    token_to_kv_pool: KVPool
    extend_seq_lens: torch.Tensor | None = None  # [B] int32: new tokens per sequence
    extend_prefix_lens: torch.Tensor | None = None  # [B] int32: cached tokens before them
    extend_start_loc: torch.Tensor | None = None  # [B] int32: first row of each sequence in the [T, ...] inputs
    max_len_extend: int = 0
    # [B] int32, encoder-decoder batches only: each row holds the encoder's tokens in columns [0, enc), then the
    # decoder's; seq_lens, prefix lengths and positions count decoder tokens. None: a decoder-only batch.
    encoder_lens: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.out_cache_loc.shape[0])

    @property
    def last_token_rows(self) -> torch.Tensor:
        """Row of each sequence's last new token in the ``[T, ...]`` activations (where logits are taken)."""
        if self.forward_mode is ForwardMode.DECODE:
            return torch.arange(self.batch_size)
        return (self.extend_start_loc + self.extend_seq_lens - 1).long()


def _check_rows(req_pool: ReqToTokenPool, rows: Sequence[int]) -> None:
    if len(set(rows)) != len(rows):
        raise ValueError(f"req_pool_indices {list(rows)} name a request row more than once")
    for r in rows:
        if not 0 <= r < req_pool.max_reqs:
            raise ValueError(f"request row {r} is outside req_to_token's rows [0, {req_pool.max_reqs})")


def prepare_extend(
    req_pool: ReqToTokenPool,
    kv_pool: KVPool,
    rows: Sequence[int],
    prefix_lens: Sequence[int],
    extend_lens: Sequence[int],
) -> ForwardBatch:
    """An extend batch: sequence ``b`` (request row ``rows[b]``) adds ``extend_lens[b]`` tokens after
    ``prefix_lens[b]`` cached ones. Allocates their slots and writes them into ``req_to_token``."""
    if not (len(rows) == len(prefix_lens) == len(extend_lens)) or not rows:
        raise ValueError(
            f"an extend batch needs one row, prefix length and extend length per sequence, got "
            f"{len(rows)}, {len(prefix_lens)}, {len(extend_lens)}"
        )
    _check_rows(req_pool, rows)
    for r, prefix, ext in zip(rows, prefix_lens, extend_lens):
        if ext < 1 or prefix < 0:
            raise ValueError(f"request row {r}: extend length {ext} must be >= 1 and prefix length {prefix} >= 0")
        if prefix + ext > req_pool.max_context_len:
            raise ValueError(
                f"request row {r}: prefix {prefix} + extend {ext} = {prefix + ext} tokens exceeds "
                f"max_context_len = {req_pool.max_context_len}"
            )
    slots = kv_pool.alloc(sum(extend_lens))  # raises PoolExhaustedError before anything is written
    starts, positions, offset = [], [], 0
    for r, prefix, ext in zip(rows, prefix_lens, extend_lens):
        req_pool.req_to_token[r, prefix : prefix + ext] = slots[offset : offset + ext].to(torch.int32)
        starts.append(offset)
        positions.append(torch.arange(prefix, prefix + ext))
        offset += ext
    return ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(rows),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor([p + e for p, e in zip(prefix_lens, extend_lens)], dtype=torch.int64),
        out_cache_loc=slots,
        positions=torch.cat(positions),
        req_to_token_pool=req_pool,
        token_to_kv_pool=kv_pool,
        extend_seq_lens=torch.tensor(extend_lens, dtype=torch.int32),
        extend_prefix_lens=torch.tensor(prefix_lens, dtype=torch.int32),
        extend_start_loc=torch.tensor(starts, dtype=torch.int32),
        max_len_extend=max(extend_lens),
    )


def prepare_decode(
    req_pool: ReqToTokenPool, kv_pool: KVPool, rows: Sequence[int], cached_lens: Sequence[int]
) -> ForwardBatch:
    """A decode batch: sequence ``b`` (row ``rows[b]``, ``cached_lens[b]`` tokens cached) adds one token."""
    if len(rows) != len(cached_lens) or not rows:
        raise ValueError(
            f"a decode batch needs one row and cached length per sequence, got {len(rows)} and {len(cached_lens)}"
        )
    _check_rows(req_pool, rows)
    for r, cached in zip(rows, cached_lens):
        if cached < 1:
            raise ValueError(
                f"request row {r} has {cached} cached tokens: decode needs a prefilled prompt "
                "(run an extend batch first)"
            )
        if cached + 1 > req_pool.max_context_len:
            raise ValueError(
                f"request row {r}: {cached} cached tokens + 1 exceeds max_context_len = {req_pool.max_context_len}"
            )
    slots = kv_pool.alloc(len(rows))
    for b, (r, cached) in enumerate(zip(rows, cached_lens)):
        req_pool.req_to_token[r, cached] = int(slots[b])
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(rows),
        req_pool_indices=torch.tensor(rows, dtype=torch.int64),
        seq_lens=torch.tensor([c + 1 for c in cached_lens], dtype=torch.int64),
        out_cache_loc=slots,
        positions=torch.tensor(cached_lens, dtype=torch.int64),
        req_to_token_pool=req_pool,
        token_to_kv_pool=kv_pool,
    )
