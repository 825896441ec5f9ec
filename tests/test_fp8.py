"""float8_e4m3fn conversions: fp8_e4m3_dequantize / fp8_e4m3_quantize against torch's own conversions.

Every fp8 kernel reads its cache through the vector conversion these operators
run (vec::E4m3Codes), so the 256 codes are checked exactly at every VLEN and in
the portable build. The reference is torch itself: its float8_e4m3fn -> float32
conversion for reading, and for writing what SGLang's fp8 pool does
(``cache_k.div_(k_scale)`` in the input's dtype, then ``.to(torch.float8_e4m3fn)``),
including how this torch treats values beyond 448 (newer torch saturates, older
gives NaN; the library asks the torch it runs with).
"""

from __future__ import annotations

import pytest
import torch

import rvv_attn
from reference import fp8_pool_quantize as pool_quantize

FLOATS = [torch.float32, torch.bfloat16, torch.float16]
ALL_CODES = torch.arange(256, dtype=torch.uint8)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The bit patterns of a float tensor (NaN payloads included), for exact comparison."""
    return t.view({4: torch.int32, 2: torch.int16, 1: torch.uint8}[t.element_size()])


def same_values(got: torch.Tensor, expected: torch.Tensor) -> bool:
    """Bit for bit, but a NaN only as a NaN: its sign and payload after float arithmetic are the FPU's (RISC-V
    returns the canonical 0x7fc00000 for every NaN result, x86 keeps the operand's), not the conversion's."""
    nan = torch.isnan(expected)
    return torch.equal(torch.isnan(got), nan) and torch.equal(bits(got)[~nan], bits(expected)[~nan])


def test_every_code_converts_as_torch_converts_it(kernel_variant):
    got = rvv_attn.ops.fp8_e4m3_dequantize(ALL_CODES, 1.0)
    expected = ALL_CODES.view(torch.float8_e4m3fn).float()
    assert got.dtype == torch.float32
    # Zeros of both signs, the subnormals, every normal, and NaN.
    assert same_values(got, expected)
    assert torch.isnan(got).nonzero().flatten().tolist() == [0x7F, 0xFF]  # S.1111.111
    assert got[0x7E] == 448.0 and got[0x01] == 2.0**-9 and bits(got)[0x80] == bits(torch.tensor(-0.0))


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.0371, 3.5])
def test_dequantize_is_the_float32_product_in_the_asked_dtype(kernel_variant, dtype, scale):
    codes = ALL_CODES.repeat(3)  # more than one vector at every VLEN, and a tail
    got = rvv_attn.ops.fp8_e4m3_dequantize(codes.view(torch.float8_e4m3fn), scale, dtype)
    expected = (codes.view(torch.float8_e4m3fn).float() * torch.tensor(scale, dtype=torch.float32)).to(dtype)
    assert got.dtype == dtype and got.shape == codes.shape
    assert same_values(got, expected)


def _every_pattern(dtype: torch.dtype) -> torch.Tensor:
    """Every bf16/f16 bit pattern (infinities, NaNs, subnormals included); for float32 a spread of magnitudes
    around e4m3's range with ties and the rounding boundaries at 448/464/480 and 2^-6/2^-10."""
    if dtype != torch.float32:
        return torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16).view(dtype)
    g = torch.Generator().manual_seed(11)
    spread = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-14, 10, (20000,), generator=g).float())
    codes = ALL_CODES.view(torch.float8_e4m3fn).float()
    finite = codes[torch.isfinite(codes)]
    # Midpoints between neighbouring codes (ties: round to even), and one float32 step either side.
    ordered = finite.unique()
    mid = (ordered[1:].double() + ordered[:-1].double()).div(2).float()
    near = torch.cat([mid, torch.nextafter(mid, mid + 1), torch.nextafter(mid, mid - 1)])
    edges = torch.tensor([448, 463.9, 464, 464.1, 479.9, 480, 1e30, float("inf"), float("nan"), 2**-6, 2**-10, 0.0])
    values = torch.cat([spread, near, edges, finite])
    return torch.cat([values, -values])


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("scale", [1.0, 0.0371, 3.5])
def test_quantize_writes_the_bytes_sglangs_pool_writes(kernel_variant, dtype, scale):
    x = _every_pattern(dtype)
    got = rvv_attn.ops.fp8_e4m3_quantize(x, scale)
    expected = pool_quantize(x, scale)
    assert got.dtype == torch.float8_e4m3fn and got.shape == x.shape
    # A NaN input must give a NaN code; its sign is not torch's to promise: x86 torch's in-place bf16 division
    # returns 0xffff for the NaNs of a vectorised chunk and 0x7fc0 for the scalar tail, so the pool's code for
    # the same NaN depends on where it sits in the tensor.
    nan_in = torch.isnan(x)
    assert ((bits(got)[nan_in] & 0x7F) == 0x7F).all()
    mismatch = ((bits(got) != bits(expected)) & ~nan_in).nonzero().flatten()
    assert mismatch.numel() == 0, [
        (float(x[i]), hex(int(bits(got)[i])), hex(int(bits(expected)[i]))) for i in mismatch[:8].tolist()
    ]


def test_quantize_then_dequantize_returns_every_code(kernel_variant):
    codes = ALL_CODES.view(torch.float8_e4m3fn)
    values = rvv_attn.ops.fp8_e4m3_dequantize(codes, 0.25)
    back = rvv_attn.ops.fp8_e4m3_quantize(values, 0.25)
    nan = torch.isnan(values)
    assert torch.equal(bits(back)[~nan], ALL_CODES[~nan])
    assert torch.isnan(back.float()[nan]).all()


def test_strided_input_reads_the_elements_not_the_storage(kernel_variant):
    g = torch.Generator().manual_seed(12)
    x = torch.randn(64, 33, generator=g).t()  # not contiguous
    assert not x.is_contiguous()
    assert torch.equal(bits(rvv_attn.ops.fp8_e4m3_quantize(x, 0.5)), bits(pool_quantize(x, 0.5)))
    codes = ALL_CODES.view(16, 16).t()
    assert same_values(
        rvv_attn.ops.fp8_e4m3_dequantize(codes, 1.0), codes.contiguous().view(torch.float8_e4m3fn).float()
    )


@pytest.mark.variant_independent
@pytest.mark.parametrize("scale", [0.0, -1.0, float("inf"), float("nan"), 1e-50, 1e40])
def test_a_scale_that_is_not_a_finite_positive_float32_is_refused(kernel_variant, scale):
    with pytest.raises(RuntimeError, match=r"fp8_e4m3_quantize: scale = .* is not a valid scale"):
        rvv_attn.ops.fp8_e4m3_quantize(torch.ones(4), scale)
    with pytest.raises(RuntimeError, match=r"fp8_e4m3_dequantize: scale = .* is not a valid scale"):
        rvv_attn.ops.fp8_e4m3_dequantize(ALL_CODES, scale)


@pytest.mark.variant_independent
def test_wrong_dtypes_are_refused_by_name(kernel_variant):
    with pytest.raises(RuntimeError, match=r"fp8_e4m3_quantize: src has dtype Char"):
        rvv_attn.ops.fp8_e4m3_quantize(torch.ones(4, dtype=torch.int8), 1.0)
    with pytest.raises(RuntimeError, match=r"fp8_e4m3_dequantize: src has dtype Float;"):
        rvv_attn.ops.fp8_e4m3_dequantize(torch.ones(4), 1.0)
    with pytest.raises(RuntimeError, match=r"fp8_e4m3_dequantize: dtype = Int"):
        rvv_attn.ops.fp8_e4m3_dequantize(ALL_CODES, 1.0, torch.int32)


def test_empty_tensors_convert_to_empty_tensors(kernel_variant):
    assert rvv_attn.ops.fp8_e4m3_quantize(torch.ones(0, 8), 1.0).shape == (0, 8)
    assert rvv_attn.ops.fp8_e4m3_dequantize(torch.ones(3, 0, dtype=torch.uint8), 1.0).shape == (3, 0)
