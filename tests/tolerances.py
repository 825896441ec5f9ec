"""Per-dtype tolerances for comparing attention kernels with the float64 references.

torch.testing.assert_close passes when |out - ref| <= atol + rtol * |ref|.
The references run in float64 on the very inputs the kernel saw (already
rounded to the dtype), so the only differences are the kernel's float32
arithmetic and the final rounding of the output to the dtype:

* rtol is the final rounding: round-to-nearest-even to a format with p
  significand bits is off by at most 2**-p relative (half an ulp), i.e.
  2**-8 for bfloat16, 2**-11 for float16, 2**-24 for float32. It is the
  whole rounding allowance and cannot be tightened without failing a
  correctly rounded result.
* atol covers float32 accumulation. An attention output is a convex
  combination of V rows (|v| <~ 5 for the tests' normal data), so an error
  in the scores of e (absolute) moves it by about e * |v|. Scores are dot
  products over D <= 256 accumulated in float32 (relative error ~ sqrt(D) *
  2**-24 on |q.k| ~ 1 after scaling), the exp approximation is good to a
  few float32 ulps, and the softmax sum over up to ~10^4 keys adds ~
  sqrt(n) * 2**-24 relative. All together well under 1e-5 absolute; 2e-5
  leaves a factor 2 for the worst case of the long test. A bug (a missed
  key, a wrong scale, a mask off by one) moves outputs by 1e-3 or more.
"""

from __future__ import annotations

import torch

F32_ACCUMULATION_ATOL = 2e-5

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-24},
    torch.bfloat16: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-8},
    torch.float16: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-11},
}


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Compare a kernel output (any dtype) with a float64 reference, at the output dtype's tolerance."""
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[out.dtype])
