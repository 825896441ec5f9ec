"""extend_attention_cpu: prefill / chunked prefill over a paged KV cache.

Every numeric test compares with reference.extend_attention (float64, one
sequence at a time) at the tolerances of tolerances.py, and checks that rows
of o_extend no sequence owns are left exactly as they were.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import opcall
import rvv_attn
from cases.extend import SENTINEL, Case, blocking, expected_blocking
from tolerances import TOLERANCES

# Named shapes for the reference comparison. Dtypes and map dtypes are spread
# over the shapes pairwise rather than crossed with all of them.
SHAPES = {
    "zero prefix": Case(prefix=[0, 0], extend=[5, 17]),
    "single new token": Case(prefix=[9, 0, 40], extend=[1, 1, 1], dtype=torch.bfloat16, map_dtype=torch.int32),
    "prefix of one token": Case(prefix=[1, 1], extend=[3, 40], dtype=torch.float16),
    "mixed lengths": Case(
        prefix=[0, 1, 37, 100, 5], extend=[7, 1, 50, 0, 66], heads=3, heads_kv=3, map_dtype=torch.int32
    ),
    "GQA 32/8 D128 Dv96": Case(
        prefix=[20, 3], extend=[12, 9], heads=32, heads_kv=8, head_dim=128, head_dim_v=96, dtype=torch.bfloat16
    ),
    "GQA 18/3 D80": Case(
        prefix=[13, 0],
        extend=[9, 21],
        heads=18,
        heads_kv=3,
        head_dim=80,
        head_dim_v=80,
        dtype=torch.float16,
        map_dtype=torch.int32,
    ),
    "MQA D256": Case(
        prefix=[30], extend=[19], heads=4, heads_kv=1, head_dim=256, head_dim_v=256, map_dtype=torch.int32
    ),
    "MHA D32": Case(
        prefix=[6, 2], extend=[11, 4], heads=2, heads_kv=2, head_dim=32, head_dim_v=32, dtype=torch.bfloat16
    ),
    "D not a vector multiple": Case(
        prefix=[17], extend=[23], heads=2, heads_kv=1, head_dim=7, head_dim_v=3, dtype=torch.float16
    ),
    "strided views": Case(prefix=[10, 4], extend=[6, 13], strided=True, dtype=torch.bfloat16, map_dtype=torch.int32),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_matches_reference(kernel_variant, name):
    case = replace(SHAPES[name]).build()
    case.check(case.run())


def test_blocking_is_derived_from_the_variant_vlen(kernel_variant):
    bm, bn, arena = blocking(128, 128)
    assert (bm, bn) == expected_blocking(kernel_variant)
    # The arena holds Q, K^T, the score tile, V, v' (all f32) and per-row m
    # and l; each of the 7 buffers is padded to a 64-byte line.
    floats = bm * 128 + 128 * bn + bm * bn + bn * 128 + bm * 128 + 2 * bm
    assert floats * 4 <= arena < floats * 4 + 7 * 64


@pytest.mark.parametrize(
    "dtype,map_dtype",
    [(torch.float32, torch.int64), (torch.float16, torch.int32), (torch.bfloat16, torch.int64)],
    ids=str,
)
def test_extend_lengths_crossing_this_variants_block_boundaries(kernel_variant, dtype, map_dtype):
    bm, bn = expected_blocking(kernel_variant)
    assert blocking(24, 40)[:2] == (bm, bn)
    # Extend lengths just below, at and above BLOCK_N and BLOCK_M, and past two
    # query blocks plus a partial key block; prefixes likewise around BLOCK_N.
    extend = [bn - 1, bn, bn + 1, bm - 1, bm, bm + 1, 2 * bm + bn + 1]
    prefix = [bn + 1, 0, bn, 2 * bn - 1, 1, bn - 1, 3 * bn]
    case = Case(
        prefix=prefix,
        extend=extend,
        heads=2,
        heads_kv=1,
        head_dim=24,
        head_dim_v=40,
        dtype=dtype,
        map_dtype=map_dtype,
        seed=1,
    ).build()
    case.check(case.run())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_logit_cap_is_applied(kernel_variant, dtype):
    # sm_scale = 1 on D = 64 gives scores of a few units: a cap of 2 bends them.
    case = Case(
        prefix=[21, 0], extend=[9, 14], head_dim=64, head_dim_v=16, dtype=dtype, sm_scale=1.0, logit_cap=2.0
    ).build()
    capped = case.run()
    case.check(capped)
    uncapped = case.run(o_extend=case.inputs["o_extend"].clone(), logit_cap=0.0)
    case.check(uncapped, case.reference(logit_cap=0.0))
    owned = case.inputs["extend_seq_lens"].sum().item()
    assert owned > 0
    # Far beyond any tolerance: the cap changed the result.
    assert (capped.double() - uncapped.double()).abs().max() > 0.1


def test_int32_and_int64_maps_give_identical_results(kernel_variant):
    case = Case(prefix=[33, 70, 2], extend=[5, 31, 12], dtype=torch.bfloat16, map_dtype=torch.int64).build()
    wide = case.run()
    case.check(wide)
    narrow = case.run(
        o_extend=case.inputs["o_extend"].clone(), req_to_token=case.inputs["req_to_token"].to(torch.int32)
    )
    assert torch.equal(wide, narrow)


def test_permuted_token_map_reads_the_mapped_slots(kernel_variant):
    # Same logical sequence, two physical layouts: the outputs must agree.
    case = Case(prefix=[45], extend=[10], seed=3).build()
    first = case.run()
    a = case.inputs
    perm = torch.randperm(a["k_buffer"].shape[0], generator=torch.Generator().manual_seed(9))
    inverse = torch.argsort(perm)  # new slot of old slot s is inverse[s]
    row = a["req_pool_indices"][0]
    remapped = a["req_to_token"].clone()
    remapped[row, :45] = inverse[a["req_to_token"][row, :45]].to(remapped.dtype)
    second = case.run(
        o_extend=a["o_extend"].clone(),
        k_buffer=a["k_buffer"][perm],
        v_buffer=a["v_buffer"][perm],
        req_to_token=remapped,
    )
    case.check(first)
    assert torch.equal(first, second)


# One long sequence past 4096 new tokens (upstream produced NaNs there) and one
# with a 9000-token prefix, at one head and small D to keep emulation short.
# The float32 inputs are bfloat16 values, so one float64 reference serves both.
_LONG: dict[str, object] = {}


def _long_case(dtype: torch.dtype) -> Case:
    case = Case(
        prefix=[0, 9000],
        extend=[4200, 37],
        heads=1,
        heads_kv=1,
        head_dim=16,
        head_dim_v=16,
        dtype=torch.bfloat16,
        seed=7,
    ).build()
    if "ref" not in _LONG:
        _LONG["ref"] = case.reference()
    case.inputs = {
        k: (t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t) for k, t in case.inputs.items()
    }
    case.dtype = dtype
    return case


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_extend_and_long_prefix_stay_finite_and_correct(kernel_variant, dtype):
    case = _long_case(dtype)
    out = case.run()
    assert torch.isfinite(out).all()
    case.check(out, _LONG["ref"])


def test_empty_batch_and_empty_extends_are_no_ops(kernel_variant):
    case = Case(prefix=[], extend=[]).build()
    before = case.inputs["o_extend"].clone()
    assert case.run().shape[0] == 1 and torch.equal(case.inputs["o_extend"], before)
    case = Case(prefix=[4, 0], extend=[0, 0]).build()
    before = case.inputs["o_extend"].clone()
    assert torch.equal(case.run(), before)


@pytest.mark.parametrize("dtype,logit_cap", [(torch.float32, 0.0), (torch.bfloat16, 1.5)], ids=str)
def test_one_new_token_on_a_prefix_equals_decode(kernel_variant, dtype, logit_cap):
    """Extending by one token is a decode step: both operators must agree on the same cache."""
    case = Case(
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
    ).build()
    extended = case.run()
    case.check(extended)

    a = case.inputs
    rows = a["extend_start_loc"]
    batch, heads, dv = rows.shape[0], a["q_extend"].shape[1], a["v_extend"].shape[2]
    # Decode writes the new K/V into the cache itself, at slots the prefixes do not use.
    used = set(a["req_to_token"][a["req_pool_indices"]].flatten().tolist())
    loc = torch.tensor([s for s in range(a["k_buffer"].shape[0]) if s not in used][:batch], dtype=torch.int64)
    req_to_token = a["req_to_token"].clone()
    for b in range(batch):
        req_to_token[a["req_pool_indices"][b], int(a["seq_lens"][b]) - 1] = int(loc[b])
    decoded = torch.full((batch, heads, dv), SENTINEL, dtype=dtype)
    from cases.decode import DECODE_ARGS, decode_writes

    d = dict(
        zip(
            DECODE_ARGS,
            (
                a["q_extend"][rows],
                a["k_buffer"].clone(),
                a["v_buffer"].clone(),
                decoded,
                a["k_extend"][rows],
                a["v_extend"][rows],
                loc,
                torch.zeros(batch, heads, 3, dv + 1),
                req_to_token,
                a["req_pool_indices"],
                a["seq_lens"],
                a["sm_scale"],
                logit_cap,
            ),
        )
    )
    opcall.call(rvv_attn.ops.decode_attention_cpu, d, decode_writes(d))
    # Two float32 computations of one value, each rounded once to the dtype:
    # they may differ by both kernels' allowances added up.
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(extended[rows].double(), decoded.double(), atol=2 * tol["atol"], rtol=2 * tol["rtol"])


# ---- bad input -----------------------------------------------------------------
# Each entry: a change to a valid case (prefix [6, 3], extend [4, 5], H 4,
# H_kv 2, D 16, Dv 8, 14 cache slots, 4 pool rows, T 12) and the error text it must give.
def _valid_case() -> Case:
    return Case(prefix=[6, 3], extend=[4, 5], head_dim=16, head_dim_v=8).build()


def _set(name, index, value):
    def change(a):
        t = a[name].clone()
        t[index] = value
        return {name: t}

    return change


def _map_entry(b, i, value):
    def change(a):
        t = a["req_to_token"].clone()
        t[a["req_pool_indices"][b], i] = value
        return {"req_to_token": t}

    return change


BAD_INPUTS = {
    "extend longer than the sequence": (
        _set("extend_seq_lens", 1, 9),
        r"extend_seq_lens\[1\] = 9 exceeds seq_lens\[1\] = 8",
    ),
    "negative extend length": (_set("extend_seq_lens", 0, -1), r"extend_seq_lens\[0\] = -1 is negative"),
    "negative sequence length": (_set("seq_lens", 1, -2), r"seq_lens\[1\] = -2 is negative"),
    "overlapping extend ranges": (
        lambda a: {"extend_start_loc": torch.tensor([1, 3])},
        r"extend rows of sequences 0 and 1 overlap",
    ),
    "extend range past T": (
        _set("extend_start_loc", 0, 9),
        r"extend_start_loc\[0\] = 9 with extend_seq_lens\[0\] = 4 runs outside the T = 12",
    ),
    "negative start": (_set("extend_start_loc", 1, -1), r"extend_start_loc\[1\] = -1"),
    "max_len_extend too small": (
        lambda a: {"max_len_extend": 4},
        r"extend_seq_lens\[1\] = 5 exceeds max_len_extend = 4",
    ),
    "slot past the cache": (
        _map_entry(0, 5, 14),
        r"req_to_token\[\d+, 5\] = 14 is outside the KV cache's token slots \[0, 14\)",
    ),
    "negative slot": (_map_entry(1, 0, -3), r"req_to_token\[\d+, 0\] = -3 is outside"),
    "pool row out of range": (_set("req_pool_indices", 1, 4), r"req_pool_indices\[1\] = 4 is outside"),
    "negative pool row": (_set("req_pool_indices", 0, -1), r"req_pool_indices\[0\] = -1 is outside"),
    "prefix wider than the map": (
        lambda a: {"req_to_token": a["req_to_token"][:, :5]},
        r"prefix_lens \(seq_lens - extend_seq_lens\)\[0\] = 6 exceeds req_to_token.size\(1\) = 5",
    ),
    "H not a multiple of H_kv": (
        lambda a: {"q_extend": a["q_extend"][:, :3], "o_extend": a["o_extend"][:, :3]},
        r"H = 3 heads, which is not a multiple of H_kv = 2",
    ),
    "NaN sm_scale": (lambda a: {"sm_scale": float("nan")}, r"sm_scale = nan is not a finite"),
    "infinite sm_scale": (lambda a: {"sm_scale": float("inf")}, r"sm_scale = inf is not a finite"),
    "negative logit_cap": (lambda a: {"logit_cap": -1.0}, r"logit_cap must be finite and >= 0 .*got -1"),
    "NaN logit_cap": (lambda a: {"logit_cap": float("nan")}, r"logit_cap must be finite and >= 0 .*got nan"),
    "float64 tensors": (
        lambda a: {k: a[k].double() for k in ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer")},
        r"q_extend has dtype Double",
    ),
    "mixed dtypes": (lambda a: {"v_buffer": a["v_buffer"].half()}, r"v_buffer has dtype Half but q_extend has Float"),
    "float token map": (
        lambda a: {"req_to_token": a["req_to_token"].float()},
        r"req_to_token must have dtype Int or Long, got Float",
    ),
    "float seq_lens": (lambda a: {"seq_lens": a["seq_lens"].float()}, r"seq_lens must have dtype Int or Long"),
    "subnormal logit_cap": (lambda a: {"logit_cap": 1e-40}, r"1/logit_cap a normal float32.*got 1e-40"),
    "int16 extend_start_loc": (
        lambda a: {"extend_start_loc": a["extend_start_loc"].short()},
        r"extend_start_loc must have dtype Int or Long, got Short",
    ),
    "int32 extend_seq_lens past max_len_extend": (
        lambda a: {"extend_seq_lens": a["extend_seq_lens"].int() * 50},
        r"extend_seq_lens\[\d\] = \d+ exceeds",
    ),
    "k_extend rows differ": (
        lambda a: {"k_extend": a["k_extend"][:-1]},
        r"k_extend.size\(0\) = 11 but q_extend.size\(0\)",
    ),
    "o_extend heads differ": (
        lambda a: {"o_extend": a["o_extend"][:, :2]},
        r"o_extend.size\(1\) = 2 but q_extend.size\(1\)",
    ),
    "k_buffer head dim differs": (
        lambda a: {"k_buffer": a["k_buffer"][:, :, :15]},
        r"k_buffer.size\(2\) = 15 but q_extend.size\(2\) \(D\) is 16",
    ),
    "v_buffer heads differ": (
        lambda a: {"v_buffer": a["v_buffer"][:, :1]},
        r"v_buffer.size\(1\) = 1 but k_extend.size\(1\)",
    ),
    "batch sizes differ": (
        lambda a: {"extend_start_loc": a["extend_start_loc"][:1]},
        r"extend_start_loc.size\(0\) = 1 but extend_seq_lens.size\(0\) \(B\) is 2",
    ),
    "seq_lens batch differs": (
        lambda a: {"seq_lens": a["seq_lens"][:1]},
        r"seq_lens.size\(0\) = 1 but the batch size is 2",
    ),
    "1-D token map": (lambda a: {"req_to_token": a["req_to_token"][0]}, r"req_to_token must be 2-D"),
    "wrong rank": (lambda a: {"q_extend": a["q_extend"][0]}, r"q_extend must be 3-D"),
    "head dim over 576": (
        lambda a: {k: torch.zeros(a[k].shape[:2] + (577,)) for k in ("q_extend", "k_extend", "k_buffer")},
        r"head dim D = 577 \(q_extend.size\(2\)\) is outside \[1, 576\]",
    ),
    "value head dim over 512": (
        lambda a: {k: torch.zeros(a[k].shape[:2] + (513,)) for k in ("v_extend", "v_buffer", "o_extend")},
        r"value head dim Dv = 513 \(v_extend.size\(2\) \(Dv\)\) is outside \[1, 512\]",
    ),
    "output aliases the query": (
        lambda a: {"o_extend": a["q_extend"][:, :, :8]},
        r"o_extend shares memory with q_extend",
    ),
    "output rows overlap": (
        lambda a: {"o_extend": a["o_extend"][:1].expand(12, 4, 8)},
        r"o_extend has overlapping elements",
    ),
    "strided last dim": (
        lambda a: {"k_buffer": torch.cat([a["k_buffer"]] * 2, dim=2)[:, :, ::2]},
        r"k_buffer must be contiguous in its last dimension",
    ),
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_a_clear_error_and_writes_nothing(kernel_variant, name):
    change, message = BAD_INPUTS[name]
    case = _valid_case()
    case.run(o_extend=case.inputs["o_extend"].clone())  # the unchanged case is valid
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises(RuntimeError, match=r"rvv_attn.extend_attention_cpu: .*" + message):
        case.run(**change(dict(case.inputs)))
