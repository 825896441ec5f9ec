"""End to end: the small Llama model, and its gpt-oss-like variant, generating through both attention backends.

A tiny configuration (2 layers, hidden 64, 4 query / 2 KV heads, head dim
16) keeps each test to a few seconds under QEMU. The gpt-oss-like one
(GPT_OSS_CFG) adds an 8-token sliding window in layer 0 and attention sinks
in both layers; the prompts and generations below outrun the window, in
prefill chunks over a cached prefix and in decode. The RVV backend runs the
active kernel variant (the VLEN's RVV build in the emulated sessions, where
conftest makes sure it is active; portable on the host).

Logits are compared only while both runs have fed the same tokens: after a
greedy choice differs the contexts differ and so do all later logits.

Tolerances on logits (|logit| <= ~4 here):

* float32: both backends compute attention in float32; the operators match a
  float64 reference within F32_ACCUMULATION_ATOL (5e-6) per call, the
  torch-native backend is closer still, and every projection has unit gain
  (weights N(0, 1/fan_in)). A token's logits pass two attention layers:
  allowance 4 x 5e-6 = 2e-5 (measured over 6 seeds: <= 1.7e-6). A missed key or wrong
  scale moves logits by 1e-2 or more.
* bfloat16 / float16: both backends round the same float32 attention
  result to the dtype once, so they differ only where a value sits at a
  rounding boundary, by one ulp, and the model's own roundings carry that
  on. The logits are themselves bfloat16/float16 values, so the allowance is
  counted in their ulps at the largest |logit|: 4 ulps (bfloat16 2**-7,
  float16 2**-10 relative to the power of two below it). Measured: 0 to 1
  ulp. For scale: the bfloat16 model differs from the float32 model by ~3
  ulps.
* int8 cache vs float cache (same backend, float32 model): each cached K/V
  element is off by up to half a quantization step: s/2 with s = max|x|/127
  per row (dynamic) or the static scales of ModelConfig.static_kv_scales(),
  5 standard deviations / 127, i.e. ~0.03 for K (std 1.5) and ~0.02 for V.
  Through the softmax and two layers that moves logits by a few 1e-2
  (measured over 6 seeds: <= 0.047 dynamic, <= 0.087 static). Allowance 0.2;
  dropping or misplacing a token moves logits by 1.5 or more, reading
  codes with a wrong scale by more still.
* int8 cache, RVV vs torch-native: both quantize by the same rule (float32
  divide, round half to even), so the caches hold the same codes and scales
  and both read the current chunk unquantized from k/v: the float32
  allowance applies (measured over 6 seeds: <= 1.8e-6), and the greedy
  tokens must be identical.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from rvv_attn.serving.backends import make_backend
from rvv_attn.serving.generation import Engine, Request
from rvv_attn.serving.model import LlamaModel, ModelConfig
from rvv_attn.serving.pools import Int8Scales, PoolExhaustedError, ReqToTokenPool, make_kv_pool
from tolerances import F32_ACCUMULATION_ATOL

CFG = ModelConfig(
    vocab_size=128, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16, intermediate_size=128
)
GPT_OSS_CFG = dataclasses.replace(CFG, sliding_window=8, attention_sinks=True)
F32_LOGIT_ATOL = 4 * F32_ACCUMULATION_ATOL
ULPS_ALLOWED = 4
INT8_LOGIT_ATOL = 0.2


def prompts(lens: list[int], seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, CFG.vocab_size, (n,), generator=g).tolist() for n in lens]


def make_engine(
    backend: str = "rvv",
    dtype: torch.dtype = torch.float32,
    kv_cache: str = "float",
    max_reqs: int = 4,
    max_context_len: int = 64,
    pool_tokens: int = 160,
    chunk_size: int = 8,
    max_running: int | None = None,
    seed: int = 0,
    cfg: ModelConfig = CFG,
) -> Engine:
    model = LlamaModel(cfg, dtype, seed=seed)
    kv_pool = make_kv_pool(
        kv_cache,
        pool_tokens,
        cfg.num_layers,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.head_dim,
        dtype,
        Int8Scales(*cfg.static_kv_scales()),
        shuffle_seed=1,
    )
    return Engine(
        model,
        make_backend(backend, cfg.num_heads, cfg.head_dim),
        ReqToTokenPool(max_reqs, max_context_len),
        kv_pool,
        chunk_size=chunk_size,
        max_running=max_running,
        keep_logits=True,
    )


def generate(engine: Engine, prompt_list: list[list[int]], new_tokens: list[int]) -> dict[str, Request]:
    for i, (p, n) in enumerate(zip(prompt_list, new_tokens)):
        engine.add_request(Request(f"r{i}", list(p), n))
    engine.run()
    # Every row and slot is back in the pools once all requests have finished.
    assert engine.kv_pool.available == engine.kv_pool.size and engine.req_pool.available == engine.req_pool.max_reqs
    return {r.rid: r for r in engine.finished}


def logits_while_inputs_agree(a: Request, b: Request) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs of logits computed from the same tokens: step i is fed outputs 0..i-1."""
    pairs = []
    for i, (la, lb) in enumerate(zip(a.logits, b.logits)):
        pairs.append((la, lb))
        if a.output[i] != b.output[i]:
            break
    return pairs


def assert_logits_close(a: dict[str, Request], b: dict[str, Request], atol: float) -> float:
    worst = 0.0
    for rid in a:
        pairs = logits_while_inputs_agree(a[rid], b[rid])
        assert pairs
        for la, lb in pairs:
            worst = max(worst, (la - lb).abs().max().item())
    assert worst <= atol, f"logits differ by {worst:.3g} > {atol:.3g}"
    return worst


# Three requests run at a time, so r3 is admitted when the first finishes and takes its slots;
# r1 (29 tokens, chunks of 8) extends a cached prefix three times.
LENS, NEW = [3, 29, 11, 2], [4, 3, 5, 6]


def test_rvv_and_torch_native_give_the_same_greedy_tokens_in_float32():
    rvv = generate(make_engine("rvv", max_running=3), prompts(LENS), NEW)
    native = generate(make_engine("torch_native", max_running=3), prompts(LENS), NEW)
    assert {rid: r.output for rid, r in rvv.items()} == {rid: r.output for rid, r in native.items()}
    assert [len(r.output) for r in rvv.values()] == sorted(NEW)  # finished in order of length
    assert_logits_close(rvv, native, F32_LOGIT_ATOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_rvv_and_torch_native_logits_agree_in_half_precision(dtype):
    rvv = generate(make_engine("rvv", dtype, max_running=3), prompts(LENS), NEW)
    native = generate(make_engine("torch_native", dtype, max_running=3), prompts(LENS), NEW)
    largest = max(logits.abs().max().item() for r in native.values() for logits in r.logits)
    mantissa_bits = {torch.bfloat16: 7, torch.float16: 10}[dtype]
    ulp = 2.0 ** (math.floor(math.log2(largest)) - mantissa_bits)
    assert_logits_close(rvv, native, ULPS_ALLOWED * ulp)


@pytest.mark.parametrize("kv_cache", ["int8-dynamic", "int8-static"])
def test_int8_cache_logits_stay_near_the_float_cache(kv_cache):
    float_cache = generate(make_engine("rvv", max_running=3), prompts(LENS), NEW)
    int8_cache = generate(make_engine("rvv", kv_cache=kv_cache, max_running=3), prompts(LENS), NEW)
    worst = assert_logits_close(int8_cache, float_cache, INT8_LOGIT_ATOL)
    assert worst > 0, "the int8 cache gave bit-identical logits: it cannot have been quantized"
    native = generate(make_engine("torch_native", kv_cache=kv_cache, max_running=3), prompts(LENS), NEW)
    assert {k: r.output for k, r in int8_cache.items()} == {k: r.output for k, r in native.items()}
    assert_logits_close(int8_cache, native, F32_LOGIT_ATOL)


# ---- the gpt-oss-like model: sliding-window and full layers, attention sinks -----------------------
# r1 (29 tokens) and r2 (11) outrun the 8-token window in prefill (r1 over cached prefixes, chunks of 8),
# r1, r2 and r3 in decode. Logit tolerances as above: window and sinks change which keys are summed, not
# the float32 arithmetic of a call, and every layer still runs one attention call per token.


# The int8 cache on the host only: under emulation test_backends' window4-sinks-int8 cases cover the int8
# operators with a window shorter than the prefix and sinks.
@pytest.mark.parametrize("kv_cache", ["float", pytest.param("int8-dynamic", marks=pytest.mark.host_only)])
def test_gpt_oss_model_gives_the_same_greedy_tokens_through_both_backends(kv_cache):
    assert max(n + m - 1 for n, m in zip(LENS, NEW)) > GPT_OSS_CFG.sliding_window
    rvv = generate(make_engine("rvv", kv_cache=kv_cache, max_running=3, cfg=GPT_OSS_CFG), prompts(LENS), NEW)
    native = generate(
        make_engine("torch_native", kv_cache=kv_cache, max_running=3, cfg=GPT_OSS_CFG), prompts(LENS), NEW
    )
    assert {rid: r.output for rid, r in rvv.items()} == {rid: r.output for rid, r in native.items()}
    assert_logits_close(rvv, native, F32_LOGIT_ATOL)


@pytest.mark.variant_independent
@pytest.mark.parametrize("without", ["window", "sinks"])
def test_gpt_oss_model_depends_on_its_window_and_sinks(without):
    # The reference backend alone: each feature changes the greedy tokens, so the agreement above is not
    # that of two backends both ignoring it. The weights are the same (sinks are drawn last).
    plain_cfg = dataclasses.replace(
        GPT_OSS_CFG, **({"sliding_window": 0} if without == "window" else {"attention_sinks": False})
    )
    gpt_oss = generate(make_engine("torch_native", max_running=3, cfg=GPT_OSS_CFG), prompts(LENS), NEW)
    plain = generate(make_engine("torch_native", max_running=3, cfg=plain_cfg), prompts(LENS), NEW)
    assert {rid: r.output for rid, r in gpt_oss.items()} != {rid: r.output for rid, r in plain.items()}


@pytest.mark.variant_independent
def test_gpt_oss_layers_alternate_and_carry_sinks():
    model = LlamaModel(dataclasses.replace(GPT_OSS_CFG, num_layers=4))
    assert [layer.attn.sliding_window_size for layer in model.layers] == [7, -1, 7, -1]  # SGLang's window - 1
    assert all(layer.attn.sinks.shape == (CFG.num_heads,) for layer in model.layers)
    llama = LlamaModel(CFG)
    assert all(layer.attn.sliding_window_size == -1 and layer.attn.sinks is None for layer in llama.layers)
    assert torch.equal(LlamaModel(GPT_OSS_CFG).lm_head, llama.lm_head)  # sinks drawn after every other weight


def test_chunked_prefill_matches_one_shot_prefill():
    one_shot = generate(make_engine(chunk_size=1000), prompts(LENS), NEW)
    chunked = generate(make_engine(chunk_size=5), prompts(LENS), NEW)
    assert make_engine(chunk_size=5).chunk_size < max(LENS)
    assert {k: r.output for k, r in one_shot.items()} == {k: r.output for k, r in chunked.items()}
    assert_logits_close(chunked, one_shot, F32_LOGIT_ATOL)


def test_slot_reuse_does_not_disturb_other_requests():
    # r0 runs long; r1 finishes early and r2, admitted only then, takes over r1's row and slots.
    lens, new = [20, 6, 9], [8, 2, 4]
    engine = make_engine(max_running=2)
    together = generate(engine, prompts(lens), new)
    first = engine.finished[0]
    assert first.rid == "r1"
    alone = {}
    for i in range(3):
        solo = generate(make_engine(), [prompts(lens)[i]], [new[i]])
        alone[f"r{i}"] = solo["r0"]
    assert {k: r.output for k, r in together.items()} == {k: r.output for k, r in alone.items()}
    assert_logits_close(together, alone, F32_LOGIT_ATOL)
    # Check the reuse happened: the pool hands back freed slots first, so replaying it shows r2's slots.
    replay = make_engine(max_running=2)
    for i, (p, n) in enumerate(zip(prompts(lens), new)):
        replay.add_request(Request(f"r{i}", p, n))
    r1_slots = set()
    while not replay.finished:
        replay.step()
        r1 = next((r for r in replay.running if r.rid == "r1"), None)
        if r1 is not None:
            r1_slots = set(replay.req_pool.req_to_token[r1.req_pool_idx, : r1.cached_len].tolist())
    replay.step()  # admits r2 and prefills it
    r2 = next(r for r in replay.running if r.rid == "r2")
    r2_slots = set(replay.req_pool.req_to_token[r2.req_pool_idx, : r2.cached_len].tolist())
    assert r2_slots & r1_slots, "r2 did not reuse any slot r1 freed"


def test_batch_mixing_very_different_lengths():
    lens, new = [1, 60, 2], [3, 2, 3]
    mixed = generate(make_engine(max_running=3, chunk_size=64, pool_tokens=128), prompts(lens, seed=5), new)
    native = generate(
        make_engine("torch_native", max_running=3, chunk_size=64, pool_tokens=128), prompts(lens, seed=5), new
    )
    assert {k: r.output for k, r in mixed.items()} == {k: r.output for k, r in native.items()}
    assert_logits_close(mixed, native, F32_LOGIT_ATOL)


# ---- errors leave the other requests intact --------------------------------------------------


def _reference_outputs(lens, new) -> dict[str, list[int]]:
    return {k: r.output for k, r in generate(make_engine(max_running=2), prompts(lens), new).items()}


def test_pool_exhaustion_is_a_clear_error_and_the_run_continues():
    lens, new = [7, 12], [5, 4]
    expected = _reference_outputs(lens, new)
    engine = make_engine(max_running=2, pool_tokens=40, chunk_size=64)
    for i, (p, n) in enumerate(zip(prompts(lens), new)):
        engine.add_request(Request(f"r{i}", p, n))
    engine.step()  # prefill both
    held = engine.kv_pool.alloc(engine.kv_pool.available)  # another user takes every free slot
    maps = engine.req_pool.req_to_token.clone()
    cached = [r.cached_len for r in engine.running]
    with pytest.raises(PoolExhaustedError, match=r"out of KV cache token slots: 2 requested, 0 free of 40"):
        engine.step()
    assert torch.equal(engine.req_pool.req_to_token, maps) and [r.cached_len for r in engine.running] == cached
    engine.kv_pool.free(held)
    engine.run()
    assert {r.rid: r.output for r in engine.finished} == expected


def test_request_longer_than_max_context_len_is_refused_and_others_run():
    lens, new = [7, 12], [5, 4]
    expected = _reference_outputs(lens, new)
    engine = make_engine(max_running=2, max_context_len=32)
    for i, (p, n) in enumerate(zip(prompts(lens), new)):
        engine.add_request(Request(f"r{i}", p, n))
    engine.step()
    with pytest.raises(
        ValueError,
        match=r"request 'long' is longer than max_context_len = 32: prompt 30 \+ "
        r"max_new_tokens 4 - 1 = 33 cache positions",
    ):
        engine.add_request(Request("long", prompts([30])[0], 4))
    assert [r.rid for r in engine.waiting] == []
    engine.run()
    assert {r.rid: r.output for r in engine.finished} == expected


def test_decode_before_prefill_is_a_clear_error_and_others_run():
    lens, new = [7, 12], [5, 4]
    expected = _reference_outputs(lens, new)
    engine = make_engine(max_running=2, chunk_size=10)
    for i, (p, n) in enumerate(zip(prompts(lens), new)):
        engine.add_request(Request(f"r{i}", p, n))
    engine.step()  # r0 fully prefilled (7), r1 only 3 of its 12 tokens
    r0, r1 = engine.running
    assert (r0.cached_len, r1.cached_len) == (7, 3)
    free = engine.kv_pool.available
    with pytest.raises(ValueError, match=r"request 'r1' has 3 of its 12 prompt tokens in the cache: decode needs"):
        engine.run_decode([r0, r1])
    assert engine.kv_pool.available == free and (r0.cached_len, r1.cached_len) == (7, 3) and len(r0.output) == 1
    engine.run()
    assert {r.rid: r.output for r in engine.finished} == expected


def test_decoding_a_token_gives_the_logits_of_prefilling_it():
    # The decode path (positions, the slot map, the new token's K/V) must see exactly what a prefill of
    # the same tokens sees: prefill the prompt plus all generated tokens but the last, in one go.
    decoded = generate(make_engine(max_running=3), prompts(LENS), NEW)
    for rid, req in decoded.items():
        replay = generate(make_engine(), [req.prompt + req.output[:-1]], [1])["r0"]
        assert replay.output == req.output[-1:]
        worst = (replay.logits[0] - req.logits[-1]).abs().max().item()
        assert worst <= F32_LOGIT_ATOL, f"{rid}: decode and prefill logits differ by {worst:.3g}"
