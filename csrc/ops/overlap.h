// Memory overlap between the tensors of one operator call.
//
// An operator may not write memory that it (or another worker) still reads,
// and may not write one element twice through two indices. Overlap is judged
// by the bytes each view actually touches, not by shared storage: the K and V
// halves of one fused KV pool ([N, 2, H, D] viewed as [:, 0] and [:, 1]) or
// disjoint row ranges of one tensor share a storage but no element, and are
// fine. Addresses are absolute, so two tensors made over the same memory by
// from_blob are compared correctly too.
//
// Torch side only; cheap in the common case (disjoint address ranges).
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace rvv_attn::overlap {

enum class Verdict { No, Yes, Unknown };

// Whether two elements of ``t`` share a byte (an expand()ed dimension, or
// strides that interleave). Unknown only for layouts too irregular to decide
// within a fixed amount of work.
Verdict internal(const at::Tensor& t);

// Whether some byte belongs to an element of ``a`` and an element of ``b``.
Verdict between(const at::Tensor& a, const at::Tensor& b);

struct Arg {
  const char* name;
  const at::Tensor* tensor;
};

// Arguments whose tensor is null or undefined (an optional argument not
// given) are left out. Every written tensor must have no internal overlap and share no byte with
// any other argument (written or read). An Unknown verdict is refused too:
// the operator cannot promise a correct result it cannot check. Each error
// names the operator, both arguments and their shapes and strides.
void check_writes(const char* op, const std::vector<Arg>& written, const std::vector<Arg>& read);

}  // namespace rvv_attn::overlap
