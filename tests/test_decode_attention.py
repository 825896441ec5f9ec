"""decode_attention_cpu: KV write + split-KV paged decode attention against a float64 reference."""

from __future__ import annotations

import itertools
import random
import zlib

import pytest
import torch

from cases.decode import Case, assert_matches_reference, decode_block, make_case
from reference import decode_attention as reference_attention
from tolerances import TOLERANCES

# ---------------------------------------------------------------------------
# The shape/dtype/layout matrix, as all-pairs combinations: every pair of
# values of any two factors occurs in some case (the full product would take
# hours under QEMU and prove little more).
HEADS = [(1, 1), (8, 8), (17, 17), (32, 8), (18, 3), (21, 7), (16, 1)]
DIMS = [(64, 64), (128, 128), (128, 64), (33, 55), (80, 80), (127, 127), (256, 256)]
# Lengths in units of the active variant's KV block k (16 ... 128 tokens).
# Every option starts with a sequence longer than two blocks, so every row of
# the matrix below, and with it every (head layout, head size) pair, runs the
# online softmax across block boundaries with rescaling at every VLEN
# (test_every_head_layout_and_head_size_crosses_two_blocks checks this).
LENS = {
    "len1": lambda batch, k: [2 * k + 3] + [1] * (batch - 1),
    "below": lambda batch, k: [2 * k + 3] + [k - 1] * (batch - 1),
    "above": lambda batch, k: [2 * k + 1] + [k + 1] * (batch - 1),
    "at": lambda batch, k: [3 * k] + [k] * (batch - 1),
    "len1024": lambda batch, k: [1024] + [1, k - 1, k + 1][: batch - 1],
    "mixed": lambda batch, k: [2 * k + 3, 1, k + 1, 2, k - 1, k, 31, 2 * k][:batch],
}
FACTORS = {
    "heads": HEADS,
    "dims": DIMS,
    "dtype": [torch.float32, torch.bfloat16, torch.float16],
    "lens": list(LENS),
    "batch": [1, 2, 3, 5, 8],
    "splits": [1, 2, 3, 5, 8],
    "map_dtype": [torch.int32, torch.int64],
    "strided": [False, True],
    "logit_cap": [0.0, 2.0],
}


def all_pairs(factors: dict, seed: int = 1, tries: int = 30) -> list[dict]:
    """Greedy all-pairs covering array (deterministic)."""
    rng = random.Random(seed)
    names = list(factors)
    sizes = [len(factors[n]) for n in names]
    uncovered = {
        (i, a, j, b)
        for i, j in itertools.combinations(range(len(names)), 2)
        for a in range(sizes[i])
        for b in range(sizes[j])
    }
    rows = []
    while uncovered:
        i, a, j, b = min(uncovered)
        best, best_gain = None, -1
        for _ in range(tries):
            row = [rng.randrange(s) for s in sizes]
            row[i], row[j] = a, b
            gain = sum((x, row[x], y, row[y]) in uncovered for x, y in itertools.combinations(range(len(names)), 2))
            if gain > best_gain:
                best, best_gain = row, gain
        uncovered -= {(x, best[x], y, best[y]) for x, y in itertools.combinations(range(len(names)), 2)}
        rows.append({n: factors[n][k] for n, k in zip(names, best)})
    return rows


MATRIX = all_pairs(FACTORS)


def _case_id(c: dict) -> str:
    return (
        f"H{c['heads'][0]}_{c['heads'][1]}-D{c['dims'][0]}_{c['dims'][1]}-{str(c['dtype']).split('.')[-1]}-"
        f"{c['lens']}x{c['batch']}-s{c['splits']}-{str(c['map_dtype']).split('.')[-1]}-"
        f"{'strided' if c['strided'] else 'dense'}-cap{c['logit_cap']:g}"
    )


@pytest.mark.parametrize("combo", MATRIX, ids=[_case_id(c) for c in MATRIX])
def test_matches_reference(kernel_variant, combo):
    (heads, heads_kv), (head_dim, head_dim_v) = combo["heads"], combo["dims"]
    case = make_case(
        LENS[combo["lens"]](combo["batch"], decode_block()),
        heads,
        heads_kv,
        head_dim,
        head_dim_v,
        combo["dtype"],
        combo["splits"],
        combo["map_dtype"],
        combo["strided"],
        combo["logit_cap"],
        seed=zlib.crc32(_case_id(combo).encode()) % 1000,
    )
    case.run()
    assert_matches_reference(case)


def test_every_head_layout_and_head_size_crosses_two_blocks(kernel_variant):
    # The emulated sessions rely on the all-pairs matrix for the head layout x
    # head size product: each pair must meet a sequence longer than two KV blocks.
    block = decode_block()
    long_rows = {(c["heads"], c["dims"]) for c in MATRIX if max(LENS[c["lens"]](c["batch"], block)) > 2 * block}
    missing = set(itertools.product(HEADS, DIMS)) - long_rows
    assert not missing, f"(heads, dims) pairs never run past two KV blocks of {block} tokens: {sorted(missing)}"


# Every head layout with every head size, float32: on the host only (49
# cases, seconds there, many minutes under QEMU); the emulated sessions rely
# on the all-pairs matrix above (checked just above).
HEAD_DIM_PRODUCT = list(itertools.product(HEADS, DIMS))


@pytest.mark.host_only
@pytest.mark.parametrize(
    "heads,dims", HEAD_DIM_PRODUCT, ids=[f"H{h[0]}_{h[1]}-D{d[0]}_{d[1]}" for h, d in HEAD_DIM_PRODUCT]
)
def test_every_head_layout_with_every_head_size(kernel_variant, heads, dims):
    case = make_case([1, 65, 130], heads[0], heads[1], dims[0], dims[1], torch.float32, splits=3)
    case.run()
    assert_matches_reference(case)


@pytest.mark.parametrize("splits", [2, 3, 4, 5, 6, 7, 8])
def test_every_split_count_gives_the_same_answer(kernel_variant, splits):
    # Lengths below, at and above the split count: trailing splits are empty.
    # The same data with one split, then with ``splits``: each is checked
    # against the reference (attn_logits too), and against each other.
    lens = [1, 2, 5, 8, 9, 40, 2 * decode_block() + 1]
    one = make_case(lens, 4, 2, 32, 24, torch.float32, 1)
    one.run()
    case = make_case(lens, 4, 2, 32, 24, torch.float32, splits)
    case.run()
    assert_matches_reference(one)
    assert_matches_reference(case)
    assert not torch.isnan(case.attn_logits).any(), "an empty split produced NaN"
    # Two float32 computations of one value, each within the float32
    # allowance of the float64 result: they differ by at most both added up.
    tol = TOLERANCES[torch.float32]
    torch.testing.assert_close(case.output, one.output, atol=2 * tol["atol"], rtol=2 * tol["rtol"])
    assert not torch.equal(case.attn_logits[:, :, :1], one.attn_logits), "split 0 must cover fewer tokens"


def test_logit_cap_is_applied(kernel_variant):
    capped = make_case([70, 3], 6, 2, 40, 40, torch.float32, 2, logit_cap=2.0, seed=5)
    plain = make_case([70, 3], 6, 2, 40, 40, torch.float32, 2, logit_cap=0.0, seed=5)
    capped.run()
    plain.run()
    assert_matches_reference(capped)
    assert_matches_reference(plain)
    assert (capped.output - plain.output).abs().max() > 0.05, "the cap did not change the result"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_new_token_is_written_and_used(kernel_variant, dtype):
    case = make_case([5, 33], 4, 2, 16, 8, dtype, 2, seed=3)
    # Make the new token dominate sequence 0: its key is the query direction.
    case.key[0] = (case.query[0, :2] * 4).to(dtype)
    before_k, before_v = case.k_buffer.clone(), case.v_buffer.clone()
    stale = reference_attention(
        case.query, before_k, before_v, case.req_to_token, case.req_pool_indices, case.seq_lens, case.sm_scale, 0.0
    )
    case.run()
    for b, slot in enumerate(case.loc.tolist()):
        assert torch.equal(case.k_buffer[slot], case.key[b])
        assert torch.equal(case.v_buffer[slot], case.value[b])
    assert_matches_reference(case)
    # Attending over the stale rows at loc would give a clearly different answer.
    assert (case.output.double() - stale).abs().max() > 0.1


def _run_with_threads(case: Case, threads: int) -> None:
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        case.run()
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_sglang_padding_rows_share_slot_0_and_the_last_one_stays(kernel_variant, dtype, threads):
    """SGLang's CPU graph runner pads a short batch with rows that write slot 0 (loc 0, pool row 0, seq_lens 1).

    The reference writes the batch's K/V in batch order, then attends: the
    real rows' outputs are unchanged by the padding, slot 0 holds the last
    padding row's K/V, and each padding row attends that one token.
    """
    case = make_case([2 * decode_block() + 3, 5, 1], 8, 2, 40, 24, dtype, 2, seed=11, padding=4)
    real = 3
    _run_with_threads(case, threads)
    assert_matches_reference(case)
    assert torch.equal(case.k_buffer[0], case.key[-1]) and torch.equal(case.v_buffer[0], case.value[-1])
    # Alone with the real rows, the outputs are the same, bit for bit.
    alone = make_case([2 * decode_block() + 3, 5, 1], 8, 2, 40, 24, dtype, 2, seed=11, padding=4)
    batch_args = ("query", "output", "key", "value", "loc", "attn_logits", "req_pool_indices", "seq_lens")
    for name in batch_args:
        setattr(alone, name, getattr(alone, name)[:real])
    alone.run()
    assert torch.equal(alone.output, case.output[:real])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_loc_drawn_with_repeats_from_a_few_slots(kernel_variant, dtype, threads):
    """loc drawn at random from slots [0, 4), as SGLang's own decode tests draw it: the slots repeat, and other
    sequences read them. Every write happens first, in batch order, the last one per slot staying; then attention."""
    case = make_case([decode_block() + 1, 7, 20, 1, 3, 9], 4, 2, 24, 16, dtype, 3, seed=12, loc_slots=4)
    assert len(set(case.loc.tolist())) < len(case.loc), "the case must repeat slots"
    read = {int(case.req_to_token[r, t]) for r, n in zip(case.req_pool_indices, case.seq_lens) for t in range(n)}
    assert read & set(case.loc.tolist()), "some written slot must also be read"
    _run_with_threads(case, threads)
    assert_matches_reference(case)
    last = {slot: b for b, slot in enumerate(case.loc.tolist())}
    for slot, b in last.items():
        assert torch.equal(case.k_buffer[slot], case.key[b]) and torch.equal(case.v_buffer[slot], case.value[b])


SPECIALS = {
    torch.float16: [
        0.0,
        -0.0,
        6e-8,
        -3e-5,
        6.1e-5,
        65504.0,
        -65504.0,
        float("inf"),
        float("-inf"),
        float("nan"),
        1.0009765625,
        3.14159,
    ],
    torch.bfloat16: [
        0.0,
        -0.0,
        1e-40,
        1e-38,
        -3.0e38,
        3.3e38,
        float("inf"),
        float("-inf"),
        float("nan"),
        1.0078125,
        -2.5e-3,
        7.0,
    ],
    torch.float32: [
        0.0,
        -0.0,
        1e-45,
        1.2e-38,
        3.4e38,
        float("inf"),
        float("-inf"),
        float("nan"),
        1.0000001,
        -7.25,
        1e-30,
        123456.7,
    ],
}


@pytest.mark.parametrize("dtype", list(SPECIALS), ids=str)
def test_single_token_returns_its_value_bit_for_bit(kernel_variant, dtype):
    # One token: softmax weight exactly 1, so the output is the new V row
    # widened and narrowed again; subnormals, infinities and NaN included.
    row = torch.tensor(SPECIALS[dtype], dtype=torch.float32).to(dtype)
    case = make_case([1, 1], 2, 1, 8, row.numel(), dtype, splits=4, seed=2)
    case.value[:] = row
    case.run()
    expected = row.expand(2, 2, -1)
    torch.testing.assert_close(case.output, expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_output_rounds_to_nearest_even(kernel_variant, dtype):
    # Two tokens with zero keys weigh 1/2 each: the float32 output
    # (v1 + v2) / 2 is exact and often a tie in the narrow type, so the
    # narrowing must match torch's round-to-nearest-even bit for bit.
    g = torch.Generator().manual_seed(11)
    width = 64
    magnitude = torch.pow(2.0, torch.randint(-26 if dtype == torch.float16 else -130, 12, (4, width), generator=g))
    v = (torch.randn(4, width, generator=g) * magnitude).to(dtype)
    case = make_case([2, 2], 1, 1, 4, width, dtype, splits=1, seed=4)
    case.key.zero_()
    for b in range(2):
        row = int(case.req_pool_indices[b])
        first = int(case.req_to_token[row, 0])
        case.k_buffer[first] = 0
        case.v_buffer[first, 0] = v[2 * b]
        case.value[b, 0] = v[2 * b + 1]
    case.run()
    expected = ((v[0::2].float() + v[1::2].float()) / 2).to(dtype)
    assert torch.equal(case.output[:, 0].view(torch.int16), expected.view(torch.int16))


@pytest.mark.variant_independent
def test_empty_batch_is_a_no_op(kernel_variant):
    case = make_case([], 4, 2, 16, 16, torch.float32, 2)
    k_before, v_before = case.k_buffer.clone(), case.v_buffer.clone()
    case.run()
    assert case.output.shape == (0, 4, 16)
    assert torch.equal(case.k_buffer, k_before) and torch.equal(case.v_buffer, v_before)


# ---------------------------------------------------------------------------
# Bad input: a clear RuntimeError and nothing written.
def _with(case: Case, **change) -> Case:
    for k, v in change.items():
        setattr(case, k, v)
    return case


def _map_entry(case: Case, value: int) -> Case:
    row = int(case.req_pool_indices[1])
    case.req_to_token[row, 2] = value
    return case


def _logits_over_seq_lens(case: Case) -> Case:
    """attn_logits laid over valid int32 seq_lens: the kernel would overwrite lengths it still reads."""
    base = torch.zeros(case.attn_logits.numel(), dtype=torch.int32)
    base[: len(case.seq_lens)] = case.seq_lens.int()
    return _with(
        case, seq_lens=base[: len(case.seq_lens)], attn_logits=base.view(torch.float32).view(case.attn_logits.shape)
    )


BAD_INPUTS = {
    # indices
    "loc past the cache": (lambda c: _with(c, loc=torch.tensor([1, 10**6])), r"loc\[1\] = 1000000 is outside"),
    "negative loc": (lambda c: _with(c, loc=torch.tensor([-2, 3])), r"loc\[0\] = -2 is outside"),
    "map entry past the cache": (lambda c: _map_entry(c, 999), r"req_to_token\[\d+, 2\] = 999 is outside the KV cache"),
    "negative map entry": (lambda c: _map_entry(c, -1), r"req_to_token\[\d+, 2\] = -1 is outside the KV cache"),
    "pool row past the end": (
        lambda c: _with(c, req_pool_indices=torch.tensor([int(c.req_pool_indices[0]), 5])),
        r"req_pool_indices\[1\] = 5 is outside req_to_token's rows \[0, 5\)",
    ),
    "negative pool row": (
        lambda c: _with(c, req_pool_indices=torch.tensor([-1, 0])),
        r"req_pool_indices\[0\] = -1 is outside",
    ),
    "length past max_context_len": (
        lambda c: _with(c, seq_lens=torch.tensor([3, 100])),
        r"seq_lens\[1\] = 100 exceeds req_to_token.size\(1\) = 12",
    ),
    "negative length": (lambda c: _with(c, seq_lens=torch.tensor([-1, 7])), r"seq_lens\[0\] = -1 is negative"),
    "zero length with a new token": (
        lambda c: _with(c, seq_lens=torch.tensor([3, 0])),
        r"seq_lens\[1\] = 0 but every sequence includes the token written at loc",
    ),
    # dtypes
    "float64 query": (lambda c: _with(c, query=c.query.double()), r"query has dtype Double"),
    "float64 cache": (
        lambda c: _with(
            c, k_buffer=c.k_buffer.double(), v_buffer=c.v_buffer.double(), key=c.key.double(), value=c.value.double()
        ),
        r"k_buffer has dtype Double",
    ),
    "query dtype differs": (lambda c: _with(c, query=c.query.half()), r"k_buffer has dtype Float but query has Half"),
    "output dtype differs": (
        lambda c: _with(c, output=c.output.bfloat16()),
        r"output has dtype BFloat16 but query has Float",
    ),
    "float map": (lambda c: _with(c, req_to_token=c.req_to_token.float()), r"req_to_token must have dtype Int or Long"),
    "int16 pool indices": (
        lambda c: _with(c, req_pool_indices=c.req_pool_indices.short()),
        r"req_pool_indices must have dtype Int or Long, got Short",
    ),
    "float seq_lens": (
        lambda c: _with(c, seq_lens=c.seq_lens.float()),
        r"seq_lens must have dtype Int or Long, got Float",
    ),
    "uint8 loc": (lambda c: _with(c, loc=c.loc.to(torch.uint8)), r"loc must have dtype Int or Long, got Byte"),
    "int64 pool row past 2^32": (
        lambda c: _with(c, req_pool_indices=torch.tensor([int(c.req_pool_indices[0]), 2**32 + 1])),
        r"req_pool_indices\[1\] = 4294967297 is outside",
    ),
    "bf16 attn_logits": (
        lambda c: _with(c, attn_logits=c.attn_logits.bfloat16()),
        r"attn_logits must have dtype float32, got BFloat16",
    ),
    # shapes
    "2-D query": (lambda c: _with(c, query=c.query[0]), r"query must be 3-D"),
    "3-D attn_logits": (lambda c: _with(c, attn_logits=c.attn_logits[:, :, 0]), r"attn_logits must be 4-D"),
    "H not a multiple of H_kv": (
        lambda c: _with(c, query=c.query[:, :3], output=c.output[:, :3], attn_logits=c.attn_logits[:, :3]),
        r"H = 3 heads, not a multiple of H_kv = 2",
    ),
    "output head count differs": (
        lambda c: _with(c, output=c.output[:, :2]),
        r"output.size\(1\) = 2 but query.size\(1\) \(H\) is 4",
    ),
    "key head count differs": (lambda c: _with(c, key=c.key[:, :1]), r"key.size\(1\) = 1 but k_buffer.size\(1\)"),
    "query head size differs": (
        lambda c: _with(c, query=c.query[:, :, :8]),
        r"query.size\(2\) = 8 but k_buffer.size\(2\) \(D\) is 16",
    ),
    "attn_logits last dim is Dv": (
        lambda c: _with(c, attn_logits=c.attn_logits[..., :-1]),
        r"attn_logits.size\(3\) = 7 but Dv \+ 1",
    ),
    "attn_logits batch differs": (
        lambda c: _with(c, attn_logits=c.attn_logits[:1]),
        r"attn_logits.size\(0\) = 1 but query.size\(0\)",
    ),
    "zero splits": (lambda c: _with(c, attn_logits=c.attn_logits[:, :, :0]), r"number of KV splits and must be >= 1"),
    "query batch differs": (
        lambda c: _with(c, query=c.query[:1], output=c.output[:1], attn_logits=c.attn_logits[:1]),
        r"key.size\(0\) = 2 but query.size\(0\)",
    ),
    "strided query last dim": (
        lambda c: _with(c, query=torch.cat([c.query, c.query], 2)[:, :, ::2]),
        r"query must be contiguous in its last dimension",
    ),
    # scalars
    "nan sm_scale": (lambda c: _with(c, sm_scale=float("nan")), r"sm_scale must be finite, got nan"),
    "inf sm_scale": (lambda c: _with(c, sm_scale=float("inf")), r"sm_scale must be finite, got inf"),
    "negative logit_cap": (lambda c: _with(c, logit_cap=-1.0), r"logit_cap must be finite and >= 0.*got -1"),
    "inf logit_cap": (lambda c: _with(c, logit_cap=float("inf")), r"logit_cap must be finite and >= 0.*got inf"),
    "subnormal logit_cap": (lambda c: _with(c, logit_cap=1e-40), r"1/logit_cap a normal float32.*got 1e-40"),
    # memory overlap: written tensors may not repeat an element or touch an input
    "expanded output rows": (
        lambda c: _with(c, output=c.output[:1].expand_as(c.output)),
        r"output has overlapping elements",
    ),
    "overlapping attn_logits splits": (
        lambda c: _with(c, attn_logits=c.attn_logits[:, :, :1].expand_as(c.attn_logits)),
        r"attn_logits has overlapping elements",
    ),
    "output inside attn_logits": (
        lambda c: _with(c, output=c.attn_logits[:, :, 0, :7]),
        r"output shares memory with attn_logits",
    ),
    "output over query": (lambda c: _with(c, output=c.query[..., :7]), r"output shares memory with query"),
    "output inside the cache": (
        lambda c: _with(c, output=c.v_buffer.view(-1)[: 2 * 4 * 7].view(2, 4, 7)),
        r"output shares memory with v_buffer",
    ),
    "attn_logits over seq_lens": (lambda c: _logits_over_seq_lens(c), r"attn_logits shares memory with seq_lens"),
}


@pytest.mark.variant_independent
@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_bad_input_raises_a_clear_error_and_writes_nothing(kernel_variant, name):
    mutate, message = BAD_INPUTS[name]
    case = mutate(make_case([3, 7], 4, 2, 16, 7, torch.float32, 2, spare_slots=5))
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises(RuntimeError, match=r"rvv_attn.decode_attention_cpu: .*" + message):
        case.run()
