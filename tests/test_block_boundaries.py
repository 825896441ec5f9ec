"""Block boundaries of the active variant, and scores far apart enough to underflow exp.

The KV block (decode) and key block (extend) hold VLEN/32 * 4 tokens: 16,
32, 64, 128 at VLEN 128 ... 1024 (16 for the portable build). The cases here
take their lengths from the block the active variant reports, so every VLEN
runs one block minus one, one block, one block plus one and two blocks plus
one, with one and two splits and the head sizes of real models (D = 128,
256), and for int8 every combination of static and dynamic K/V scales. They
are sized for QEMU: one KV head, small batches, a handful of calls per VLEN.
"""

from __future__ import annotations

import math

import pytest
import torch

from cases.decode import assert_matches_reference, decode_block, expected_decode_block, make_case
from cases.extend import Case as ExtendCase
from cases.extend import blocking as extend_blocking
from cases.int8 import DYN, int8_decode, int8_extend
from tolerances import large_score_atol

D_SIZES = [128, 256]
SCALE_MODES = {
    "staticK-staticV": (0.02, 0.02),
    "staticK-dynV": (0.02, DYN),
    "dynK-staticV": (DYN, 0.02),
    "dynK-dynV": (DYN, DYN),
}


def edges(block: int) -> list[int]:
    return [block - 1, block, block + 1, 2 * block + 1]


def test_decode_block_is_derived_from_the_variant_vlen(kernel_variant):
    assert decode_block() == expected_decode_block(kernel_variant)
    # Extend's key block is two of decode's (one wide vector of tokens), so
    # the extend edges below also fall inside its key blocks.
    assert extend_blocking()[1] == 2 * decode_block()


@pytest.mark.parametrize("head_dim", D_SIZES)
@pytest.mark.parametrize("splits", [1, 2])
def test_decode_lengths_around_the_kv_block(kernel_variant, splits, head_dim):
    case = make_case(edges(decode_block()), 2, 1, head_dim, head_dim, torch.float32, splits, seed=head_dim + splits)
    case.run()
    assert_matches_reference(case)


@pytest.mark.parametrize("head_dim", D_SIZES)
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("mode", list(SCALE_MODES))
def test_int8_decode_lengths_around_the_kv_block(kernel_variant, mode, splits, head_dim):
    # Dynamic rows 3000x apart in magnitude: a block read with another
    # block's (or token's) scales is off by O(1), not by rounding.
    k_scale, v_scale = SCALE_MODES[mode]
    t = int8_decode(
        edges(decode_block()),
        2,
        1,
        head_dim,
        head_dim,
        torch.float32,
        k_scale,
        v_scale,
        splits=splits,
        magnitudes=True,
        seed=head_dim + splits,
    )
    # sm_scale 0.5/sqrt(D) instead of make_case's 2/sqrt(D), for the reason given at the extend test below:
    # a dynamic K scale adds one rounding of |score| * 2**-24 per score, inside the float32 atol only while
    # scores stay below ~10 (measured 6.2e-6 > 5e-6 at VLEN 512, D = 256, dynK-dynV, with 2/sqrt(D)).
    t.case.sm_scale = 0.5 / math.sqrt(head_dim)
    t.check()


def _extend_edges(head_dim: int) -> tuple[list[int], list[int]]:
    """(prefixes, new-token counts): over both head sizes every edge length is a prefix and a new-token count,
    and the new tokens cross a key block (k + 1, 2k + 1) with and without a prefix ending inside a block.
    k is decode's key block, half of extend's: extend's rows cross at k a vector of its wide key block and at
    2k + 1 the block itself."""
    k = decode_block()
    if head_dim == D_SIZES[0]:
        return [k - 1, k + 1], [k, 2 * k + 1]
    return [k, 2 * k + 1], [k + 1, k - 1]


@pytest.mark.parametrize("head_dim", D_SIZES)
def test_extend_lengths_around_the_key_block(kernel_variant, head_dim):
    prefix, extend = _extend_edges(head_dim)
    case = ExtendCase(
        prefix=prefix, extend=extend, heads=2, heads_kv=1, head_dim=head_dim, head_dim_v=head_dim, seed=head_dim
    ).build()
    case.check(case.run())


@pytest.mark.parametrize("head_dim", D_SIZES)
@pytest.mark.parametrize("mode", list(SCALE_MODES))
def test_int8_extend_lengths_around_the_key_block(kernel_variant, mode, head_dim):
    prefix, extend = _extend_edges(head_dim)
    k_scale, v_scale = SCALE_MODES[mode]
    # sm_scale 0.5/sqrt(D), as in test_int8_kv_cache's logit-cap test: a dynamic K scale multiplies each
    # float32 score once more (an extra rounding of |score| * 2**-24), which the float32 atol of
    # tolerances.py absorbs only while scores stay below ~10; rows of magnitude up to 10**0.5 at
    # D = 256 with 1/sqrt(D) reach that (measured 7.4e-6 > 5e-6 at VLEN 1024).
    t = int8_extend(
        ExtendCase(
            prefix=prefix,
            extend=extend,
            heads=2,
            heads_kv=1,
            head_dim=head_dim,
            head_dim_v=head_dim,
            sm_scale=0.5 / math.sqrt(head_dim),
            seed=head_dim,
        ),
        k_scale,
        v_scale,
        magnitudes=True,
    )
    t.check()


# ---- exp underflow ---------------------------------------------------------------------------------
# Scores hundreds apart: exp(score - max) underflows (the kernels' exp returns
# 0 below -87.3, where float32 has no normal numbers left), and so does the
# online-softmax rescale exp(m_old - m_new) when a later block's max is more
# than 88 above the earlier ones. The float64 reference gives those keys
# weights below 1e-38: the result must be the attention over the dominant
# keys only, without NaN, inf or garbage from an exp taken past its range.
def _score_terms(case) -> float:
    """max over heads and keys of sm_scale * sum_d |q_d k_d| (the scale of a score's rounding error)."""
    a, k, _ = case._reference_inputs()
    group = a["query"].shape[1] // k.shape[1]
    worst = 0.0
    for b in range(a["query"].shape[0]):
        slots = a["req_to_token"][int(a["req_pool_indices"][b]), : int(a["seq_lens"][b])].long()
        keys = k[slots].abs().double().repeat_interleave(group, dim=1)  # [L, H, D]
        worst = max(worst, float(torch.einsum("hd,lhd->hl", a["query"][b].abs().double(), keys).max()))
    return float(a["sm_scale"]) * worst


@pytest.mark.parametrize("splits", [1, 2])
def test_decode_scores_hundreds_apart(kernel_variant, splits):
    block = decode_block()
    # sm_scale 20/sqrt(D): scores ~N(0, 400), spread over hundreds.
    case = make_case([2 * block + 1, block + 3], 2, 1, 64, 64, torch.float32, splits, seed=31)
    case.sm_scale = 20.0 / math.sqrt(64)
    case.run()
    spread = case.reference_splits()[1]
    atol = large_score_atol(_score_terms(case), 64, float(case.v_buffer.abs().max()))
    assert_matches_reference(case, atol=atol)
    assert torch.isfinite(spread[:, :, 0]).all()


@pytest.mark.parametrize("later", ["higher", "lower"])
def test_decode_later_block_more_than_88_above_or_below(kernel_variant, later):
    # One sequence of three blocks: keys of the last block point along the
    # query (score ~ +100), the others are orthogonal-ish (score ~ 0), or the
    # reverse. "higher": the rescale of the first blocks' sums underflows;
    # "lower": the last block's probabilities underflow.
    block, d = decode_block(), 32
    case = make_case([3 * block], 1, 1, d, d, torch.float32, 1, seed=37)
    row = int(case.req_pool_indices[0])
    slots = case.req_to_token[row, : 3 * block].long()
    q = case.query[0, 0] / case.query[0, 0].norm()
    case.query[0, 0] = q
    case.sm_scale = 1.0
    strong = slots[2 * block :] if later == "higher" else slots[:block]
    for i, slot in enumerate(slots.tolist()):
        kk = case.k_buffer[slot, 0]
        kk -= (kk @ q) * q  # orthogonal to the query: score 0
        if slot in strong.tolist():
            kk += (100.0 + i % 7) * q
    # The new token (written at loc, the last slot) keeps its key: set it like the others.
    case.key[0, 0] = case.k_buffer[int(case.loc[0]), 0]
    case.run()
    atol = large_score_atol(_score_terms(case), d, float(case.v_buffer.abs().max()))
    assert_matches_reference(case, atol=atol)


def test_extend_scores_hundreds_apart(kernel_variant):
    block = decode_block()
    case = ExtendCase(
        prefix=[2 * block + 1, 3],
        extend=[block + 2, 5],
        heads=2,
        heads_kv=1,
        head_dim=64,
        head_dim_v=64,
        sm_scale=20.0 / math.sqrt(64),
        seed=41,
    ).build()
    out = case.run()
    a = case.inputs
    keys = torch.cat([a["k_buffer"], a["k_extend"]]).abs().double()[:, 0]  # H_kv = 1
    terms = a["sm_scale"] * float((a["q_extend"].abs().double().flatten(0, 1) @ keys.T).max())
    value_max = max(float(a["v_extend"].abs().max()), float(a["v_buffer"].abs().max()))
    ref = case.reference()
    owned = ~torch.isnan(ref[:, 0, 0])
    torch.testing.assert_close(
        out[owned].double(), ref[owned], atol=large_score_atol(terms, 64, value_max), rtol=2.0**-24
    )
