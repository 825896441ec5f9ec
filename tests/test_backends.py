"""The attention backends on one layer: what they store, save_kv_cache=False, selection by name.

Outputs are checked against the float64 references of reference.py at the
tolerances of tolerances.py (the RVV backend is the operators plus the
batch plumbing, so the operators' own tolerances apply).
"""

from __future__ import annotations

import pytest
import torch

from reference import decode_attention as reference_decode
from reference import extend_attention as reference_extend
from rvv_attn.backends import AttentionLayer, BackendUnavailableError, RVVAttnBackend, make_backend
from rvv_attn.batch import prepare_decode, prepare_extend
from rvv_attn.pools import Int8KVPool, Int8Scales, ReqToTokenPool, make_kv_pool
from tolerances import assert_close_to_reference

H, HKV, D = 4, 2, 16
LAYER = AttentionLayer(layer_id=1, num_heads=H, num_kv_heads=HKV, head_dim=D, v_head_dim=D, scaling=D ** -0.5)
# torch_native runs no kernel of ours: its cases give the same answer at every VLEN.
BACKEND_NAMES = ["rvv", pytest.param("torch_native", marks=pytest.mark.variant_independent)]
FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def qkv(tokens: int, dtype: torch.dtype, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    return tuple(torch.randn(tokens, heads, D, generator=g).to(dtype) for heads in (H, HKV, HKV))


def cache_state(pool) -> list[torch.Tensor]:
    state = [*pool.k_buffers, *pool.v_buffers]
    if isinstance(pool, Int8KVPool):
        state += [*pool.k_scale_buffers, *pool.v_scale_buffers]
    return [t.clone() for t in state]


def assert_same_state(before: list[torch.Tensor], after: list[torch.Tensor]) -> None:
    for a, b in zip(before, after):
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


def prefilled(backend, dtype, kv_cache="float", seed=0):
    """Pools with two requests prefilled (10 and 3 tokens) through ``backend``, and the generator."""
    g = torch.Generator().manual_seed(seed)
    req_pool = ReqToTokenPool(3, 32)
    pool = make_kv_pool(kv_cache, 48, 2, HKV, D, D, dtype, Int8Scales(4 / 127, 3 / 127), shuffle_seed=seed)
    batch = prepare_extend(req_pool, pool, [2, 0], [0, 0], [10, 3])
    q, k, v = qkv(13, dtype, g)
    backend.init_forward_metadata(batch)
    backend.forward(q, k, v, LAYER, batch)
    return req_pool, pool, g


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_extend_stores_kv_and_matches_the_reference(name, dtype):
    backend = make_backend(name, H, D)
    req_pool, pool, g = prefilled(backend, dtype)
    batch = prepare_extend(req_pool, pool, [0, 2], [3, 10], [5, 2])  # a second chunk over cached prefixes
    q, k, v = qkv(7, dtype, g)
    backend.init_forward_metadata(batch)
    out = backend.forward(q, k, v, LAYER, batch).view(7, H, D)
    assert torch.equal(pool.k_buffers[1][batch.out_cache_loc], k) and torch.equal(
        pool.v_buffers[1][batch.out_cache_loc], v)
    assert not pool.k_buffers[0].any(), "layer 0's cache was written by a layer-1 call"
    ref = reference_extend(q, k, v, pool.k_buffers[1], pool.v_buffers[1], req_pool.req_to_token,
                           batch.req_pool_indices, batch.seq_lens, batch.extend_seq_lens, batch.extend_start_loc,
                           LAYER.scaling, 0.0)
    assert_close_to_reference(out, ref)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_decode_stores_kv_and_matches_the_reference(name, dtype):
    backend = make_backend(name, H, D)
    req_pool, pool, g = prefilled(backend, dtype)
    batch = prepare_decode(req_pool, pool, [0, 2], [3, 10])
    q, k, v = qkv(2, dtype, g)
    backend.init_forward_metadata(batch)
    out = backend.forward(q, k, v, LAYER, batch).view(2, H, D)
    assert torch.equal(pool.k_buffers[1][batch.out_cache_loc], k)
    ref = reference_decode(q, pool.k_buffers[1], pool.v_buffers[1], req_pool.req_to_token, batch.req_pool_indices,
                           batch.seq_lens, LAYER.scaling, 0.0)
    assert_close_to_reference(out, ref)


@pytest.mark.parametrize("kv_cache", ["float", "int8-dynamic", "int8-static"])
@pytest.mark.parametrize("mode", ["extend", "decode"])
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_save_kv_cache_false_writes_nothing_and_attends_to_the_new_tokens(name, mode, kv_cache):
    backend = make_backend(name, H, D)
    req_pool, pool, g = prefilled(backend, torch.float32, kv_cache)
    if mode == "extend":
        batch = prepare_extend(req_pool, pool, [0, 2], [3, 10], [4, 2])
    else:
        batch = prepare_decode(req_pool, pool, [0, 2], [3, 10])
    q, k, v = qkv(batch.num_tokens, torch.float32, g)
    before = cache_state(pool)
    backend.init_forward_metadata(batch)
    unsaved = backend.forward(q, k, v, LAYER, batch, save_kv_cache=False)
    assert_same_state(before, cache_state(pool))
    saved = backend.forward(q, k, v, LAYER, batch, save_kv_cache=True)
    changed = [not torch.equal(a, b) for a, b in zip(before, cache_state(pool))]
    assert any(changed), "save_kv_cache=True stored nothing"
    if kv_cache == "float" or mode == "extend":
        # The same keys either way: the new tokens come from k/v whether or not they are stored.
        # (Extend reads its chunk unquantized from k/v also with an int8 cache.)
        torch.testing.assert_close(unsaved, saved, rtol=2.0**-24, atol=5e-6)
    else:
        # int8 decode reads the new token back quantized when it is stored: only close.
        torch.testing.assert_close(unsaved, saved, rtol=0, atol=0.1)


@pytest.mark.variant_independent
def test_backends_are_chosen_by_name():
    assert isinstance(make_backend("rvv", H, D), RVVAttnBackend)
    assert make_backend("torch_native", H, D).name == "torch_native"
    with pytest.raises(ValueError, match=r"unknown attention backend 'flash'; choose one of rvv, torch_native"):
        make_backend("flash", H, D)


@pytest.mark.variant_independent
def test_rvv_backend_without_its_operators_is_a_clear_error():
    # A namespace no library registered: what an installation without the built operators has.
    with pytest.raises(BackendUnavailableError,
                       match=r"backend 'rvv' needs torch.ops.rvv_attn_absent.decode_attention_cpu, which is not "
                             r"registered .* or choose the backend 'torch_native'"):
        make_backend("rvv", H, D, ops_namespace="rvv_attn_absent")
