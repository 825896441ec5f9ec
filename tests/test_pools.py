"""Request/token pools and forward-batch construction (no kernels: fast everywhere)."""

from __future__ import annotations

import math

import pytest
import torch

from rvv_attn.serving.batch import ForwardMode, prepare_decode, prepare_extend
from rvv_attn.serving.pools import Int8KVPool, Int8Scales, KVPool, PoolExhaustedError, ReqToTokenPool, make_kv_pool

pytestmark = pytest.mark.variant_independent


def kv_pool(size: int = 16, **kw) -> KVPool:
    return KVPool(size, num_layers=2, heads_kv=2, head_dim=8, head_dim_v=4, dtype=torch.float32, **kw)


def test_request_rows_are_handed_out_freed_and_reused():
    pool = ReqToTokenPool(3, 10)
    assert pool.req_to_token.dtype == torch.int32 and pool.req_to_token.shape == (3, 10)
    assert pool.alloc(2) == [0, 1]
    pool.free(0)
    assert pool.alloc(1) == [0]  # the freed row first
    assert pool.alloc(1) == [2]
    with pytest.raises(PoolExhaustedError, match=r"out of request rows: 1 requested, 0 free of 3"):
        pool.alloc(1)
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([1, 1])
    assert pool.available == 0  # the refused double free changed nothing


def test_token_slots_freed_are_reused_first_and_exhaustion_allocates_nothing():
    pool = kv_pool(8)
    first = pool.alloc(5)
    assert first.dtype == torch.int64 and first.tolist() == [0, 1, 2, 3, 4]
    pool.free(first[[1, 3]])
    again = pool.alloc(3)
    assert again.tolist() == [1, 3, 5], "freed slots must be handed out before fresh ones"
    assert pool.available == 2
    with pytest.raises(PoolExhaustedError, match=r"out of KV cache token slots: 3 requested, 2 free of 8"):
        pool.alloc(3)
    assert pool.available == 2
    assert pool.alloc(2).tolist() == [6, 7]


def test_freeing_a_free_or_foreign_slot_is_refused_and_changes_nothing():
    pool = kv_pool(4)
    pool.alloc(2)
    with pytest.raises(ValueError, match=r"cannot free KV cache token slots 2: it is not allocated"):
        pool.free([0, 2])
    with pytest.raises(ValueError, match=r"outside \[0, 4\)"):
        pool.free([7])
    assert pool.available == 2
    pool.free([0, 1])
    assert pool.available == 4


def test_shuffled_pool_hands_out_scattered_slots():
    slots = kv_pool(64, shuffle_seed=3).alloc(16).tolist()
    assert sorted(slots) != slots and len(set(slots)) == 16


def test_int8_pool_scales_start_as_nan_and_return_to_nan_when_freed():
    pool = Int8KVPool(8, 2, 2, 8, 8, Int8Scales.dynamic())
    assert pool.k_buffers[0].dtype == torch.int8
    assert pool.k_scale_buffers[1].shape == (8, 2) and torch.isnan(pool.k_scale_buffers[1]).all()
    slots = pool.alloc(3)
    pool.k_scale_buffers[0][slots] = 0.5
    pool.v_scale_buffers[1][slots] = 0.25
    pool.free(slots[:2])
    assert (
        torch.isnan(pool.k_scale_buffers[0][slots[:2]]).all() and torch.isnan(pool.v_scale_buffers[1][slots[:2]]).all()
    )
    assert pool.k_scale_buffers[0][slots[2]].eq(0.5).all(), "a slot still in use keeps its scales"


def test_int8_scales_and_pool_kinds_are_validated():
    assert math.isnan(Int8Scales.dynamic().k_scale)
    with pytest.raises(ValueError, match=r"k_scale = 0.0 must be a finite static scale > 0"):
        Int8Scales(0.0, 1.0)
    with pytest.raises(ValueError, match=r"kv_cache = 'int4'"):
        make_kv_pool("int4", 8, 1, 1, 8, 8, torch.float32)
    with pytest.raises(ValueError, match=r"'int8-static' needs finite static K and V scales"):
        make_kv_pool("int8-static", 8, 1, 1, 8, 8, torch.float32, Int8Scales.dynamic())
    with pytest.raises(ValueError, match=r"dtype torch.int8 is not one of"):
        KVPool(8, 1, 1, 8, 8, torch.int8)
    static = make_kv_pool("int8-static", 8, 1, 1, 8, 8, torch.float32, Int8Scales(0.05, 0.25))
    assert static.is_int8 and static.scales == Int8Scales(0.05, 0.25)


def test_extend_batch_has_sglang_dtypes_and_fills_req_to_token():
    req_pool, pool = ReqToTokenPool(4, 16), kv_pool(32)
    pool.alloc(3)  # slots 0..2 belong to someone else
    batch = prepare_extend(req_pool, pool, rows=[2, 0], prefix_lens=[0, 5], extend_lens=[3, 2])
    assert batch.forward_mode is ForwardMode.EXTEND
    for name in ("req_pool_indices", "seq_lens", "out_cache_loc", "positions"):
        assert getattr(batch, name).dtype == torch.int64, name
    for name in ("extend_seq_lens", "extend_prefix_lens", "extend_start_loc"):
        assert getattr(batch, name).dtype == torch.int32, name
    assert batch.seq_lens.tolist() == [3, 7] and batch.extend_start_loc.tolist() == [0, 3]
    assert batch.max_len_extend == 3 and batch.positions.tolist() == [0, 1, 2, 5, 6]
    assert batch.out_cache_loc.tolist() == [3, 4, 5, 6, 7]
    assert req_pool.req_to_token[2, :3].tolist() == [3, 4, 5]
    assert req_pool.req_to_token[0, 5:7].tolist() == [6, 7]
    assert batch.last_token_rows.tolist() == [2, 4]


def test_extend_that_does_not_fit_changes_nothing():
    req_pool, pool = ReqToTokenPool(2, 8), kv_pool(6)
    req_pool.req_to_token[1] = 5
    before = req_pool.req_to_token.clone()
    with pytest.raises(PoolExhaustedError, match="7 requested, 6 free"):
        prepare_extend(req_pool, pool, [0, 1], [0, 0], [3, 4])
    with pytest.raises(ValueError, match=r"request row 1: prefix 6 \+ extend 3 = 9 tokens exceeds max_context_len = 8"):
        prepare_extend(req_pool, pool, [0, 1], [0, 6], [1, 3])
    with pytest.raises(ValueError, match="name a request row more than once"):
        prepare_extend(req_pool, pool, [1, 1], [0, 0], [1, 1])
    assert torch.equal(req_pool.req_to_token, before) and pool.available == 6


def test_decode_batch_appends_one_slot_and_refuses_an_unprefilled_row():
    req_pool, pool = ReqToTokenPool(3, 8), kv_pool(8)
    prepare_extend(req_pool, pool, [1], [0], [4])
    before = req_pool.req_to_token.clone()
    with pytest.raises(ValueError, match=r"request row 2 has 0 cached tokens: decode needs a prefilled prompt"):
        prepare_decode(req_pool, pool, [1, 2], [4, 0])
    assert torch.equal(req_pool.req_to_token, before) and pool.available == 4
    batch = prepare_decode(req_pool, pool, [1], [4])
    assert batch.forward_mode is ForwardMode.DECODE
    assert batch.seq_lens.tolist() == [5] and batch.positions.tolist() == [4]
    assert req_pool.req_to_token[1, 4] == int(batch.out_cache_loc[0]) == 4
    with pytest.raises(ValueError, match="exceeds max_context_len = 8"):
        prepare_decode(req_pool, pool, [1], [8])
