"""decode_attention_int8_cpu / extend_attention_int8_cpu: attention over an int8 KV cache.

Every numeric test runs the operator and an independent plain-torch
reference (reference.py: quantize exactly as specified, dequantize to
float64, then the float references). The cache contents and the scale
buffers must equal the reference's bit for bit; the output must match at
the tolerances of tolerances.py (the reference quantizes identically, so the
only differences are float32 arithmetic and the output's rounding).
"""

from __future__ import annotations

import pytest
import torch

from cases.extend import SENTINEL
from cases.extend import Case as ExtendCase
from cases.int8 import DECODE, DYN, EXTEND, NAN, Int8Decode, Int8Extend, call_int8, int8_decode, int8_extend, is_dynamic
from reference import quantize_int8
from tolerances import TOLERANCES


@pytest.mark.parametrize(
    "scale,dtype",
    [(0.001, torch.float32), (0.01, torch.bfloat16), (0.1, torch.float16), (0.01, torch.float32)],
    ids=str,
)
def test_decode_static_scales(kernel_variant, scale, dtype):
    t = int8_decode([1, 40, 70], 8, 2, 64, 48, dtype, scale, scale, seed=1)
    t.check()


@pytest.mark.parametrize("heads,heads_kv", [(4, 4), (8, 2), (6, 1)], ids=["MHA", "GQA", "MQA"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_decode_dynamic_rows_of_different_magnitudes_and_zero_rows(kernel_variant, heads, heads_kv, dtype):
    t = int8_decode([3, 66, 17], heads, heads_kv, 40, 33, dtype, DYN, DYN, magnitudes=True, zero_rows=True, seed=2)
    t.check()
    # Sequence 0's new token (batch row 0) is an all-zero row: scale 1.0, codes 0.
    slot = int(t.case.loc[0])
    assert torch.all(t.k_scale_buf[slot] == 1.0) and torch.all(t.v_scale_buf[slot] == 1.0)
    assert torch.all(t.case.k_buffer[slot] == 0)


@pytest.mark.parametrize("k_scale,v_scale", [(0.02, DYN), (DYN, 0.02)], ids=["staticK-dynV", "dynK-staticV"])
@pytest.mark.parametrize("new_int8", [False, True], ids=["float-new", "int8-new"])
def test_decode_mixed_modes(kernel_variant, k_scale, v_scale, new_int8):
    t = int8_decode([5, 37], 6, 2, 32, 24, torch.bfloat16, k_scale, v_scale, new_int8=new_int8, magnitudes=True, seed=3)
    t.check()
    # The static side's buffer stays all NaN (never read, never written).
    static = t.k_scale_buf if not is_dynamic(k_scale) else t.v_scale_buf
    assert torch.isnan(static).all()


@pytest.mark.parametrize("scale", [DYN, 0.05], ids=["dynamic", "static"])
def test_decode_int8_inputs_are_copied_with_caller_scales(kernel_variant, scale):
    t = int8_decode([9, 2], 4, 2, 16, 16, torch.float32, scale, scale, new_int8=True, magnitudes=True, seed=4)
    t.check()
    for b, slot in enumerate(t.case.loc.tolist()):
        assert torch.equal(t.case.k_buffer[slot], t.case.key[b])
        assert torch.equal(t.case.v_buffer[slot], t.case.value[b])


def test_decode_logit_cap_is_applied(kernel_variant):
    capped = int8_decode([70, 3], 6, 2, 40, 40, torch.float32, DYN, 0.03, logit_cap=2.0, seed=5)
    plain = int8_decode([70, 3], 6, 2, 40, 40, torch.float32, DYN, 0.03, logit_cap=0.0, seed=5)
    capped.check()
    plain.check()
    assert (capped.case.output - plain.case.output).abs().max() > 0.05, "the cap did not change the result"


def test_quantization_rounds_half_to_even_and_clamps(kernel_variant):
    # Static scale 0.5: x / 0.5 is exact, so ties are real ties.
    t = int8_decode([1], 1, 1, 8, 8, torch.float32, 0.5, DYN, seed=6)
    t.case.key[0, 0] = torch.tensor([1.25, 0.75, 1.75, -1.25, -0.25, 0.25, 100.0, -64.0])
    t.case.value[0, 0] = torch.tensor([3.0, -1.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])  # dynamic: scale 3/127
    t.check()
    slot = int(t.case.loc[0])
    assert t.case.k_buffer[slot, 0].tolist() == [2, 2, 4, -2, 0, 0, 127, -127]
    assert t.v_scale_buf[slot, 0].item() == (torch.tensor(3.0) / 127).item()
    assert t.case.v_buffer[slot, 0, 0].item() == 127


def _with_threads(threads: int, run) -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        run()
    finally:
        torch.set_num_threads(saved)


SCALE_MODES = {"static": (0.02, 0.02), "dynamic": (DYN, DYN), "staticK-dynV": (0.02, DYN)}


@pytest.mark.parametrize("mode", list(SCALE_MODES))
@pytest.mark.parametrize("threads", [1, 3])
def test_decode_sglang_padding_rows_leave_the_last_rows_codes_and_scale(kernel_variant, mode, threads):
    """SGLang's padding rows (loc 0, pool row 0, seq_lens 1) all write slot 0: it ends with the last padding
    row's codes and, in dynamic mode, that row's scale (rows of different magnitudes, so each scale differs)."""
    k_scale, v_scale = SCALE_MODES[mode]
    t = int8_decode([37, 4, 1], 4, 2, 32, 24, torch.bfloat16, k_scale, v_scale, magnitudes=True, seed=21, padding=3)
    _with_threads(threads, t.check)
    for side, new, scale, cache, scale_buf in (
        ("k", t.case.key[-1], k_scale, t.case.k_buffer, t.k_scale_buf),
        ("v", t.case.value[-1], v_scale, t.case.v_buffer, t.v_scale_buf),
    ):
        codes, scales = quantize_int8(new, None if is_dynamic(scale) else scale)
        assert torch.equal(cache[0], codes), f"{side} slot 0 does not hold the last padding row"
        if is_dynamic(scale):
            assert torch.equal(scale_buf[0], scales), f"{side}_scale_buf[0] is not the last padding row's scale"


@pytest.mark.parametrize("mode", list(SCALE_MODES))
@pytest.mark.parametrize("new_int8", [False, True], ids=["float-new", "int8-new"])
def test_decode_loc_drawn_with_repeats_from_a_few_slots(kernel_variant, mode, new_int8):
    """loc drawn at random from slots [0, 3), as SGLang's decode tests draw it: writes in batch order (codes and
    scales of the last row per slot), all of them before attention reads the cache."""
    k_scale, v_scale = SCALE_MODES[mode]
    t = int8_decode(
        [20, 5, 9, 1, 2],
        4,
        2,
        16,
        16,
        torch.float32,
        k_scale,
        v_scale,
        new_int8=new_int8,
        magnitudes=True,
        seed=22,
        loc_slots=3,
    )
    assert len(set(t.case.loc.tolist())) < len(t.case.loc), "the case must repeat slots"
    t.check()


EXTEND_SHAPES = {
    "static 0.001 f32 GQA": (
        ExtendCase(prefix=[20, 0, 37], extend=[12, 9, 1], heads=8, heads_kv=2, head_dim=64, head_dim_v=48),
        0.001,
        0.001,
    ),
    "static 0.01 bf16 MHA": (
        ExtendCase(prefix=[6, 2], extend=[11, 4], heads=2, heads_kv=2, dtype=torch.bfloat16, map_dtype=torch.int32),
        0.01,
        0.01,
    ),
    "static 0.1 f16 MQA": (
        ExtendCase(prefix=[30], extend=[19], heads=4, heads_kv=1, head_dim=40, head_dim_v=24, dtype=torch.float16),
        0.1,
        0.1,
    ),
    "dynamic f32 GQA": (
        ExtendCase(prefix=[13, 0, 70], extend=[9, 21, 33], heads=6, heads_kv=3, head_dim=48, head_dim_v=40),
        DYN,
        DYN,
    ),
    "dynamic bf16 MHA strided": (
        ExtendCase(
            prefix=[10, 4],
            extend=[6, 13],
            heads=3,
            heads_kv=3,
            strided=True,
            dtype=torch.bfloat16,
            map_dtype=torch.int32,
        ),
        DYN,
        DYN,
    ),
    "dynamic f16 D7": (
        ExtendCase(prefix=[17], extend=[23], heads=2, heads_kv=1, head_dim=7, head_dim_v=3, dtype=torch.float16),
        DYN,
        DYN,
    ),
    "static K dynamic V": (ExtendCase(prefix=[21, 5], extend=[9, 14], dtype=torch.bfloat16), 0.02, DYN),
    "dynamic K static V": (ExtendCase(prefix=[21, 5], extend=[9, 14], dtype=torch.float16), DYN, 0.02),
}


@pytest.mark.parametrize("name", list(EXTEND_SHAPES))
def test_extend_matches_reference(kernel_variant, name):
    case, k_scale, v_scale = EXTEND_SHAPES[name]
    t = int8_extend(case, k_scale, v_scale, magnitudes=True, zero_rows=True)
    t.check()


@pytest.mark.parametrize("k_scale,v_scale", [(DYN, DYN), (0.05, DYN), (DYN, 0.05)], ids=["dyn", "staticK", "staticV"])
def test_extend_int8_inputs_are_copied_with_caller_scales(kernel_variant, k_scale, v_scale):
    t = int8_extend(ExtendCase(prefix=[7, 0], extend=[5, 18], seed=3), k_scale, v_scale, new_int8=True, magnitudes=True)
    t.check()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_extend_logit_cap_is_applied(kernel_variant, dtype):
    # sm_scale 0.5 on D = 64: scores of a few units, which a cap of 2 bends. (Not 1.0: the dynamic K
    # scale multiplies each float32 score once more, an extra rounding of |score| * 2^-24 that the
    # float32 atol of tolerances.py only absorbs for scores up to ~10.)
    base = ExtendCase(
        prefix=[21, 0], extend=[9, 14], head_dim=64, head_dim_v=16, dtype=dtype, sm_scale=0.5, logit_cap=2.0
    )
    capped = int8_extend(base, DYN, 0.03).check()
    plain = int8_extend(base, DYN, 0.03).check(o_extend=torch.full_like(capped, SENTINEL), logit_cap=0.0)
    assert (capped.double() - plain.double()).abs().max() > 0.1, "the cap did not change the result"


@pytest.mark.parametrize(
    "dtype,k_scale,v_scale,logit_cap",
    [(torch.float32, DYN, DYN, 0.0), (torch.bfloat16, 0.02, DYN, 1.5), (torch.float16, DYN, 0.02, 0.0)],
    ids=str,
)
def test_extend_one_token_on_a_prefix_equals_decode(kernel_variant, dtype, k_scale, v_scale, logit_cap):
    """Extending by one int8 token is a decode step: both write the same int8 row and agree on the output.

    (With a float token the two differ by design: extend attends the float
    values, decode the cache's; see test_sglang_compat.py.)
    """
    t = int8_extend(
        ExtendCase(
            prefix=[37, 1, 80],
            extend=[1, 1, 1],
            heads=6,
            heads_kv=2,
            head_dim=40,
            head_dim_v=24,
            dtype=dtype,
            logit_cap=logit_cap,
            sm_scale=0.5,
            seed=5,
        ),
        k_scale,
        v_scale,
        new_int8=True,
        magnitudes=True,
    )
    a = t.case.inputs
    rows, slots = t.new_slots()
    k0, v0, ks0, vs0 = a["k_buffer"].clone(), a["v_buffer"].clone(), t.k_scale_buf.clone(), t.v_scale_buf.clone()
    extended = t.check()
    decoded = torch.full((len(rows), a["q_extend"].shape[1], a["v_extend"].shape[2]), SENTINEL, dtype=dtype)
    from cases.decode import DECODE_ARGS

    args = dict(
        zip(
            DECODE_ARGS + ("k_scale_buf", "v_scale_buf", "k_scale", "v_scale"),
            (
                a["q_extend"][rows],
                k0,
                v0,
                decoded,
                a["k_extend"][rows],
                a["v_extend"][rows],
                torch.tensor(slots),
                torch.zeros(len(rows), decoded.shape[1], 3, decoded.shape[2] + 1),
                a["req_to_token"],
                a["req_pool_indices"],
                a["seq_lens"],
                a["sm_scale"],
                logit_cap,
                ks0,
                vs0,
                k_scale,
                v_scale,
            ),
        )
    )
    call_int8(DECODE, args, slots)
    # Same int8 rows and scales written by both operators.
    assert torch.equal(k0, a["k_buffer"]) and torch.equal(v0, a["v_buffer"])
    torch.testing.assert_close(ks0, t.k_scale_buf, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(vs0, t.v_scale_buf, rtol=0, atol=0, equal_nan=True)
    # Two float32 computations of one value, each rounded once to the dtype.
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(extended[rows].double(), decoded.double(), atol=2 * tol["atol"], rtol=2 * tol["rtol"])


# ---- accuracy of int8 against the float cache ---------------------------------------------------
# Quantization error, not kernel error: per element |x - q s| <= s / 2 with
# s = max|row| / 127 (dynamic), i.e. <= 0.4% of the row's largest value. For
# the unit-normal data here (D = 64, sm_scale 1/sqrt(D)) a score moves by
# ~ sqrt(D) * (s/2) / sqrt(3) * sm_scale ~ 0.005 and the output by about that
# times |v| plus V's own s/2 ~ 0.01: bound 0.05. Measured max errors are
# printed (pytest -s) and reported in the change description.
ACCURACY_BOUND = 0.05


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_int8_attention_is_close_to_the_float_cache(kernel_variant, dtype):
    case = ExtendCase(
        prefix=[200, 64], extend=[16, 40], heads=8, heads_kv=2, head_dim=64, head_dim_v=64, dtype=dtype, seed=11
    ).build()
    a = case.inputs
    float_out = a["o_extend"].clone()
    case.run(o_extend=float_out)
    # The same data in an int8 cache (dynamic scales) with the new tokens written by the operator.
    t = Int8Extend(case, *(None,) * 2, DYN, DYN)
    kq, t.k_scale_buf = quantize_int8(a["k_buffer"], None)
    vq, t.v_scale_buf = quantize_int8(a["v_buffer"], None)
    slots_used = a["k_buffer"].shape[0]
    pad = sum(case.extend)
    t.case.inputs = dict(
        a,
        k_buffer=torch.cat([kq, torch.zeros((pad,) + kq.shape[1:], dtype=torch.int8)]),
        v_buffer=torch.cat([vq, torch.zeros((pad,) + vq.shape[1:], dtype=torch.int8)]),
        req_to_token=a["req_to_token"].clone(),
    )
    t.k_scale_buf = torch.cat([t.k_scale_buf, torch.ones(pad, case.heads_kv)])
    t.v_scale_buf = torch.cat([t.v_scale_buf, torch.ones(pad, case.heads_kv)])
    nxt = slots_used
    for b in range(2):
        pool = int(a["req_pool_indices"][b])
        for i in range(case.extend[b]):
            t.case.inputs["req_to_token"][pool, case.prefix[b] + i] = nxt
            nxt += 1
    int8_out = t.check()
    owned = t.new_slots()[0]
    err = (int8_out[owned].double() - float_out[owned].double()).abs().max().item()
    print(
        f"\nint8 vs float cache, {dtype}: max abs error {err:.3e} (|out| max "
        f"{float_out[owned].double().abs().max().item():.2f})"
    )
    assert 0 < err < ACCURACY_BOUND


# ---- bad input ---------------------------------------------------------------------------------
def _valid_decode(k_scale=DYN, v_scale=DYN, new_int8=False) -> Int8Decode:
    return int8_decode([3, 7], 4, 2, 16, 8, torch.float32, k_scale, v_scale, splits=2, new_int8=new_int8, seed=7)


def _read_slot(t: Int8Decode) -> int:
    """A cache slot sequence 1 reads that this call does not write."""
    row = int(t.case.req_pool_indices[1])
    return int(t.case.req_to_token[row, 2])


def _bad_scale_in_slot(which: str, value: float):
    def mutate(t):
        slot = _read_slot(t)
        getattr(t, f"{which}_scale_buf")[slot, 1] = value
        return {}, rf"{which}_scale_buf\[{slot}, 1\] = {value:g} is not a finite scale > 0.*slot {slot}, KV head 1"

    return mutate


DECODE_BAD = {
    "zero k_scale": (lambda t: ({"k_scale": 0.0}, r"k_scale = 0 is not a valid scale")),
    "negative v_scale": (lambda t: ({"v_scale": -0.5}, r"v_scale = -0.5 is not a valid scale")),
    "infinite k_scale": (lambda t: ({"k_scale": float("inf")}, r"k_scale = inf is not a valid scale")),
    "k_scale overflowing float32": (lambda t: ({"k_scale": 1e300}, r"k_scale = 1e\+300 is not a valid scale")),
    "NaN k scale in a read slot": _bad_scale_in_slot("k", NAN),
    "zero v scale in a read slot": _bad_scale_in_slot("v", 0.0),
    "negative k scale in a read slot": _bad_scale_in_slot("k", -1.0),
    "infinite v scale in a read slot": _bad_scale_in_slot("v", float("inf")),
    "float cache": (
        lambda t: (
            {"k_buffer": t.case.k_buffer.float(), "v_buffer": t.case.v_buffer.float()},
            r"k_buffer has dtype Float; this operator needs an int8 KV cache",
        )
    ),
    "int8 k only": (lambda t: ({"v_buffer": t.case.v_buffer.float()}, r"v_buffer has dtype Float; this operator")),
    "scale buffer float64": (
        lambda t: ({"k_scale_buf": t.k_scale_buf.double()}, r"k_scale_buf must have dtype float32, got Double")
    ),
    "scale buffer too short": (
        lambda t: (
            {"v_scale_buf": t.v_scale_buf[:-1]},
            r"v_scale_buf.size\(0\) = \d+ but v_buffer.size\(0\) \(max_total_tokens\)",
        )
    ),
    "scale buffer wrong heads": (
        lambda t: (
            {"k_scale_buf": t.k_scale_buf[:, :1]},
            r"k_scale_buf.size\(1\) = 1 but k_buffer.size\(1\) \(H_kv\) is 2",
        )
    ),
    "scale buffer 1-D": (lambda t: ({"k_scale_buf": t.k_scale_buf[:, 0]}, r"k_scale_buf must be 2-D")),
    "new key float64": (
        lambda t: (
            {"key": t.case.key.double(), "value": t.case.value.double()},
            r"key has dtype Double but query has Float",
        )
    ),
    "key int8, value float": (
        lambda t: ({"key": t.case.key.to(torch.int8)}, r"value has dtype Float but key has Char")
    ),
    "non-finite new key": (
        lambda t: (
            {
                "key": t.case.key.clone().index_put_(
                    (torch.tensor([1]), torch.tensor([0]), torch.tensor([3])), torch.tensor(NAN)
                )
            },
            r"key\[1, 0, 3\] = nan is not finite",
        )
    ),
    "loc past the cache": (lambda t: ({"loc": torch.tensor([1, 10**6])}, r"loc\[1\] = 1000000 is outside")),
    "map entry past the cache": (
        lambda t: (
            t.case.req_to_token.__setitem__((int(t.case.req_pool_indices[1]), 2), 999) or {},
            r"req_to_token\[\d+, 2\] = 999 is outside the KV cache",
        )
    ),
    "nan sm_scale": (lambda t: ({"sm_scale": NAN}, r"sm_scale must be finite")),
}


@pytest.mark.parametrize("name", list(DECODE_BAD))
def test_decode_bad_input_raises_and_writes_nothing(kernel_variant, name):
    t = _valid_decode()
    change, message = DECODE_BAD[name](t)
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises(RuntimeError, match=r"rvv_attn.decode_attention_int8_cpu: .*" + message):
        t.run(**change)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("value", [NAN, float("-inf")], ids=["nan", "-inf"])
@pytest.mark.parametrize("where", ["first", "past the first vector", "last"])
def test_a_non_finite_new_element_anywhere_is_found(kernel_variant, dtype, value, where):
    # Rows of 80 and 72 elements span several vectors at every VLEN; the
    # scan must name the exact element and the call write nothing.
    t = int8_decode([3, 7], 4, 2, 80, 72, dtype, DYN, DYN, splits=2, seed=8)
    name = "value" if where == "last" else "key"
    tensor = getattr(t.case, name).clone()
    b, h, d = {"first": (0, 0, 0), "past the first vector": (1, 0, 45), "last": (1, 1, 71)}[where]
    tensor[b, h, d] = value
    shown = "nan" if value != value else "-inf"
    with pytest.raises(RuntimeError, match=rf"{name}\[{b}, {h}, {d}\] = {shown} is not finite"):
        t.run(**{name: tensor})


def test_decode_int8_input_needs_a_valid_scale_at_its_own_slot(kernel_variant):
    # int8 rows come with caller-provided scales: a missing one is an error
    # (a float row would have had its scale computed).
    t = _valid_decode(new_int8=True)
    slot = int(t.case.loc[0])
    t.k_scale_buf[slot, 0] = NAN
    before = (t.case.k_buffer.clone(), t.k_scale_buf.clone())
    with pytest.raises(RuntimeError, match=rf"k_scale_buf\[{slot}, 0\] = nan is not a finite scale > 0"):
        t.run()
    assert torch.equal(t.case.k_buffer, before[0])
    # The same slot with a float row is fine: its scale is computed.
    t2 = _valid_decode()
    t2.k_scale_buf[int(t2.case.loc[0]), 0] = NAN
    t2.check()


@pytest.mark.parametrize("map_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("which", ["k", "v"])
def test_a_bad_scale_anywhere_in_a_long_sequence_is_found(kernel_variant, which, map_dtype):
    # The binding scans a vector of slots per step (up to 128 at VLEN 1024)
    # and ORs the heads together: a bad scale in any step, on any head, is
    # found, and the first in token order is the one named. Position 299 is
    # the new token (its stale scale is overwritten, so it is never reported).
    t = int8_decode([5, 300], 4, 4, 8, 8, torch.float32, DYN, DYN, seed=11)
    t.case.req_to_token = t.case.req_to_token.to(map_dtype)
    row = int(t.case.req_pool_indices[1])
    buf = getattr(t, f"{which}_scale_buf")
    for first, head, second in [(0, 3, 1), (130, 0, 297), (257, 2, 258), (298, 3, None)]:
        slots = [int(t.case.req_to_token[row, p]) for p in (first, second) if p is not None]
        saved = buf[slots].clone()
        buf[slots[0], head] = NAN
        if second is not None:
            buf[slots[1], 0] = 0.0
        with pytest.raises(
            RuntimeError,
            match=rf"{which}_scale_buf\[{slots[0]}, {head}\] = nan is not a finite "
            rf"scale > 0.*req_to_token\[{row}, {first}\], sequence 1\)",
        ):
            t.run()
        buf[slots] = saved
    t.check()  # every scale restored: the same call is accepted and correct


def test_the_extreme_usable_scales_are_accepted(kernel_variant):
    # The scan's bounds are 0 < scale <= FLT_MAX: the smallest subnormal and
    # the largest float are usable scales (the output is not checked: such
    # scales make the dequantized values meaningless, not invalid).
    t = int8_decode([5, 40], 4, 2, 8, 8, torch.float32, DYN, DYN, seed=12)
    row = int(t.case.req_pool_indices[1])
    t.k_scale_buf[int(t.case.req_to_token[row, 3]), 1] = torch.finfo(torch.float32).smallest_normal / 2**23
    t.v_scale_buf[int(t.case.req_to_token[row, 33]), 0] = torch.finfo(torch.float32).max
    t.run()


@pytest.mark.variant_independent
def test_float_operators_refuse_an_int8_cache(kernel_variant):
    t = _valid_decode()
    c = t.case
    with pytest.raises(
        RuntimeError,
        match=r"rvv_attn.decode_attention_cpu: k_buffer is an int8 KV cache.*"
        r"decode_attention_int8_cpu",
    ):
        c.run()  # through opcall: a rejected call changes nothing
    e = int8_extend(ExtendCase(prefix=[6, 3], extend=[4, 5]), DYN, DYN)
    with pytest.raises(RuntimeError, match=r"rvv_attn.extend_attention_cpu: k_buffer is an int8 KV cache"):
        e.case.run()


def _valid_extend() -> Int8Extend:
    return int8_extend(ExtendCase(prefix=[6, 3], extend=[4, 5], head_dim=16, head_dim_v=8), DYN, DYN)


def _extend_read_slot(t: Int8Extend) -> int:
    a = t.case.inputs
    return int(a["req_to_token"][int(a["req_pool_indices"][0]), 2])


EXTEND_BAD = {
    "zero v_scale": (lambda t: ({"v_scale": 0.0}, r"v_scale = 0 is not a valid scale")),
    "negative k_scale": (lambda t: ({"k_scale": -1.0}, r"k_scale = -1 is not a valid scale")),
    "NaN scale in a prefix slot": (
        lambda t: (
            t.k_scale_buf.__setitem__((_extend_read_slot(t), 0), NAN) or {},
            rf"k_scale_buf\[{_extend_read_slot(t)}, 0\] = nan is not a finite",
        )
    ),
    "float cache": (
        lambda t: (
            {"k_buffer": t.case.inputs["k_buffer"].float()},
            r"k_buffer has dtype Float; this operator needs an int8 KV cache",
        )
    ),
    "scale buffer wrong dtype": (
        lambda t: ({"v_scale_buf": t.v_scale_buf.half()}, r"v_scale_buf must have dtype float32, got Half")
    ),
    "scale buffer wrong heads": (
        lambda t: (
            {"v_scale_buf": t.v_scale_buf[:, :1]},
            r"v_scale_buf.size\(1\) = 1 but v_buffer.size\(1\) \(H_kv\) is 2",
        )
    ),
    "new keys bf16": (
        lambda t: (
            {"k_extend": t.case.inputs["k_extend"].bfloat16(), "v_extend": t.case.inputs["v_extend"].bfloat16()},
            r"k_extend has dtype BFloat16 but q_extend has Float",
        )
    ),
    "inf in a new value": (
        lambda t: (
            {
                "v_extend": t.case.inputs["v_extend"]
                .clone()
                .index_fill_(0, torch.tensor([int(t.case.inputs["extend_start_loc"][1])]), float("inf"))
            },
            r"v_extend\[\d+, 0, 0\] = inf is not finite",
        )
    ),
    "new-token slot past the cache": (
        lambda t: (
            t.case.inputs["req_to_token"].__setitem__((int(t.case.inputs["req_pool_indices"][0]), 6 + 1), 10**5) or {},
            r"req_to_token\[\d+, 7\] = 100000 is outside the KV cache",
        )
    ),
    "extend longer than the sequence": (
        lambda t: ({"extend_seq_lens": torch.tensor([4, 9])}, r"extend_seq_lens\[1\] = 9 exceeds seq_lens\[1\] = 8")
    ),
}


@pytest.mark.parametrize(
    "k_scale,v_scale,new_int8",
    [(0.03, 0.03, False), (DYN, DYN, False), (0.03, 0.03, True)],
    ids=["static", "dynamic", "static-int8-new"],
)
@pytest.mark.parametrize("threads", [1, 3])
def test_extend_new_tokens_naming_one_slot_keep_the_last(kernel_variant, k_scale, v_scale, new_int8, threads):
    """New tokens whose map entries name one slot: the writes go in batch order (sequence by sequence, each
    sequence's tokens in order) and the slot keeps the last one's codes and scale. Float new tokens are attended as
    given; int8 ones are read back from the cache after every write, so an overwritten one reads the later row."""
    t = int8_extend(
        ExtendCase(prefix=[6, 3], extend=[4, 5], head_dim=16, head_dim_v=8), k_scale, v_scale, new_int8, magnitudes=True
    )
    a = t.case.inputs
    m = a["req_to_token"]
    row0, row1 = int(a["req_pool_indices"][0]), int(a["req_pool_indices"][1])
    m[row1, 3 + 1] = m[row1, 3]  # sequence 1: tokens 0, 1 and 3 share a slot
    m[row1, 3 + 3] = m[row1, 3]
    m[row0, 6 + 3] = m[row1, 3 + 4]  # sequence 0's last token and sequence 1's last one
    rows, slots = t.new_slots()
    assert len(set(slots)) == len(slots) - 3
    _with_threads(threads, t.check)
    last = {slot: row for row, slot in zip(rows, slots)}
    for slot, row in last.items():
        codes = (
            a["k_extend"][row]
            if new_int8
            else quantize_int8(a["k_extend"][row], None if is_dynamic(k_scale) else k_scale)[0]
        )
        assert torch.equal(a["k_buffer"][slot], codes)


@pytest.mark.parametrize("name", list(EXTEND_BAD))
def test_extend_bad_input_raises_and_writes_nothing(kernel_variant, name):
    t = _valid_extend()
    change, message = EXTEND_BAD[name](t)
    args = t.args(**change)
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises(RuntimeError, match=r"rvv_attn.extend_attention_int8_cpu: .*" + message):
        call_int8(EXTEND, args, t.new_slots()[1])
