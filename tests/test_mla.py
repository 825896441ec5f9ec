"""DeepSeek-style MLA through SGLang's cache views: v_buffer = k_buffer[..., :Dv], one latent head, D = Dv + 64.

Decode writes only the key row (the value lives in it) and reads V from the
K rows; extend attends with D = 576 / Dv = 512 over the same views, or, in
SGLang's MLA prefill without a prefix, only its new tokens. The shapes are
DeepSeek's head dims with few heads and tokens, so every VLEN runs them.
"""

from __future__ import annotations

import math

import pytest
import torch

import opcall
from reference import decode_attention_options as reference_decode
from reference import extend_attention_options as reference_extend
from tolerances import assert_close_to_reference

RANK, ROPE = 512, 64  # kv_lora_rank and the rope part: D = 576, Dv = 512


def _mla_pool(slots: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    k_buffer = (torch.randn(slots, 1, RANK + ROPE, generator=g) * 0.3).bfloat16()
    return k_buffer, k_buffer[..., :RANK]


def _map(lens: list[int], slots: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    free = torch.randperm(slots, generator=g).tolist()
    req_to_token = torch.zeros(len(lens), max(lens) + 1, dtype=torch.int32)
    for b, n in enumerate(lens):
        req_to_token[b, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
    return req_to_token, torch.arange(len(lens))


@pytest.mark.parametrize("value_given_as", ["view of key", "separate tensor"])
def test_mla_decode_writes_the_key_row_and_reads_v_from_it(kernel_variant, value_given_as):
    g = torch.Generator().manual_seed(0)
    heads, lens, slots = 8, [19, 6], 40
    k_buffer, v_buffer = _mla_pool(slots, g)
    req_to_token, pools = _map(lens, slots, g)
    loc = torch.tensor([int(req_to_token[b, n - 1]) for b, n in enumerate(lens)])
    key = (torch.randn(2, 1, RANK + ROPE, generator=g) * 0.3).bfloat16()
    value = key[..., :RANK] if value_given_as == "view of key" else torch.randn(2, 1, RANK).bfloat16()
    sinks = torch.randn(heads, generator=g)
    args = dict(
        query=(torch.randn(2, heads, RANK + ROPE, generator=g) * 0.3).bfloat16(),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        output=torch.empty(2, heads, RANK, dtype=torch.bfloat16),
        key=key,
        value=value,
        loc=loc,
        attn_logits=torch.empty(2, heads, 4, RANK + 1),
        req_to_token=req_to_token,
        req_pool_indices=pools,
        seq_lens=torch.tensor(lens),
        sm_scale=1 / math.sqrt(RANK + ROPE),
        logit_cap=0.0,
        sinks=sinks,
    )
    value_before = value.clone()
    opcall.call_documented("decode_attention_cpu", args)
    assert torch.equal(k_buffer[loc], key)  # the whole 576-wide row, so V (its first 512 columns) too
    assert torch.equal(value, value_before)
    expected = reference_decode(
        args["query"], k_buffer, v_buffer, req_to_token, pools, args["seq_lens"], args["sm_scale"], 0.0, sinks=sinks
    )
    assert_close_to_reference(args["output"], expected)


def test_mla_extend_with_a_prefix_over_the_views(kernel_variant):
    """DeepSeek's absorbed MLA extend: MQA with D = 576, Dv = 512, v_extend a view of k_extend."""
    g = torch.Generator().manual_seed(1)
    heads, prefix, ext, slots = 4, [9, 0], [3, 2], 30
    k_buffer, v_buffer = _mla_pool(slots, g)
    lens = [p + e for p, e in zip(prefix, ext)]
    req_to_token, pools = _map(lens, slots, g)
    k_extend = (torch.randn(sum(ext), 1, RANK + ROPE, generator=g) * 0.3).bfloat16()
    ext_t = torch.tensor(ext)
    args = dict(
        q_extend=(torch.randn(sum(ext), heads, RANK + ROPE, generator=g) * 0.3).bfloat16(),
        k_extend=k_extend,
        v_extend=k_extend[..., :RANK],
        o_extend=torch.empty(sum(ext), heads, RANK, dtype=torch.bfloat16),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=pools,
        seq_lens=torch.tensor(lens),
        extend_seq_lens=ext_t,
        extend_start_loc=ext_t.cumsum(0) - ext_t,
        max_len_extend=max(ext),
        sm_scale=1 / math.sqrt(RANK + ROPE),
        logit_cap=0.0,
    )
    opcall.call_documented("extend_attention_cpu", args)
    expected = reference_extend(
        args["q_extend"],
        k_extend,
        args["v_extend"],
        k_buffer,
        v_buffer,
        req_to_token,
        pools,
        args["seq_lens"],
        ext_t,
        args["extend_start_loc"],
        args["sm_scale"],
        0.0,
    )
    assert_close_to_reference(args["o_extend"], expected)


def test_mla_prefill_without_a_prefix_reads_only_the_new_tokens(kernel_variant):
    """SGLang's MLA prefill: q/k [T, H, 192], v [T, H, 128], caches with one latent head; every prefix 0."""
    g = torch.Generator().manual_seed(2)
    heads, ext, slots = 4, [5, 3], 16
    k_buffer, v_buffer = _mla_pool(slots, g)
    req_to_token, pools = _map(ext, slots, g)
    ext_t = torch.tensor(ext)
    q = torch.randn(sum(ext), heads, 192, generator=g).bfloat16()
    k = torch.randn(sum(ext), heads, 192, generator=g).bfloat16()
    v = torch.randn(sum(ext), heads, 128, generator=g).bfloat16()
    args = dict(
        q_extend=q,
        k_extend=k,
        v_extend=v,
        o_extend=torch.empty(sum(ext), heads, 128, dtype=torch.bfloat16),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=pools,
        seq_lens=ext_t.clone(),
        extend_seq_lens=ext_t,
        extend_start_loc=ext_t.cumsum(0) - ext_t,
        max_len_extend=max(ext),
        sm_scale=1 / math.sqrt(192),
        logit_cap=0.0,
    )
    opcall.call_documented("extend_attention_cpu", args)
    # No prefix: the reference reads no cache slot (k/v stand in for the caches' shapes).
    expected = reference_extend(
        q, k, v, k, v, req_to_token, pools, args["seq_lens"], ext_t, args["extend_start_loc"], args["sm_scale"], 0.0
    )
    assert_close_to_reference(args["o_extend"], expected)

    args["seq_lens"] = ext_t + torch.tensor([0, 2])
    with pytest.raises(RuntimeError, match=r"every prefix must be 0; sequence 1 has seq_lens - extend_seq_lens = 2"):
        opcall.call_documented("extend_attention_cpu", args)


@pytest.mark.variant_independent
def test_a_fake_mla_view_is_refused():
    """Same storage, but not k_buffer[..., :Dv]: the write would land in what is read as V."""
    g = torch.Generator().manual_seed(3)
    k_buffer, _ = _mla_pool(8, g)
    req_to_token, pools = _map([3], 8, g)
    key = torch.randn(1, 1, RANK + ROPE).bfloat16()
    for fake in (k_buffer[..., ROPE:], k_buffer[:7, :, :RANK]):
        args = dict(
            query=torch.randn(1, 2, RANK + ROPE).bfloat16(),
            k_buffer=k_buffer,
            v_buffer=fake,
            output=torch.empty(1, 2, RANK, dtype=torch.bfloat16),
            key=key,
            value=key[..., :RANK],
            loc=torch.tensor([int(req_to_token[0, 2])]),
            attn_logits=torch.empty(1, 2, 2, RANK + 1),
            req_to_token=req_to_token,
            req_pool_indices=pools,
            seq_lens=torch.tensor([3]),
            sm_scale=0.05,
            logit_cap=0.0,
        )
        with pytest.raises(RuntimeError, match=r"k_buffer shares memory with v_buffer|v_buffer"):
            opcall.call_documented("decode_attention_cpu", args)
