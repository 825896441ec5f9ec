"""Speculative decoding's verify step: extend with a tree mask, and extend with ``is_causal=False``.

SGLang 0.5.23's CPU backend passes, for a target-verify batch whose draft
tokens form a tree (EAGLE with topk > 1, NGRAM), ``tree_mask``: a flat bool
tensor [B * L * L] where every request extends by the same L draft tokens and
draft token i sees draft token j iff mask[b, i, j] (the committed prefix in
full); and ``is_causal=False`` for layers that attend all new tokens
(encoder-only). The reference builds the same visibility explicitly
(reference.extend_attention_options).
"""

from __future__ import annotations

import pytest
import torch

import opcall
import rvv_attn
from cases.extend import Case, token_tree_masks
from reference import extend_attention_options
from tolerances import assert_close_to_reference

EXTEND = rvv_attn.ops.extend_attention_cpu
EXTEND_FP8 = rvv_attn.ops.extend_attention_fp8_cpu


def make_case(prefix, draft: int, dtype=torch.float32, seed=0, **kw) -> dict:
    return dict(Case(prefix=prefix, extend=[draft] * len(prefix), dtype=dtype, seed=seed, **kw).build().inputs)


def reference(a: dict, **options) -> torch.Tensor:
    return extend_attention_options(
        a["q_extend"],
        a["k_extend"].double(),
        a["v_extend"].double(),
        a["k_buffer"],
        a["v_buffer"],
        a["req_to_token"],
        a["req_pool_indices"],
        a["seq_lens"],
        a["extend_seq_lens"],
        a["extend_start_loc"],
        a["sm_scale"],
        a["logit_cap"],
        **options,
    )


def run(op, a: dict) -> None:
    opcall.call(op, a, opcall.documented_writes("extend_attention_cpu", a))


def check(a: dict, ref: torch.Tensor) -> None:
    rows = opcall.owned_rows(a)
    assert_close_to_reference(a["o_extend"][rows], ref[rows])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tree_mask_matches_the_reference(kernel_variant, dtype):
    block_m, block_n, _ = rvv_attn.ops.extend_attention_blocking(32, 32)
    draft = block_m + 3  # more than one query block, and keys past the first key block at small VLENs
    a = make_case([0, 7, block_n + 5], draft, dtype, seed=61)
    a["tree_mask"] = token_tree_masks(3, draft, torch.Generator().manual_seed(1))
    ref = reference(a, tree_mask=a["tree_mask"])
    run(EXTEND, a)
    check(a, ref)
    # The tree changes the result: a plain causal extend of the same tokens differs.
    causal = reference(a)
    assert (ref[opcall.owned_rows(a)] - causal[opcall.owned_rows(a)]).abs().max() > 1e-3


def test_any_mask_even_rows_that_see_no_draft_token(kernel_variant):
    """Masks need not be trees: any pattern, a key after the query, and rows that see no draft token at all
    (with a prefix: only the prefix; without: nothing, zeros)."""
    draft = 11
    a = make_case([0, 9], draft, seed=62, logit_cap=5.0)
    mask = torch.rand(2, draft, draft, generator=torch.Generator().manual_seed(2)) < 0.4
    mask[:, 3] = False  # row 3 of both sequences: no draft token
    a["tree_mask"] = mask.flatten()
    ref = reference(a, tree_mask=a["tree_mask"])
    run(EXTEND, a)
    check(a, ref)
    first = int(a["extend_start_loc"][0])
    assert torch.equal(a["o_extend"][first + 3], torch.zeros_like(a["o_extend"][first + 3]))


def test_tree_mask_with_sinks_on_an_fp8_cache(kernel_variant):
    draft = 6
    a = make_case([12, 30], draft, seed=63, heads=8, heads_kv=2)
    g = torch.Generator().manual_seed(3)
    for name in ("k_buffer", "v_buffer"):
        a[name] = (torch.randn(a[name].shape, generator=g) * 20).to(torch.float8_e4m3fn)
    a["tree_mask"] = token_tree_masks(2, draft, g)
    a["sinks"] = torch.randn(8, generator=g)
    a["k_scale"] = a["v_scale"] = 0.05
    dequantized = {name: a[name].to(torch.float64) * 0.05 for name in ("k_buffer", "v_buffer")}
    ref = reference({**a, **dequantized}, tree_mask=a["tree_mask"], sinks=a["sinks"])
    run(EXTEND_FP8, a)
    check(a, ref)


def test_not_causal_attends_every_new_token(kernel_variant):
    block_m, block_n, _ = rvv_attn.ops.extend_attention_blocking(32, 32)
    a = make_case([0, 5], block_n + 2, seed=64)
    a["extend_seq_lens"] = torch.tensor([block_n + 2, 4])  # lengths may differ without a tree mask
    a["seq_lens"] = torch.tensor([block_n + 2, 9])
    a["is_causal"] = False
    ref = reference(a, causal=False)
    run(EXTEND, a)
    check(a, ref)
    assert (ref[opcall.owned_rows(a)] - reference(a)[opcall.owned_rows(a)]).abs().max() > 1e-3


@pytest.mark.parametrize(
    "change,message",
    [
        (dict(tree_mask=torch.ones(2 * 4 * 4, dtype=torch.uint8)), r"tree_mask has dtype Byte; it must be bool"),
        (dict(tree_mask=torch.ones(2 * 4 * 4 - 1, dtype=torch.bool)), r"tree_mask has shape \[31\]; expected \[32\]"),
        (dict(tree_mask=torch.ones(2, 4, 4, dtype=torch.bool)), r"tree_mask has shape \[2, 4, 4\]; expected \[32\]"),
        (dict(tree_mask=torch.ones(32, dtype=torch.bool), sliding_window_size=3), r"tree_mask cannot be used with a"),
        (dict(is_causal=False, sliding_window_size=3), r"is_causal=False cannot be used with a sliding window"),
    ],
    ids=["dtype", "numel", "rank", "window", "noncausal-window"],
)
def test_bad_masks_are_refused_by_name_and_nothing_is_written(kernel_variant, change, message):
    a = make_case([3, 5], 4, seed=65)
    a.update(change)
    with pytest.raises(RuntimeError, match=message):
        opcall.call(EXTEND, a, {})


def test_a_tree_mask_needs_equal_draft_counts(kernel_variant):
    a = make_case([3, 5], 4, seed=66)
    a["extend_seq_lens"] = torch.tensor([4, 3])
    a["seq_lens"] = torch.tensor([7, 8])
    a["tree_mask"] = torch.ones(2 * 4 * 4, dtype=torch.bool)
    with pytest.raises(RuntimeError, match=r"every sequence extends by max_len_extend = 4 .* extend_seq_lens\[1\] = 3"):
        opcall.call(EXTEND, a, {})
