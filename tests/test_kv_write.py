"""decode_set_kv_buffer: the KV-cache write that decode attention does first."""

from __future__ import annotations

import pytest
import torch

from cases.kv_write import make_case, write
from reference import write_kv as reference_write_kv

DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "batch,heads_kv,head_dim,head_dim_v",
    [(1, 1, 1, 1), (3, 2, 33, 55), (4, 8, 128, 64), (2, 3, 256, 256), (5, 1, 1000, 7)],
)
@pytest.mark.parametrize("strided", [False, True], ids=["dense", "strided"])
def test_rows_land_at_their_slots_and_nothing_else_changes(
    kernel_variant, dtype, batch, heads_kv, head_dim, head_dim_v, strided
):
    k_buffer, v_buffer, key, value, loc = make_case(batch, heads_kv, head_dim, head_dim_v, dtype, strided=strided)
    k_expected, v_expected = k_buffer.clone(), v_buffer.clone()
    reference_write_kv(k_expected, v_expected, key, value, loc)
    write(dict(k_buffer=k_buffer, v_buffer=v_buffer, key=key, value=value, loc=loc))
    # A copy must be exact, bit for bit, in every dtype.
    assert torch.equal(k_buffer, k_expected)
    assert torch.equal(v_buffer, v_expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize("strided", [False, True], ids=["dense", "strided"])
def test_repeated_slots_keep_the_last_row_in_batch_order(kernel_variant, dtype, threads, strided):
    """loc drawn from a few slots, as SGLang's CPU decode tests draw it: every write happens in batch order and
    the last row naming a slot is what the slot holds, whatever the thread count."""
    k_buffer, v_buffer, key, value, _ = make_case(23, 3, 40, 17, dtype, slots=9, strided=strided, seed=7)
    loc = torch.randint(0, 5, (23,), generator=torch.Generator().manual_seed(7))
    assert len(set(loc.tolist())) < 23 // 2, "the case must repeat slots"
    k_expected, v_expected = k_buffer.clone(), v_buffer.clone()
    reference_write_kv(k_expected, v_expected, key, value, loc)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        write(dict(k_buffer=k_buffer, v_buffer=v_buffer, key=key, value=value, loc=loc.to(torch.int32)))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(k_buffer, k_expected)
    assert torch.equal(v_buffer, v_expected)
    last = {slot: b for b, slot in enumerate(loc.tolist())}
    for slot, b in last.items():
        assert torch.equal(k_buffer[slot], key[b]) and torch.equal(v_buffer[slot], value[b])


@pytest.mark.variant_independent
def test_empty_batch_is_a_no_op(kernel_variant):
    k_buffer, v_buffer, key, value, loc = make_case(0, 2, 16, 16, torch.float32)
    before = k_buffer.clone(), v_buffer.clone()
    write(dict(k_buffer=k_buffer, v_buffer=v_buffer, key=key, value=value, loc=loc))
    assert torch.equal(k_buffer, before[0]) and torch.equal(v_buffer, before[1])


def _bad(case, **change):
    args = dict(zip(["k_buffer", "v_buffer", "key", "value", "loc"], case))
    args.update(change)
    return args


BAD_INPUTS = {
    "slot past the end": (lambda c: _bad(c, loc=torch.tensor([1, 64], dtype=torch.int64)), r"loc\[1\] = 64 is outside"),
    "negative slot": (lambda c: _bad(c, loc=torch.tensor([-1, 3], dtype=torch.int64)), r"loc\[0\] = -1 is outside"),
    "float loc": (lambda c: _bad(c, loc=c[4].float()), r"loc must have dtype Int or Long, got Float"),
    "huge int64 slot": (
        lambda c: _bad(c, loc=torch.tensor([1, 2**32 + 3], dtype=torch.int64)),
        r"loc\[1\] = 4294967299 is outside",
    ),
    "key inside k_buffer": (lambda c: _bad(c, key=c[0][:2]), r"k_buffer shares memory with key"),
    "one tensor for both caches": (
        lambda c: _bad(c, v_buffer=c[0], value=c[2]),
        r"k_buffer shares memory with v_buffer",
    ),
    "expanded cache": (lambda c: _bad(c, k_buffer=c[0][:1].expand_as(c[0])), r"k_buffer has overlapping elements"),
    "float64 cache": (
        lambda c: _bad(c, k_buffer=c[0].double(), v_buffer=c[1].double(), key=c[2].double(), value=c[3].double()),
        r"k_buffer has dtype Double",
    ),
    "key dtype differs": (lambda c: _bad(c, key=c[2].half()), r"key has dtype Half but k_buffer has Float"),
    "head count differs": (lambda c: _bad(c, key=c[2][:, :1]), r"key.size\(1\) = 1 but k_buffer.size\(1\)"),
    "head dim differs": (lambda c: _bad(c, value=c[3][:, :, :3]), r"value.size\(2\) = 3 but v_buffer.size\(2\)"),
    "batch differs": (lambda c: _bad(c, value=c[3][:1]), r"value.size\(0\) = 1 but key.size\(0\)"),
    "wrong rank": (lambda c: _bad(c, key=c[2][0]), r"key must be 3-D"),
    "strided last dim": (
        lambda c: _bad(c, key=torch.cat([c[2], c[2]], dim=2)[:, :, ::2]),
        r"key must be contiguous in its last dimension",
    ),
}


@pytest.mark.variant_independent
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_a_clear_error_and_writes_nothing(kernel_variant, name):
    mutate, message = BAD_INPUTS[name]
    case = make_case(2, 2, 16, 8, torch.float32)
    args = mutate(case)
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises(RuntimeError, match=r"rvv_attn.decode_set_kv_buffer: .*" + message):
        write(args)
