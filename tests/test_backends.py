"""The attention backends on one layer: what they store, save_kv_cache=False, selection by name, and a
gpt-oss layer's sliding window and sinks (with an encoder offset) reaching the operators.

Outputs are checked against the float64 references of reference.py at the
tolerances of tolerances.py (the RVV backend is the operators plus the
batch plumbing, so the operators' own tolerances apply).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference import decode_attention as reference_decode
from reference import decode_attention_options, dequantize_int8, extend_attention_options
from reference import extend_attention as reference_extend
from rvv_attn.serving.backends import (
    AttentionLayer,
    BackendUnavailableError,
    RVVAttnBackend,
    make_backend,
    operator_window,
)
from rvv_attn.serving.batch import prepare_decode, prepare_extend
from rvv_attn.serving.pools import Int8KVPool, Int8Scales, ReqToTokenPool, make_kv_pool
from tolerances import assert_close_to_reference

H, HKV, D = 4, 2, 16
LAYER = AttentionLayer(layer_id=1, num_heads=H, num_kv_heads=HKV, head_dim=D, v_head_dim=D, scaling=D**-0.5)
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


STATIC_SCALES = Int8Scales(4 / 127, 3 / 127)


def prefilled(backend, dtype, kv_cache="float", seed=0, layer=LAYER, scales=STATIC_SCALES):
    """Pools with two requests prefilled (10 and 3 tokens) through ``backend``, and the generator."""
    g = torch.Generator().manual_seed(seed)
    req_pool = ReqToTokenPool(3, 32)
    pool = make_kv_pool(kv_cache, 48, 2, HKV, D, D, dtype, scales, shuffle_seed=seed)
    batch = prepare_extend(req_pool, pool, [2, 0], [0, 0], [10, 3])
    q, k, v = qkv(13, dtype, g)
    backend.init_forward_metadata(batch)
    backend.forward(q, k, v, layer, batch)
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
        pool.v_buffers[1][batch.out_cache_loc], v
    )
    assert not pool.k_buffers[0].any(), "layer 0's cache was written by a layer-1 call"
    ref = reference_extend(
        q,
        k,
        v,
        pool.k_buffers[1],
        pool.v_buffers[1],
        req_pool.req_to_token,
        batch.req_pool_indices,
        batch.seq_lens,
        batch.extend_seq_lens,
        batch.extend_start_loc,
        LAYER.scaling,
        0.0,
    )
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
    ref = reference_decode(
        q,
        pool.k_buffers[1],
        pool.v_buffers[1],
        req_pool.req_to_token,
        batch.req_pool_indices,
        batch.seq_lens,
        LAYER.scaling,
        0.0,
    )
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
    with pytest.raises(
        BackendUnavailableError,
        match=r"backend 'rvv' needs torch.ops.rvv_attn_absent.decode_attention_cpu, which is not "
        r"registered .* or choose the backend 'torch_native'",
    ):
        make_backend("rvv", H, D, ops_namespace="rvv_attn_absent")


# ---- a gpt-oss layer: sliding window and attention sinks ----------------------------------------
# The backends take the layer's window in SGLang's RadixAttention convention (previous tokens seen besides
# the query's own); the references take W, the keys seen including the query's own: W - 1 is the layer's.
# Sequences: row 2 holds 10 cached tokens and row 0 holds 3; extend adds 2 and 5, decode one each, so a
# window of 4 is shorter than row 2's prefix and than row 0's extend.
# case: (W, sinks dtype or None, KV cache, model dtype, save_kv_cache)
WINDOW_CASES = {
    "window4-sinks": (4, torch.float32, "float", torch.float32, True),
    "window1": (1, None, "float", torch.float32, True),
    "window40-bf16-sinks": (40, torch.bfloat16, "float", torch.bfloat16, True),  # longer than any sequence
    "f32-sinks-fp16-query": (0, torch.float32, "float", torch.float16, True),
    "window4-sinks-int8": (4, torch.float32, "int8-dynamic", torch.float32, True),
    "window4-sinks-unsaved": (4, torch.float32, "float", torch.float32, False),  # decode: the one-token extend
}


def gpt_oss_layer(window: int, sinks_dtype: torch.dtype | None, seed: int = 7) -> AttentionLayer:
    # Sinks of the scores' size (N(0, 2^2) against scores ~N(0, 1)), so they visibly take weight.
    sinks = (
        None
        if sinks_dtype is None
        else (2 * torch.randn(H, generator=torch.Generator().manual_seed(seed))).to(sinks_dtype)
    )
    return dataclasses.replace(LAYER, sliding_window_size=window - 1 if window > 0 else -1, sinks=sinks)


def float_cache(pool, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer's cache as the attention reads it (int8 codes times their scales)."""
    if not isinstance(pool, Int8KVPool):
        return pool.k_buffers[layer_id], pool.v_buffers[layer_id]
    return (
        dequantize_int8(pool.k_buffers[layer_id], pool.k_scale_buffers[layer_id], pool.scales.k_scale),
        dequantize_int8(pool.v_buffers[layer_id], pool.v_scale_buffers[layer_id], pool.scales.v_scale),
    )


@pytest.mark.parametrize("case", WINDOW_CASES)
@pytest.mark.parametrize("mode", ["extend", "decode"])
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_window_and_sinks_match_the_reference(name, mode, case):
    window, sinks_dtype, kv_cache, dtype, save = WINDOW_CASES[case]
    layer = gpt_oss_layer(window, sinks_dtype)
    assert operator_window(layer) == (window if window > 0 else -1)
    backend = make_backend(name, H, D)
    req_pool, pool, g = prefilled(backend, dtype, kv_cache, layer=layer, scales=Int8Scales.dynamic())
    if mode == "extend":
        batch = prepare_extend(req_pool, pool, [0, 2], [3, 10], [5, 2])
    else:
        batch = prepare_decode(req_pool, pool, [0, 2], [3, 10])
    q, k, v = qkv(batch.num_tokens, dtype, g)
    backend.init_forward_metadata(batch)
    out = backend.forward(q, k, v, layer, batch, save_kv_cache=save).view(-1, H, D)
    k_cache, v_cache = float_cache(pool, layer.layer_id)
    if not save:  # the reference reads every key from the cache: put the new tokens where the cache would
        k_cache, v_cache = k_cache.clone(), v_cache.clone()
        k_cache[batch.out_cache_loc], v_cache[batch.out_cache_loc] = k.to(k_cache.dtype), v.to(v_cache.dtype)
    args = (req_pool.req_to_token, batch.req_pool_indices, batch.seq_lens)
    if mode == "extend":
        ref, plain = (
            extend_attention_options(
                q,
                k,
                v,
                k_cache,
                v_cache,
                *args,
                batch.extend_seq_lens,
                batch.extend_start_loc,
                LAYER.scaling,
                0.0,
                window=w,
                sinks=s,
            )
            for w, s in ((window, layer.sinks), (-1, None))
        )
    else:
        ref, plain = (
            decode_attention_options(q, k_cache, v_cache, *args, LAYER.scaling, 0.0, window=w, sinks=s)
            for w, s in ((window, layer.sinks), (-1, None))
        )
    assert_close_to_reference(out, ref)
    # Not vacuous: the window and sinks move these outputs by far more than the tolerance.
    assert (ref - plain).abs().max() > 0.05


@pytest.mark.parametrize("mode", ["extend", "decode"])
@pytest.mark.parametrize("name", BACKEND_NAMES)
def test_encoder_offset_with_window_and_sinks(name, mode):
    """An encoder-decoder batch: each row holds the encoder's tokens first, positions count decoder tokens."""
    layer = gpt_oss_layer(3, torch.float32)
    backend = make_backend(name, H, D)
    g = torch.Generator().manual_seed(3)
    req_pool = ReqToTokenPool(3, 32)
    pool = make_kv_pool("float", 48, 2, HKV, D, D, torch.float32, shuffle_seed=3)
    enc, dec = [5, 2], [7, 3]
    rows = [2, 0]
    # Encoder tokens and a first decoder chunk in the cache, written directly (not through a backend).
    filled = prepare_extend(req_pool, pool, rows, [0, 0], [e + d for e, d in zip(enc, dec)])
    pool.k_buffers[1][filled.out_cache_loc] = torch.randn(sum(enc) + sum(dec), HKV, D, generator=g)
    pool.v_buffers[1][filled.out_cache_loc] = torch.randn(sum(enc) + sum(dec), HKV, D, generator=g)
    full = [e + d for e, d in zip(enc, dec)]
    encoder_lens = torch.tensor(enc, dtype=torch.int32)
    if mode == "extend":
        batch = prepare_extend(req_pool, pool, rows, full, [4, 2])
        batch = dataclasses.replace(
            batch,
            seq_lens=batch.seq_lens - encoder_lens,
            extend_prefix_lens=batch.extend_prefix_lens - encoder_lens,
            positions=batch.positions - encoder_lens.repeat_interleave(batch.extend_seq_lens).long(),
            encoder_lens=encoder_lens,
        )
    else:
        batch = prepare_decode(req_pool, pool, rows, full)
        batch = dataclasses.replace(
            batch,
            seq_lens=batch.seq_lens - encoder_lens,
            positions=batch.positions - encoder_lens,
            encoder_lens=encoder_lens,
        )
    q, k, v = qkv(batch.num_tokens, torch.float32, g)
    backend.init_forward_metadata(batch)
    out = backend.forward(q, k, v, layer, batch).view(-1, H, D)
    args = (req_pool.req_to_token, batch.req_pool_indices, batch.seq_lens)
    options = {"window": 3, "sinks": layer.sinks, "encoder_lens": encoder_lens}
    if mode == "extend":
        ref = extend_attention_options(
            q,
            k,
            v,
            pool.k_buffers[1],
            pool.v_buffers[1],
            *args,
            batch.extend_seq_lens,
            batch.extend_start_loc,
            LAYER.scaling,
            0.0,
            **options,
        )
    else:
        ref = decode_attention_options(q, pool.k_buffers[1], pool.v_buffers[1], *args, LAYER.scaling, 0.0, **options)
    assert_close_to_reference(out, ref)


@pytest.mark.variant_independent
def test_attention_layer_refuses_a_bad_window_or_sinks():
    with pytest.raises(ValueError, match=r"layer 1: sliding_window_size = -2 must be >= 0 .* or -1 for no window"):
        dataclasses.replace(LAYER, sliding_window_size=-2)
    with pytest.raises(
        ValueError,
        match=r"layer 1: sinks must be a floating-point tensor of shape \[4\] "
        r"\(one per query head\), got torch.float32 \[2\]",
    ):
        dataclasses.replace(LAYER, sinks=torch.zeros(2))
