"""Attention over a float8_e4m3fn KV cache: decode_attention_fp8_cpu and extend_attention_fp8_cpu.

The reference dequantizes the very bytes the kernel reads with torch's own
conversion (``cache.to(float64) * scale``) and runs the float64 attention of
tests/reference.py; the new rows decode writes are compared bit for bit with
what SGLang's fp8 pool writes (``x.clone().div_(scale).to(float8_e4m3fn)``).
The decode kernel reads codes without their 2^120 rebias and folds it into
the query and the probabilities (exactly, for queries below 2^7; otherwise
partly into the scores), and finds NaN codes with a separate scan: the tests
aim at both.
"""

from __future__ import annotations

import math

import pytest
import torch

import opcall
import rvv_attn
from cases.decode import decode_block, make_case
from cases.extend import Case as ExtendCase
from reference import decode_attention, decode_attention_options, extend_attention_options
from reference import fp8_pool_quantize as pool_quantize
from tolerances import TOLERANCES, assert_close_to_reference

DECODE = rvv_attn.ops.decode_attention_fp8_cpu
EXTEND = rvv_attn.ops.extend_attention_fp8_cpu
FP8 = torch.float8_e4m3fn


def dequantized(cache: torch.Tensor, scale: float) -> torch.Tensor:
    """The cache's values in float64, by torch's own conversion."""
    return cache.view(FP8).to(torch.float64) * scale


def fp8_cache(shape, scale: float, g: torch.Generator, spread: float = 20.0) -> torch.Tensor:
    """Codes N(0, 1) * spread (most of e4m3's range, none past 448), values codes * scale: the tests keep
    scales near 1 / spread, so values are about unit normal, as tolerances.py assumes."""
    return pool_quantize(torch.randn(*shape, generator=g) * (spread * scale), scale)


def decode_call(c, k_scale: float, v_scale: float, **options) -> dict:
    args = dict(c.named_args(), k_scale=k_scale, v_scale=v_scale, **options)
    return args


def run_decode(args: dict) -> None:
    opcall.call_documented("decode_attention_fp8_cpu", args)


def make_fp8_decode(lens, heads, heads_kv, d, dv, dtype, k_scale, v_scale, seed=0, splits=3, write=True):
    c = make_case(lens, heads, heads_kv, d, dv, dtype, splits, seed=seed)
    g = torch.Generator().manual_seed(seed + 50)
    slots = c.k_buffer.shape[0]
    c.k_buffer = fp8_cache((slots, heads_kv, d), k_scale, g, spread=20.0)
    c.v_buffer = fp8_cache((slots, heads_kv, dv), v_scale, g, spread=20.0)
    c.key = (torch.randn(len(lens), heads_kv, d, generator=g) * 20 * k_scale).to(dtype)
    c.value = (torch.randn(len(lens), heads_kv, dv, generator=g) * 20 * v_scale).to(dtype)
    if not write:
        c.key = c.value = None
    return c


def expected_decode(args: dict, **options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(k cache, v cache, output float64) after the pool's write and float64 attention over the dequantized cache."""
    k, v = args["k_buffer"].clone(), args["v_buffer"].clone()
    if args["key"] is not None:
        for b, slot in enumerate(args["loc"].tolist()):
            k[slot] = pool_quantize(args["key"][b], args["k_scale"]).view(k.dtype)
            v[slot] = pool_quantize(args["value"][b], args["v_scale"]).view(v.dtype)
    # Without options, the plain reference: the options' one maps a row's NaN weights to 0 (meant for rows
    # that see no key), and a NaN code must give NaN.
    reference = decode_attention_options if options else decode_attention
    out = reference(
        args["query"],
        dequantized(k, args["k_scale"]),
        dequantized(v, args["v_scale"]),
        args["req_to_token"],
        args["req_pool_indices"],
        args["seq_lens"],
        args["sm_scale"],
        args["logit_cap"],
        **options,
    )
    return k, v, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    "heads,heads_kv,d,dv",
    [(8, 2, 64, 64), (4, 4, 32, 16), (12, 2, 36, 20), (16, 1, 48, 40)],
    ids=["gqa4", "mha", "group6-d36", "group16"],
)
def test_decode_matches_the_dequantized_reference(kernel_variant, dtype, heads, heads_kv, d, dv):
    n = decode_block()
    # Lengths around the KV block and split boundaries; the new token is each sequence's last.
    c = make_fp8_decode([1, n, n + 1, 3 * n + 5], heads, heads_kv, d, dv, dtype, 0.05, 0.02, seed=heads + d)
    args = decode_call(c, 0.05, 0.02)
    k, v, ref = expected_decode(args)
    run_decode(args)
    assert torch.equal(args["k_buffer"].view(torch.uint8), k.view(torch.uint8)), "k_buffer: not the pool's codes"
    assert torch.equal(args["v_buffer"].view(torch.uint8), v.view(torch.uint8)), "v_buffer: not the pool's codes"
    assert_close_to_reference(args["output"], ref)


def test_decode_reads_a_uint8_cache_without_writing(kernel_variant):
    """SGLang's pool allocates uint8 and passes key = value = None (it wrote the rows itself)."""
    c = make_fp8_decode([7, 40], 8, 2, 32, 32, torch.bfloat16, 1.0, 1.0, seed=3, write=False)
    c.k_buffer, c.v_buffer = c.k_buffer.view(torch.uint8), c.v_buffer.view(torch.uint8)
    args = decode_call(c, 1.0, 1.0)
    _, _, ref = expected_decode(args)
    run_decode(args)  # opcall: nothing in the caches may change
    assert_close_to_reference(args["output"], ref)


@pytest.mark.parametrize(
    "options",
    [
        dict(sliding_window_size=9),
        dict(logit_cap=30.0),
        dict(sinks=True),
        dict(is_cross_attn=True, encoder_lens=[5, 0, 12]),
        dict(encoder_lens=[3, 4, 2]),
    ],
    ids=["window", "cap", "sinks", "cross", "encoder"],
)
def test_decode_options_on_an_fp8_cache(kernel_variant, options):
    c = make_fp8_decode([9, 30, 41], 8, 2, 32, 24, torch.float32, 0.1, 0.05, seed=11)
    enc = options.get("encoder_lens")
    if enc is not None:
        # The encoder's tokens come first in each pool row: room for them before the decoder's.
        m = c.req_to_token
        shifted = torch.full((m.shape[0], m.shape[1] + max(enc)), 10**6, dtype=m.dtype)
        for b, row in enumerate(c.req_pool_indices.tolist()):
            spare = torch.randperm(c.k_buffer.shape[0])[: enc[b]]  # any slots: only read
            shifted[row, : enc[b]] = spare
            shifted[row, enc[b] : enc[b] + m.shape[1]] = m[row]
        c.req_to_token = shifted
    args = decode_call(c, 0.1, 0.05)
    reference_options = {}
    if "sliding_window_size" in options:
        args["sliding_window_size"] = reference_options["window"] = options["sliding_window_size"]
    if "logit_cap" in options:
        args["logit_cap"] = options["logit_cap"]
    if options.get("sinks"):
        args["sinks"] = reference_options["sinks"] = torch.randn(8, generator=torch.Generator().manual_seed(4))
    if enc is not None:
        args["encoder_lens"] = reference_options["encoder_lens"] = torch.tensor(enc)
    if options.get("is_cross_attn"):
        args["is_cross_attn"] = reference_options["cross"] = True
        args["key"] = args["value"] = None  # the encoder's K/V are cached already
    _, _, ref = expected_decode(args, **reference_options)
    run_decode(args)
    assert_close_to_reference(args["output"], ref)


@pytest.mark.parametrize("q_magnitude", [200.0, 1000.0], ids=["q200", "q1000"])
def test_decode_large_queries_fold_less_of_the_rebias(kernel_variant, q_magnitude):
    """Query entries (times sm_scale * k_scale) of 2^7 and more cannot take all of 2^120 without overflowing:
    the kernel moves less into the query table and the rest onto the scores. K codes of ~0.3 / q_magnitude
    (subnormal codes) keep the scores moderate, so the softmax is not one-hot and the result says whether
    every key was scaled right."""
    c = make_fp8_decode([50, 70], 8, 2, 32, 32, torch.float32, 1.0, 0.05, seed=21, write=False)
    c.query = c.query * q_magnitude
    g = torch.Generator().manual_seed(5)
    c.k_buffer = pool_quantize(torch.randn(c.k_buffer.shape, generator=g) * (0.3 / q_magnitude), 1.0)
    c.sm_scale = 1.0
    args = decode_call(c, 1.0, 0.05)
    _, _, ref = expected_decode(args)
    run_decode(args)
    assert_close_to_reference(args["output"], ref)


def test_decode_nan_codes_give_nan_where_the_dequantized_cache_does(kernel_variant):
    """A NaN code in a K row makes its token's score NaN (every head reading that KV head: all NaN output);
    in a V row, that column of the output NaN. Everything else stays finite and right."""
    n = decode_block()
    c = make_fp8_decode([2 * n + 3, n, 5], 4, 2, 32, 16, torch.float32, 0.05, 0.05, seed=31, write=False)
    m, pools = c.req_to_token, c.req_pool_indices
    k_slot = int(m[pools[0], n + 1])  # sequence 0, KV head 1, second block
    c.k_buffer[k_slot, 1, 7] = torch.tensor(0xFF, dtype=torch.uint8).view(FP8)
    v_slot = int(m[pools[1], 3])  # sequence 1, KV head 0, column 9
    c.v_buffer[v_slot, 0, 9] = torch.tensor(0x7F, dtype=torch.uint8).view(FP8)
    args = decode_call(c, 0.05, 0.05)
    _, _, ref = expected_decode(args)
    run_decode(args)
    out = args["output"]
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN where the reference has none, or none where it has"
    assert torch.isnan(out[0, 2:]).all() and not torch.isnan(out[0, :2]).any()
    assert torch.isnan(out[1, :2, 9]).all() and torch.isnan(out[1]).sum() == 2
    finite = ~torch.isnan(ref)
    torch.testing.assert_close(out.double()[finite], ref[finite], **TOLERANCES[out.dtype])


# ---- extend --------------------------------------------------------------------------------------
def make_fp8_extend(case: ExtendCase, k_scale: float, v_scale: float) -> dict:
    case = case.build()
    a = dict(case.inputs)
    g = torch.Generator().manual_seed(case.seed + 70)
    a["k_buffer"] = fp8_cache(a["k_buffer"].shape, k_scale, g, spread=20.0)
    a["v_buffer"] = fp8_cache(a["v_buffer"].shape, v_scale, g, spread=20.0)
    a["k_scale"], a["v_scale"] = k_scale, v_scale
    return a


def expected_extend(a: dict, **options) -> torch.Tensor:
    return extend_attention_options(
        a["q_extend"],
        a["k_extend"].double(),
        a["v_extend"].double(),
        dequantized(a["k_buffer"], a["k_scale"]),
        dequantized(a["v_buffer"], a["v_scale"]),
        a["req_to_token"],
        a["req_pool_indices"],
        a["seq_lens"],
        a["extend_seq_lens"],
        a["extend_start_loc"],
        a["sm_scale"],
        a["logit_cap"],
        **options,
    )


def run_extend(a: dict) -> None:
    opcall.call_documented("extend_attention_fp8_cpu", a)


def check_extend_rows(a: dict, ref: torch.Tensor) -> None:
    rows = opcall.owned_rows(a)
    assert_close_to_reference(a["o_extend"][rows], ref[rows])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_extend_matches_the_dequantized_reference(kernel_variant, dtype):
    block_m, block_n, _ = rvv_attn.ops.extend_attention_blocking(32, 32)
    case = ExtendCase(prefix=[0, block_n + 3, 2 * block_n], extend=[5, block_m + 1, 3], dtype=dtype, seed=41)
    a = make_fp8_extend(case, 0.05, 0.02)
    ref = expected_extend(a)
    run_extend(a)  # opcall: the caches are read only
    check_extend_rows(a, ref)


@pytest.mark.parametrize(
    "options",
    [dict(window=6), dict(cap=20.0), dict(sinks=True), dict(cross=True)],
    ids=["window", "cap", "sinks", "cross"],
)
def test_extend_options_on_an_fp8_cache(kernel_variant, options):
    case = ExtendCase(prefix=[13, 30], extend=[9, 4], heads=8, heads_kv=2, head_dim=40, head_dim_v=24, seed=43)
    a = make_fp8_extend(case, 0.1, 0.1)
    reference_options = {}
    if options.get("cross"):
        # The encoder's tokens are each sequence's cached ones: map columns 0 .. enc - 1.
        a["is_cross_attn"] = reference_options["cross"] = True
        a["encoder_lens"] = reference_options["encoder_lens"] = torch.tensor([13, 30])
    if "window" in options:
        a["sliding_window_size"] = reference_options["window"] = options["window"]
    if "cap" in options:
        a["logit_cap"] = options["cap"]
    if options.get("sinks"):
        a["sinks"] = reference_options["sinks"] = torch.randn(8, generator=torch.Generator().manual_seed(6))
    ref = expected_extend(a, **reference_options)
    run_extend(a)
    check_extend_rows(a, ref)


# ---- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), float("nan"), 1e39], ids=["0", "neg", "inf", "nan", "1e39"])
def test_a_bad_scale_is_refused_by_name_and_nothing_is_written(kernel_variant, bad):
    c = make_fp8_decode([5, 9], 4, 2, 16, 16, torch.float32, 1.0, 1.0, seed=51)
    for side in ("k_scale", "v_scale"):
        args = decode_call(c, 1.0, 1.0)
        args[side] = bad
        with pytest.raises(RuntimeError, match=rf"decode_attention_fp8_cpu: {side} = .* is not a valid scale"):
            opcall.call(DECODE, args, {})  # {}: nothing may change
    case = ExtendCase(prefix=[3], extend=[2], seed=52)
    a = make_fp8_extend(case, 1.0, 1.0)
    a["v_scale"] = bad
    with pytest.raises(RuntimeError, match=r"extend_attention_fp8_cpu: v_scale = .* is not a valid scale"):
        opcall.call(EXTEND, a, {})


def test_wrong_dtypes_are_refused_by_name(kernel_variant):
    c = make_fp8_decode([5, 9], 4, 2, 16, 16, torch.bfloat16, 1.0, 1.0, seed=53)
    args = decode_call(c, 1.0, 1.0)
    with pytest.raises(RuntimeError, match=r"decode_attention_fp8_cpu: k_buffer has dtype Char; .*float8_e4m3fn"):
        opcall.call(DECODE, dict(args, k_buffer=args["k_buffer"].view(torch.int8)), {})
    with pytest.raises(RuntimeError, match=r"decode_attention_fp8_cpu: key has dtype Float but query has BFloat16"):
        opcall.call(DECODE, dict(args, key=args["key"].float()), {})
    # The float operator points an fp8 cache to these operators.
    float_args = {k: v for k, v in args.items() if k not in ("k_scale", "v_scale")}
    with pytest.raises(RuntimeError, match=r"k_buffer is an fp8 KV cache .*decode_attention_fp8_cpu"):
        opcall.call(rvv_attn.ops.decode_attention_cpu, float_args, {})


def test_decode_set_kv_buffer_quantizes_into_an_fp8_cache_as_the_pool_does(kernel_variant):
    """SGLang's pool without a scale: torch's own float -> float8_e4m3fn conversion, bit for bit, values past
    448 included (saturated or NaN as this torch converts them)."""
    g = torch.Generator().manual_seed(71)
    k_buffer = torch.zeros(12, 2, 16, dtype=FP8)
    v_buffer = torch.zeros(12, 2, 8, dtype=FP8)
    key = (torch.randn(3, 2, 16, generator=g) * 200).to(torch.bfloat16)
    value = (torch.randn(3, 2, 8, generator=g) * 200).to(torch.bfloat16)
    loc = torch.tensor([7, 2, 7])  # slot 7 twice: the last row stays
    args = dict(k_buffer=k_buffer, v_buffer=v_buffer, key=key, value=value, loc=loc)
    opcall.call(rvv_attn.ops.decode_set_kv_buffer, args, opcall.documented_writes("decode_set_kv_buffer", args))
    for buffer, rows in ((k_buffer, key), (v_buffer, value)):
        expected = torch.zeros_like(buffer)
        for b, slot in enumerate(loc.tolist()):
            expected[slot] = rows[b].to(FP8)
        got, want = buffer.view(torch.uint8), expected.view(torch.uint8)
        nan = (want & 0x7F) == 0x7F
        assert torch.equal(got[~nan], want[~nan]) and bool(((got[nan] & 0x7F) == 0x7F).all())


def test_mla_decode_on_an_fp8_latent_cache(kernel_variant):
    """SGLang's MLA pool in fp8: one latent head of D = 576 (512 + 64 rope), V the K rows' first 512 columns.
    Rows longer than one scan piece at every VLEN (576 bytes), and one NaN code in a V column of the latent
    part, which must reach only that output column."""
    g = torch.Generator().manual_seed(81)
    rank, rope, heads, lens, slots = 512, 64, 8, [19, 6], 40
    k_buffer = pool_quantize(torch.randn(slots, 1, rank + rope, generator=g) * 0.3, 0.02)
    v_buffer = k_buffer[..., :rank]
    free = torch.randperm(slots, generator=g).tolist()
    req_to_token = torch.zeros(2, max(lens) + 1, dtype=torch.int32)
    for b, n in enumerate(lens):
        req_to_token[b, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=torch.int32)
    k_buffer[int(req_to_token[1, 2]), 0, 300] = torch.tensor(0x7F, dtype=torch.uint8).view(FP8)
    key = (torch.randn(2, 1, rank + rope, generator=g) * 0.3).bfloat16()
    loc = torch.tensor([int(req_to_token[b, n - 1]) for b, n in enumerate(lens)])
    args = dict(
        query=(torch.randn(2, heads, rank + rope, generator=g) * 0.3).bfloat16(),
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        output=torch.empty(2, heads, rank, dtype=torch.bfloat16),
        key=key,
        value=key[..., :rank],
        loc=loc,
        attn_logits=torch.empty(2, heads, 4, rank + 1),
        req_to_token=req_to_token,
        req_pool_indices=torch.arange(2),
        seq_lens=torch.tensor(lens),
        sm_scale=1 / math.sqrt(rank + rope),
        logit_cap=0.0,
        k_scale=0.02,
        v_scale=0.02,
    )
    expected_k = k_buffer.clone()
    expected_k[loc] = pool_quantize(key, 0.02)
    run_decode(args)
    assert torch.equal(k_buffer.view(torch.uint8), expected_k.view(torch.uint8)), "the latent rows written"
    ref = decode_attention(
        args["query"],
        dequantized(k_buffer, 0.02),
        dequantized(v_buffer, 0.02),
        req_to_token,
        args["req_pool_indices"],
        args["seq_lens"],
        args["sm_scale"],
        0.0,
    )
    out = args["output"]
    # The NaN code sits in sequence 1's K row, so in its score too: every head of sequence 1 is NaN.
    assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()
    assert_close_to_reference(out[0], ref[0])
