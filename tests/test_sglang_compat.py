"""The operators called the way an SGLang CPU attention backend calls them.

SGLang's request pool holds ``req_to_token`` as int32; its forward batch
carries ``seq_lens``, ``req_pool_indices`` and ``out_cache_loc`` as int64 and
``extend_seq_lens`` / ``extend_start_loc`` as int32; decode's scratch
``attn_logits`` is float32 [B, H, num_kv_splits, Dv + 1]. Every operator must
take these tensors as they are, and give the same answer as with all-int64
indices. Also here: the memory-overlap rules (what is refused, what works),
the soft cap's accuracy at any cap, and the int8 extend attending its new
tokens as given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch

import opcall
from reference import decode_attention as reference_decode
from reference import dequantize_int8, quantize_int8
from reference import extend_attention as reference_extend
from tolerances import TOLERANCES, assert_close_to_reference

# Every call checked by opcall: only the documented elements may change.
OPS = opcall.CheckedOps()
# SGLang's default number of KV splits for decode (--triton-attention-num-kv-splits).
SGLANG_NUM_KV_SPLITS = 8
DYN = float("nan")


@dataclass
class Batch:
    """A paged KV cache and one extend batch, with SGLang's dtypes (fragmented slot allocation)."""

    heads: int
    heads_kv: int
    head_dim: int
    dtype: torch.dtype
    prefix: list[int]
    extend: list[int]
    seed: int = 0

    def __post_init__(self) -> None:
        g = torch.Generator().manual_seed(self.seed)
        self.g = g
        batch = len(self.prefix)
        total = [p + e for p, e in zip(self.prefix, self.extend)]
        # Room for every token plus one decode step each, handed out shuffled.
        self.num_slots = sum(total) + batch + 4
        free = torch.randperm(self.num_slots, generator=g).tolist()
        self.max_context = max(total) + 4
        self.req_to_token = torch.zeros(batch + 2, self.max_context, dtype=torch.int32)
        self.req_pool_indices = torch.randperm(batch + 2, generator=g)[:batch].to(torch.int64)
        for b, n in enumerate(total):
            row = int(self.req_pool_indices[b])
            self.req_to_token[row, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
        self.free = free
        self.seq_lens = torch.tensor(total, dtype=torch.int64)
        self.extend_seq_lens = torch.tensor(self.extend, dtype=torch.int32)
        self.extend_start_loc = torch.cumsum(self.extend_seq_lens, 0, dtype=torch.int32) - self.extend_seq_lens
        self.out_cache_loc = torch.cat(
            [
                self.req_to_token[int(self.req_pool_indices[b]), p : p + e].to(torch.int64)
                for b, (p, e) in enumerate(zip(self.prefix, self.extend))
            ]
        )
        tokens = sum(self.extend)
        self.q = self.randn(tokens, self.heads, self.head_dim)
        self.k = self.randn(tokens, self.heads_kv, self.head_dim)
        self.v = self.randn(tokens, self.heads_kv, self.head_dim)
        self.sm_scale = 1.0 / math.sqrt(self.head_dim)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def float_cache(self) -> tuple[torch.Tensor, torch.Tensor]:
        """A float cache holding random prefix tokens (the new tokens' slots are written by the call)."""
        return (
            self.randn(self.num_slots, self.heads_kv, self.head_dim),
            self.randn(self.num_slots, self.heads_kv, self.head_dim),
        )

    def as_int64(self) -> dict[str, torch.Tensor]:
        return dict(
            req_to_token=self.req_to_token.long(),
            extend_seq_lens=self.extend_seq_lens.long(),
            extend_start_loc=self.extend_start_loc.long(),
        )

    def decode_step(self) -> dict[str, torch.Tensor]:
        """One new token per request in fresh slots, as SGLang's decode batch has it (seq_lens includes it)."""
        batch = len(self.prefix)
        loc = torch.tensor([self.free.pop() for _ in range(batch)], dtype=torch.int64)
        for b in range(batch):
            self.req_to_token[int(self.req_pool_indices[b]), int(self.seq_lens[b])] = int(loc[b])
        return dict(
            query=self.randn(batch, self.heads, self.head_dim),
            key=self.randn(batch, self.heads_kv, self.head_dim),
            value=self.randn(batch, self.heads_kv, self.head_dim),
            loc=loc,
            seq_lens=self.seq_lens + 1,
            attn_logits=torch.zeros(batch, self.heads, SGLANG_NUM_KV_SPLITS, self.head_dim + 1),
        )


def _extend_float(t: Batch, k_buffer, v_buffer, logit_cap=0.0, **index_overrides) -> torch.Tensor:
    """SGLang's forward_extend for a float cache: store the new K/V at out_cache_loc, then attend."""
    idx = dict(req_to_token=t.req_to_token, extend_seq_lens=t.extend_seq_lens, extend_start_loc=t.extend_start_loc)
    idx.update(index_overrides)
    OPS.decode_set_kv_buffer(k_buffer, v_buffer, t.k, t.v, t.out_cache_loc)
    out = torch.empty(t.q.shape[0], t.heads, t.head_dim, dtype=t.dtype)
    OPS.extend_attention_cpu(
        t.q,
        t.k,
        t.v,
        out,
        k_buffer,
        v_buffer,
        idx["req_to_token"],
        t.req_pool_indices,
        t.seq_lens,
        idx["extend_seq_lens"],
        idx["extend_start_loc"],
        max(t.extend),
        t.sm_scale,
        logit_cap,
    )
    return out


def _decode_float(t: Batch, step: dict, k_buffer, v_buffer, logit_cap=0.0, req_to_token=None) -> torch.Tensor:
    out = torch.empty(step["query"].shape[0], t.heads, t.head_dim, dtype=t.dtype)
    OPS.decode_attention_cpu(
        step["query"],
        k_buffer,
        v_buffer,
        out,
        step["key"],
        step["value"],
        step["loc"],
        step["attn_logits"],
        t.req_to_token if req_to_token is None else req_to_token,
        t.req_pool_indices,
        step["seq_lens"],
        t.sm_scale,
        logit_cap,
    )
    return out


def _expected_extend(t: Batch, k_buffer, v_buffer, logit_cap=0.0) -> torch.Tensor:
    return reference_extend(
        t.q,
        t.k,
        t.v,
        k_buffer,
        v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.extend_seq_lens,
        t.extend_start_loc,
        t.sm_scale,
        logit_cap,
    )


# ---- index dtypes -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_float_operators_take_sglangs_tensors(kernel_variant, dtype):
    t = Batch(heads=8, heads_kv=2, head_dim=64, dtype=dtype, prefix=[5, 0, 40], extend=[7, 3, 1], seed=1)
    k_buffer, v_buffer = t.float_cache()
    out = _extend_float(t, k_buffer, v_buffer)
    assert_close_to_reference(out, _expected_extend(t, k_buffer, v_buffer))
    assert torch.equal(k_buffer[t.out_cache_loc], t.k) and torch.equal(v_buffer[t.out_cache_loc], t.v)

    step = t.decode_step()
    k_before, v_before = k_buffer.clone(), v_buffer.clone()
    out = _decode_float(t, step, k_buffer, v_buffer)
    k_before[step["loc"]], v_before[step["loc"]] = step["key"], step["value"]
    assert torch.equal(k_buffer, k_before) and torch.equal(v_buffer, v_before)
    assert_close_to_reference(
        out,
        reference_decode(
            step["query"], k_buffer, v_buffer, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, 0.0
        ),
    )


def test_int32_and_int64_indices_give_identical_results(kernel_variant):
    t = Batch(heads=4, heads_kv=4, head_dim=32, dtype=torch.bfloat16, prefix=[17, 3], extend=[9, 30], seed=2)
    k32, v32 = t.float_cache()
    k64, v64 = k32.clone(), v32.clone()
    out32 = _extend_float(t, k32, v32)
    out64 = _extend_float(t, k64, v64, **t.as_int64())
    assert torch.equal(out32, out64) and torch.equal(k32, k64)

    step = t.decode_step()
    step64 = dict(step, loc=step["loc"].int(), seq_lens=step["seq_lens"].int(), attn_logits=step["attn_logits"].clone())
    dec32 = _decode_float(t, step, k32, v32)
    dec64 = _decode_float(t, step64, k64, v64, req_to_token=t.req_to_token.long())
    assert torch.equal(dec32, dec64) and torch.equal(k32, k64) and torch.equal(v32, v64)


@pytest.mark.parametrize("k_scale,v_scale", [(0.02, 0.03), (DYN, DYN)], ids=["static", "dynamic"])
def test_int8_operators_take_sglangs_tensors(kernel_variant, k_scale, v_scale):
    t = Batch(heads=8, heads_kv=2, head_dim=64, dtype=torch.bfloat16, prefix=[12, 0, 33], extend=[5, 9, 2], seed=3)
    kf, vf = t.float_cache()
    k_buffer, k_sb = quantize_int8(kf, None)
    v_buffer, v_sb = quantize_int8(vf, None)
    if not math.isnan(k_scale):
        k_buffer, v_buffer = quantize_int8(kf, k_scale)[0], quantize_int8(vf, v_scale)[0]
    out = torch.empty(t.q.shape[0], t.heads, t.head_dim, dtype=t.dtype)
    OPS.extend_attention_int8_cpu(
        t.q,
        t.k,
        t.v,
        out,
        k_buffer,
        v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.extend_seq_lens,
        t.extend_start_loc,
        max(t.extend),
        t.sm_scale,
        0.0,
        k_sb,
        v_sb,
        k_scale,
        v_scale,
    )
    # The prefix as the cache holds it, the new tokens as given.
    kd, vd = dequantize_int8(k_buffer, k_sb, k_scale), dequantize_int8(v_buffer, v_sb, v_scale)
    assert_close_to_reference(
        out,
        reference_extend(
            t.q,
            t.k,
            t.v,
            kd,
            vd,
            t.req_to_token,
            t.req_pool_indices,
            t.seq_lens,
            t.extend_seq_lens,
            t.extend_start_loc,
            t.sm_scale,
            0.0,
        ),
    )
    step = t.decode_step()
    dec = torch.empty(len(t.prefix), t.heads, t.head_dim, dtype=t.dtype)
    OPS.decode_attention_int8_cpu(
        step["query"],
        k_buffer,
        v_buffer,
        dec,
        step["key"],
        step["value"],
        step["loc"],
        step["attn_logits"],
        t.req_to_token,
        t.req_pool_indices,
        step["seq_lens"],
        t.sm_scale,
        0.0,
        k_sb,
        v_sb,
        k_scale,
        v_scale,
    )
    kd, vd = dequantize_int8(k_buffer, k_sb, k_scale), dequantize_int8(v_buffer, v_sb, v_scale)
    assert_close_to_reference(
        dec,
        reference_decode(step["query"], kd, vd, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, 0.0),
    )


# ---- int8 extend: the new tokens as given -----------------------------------------------------


@pytest.mark.parametrize(
    "k_scale,v_scale", [(0.01, 0.01), (DYN, DYN), (0.01, DYN)], ids=["static-0.01", "dynamic", "static-K-dynamic-V"]
)
def test_int8_extend_attends_its_new_tokens_as_given(kernel_variant, k_scale, v_scale):
    """With no prefix every key is a new token, so int8 extend must equal float extend.

    A static scale of 0.01 clips unit-normal K/V at 1.27: reading the new
    tokens back from the cache would be off by O(1). The cache still gets the
    quantized rows, and the following decode reads those.
    """
    t = Batch(heads=4, heads_kv=2, head_dim=32, dtype=torch.float32, prefix=[0, 0], extend=[20, 37], seed=4)
    kf, vf = t.float_cache()
    float_out = _extend_float(t, kf.clone(), vf.clone())
    k_buffer = torch.zeros(t.num_slots, t.heads_kv, t.head_dim, dtype=torch.int8)
    v_buffer = torch.zeros_like(k_buffer)
    k_sb, v_sb = torch.full((t.num_slots, t.heads_kv), DYN), torch.full((t.num_slots, t.heads_kv), DYN)
    out = torch.empty_like(float_out)
    OPS.extend_attention_int8_cpu(
        t.q,
        t.k,
        t.v,
        out,
        k_buffer,
        v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.extend_seq_lens,
        t.extend_start_loc,
        max(t.extend),
        t.sm_scale,
        0.0,
        k_sb,
        v_sb,
        k_scale,
        v_scale,
    )
    # Two float32 computations of one value (different summation order), each within the tolerance of float64.
    tol = TOLERANCES[torch.float32]
    torch.testing.assert_close(out, float_out, atol=2 * tol["atol"], rtol=2 * tol["rtol"])

    # The cache holds the quantized rows (and, dynamic, their scales).
    k_q, k_s = quantize_int8(t.k, None if math.isnan(k_scale) else k_scale)
    v_q, v_s = quantize_int8(t.v, None if math.isnan(v_scale) else v_scale)
    assert torch.equal(k_buffer[t.out_cache_loc], k_q) and torch.equal(v_buffer[t.out_cache_loc], v_q)
    if math.isnan(k_scale):
        assert torch.equal(k_sb[t.out_cache_loc], k_s)

    # The next decode step reads them quantized.
    step = t.decode_step()
    dec = torch.empty(2, t.heads, t.head_dim)
    OPS.decode_attention_int8_cpu(
        step["query"],
        k_buffer,
        v_buffer,
        dec,
        step["key"],
        step["value"],
        step["loc"],
        step["attn_logits"],
        t.req_to_token,
        t.req_pool_indices,
        step["seq_lens"],
        t.sm_scale,
        0.0,
        k_sb,
        v_sb,
        k_scale,
        v_scale,
    )
    kd, vd = dequantize_int8(k_buffer, k_sb, k_scale), dequantize_int8(v_buffer, v_sb, v_scale)
    expected = reference_decode(
        step["query"], kd, vd, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, 0.0
    )
    assert_close_to_reference(dec, expected)
    if k_scale == 0.01:
        # Proof that the cache really is the quantized one: the float values give another answer.
        kf[t.out_cache_loc], vf[t.out_cache_loc] = t.k, t.v
        kf[step["loc"]], vf[step["loc"]] = step["key"], step["value"]
        unquantized = reference_decode(
            step["query"], kf, vf, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, 0.0
        )
        assert (unquantized - expected).abs().max() > 0.05


# ---- soft cap at any cap -------------------------------------------------------------------------


@pytest.mark.parametrize("cap", [1e-3, 1.0, 30.0, 1e3, 1e6, 1e30], ids=lambda c: f"cap{c:g}")
def test_soft_cap_is_exact_at_any_cap(kernel_variant, cap):
    """cap * tanh(s / cap) against float64 at the float32 tolerance, from caps that flatten every score to
    caps far above them (where a cancelling tanh formula loses ~cap * 2^-24 per score)."""
    t = Batch(heads=4, heads_kv=1, head_dim=64, dtype=torch.float32, prefix=[70, 9], extend=[21, 40], seed=5)
    # Scores ~N(0, 1) (sm_scale 1/sqrt(D), as tolerances.py assumes): the cap flattens them at 1e-3, shapes them at
    # 1 and 30, and must leave them alone (to float32 accuracy) from 1e3 up.
    k_buffer, v_buffer = t.float_cache()
    out = _extend_float(t, k_buffer, v_buffer, logit_cap=cap)
    expected = _expected_extend(t, k_buffer, v_buffer, logit_cap=cap)
    assert_close_to_reference(out, expected)
    step = t.decode_step()
    dec = _decode_float(t, step, k_buffer, v_buffer, logit_cap=cap)
    expected_dec = reference_decode(
        step["query"], k_buffer, v_buffer, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, cap
    )
    assert_close_to_reference(dec, expected_dec)
    err = max((out.double() - expected).abs().max().item(), (dec.double() - expected_dec).abs().max().item())
    print(f"\nsoft cap {cap:g}: max abs error vs float64 {err:.2e}")


# ---- memory overlap -------------------------------------------------------------------------------


def test_fused_kv_pool_halves_and_disjoint_views_work(kernel_variant):
    """K and V as the two halves of one [N, 2, H_kv, D] pool, query and output as disjoint column ranges of one
    buffer: they share a storage but no element, and must work."""
    t = Batch(heads=4, heads_kv=2, head_dim=16, dtype=torch.float32, prefix=[8, 3], extend=[5, 6], seed=6)
    kv = t.randn(t.num_slots, 2, t.heads_kv, t.head_dim)
    k_buffer, v_buffer = kv[:, 0], kv[:, 1]
    out = _extend_float(t, k_buffer, v_buffer)
    assert_close_to_reference(out, _expected_extend(t, k_buffer, v_buffer))
    step = t.decode_step()
    qo = torch.full((2, t.heads, 2 * t.head_dim), float("nan"))
    qo[..., : t.head_dim] = step["query"]
    step["query"] = qo[..., : t.head_dim]
    out = qo[..., t.head_dim :]
    OPS.decode_attention_cpu(
        step["query"],
        k_buffer,
        v_buffer,
        out,
        step["key"],
        step["value"],
        step["loc"],
        step["attn_logits"],
        t.req_to_token,
        t.req_pool_indices,
        step["seq_lens"],
        t.sm_scale,
        0.0,
    )
    assert_close_to_reference(
        out,
        reference_decode(
            step["query"], k_buffer, v_buffer, t.req_to_token, t.req_pool_indices, step["seq_lens"], t.sm_scale, 0.0
        ),
    )

    # int8: one fused scale buffer [N, 2, H_kv] for K and V, written in dynamic mode.
    kv8 = torch.zeros(t.num_slots, 2, t.heads_kv, t.head_dim, dtype=torch.int8)
    scales = torch.ones(t.num_slots, 2, t.heads_kv)
    step = t.decode_step()
    dec = torch.empty(2, t.heads, t.head_dim)
    OPS.decode_attention_int8_cpu(
        step["query"],
        kv8[:, 0],
        kv8[:, 1],
        dec,
        step["key"],
        step["value"],
        step["loc"],
        step["attn_logits"],
        t.req_to_token,
        t.req_pool_indices,
        step["seq_lens"],
        t.sm_scale,
        0.0,
        scales[:, 0],
        scales[:, 1],
        DYN,
        DYN,
    )
    assert torch.equal(kv8[step["loc"], 0], quantize_int8(step["key"], None)[0])
    assert torch.equal(scales[step["loc"], 1], quantize_int8(step["value"], None)[1])


def test_one_tensor_for_both_written_scale_buffers_is_refused(kernel_variant):
    t = Batch(heads=2, heads_kv=1, head_dim=8, dtype=torch.float32, prefix=[4], extend=[1], seed=7)
    k_buffer = torch.zeros(t.num_slots, 1, 8, dtype=torch.int8)
    v_buffer = torch.zeros_like(k_buffer)
    scales = torch.ones(t.num_slots, 1)
    step = t.decode_step()
    before = [x.clone() for x in (k_buffer, v_buffer, scales)]
    dec = torch.full((1, 2, 8), 7.0)
    with pytest.raises(RuntimeError, match=r"decode_attention_int8_cpu: k_scale_buf shares memory with v_scale_buf"):
        OPS.decode_attention_int8_cpu(
            step["query"],
            k_buffer,
            v_buffer,
            dec,
            step["key"],
            step["value"],
            step["loc"],
            step["attn_logits"],
            t.req_to_token,
            t.req_pool_indices,
            step["seq_lens"],
            t.sm_scale,
            0.0,
            scales,
            scales,
            DYN,
            DYN,
        )
    for a, b in zip((k_buffer, v_buffer, scales), before):
        assert torch.equal(a, b)
    assert torch.all(dec == 7.0)
    out = torch.full((1, 2, 8), 7.0)
    with pytest.raises(RuntimeError, match=r"extend_attention_int8_cpu: k_scale_buf shares memory with v_scale_buf"):
        OPS.extend_attention_int8_cpu(
            t.q,
            t.k,
            t.v,
            out,
            k_buffer,
            v_buffer,
            t.req_to_token,
            t.req_pool_indices,
            t.seq_lens,
            t.extend_seq_lens,
            t.extend_start_loc,
            1,
            t.sm_scale,
            0.0,
            scales,
            scales,
            DYN,
            DYN,
        )
    for a, b in zip((k_buffer, v_buffer, scales), before):
        assert torch.equal(a, b)
    assert torch.all(out == 7.0)


@pytest.mark.variant_independent
@pytest.mark.parametrize(
    "name", ["expanded o_extend", "o_extend over q_extend", "o_extend over k_buffer", "o_extend over extend_start_loc"]
)
def test_extend_refuses_overlapping_output(kernel_variant, name):
    t = Batch(heads=2, heads_kv=2, head_dim=8, dtype=torch.float32, prefix=[3, 2], extend=[2, 2], seed=8)
    k_buffer, v_buffer = t.float_cache()
    tokens = t.q.shape[0]
    start_loc = t.extend_start_loc
    if name == "expanded o_extend":
        out = torch.zeros(1, 2, 8).expand(tokens, 2, 8)
        message = "o_extend has overlapping elements"
    elif name == "o_extend over q_extend":
        out = t.q
        message = "o_extend shares memory with q_extend"
    elif name == "o_extend over k_buffer":
        out = k_buffer[:tokens]
        message = "o_extend shares memory with k_buffer"
    else:
        base = torch.zeros(tokens * 2 * 8, dtype=torch.float32)
        start_loc = base.view(torch.int32)[:2]
        start_loc.copy_(t.extend_start_loc)
        out = base.view(tokens, 2, 8)
        message = "o_extend shares memory with extend_start_loc"
    watched = [x.clone() for x in (out, k_buffer, v_buffer, t.q)]
    with pytest.raises(RuntimeError, match=f"extend_attention_cpu: {message}"):
        OPS.extend_attention_cpu(
            t.q,
            t.k,
            t.v,
            out,
            k_buffer,
            v_buffer,
            t.req_to_token,
            t.req_pool_indices,
            t.seq_lens,
            t.extend_seq_lens,
            start_loc,
            2,
            t.sm_scale,
            0.0,
        )
    for a, b in zip((out, k_buffer, v_buffer, t.q), watched):
        assert torch.equal(a, b)
