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
* atol covers float32 arithmetic. An attention output is a convex
  combination of V rows (|v| <~ 4 for the tests' normal data), so an error
  e in the scores moves it by about e * |v|. A score is a dot product over
  D <= 256 terms accumulated in float32: rounding error ~ D * 2**-24 * |q_d
  k_d| * sm_scale ~ 6e-7 for unit-normal data; the exp polynomial is good to
  1.5e-7 relative and the softmax sum over ~10^4 keys to ~sqrt(n) * 2**-24.
  Together ~1e-6 for D <= 64. The margin is thin for long float32 rows at
  D = 128 and 256: over 18 draws each of H 32/8, 16/1 and 17/17 with a
  1024-token sequence, the portable build's worst output or partial error
  was 2.4e-6 at D = 64, 5.1e-6 at D = 128 and 5.2e-6 at D = 256 (the suite's
  own draws stay below 5e-6). A real bug (a missed or extra key, a wrong
  scale, a mask off by one) moves outputs by 1e-3 or more.
"""

from __future__ import annotations

import torch

F32_ACCUMULATION_ATOL = 5e-6

TOLERANCES: dict[torch.dtype, dict[str, float]] = {
    torch.float32: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-24},
    torch.bfloat16: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-8},
    torch.float16: {"atol": F32_ACCUMULATION_ATOL, "rtol": 2.0**-11},
}


def assert_close_to_reference(out: torch.Tensor, ref: torch.Tensor) -> None:
    """Compare a kernel output (any dtype) with a float64 reference, at the output dtype's tolerance."""
    torch.testing.assert_close(out.double(), ref, **TOLERANCES[out.dtype])


# ---- attn_logits: per-split partial outputs and log-sum-exp ------------------------------------
# A split's partial output is float32 (never narrowed), so it gets the float32
# row of TOLERANCES. Its log-sum-exp lse = m + log(l) is a float32 sum of the
# split's max score m and the log of its softmax sum l: an error e in the
# scores moves both by e (covered by F32_ACCUMULATION_ATOL, which bounds e
# for the tests' data), l's relative error (~sqrt(n) * 2**-24 for n <= 10^4
# terms, < 1e-5) moves log(l) by as much in absolute terms, and rounding the
# sum m + log(l) costs half an ulp of |lse|, one more of log(l): rtol 2**-23.
LSE_TOLERANCE = {"atol": F32_ACCUMULATION_ATOL + 1e-5, "rtol": 2.0**-23}


# ---- scores of large magnitude ------------------------------------------------------------------
def large_score_atol(score_terms: float, head_dim: int, value_max: float) -> float:
    """atol for an attention output whose scores are hundreds apart (exp underflow cases).

    ``score_terms`` is the largest sm_scale * sum_d |q_d k_d| of any score: a
    float32 dot product over D terms is off by about sqrt(D) * 2**-24 of that
    (random rounding errors add in quadrature; the query is pre-scaled, one
    more rounding per term). Subtracting the row max is exact for the max
    itself, so a score error e scales that key's weight by exp(e) ~ 1 + e, and
    the normalized output, a convex combination of V rows, moves by at most
    2 e max|v|. With scores ~N(0, 4) this is ~1e-6, the float32 allowance
    above; with scores of hundreds it grows in proportion, and the output is
    then still held to the float32 rounding of its own scores.
    """
    score_error = (head_dim**0.5 + 1) * 2.0**-24 * score_terms
    return F32_ACCUMULATION_ATOL + 2 * score_error * value_max
