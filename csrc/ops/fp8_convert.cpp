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
#include <c10/util/Float8_e4m3fn.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

#include "ops/checks.h"
#include "ops/runtime.h"

namespace rvv_attn {
namespace {

constexpr char kQuantizeName[] = "rvv_attn.fp8_e4m3_quantize";
constexpr char kDequantizeName[] = "rvv_attn.fp8_e4m3_dequantize";

float checked_scale(const char* op, double scale) {
  const float f = static_cast<float>(scale);
  TORCH_CHECK(std::isfinite(f) && f > 0.0f, op, ": scale = ", scale,
              " is not a valid scale: give a finite scale > 0 (as float32; SGLang's layer k_scale / v_scale, "
              "1.0 when the checkpoint has none)");
  return f;
}

// How the torch this library was built against converts a float beyond
// e4m3's range: its own scalar conversion says (saturating to 448 in newer
// torch, NaN in older), so the kernels follow the torch they run with.
bool torch_saturates_e4m3() {
  static const bool saturates = c10::Float8_e4m3fn(1000.0f).x == 0x7e;
  return saturates;
}

at::Tensor fp8_e4m3_quantize(const at::Tensor& src, double scale) {
  const char* op = kQuantizeName;
  checks::cpu_tensor(op, "src", src);
  const DType dtype = checks::float_dtype(op, "src", src);
  const float s = checked_scale(op, scale);
  const at::Tensor in = src.contiguous();
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(at::kFloat8_e4m3fn));
  const Fp8ConvertParams p{dtype, in.numel(), in.data_ptr(), out.data_ptr(), s, torch_saturates_e4m3()};
  ops::kernels().fp8_quantize(p, ops::torch_pool());
  return out;
}

at::Tensor fp8_e4m3_dequantize(const at::Tensor& src, double scale, std::optional<at::ScalarType> dtype) {
  const char* op = kDequantizeName;
  checks::cpu_tensor(op, "src", src);
  TORCH_CHECK(src.scalar_type() == at::kFloat8_e4m3fn || src.scalar_type() == at::kByte, op, ": src has dtype ",
              src.scalar_type(), "; give the fp8 cache as float8_e4m3fn, or as the uint8 tensor SGLang stores it in");
  const float s = checked_scale(op, scale);
  const at::ScalarType out_type = dtype.value_or(at::kFloat);
  TORCH_CHECK(out_type == at::kFloat || out_type == at::kBFloat16 || out_type == at::kHalf, op, ": dtype = ", out_type,
              "; supported are float32, bfloat16 and float16");
  at::Tensor out = at::empty(src.sizes(), src.options().dtype(out_type));
  const DType out_dtype = checks::float_dtype(op, "dtype", out);
  const at::Tensor in = src.contiguous();
  const Fp8ConvertParams p{out_dtype, in.numel(), in.data_ptr(), out.data_ptr(), s, torch_saturates_e4m3()};
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
