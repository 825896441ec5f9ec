// fp8_e4m3_quantize / fp8_e4m3_dequantize: a float8_e4m3fn KV cache's
// write and read, as SGLang's fp8 pool and its readers do them, on the
// active variant's vector conversions (kernels/fp8_convert.cpp).
//
// quantize(src, scale): (src / scale) in src's dtype, then torch's
//   conversion to float8_e4m3fn, bit for bit (the pool's set_kv_buffer);
// dequantize(src, scale, dtype): e4m3(src) * scale in float32, as dtype.
// src may be float8_e4m3fn or uint8 (SGLang stores the cache as uint8 and
// views it as float8_e4m3fn); the result is a new contiguous tensor.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

#include "ops/checks.h"
#include "ops/fp8_kv.h"
#include "ops/runtime.h"

namespace rvv_attn {
namespace {

constexpr char kQuantizeName[] = "rvv_attn.fp8_e4m3_quantize";
constexpr char kDequantizeName[] = "rvv_attn.fp8_e4m3_dequantize";

at::Tensor fp8_e4m3_quantize(const at::Tensor& src, double scale) {
  const char* op = kQuantizeName;
  checks::cpu_tensor(op, "src", src);
  const DType dtype = checks::float_dtype(op, "src", src);
  const float s = ops::checked_fp8_scale(op, "scale", scale);
  const at::Tensor in = src.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kFloat8_e4m3fn));
  const Fp8ConvertParams p{dtype, in.numel(), in.data_ptr(), out.data_ptr(), s, ops::torch_saturates_e4m3()};
  ops::kernels().fp8_quantize(p, ops::torch_pool());
  return out;
}

at::Tensor fp8_e4m3_dequantize(const at::Tensor& src, double scale, std::optional<at::ScalarType> dtype) {
  const char* op = kDequantizeName;
  checks::cpu_tensor(op, "src", src);
  TORCH_CHECK(ops::is_fp8_cache(src), op, ": src has dtype ", src.scalar_type(),
              "; give the fp8 cache as float8_e4m3fn, or as the uint8 tensor SGLang stores it in");
  const float s = ops::checked_fp8_scale(op, "scale", scale);
  const at::ScalarType out_type = dtype.value_or(at::kFloat);
  const DType out_dtype = checks::float_dtype_of(op, "dtype", " = ", out_type);
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(out_type));
  const at::Tensor in = src.contiguous();
  const Fp8ConvertParams p{out_dtype, in.numel(), in.data_ptr(), out.data_ptr(), s, ops::torch_saturates_e4m3()};
  ops::kernels().fp8_dequantize(p, ops::torch_pool());
  return out;
}

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY_FRAGMENT(rvv_attn, m) {
  m.def("fp8_e4m3_quantize(Tensor src, float scale=1.0) -> Tensor");
  m.def("fp8_e4m3_dequantize(Tensor src, float scale=1.0, ScalarType? dtype=None) -> Tensor");
}

TORCH_LIBRARY_IMPL(rvv_attn, CPU, m) {
  m.impl("fp8_e4m3_quantize", &rvv_attn::fp8_e4m3_quantize);
  m.impl("fp8_e4m3_dequantize", &rvv_attn::fp8_e4m3_dequantize);
}
