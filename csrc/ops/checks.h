// Input checks shared by every operator entry point. Each failure names the
// operator, the argument and the offending value, and fires before anything
// is written.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>

#include "kernels/kernel_api.h"

namespace rvv_attn::checks {

inline std::string shape_of(const at::Tensor& t) { return c10::str(t.sizes()); }

inline void cpu_tensor(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.defined(), op, ": ", name, " is undefined");
  TORCH_CHECK(t.device().is_cpu(), op, ": ", name, " must be a CPU tensor, got device ", t.device());
}

inline void rank(const char* op, const char* name, const at::Tensor& t, int64_t dims, const char* layout) {
  cpu_tensor(op, name, t);
  TORCH_CHECK(t.dim() == dims, op, ": ", name, " must be ", dims, "-D ", layout, ", got shape ", shape_of(t));
}

inline void size_is(const char* op, const char* name, const at::Tensor& t, int64_t dim, int64_t expected,
                    const char* what) {
  TORCH_CHECK(t.size(dim) == expected, op, ": ", name, ".size(", dim, ") = ", t.size(dim), " but ", what, " is ",
              expected, " (", name, " has shape ", shape_of(t), ")");
}

inline void dense_last_dim(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.size(-1) <= 1 || t.stride(-1) == 1, op, ": ", name,
              " must be contiguous in its last dimension, got strides ", c10::str(t.strides()));
}

// float32, bfloat16 or float16 -> DType; anything else is an error
// "<op>: <name><is><type>; supported are ...": a tensor's dtype
// (is = " has dtype "), or a dtype argument (is = " = ").
inline DType float_dtype_of(const char* op, const char* name, const char* is, at::ScalarType type) {
  switch (type) {
    case at::kFloat: return DType::Float32;
    case at::kBFloat16: return DType::BFloat16;
    case at::kHalf: return DType::Float16;
    default: TORCH_CHECK(false, op, ": ", name, is, type, "; supported are float32, bfloat16 and float16");
  }
  return DType::Float32;  // unreachable
}
inline DType float_dtype(const char* op, const char* name, const at::Tensor& t) {
  return float_dtype_of(op, name, " has dtype ", t.scalar_type());
}

// The float operators refuse a quantized cache with a pointer to the
// operators that read it.
inline void not_int8_cache(const char* op, const char* name, const at::Tensor& t) {
  TORCH_CHECK(t.scalar_type() != at::kChar, op, ": ", name,
              " is an int8 KV cache (dtype Char); this operator takes float32, bfloat16 or float16 caches. "
              "Use rvv_attn.decode_attention_int8_cpu / rvv_attn.extend_attention_int8_cpu for int8 caches");
  TORCH_CHECK(t.scalar_type() != at::kFloat8_e4m3fn, op, ": ", name,
              " is an fp8 KV cache (dtype Float8_e4m3fn); this operator takes float32, bfloat16 or float16 caches. "
              "Use rvv_attn.decode_attention_fp8_cpu / rvv_attn.extend_attention_fp8_cpu for fp8 caches");
}

inline void same_dtype(const char* op, const char* name, const at::Tensor& t, const char* ref_name,
                       const at::Tensor& ref) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), op, ": ", name, " has dtype ", t.scalar_type(), " but ", ref_name,
              " has ", ref.scalar_type(), "; they must match");
}

inline void index_dtype(const char* op, const char* name, const at::Tensor& t,
                        std::initializer_list<at::ScalarType> allowed) {
  for (at::ScalarType s : allowed) {
    if (t.scalar_type() == s) return;
  }
  std::string names;
  for (at::ScalarType s : allowed) names += (names.empty() ? "" : " or ") + std::string(c10::toString(s));
  TORCH_CHECK(false, op, ": ", name, " must have dtype ", names, ", got ", t.scalar_type());
}

// Index tensors (positions, lengths, slots) may be int32 or int64, as
// SGLang passes them; the binding reads them as int64 copies.
inline void index_tensor(const char* op, const char* name, const at::Tensor& t) {
  index_dtype(op, name, t, {at::kInt, at::kLong});
}

// 0 disables the soft cap; otherwise the kernels compute cap * tanh(s * (1/cap))
// in float32, so 1/cap must be a normal float32: a subnormal cap would make it
// infinite (and the output NaN), a cap above 1/FLT_MIN would make it subnormal
// and lose precision.
inline void logit_cap(const char* op, double cap) {
  const float f = static_cast<float>(cap);
  const bool off = cap == 0.0;
  const bool ok =
      off || (std::isfinite(f) && f > 0.0f && 1.0f / f >= std::numeric_limits<float>::min() && std::isfinite(1.0f / f));
  TORCH_CHECK(cap >= 0.0 && ok, op,
              ": logit_cap must be finite and >= 0 (0 disables the cap), and 1/logit_cap a "
              "normal float32 (so a non-zero cap lies in [",
              1.0f / std::numeric_limits<float>::max(), ", ", 1.0f / std::numeric_limits<float>::min(), "]), got ",
              cap);
}

}  // namespace rvv_attn::checks
