"""flash_attn_varlen_func: dense variable-length attention (SGLang's vision encoders), against a float64 reference.

Lengths are chosen around the active variant's extend tiles (BLOCK_M query
rows, BLOCK_N keys), with query and key lengths that differ per sequence in
both directions, a sequence without keys, and GQA.
"""

from __future__ import annotations

import pytest
import torch

import rvv_attn
from reference import flash_attn_varlen as reference_varlen
from tolerances import assert_close_to_reference


def _cu(lengths: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def _inputs(
    q_lens: list[int],
    k_lens: list[int],
    heads: int,
    heads_kv: int,
    head_dim: int,
    head_dim_v: int,
    dtype: torch.dtype,
    seed: int,
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, head_dim, generator=g).to(dtype)
    k = torch.randn(sum(k_lens), heads_kv, head_dim, generator=g).to(dtype)
    v = torch.randn(sum(k_lens), heads_kv, head_dim_v, generator=g).to(dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [False, True], ids=["dense", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_varlen_matches_reference(kernel_variant, causal, dtype):
    block_m, block_n, _ = (int(x) for x in rvv_attn.ops.extend_attention_blocking(40, 24))
    q_lens = [block_m + 1, 3, block_n, 5, 0]
    k_lens = [block_n + 2, 9, block_n - 1, 0, 4]  # Lq > Lk, Lq < Lk, no keys, no queries
    q, k, v = _inputs(q_lens, k_lens, heads=4, heads_kv=2, head_dim=40, head_dim_v=24, dtype=dtype, seed=1)
    cu_q, cu_k = _cu(q_lens), _cu(k_lens)
    out = rvv_attn.ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(q_lens), max(k_lens), causal)
    assert out.shape == (sum(q_lens), 4, 24) and out.dtype == dtype
    assert_close_to_reference(out, reference_varlen(q, k, v, cu_q, cu_k, causal))


def test_varlen_as_a_vision_encoder_calls_it(kernel_variant):
    """Keywords, equal-length images (SGLang's "non-varlen" path), strided q/k/v views of one qkv tensor."""
    import rvv_attn.sglang  # noqa: F401

    images, patches, heads, head_dim = 2, 37, 4, 32
    g = torch.Generator().manual_seed(2)
    qkv = torch.randn(images * patches, 3, heads, head_dim, generator=g).to(torch.bfloat16)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    cu = _cu([patches] * images)
    out = torch.ops.sgl_kernel.flash_attn_varlen_func(
        q=q, k=k, v=v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=patches, max_seqlen_k=patches, causal=False
    )
    assert_close_to_reference(out, reference_varlen(q, k, v, cu, cu, False))


def test_rows_no_sequence_covers_are_zero(kernel_variant):
    q, k, v = _inputs([3, 2], [4, 4], heads=2, heads_kv=1, head_dim=8, head_dim_v=8, dtype=torch.float32, seed=3)
    cu_q = torch.tensor([0, 2, 4], dtype=torch.int32)  # q has 5 rows; row 4 belongs to no sequence
    out = rvv_attn.ops.flash_attn_varlen_func(q, k, v, cu_q, _cu([4, 4]), 2, 4, True)
    assert torch.equal(out[4], torch.zeros_like(out[4]))
    assert_close_to_reference(out, reference_varlen(q, k, v, cu_q, _cu([4, 4]), True))


@pytest.mark.parametrize(
    "case",
    ["decreasing", "past the rows", "over max", "int64", "not from 0", "head dims", "heads", "dtype", "sizes differ"],
)
@pytest.mark.variant_independent
def test_bad_input_is_refused(case):
    q, k, v = _inputs([3, 2], [4, 1], heads=4, heads_kv=2, head_dim=8, head_dim_v=8, dtype=torch.float32, seed=4)
    cu_q, cu_k, max_q, max_k = _cu([3, 2]), _cu([4, 1]), 3, 4
    match = {
        "decreasing": r"cu_seqlens_k must not decrease, but cu_seqlens_k\[2\] = 3 < cu_seqlens_k\[1\] = 4",
        "past the rows": r"cu_seqlens_q\[2\] = 9 runs past the 5 rows of q",
        "over max": r"sequence 0 has 3 rows \(cu_seqlens_q\[1\] - cu_seqlens_q\[0\]\), more than max_seqlen_q = 2",
        "int64": r"cu_seqlens_q must have dtype Int, got Long",
        "not from 0": r"cu_seqlens_k\[0\] = 1; it must be 0",
        "head dims": r"k.size\(2\) = 7 but q.size\(2\) \(D\) is 8",
        "heads": r"q has H = 3 heads, which is not a multiple of H_kv = 2",
        "dtype": r"k has dtype BFloat16 but q has Float",
        "sizes differ": r"cu_seqlens_k.size\(0\) = 2 but cu_seqlens_q.size\(0\) \(B \+ 1\) is 3",
    }[case]
    if case == "decreasing":
        cu_k = torch.tensor([0, 4, 3], dtype=torch.int32)
    elif case == "past the rows":
        cu_q = torch.tensor([0, 3, 9], dtype=torch.int32)
    elif case == "over max":
        max_q = 2
    elif case == "int64":
        cu_q = cu_q.long()
    elif case == "not from 0":
        cu_k = torch.tensor([1, 4, 5], dtype=torch.int32)
    elif case == "head dims":
        k = k[..., :7]
    elif case == "heads":
        q = q[:, :3]
    elif case == "dtype":
        k = k.bfloat16()
    elif case == "sizes differ":
        cu_k = cu_k[:2]
    with pytest.raises(RuntimeError, match=match):
        rvv_attn.ops.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, False)


def _attend_images(q, k, v, cu_q, cu_k, max_q, max_k):
    # Torch operations on both sides of the call, so the compiled graph is more than the one operator.
    out = torch.ops.rvv_attn.flash_attn_varlen_func(q * 0.5, k, v, cu_q, cu_k, max_q, max_k, True)
    return out.sum(dim=1) + 1.0


def test_torch_compile_fullgraph_matches_eager(kernel_variant):
    """torch.compile(fullgraph=True) traces the call through the operator's fake implementation (no graph break)
    and the compiled function gives eager's result, bit for bit, for two batches of different shapes."""
    torch._dynamo.reset()
    compiled = torch.compile(_attend_images, fullgraph=True, backend="aot_eager")
    for q_lens, k_lens, seed in (([5, 4], [6, 5], 5), ([7, 1, 3], [2, 9, 3], 6)):
        q, k, v = _inputs(
            q_lens, k_lens, heads=4, heads_kv=2, head_dim=16, head_dim_v=8, dtype=torch.float32, seed=seed
        )
        args = (q, k, v, _cu(q_lens), _cu(k_lens), max(q_lens), max(k_lens))
        expected = _attend_images(*args)
        assert torch.equal(compiled(*args), expected)
