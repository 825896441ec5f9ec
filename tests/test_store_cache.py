"""store_cache_cpu: SGLang main's KV-pool write (token i's K/V rows to slot indices[i]), compared bit for bit."""

from __future__ import annotations

import pytest
import torch

import opcall
import rvv_attn


def _call(k, v, k_cache, v_cache, indices, row_dim=None) -> None:
    args = dict(k=k, v=v, k_cache=k_cache, v_cache=v_cache, indices=indices, row_dim=row_dim)
    opcall.call(
        rvv_attn.ops.store_cache_cpu,
        args,
        {"k_cache": opcall.rows(k_cache, indices), "v_cache": opcall.rows(v_cache, indices)},
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.uint8], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
def test_rows_land_in_their_slots(kernel_variant, dtype, index_dtype):
    g = torch.Generator().manual_seed(0)
    tokens, heads, head_dim, head_dim_v, slots = 7, 3, 10, 6, 20

    def rand(*shape):
        x = torch.randn(*shape, generator=g) * 40
        return x.to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)

    # A fused [N, 2, H, D] pool (K and V halves), and new rows that are strided views.
    pool = rand(slots, 2, heads, head_dim)
    k_cache, v_cache = pool[:, 0], pool[:, 1, :, :head_dim_v]
    k = rand(tokens, heads, 2 * head_dim)[:, :, :head_dim]
    v = rand(tokens, heads, head_dim_v)
    indices = torch.randperm(slots, generator=g)[:tokens].to(index_dtype)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    expected_k[indices.long()], expected_v[indices.long()] = k, v
    _call(k, v, k_cache, v_cache, indices, row_dim=heads * head_dim)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize("threads", [1, 3])
def test_repeated_indices_keep_the_last_token_in_order(kernel_variant, dtype, threads):
    """Tokens naming one slot are written in order and the last stays, as torch's indexed assignment leaves a CPU
    cache (SGLang's padded batches all write slot 0)."""
    g = torch.Generator().manual_seed(3)
    tokens, heads, head_dim, head_dim_v, slots = 19, 2, 12, 5, 10
    x = torch.randn(tokens + slots, heads, head_dim + head_dim_v, generator=g) * 40
    x = x.to(torch.uint8) if dtype == torch.uint8 else x.to(dtype)
    k, v = x[:tokens, :, :head_dim], x[:tokens, :, head_dim:]
    k_cache, v_cache = x[tokens:, :, :head_dim].clone(), x[tokens:, :, head_dim:].clone()
    # Real tokens at their own slots, then padding tokens all at slot 0, then repeats drawn from a few slots.
    indices = torch.cat(
        [torch.tensor([3, 7, 5]), torch.zeros(4, dtype=torch.int64), torch.randint(0, 4, (12,), generator=g)]
    )
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    for i, slot in enumerate(indices.tolist()):
        expected_k[slot], expected_v[slot] = k[i], v[i]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _call(k, v, k_cache, v_cache, indices)
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.variant_independent
@pytest.mark.parametrize("case", ["out of range", "negative", "dtype", "row_dim", "heads", "float indices"])
def test_bad_input_is_refused_and_nothing_is_written(case):
    k, v = torch.ones(3, 2, 4), torch.ones(3, 2, 4)
    k_cache, v_cache = torch.zeros(8, 2, 4), torch.zeros(8, 2, 4)
    indices, row_dim = torch.tensor([1, 5, 2]), None
    match = {
        "out of range": r"indices\[1\] = 8 is outside the caches' token slots \[0, 8\)",
        "negative": r"indices\[0\] = -1 is outside",
        "dtype": r"v_cache has dtype BFloat16 but k has Float",
        "row_dim": r"row_dim = 9 but k's rows hold H \* D = 2 \* 4 = 8 elements",
        "heads": r"k_cache.size\(1\) = 1 but k.size\(1\) \(H\) is 2",
        "float indices": r"indices must have dtype Int or Long, got Float",
    }[case]
    if case == "out of range":
        indices = torch.tensor([1, 8, 2])
    elif case == "negative":
        indices = torch.tensor([-1, 5, 2])
    elif case == "dtype":
        v_cache = v_cache.bfloat16()
    elif case == "row_dim":
        row_dim = 9
    elif case == "heads":
        k_cache = k_cache[:, :1]
    elif case == "float indices":
        indices = indices.float()
    args = dict(k=k, v=v, k_cache=k_cache, v_cache=v_cache, indices=indices, row_dim=row_dim)
    with pytest.raises(RuntimeError, match=match):
        opcall.call(rvv_attn.ops.store_cache_cpu, args)


def test_sgl_kernel_name_without_row_dim(kernel_variant):
    import rvv_attn.sglang  # noqa: F401

    k, v = torch.randn(2, 1, 4), torch.randn(2, 1, 4)
    k_cache, v_cache = torch.zeros(4, 1, 4), torch.zeros(4, 1, 4)
    torch.ops.sgl_kernel.store_cache_cpu(k, v, k_cache, v_cache, torch.tensor([3, 0], dtype=torch.int32), None)
    assert torch.equal(k_cache[3], k[0]) and torch.equal(v_cache[0], v[1])
    assert torch.equal(k_cache[1:3], torch.zeros(2, 1, 4))
