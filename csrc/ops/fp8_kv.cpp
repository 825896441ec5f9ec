#include "ops/fp8_kv.h"

#include <c10/util/Exception.h>
#include <c10/util/Float8_e4m3fn.h>

#include <cmath>

#include "ops/checks.h"
#include "ops/runtime.h"

namespace rvv_attn::ops {

bool is_fp8_cache(const at::Tensor& t) { return t.scalar_type() == at::kFloat8_e4m3fn || t.scalar_type() == at::kByte; }

float checked_fp8_scale(const char* op, const char* name, double scale) {
  const float f = static_cast<float>(scale);
  TORCH_CHECK(std::isfinite(f) && f > 0.0f, op, ": ", name, " = ", scale,
              " is not a valid scale: give a finite scale > 0 (as float32; SGLang's layer k_scale / v_scale, "
              "1.0 when the checkpoint has none)");
  return f;
}

Fp8Setup check_fp8_args(const char* op, const Fp8KvArgs& args, const at::Tensor& k_buffer, const at::Tensor& v_buffer) {
  for (auto [name, t] : {std::pair<const char*, const at::Tensor*>{"k_buffer", &k_buffer}, {"v_buffer", &v_buffer}}) {
    TORCH_CHECK(is_fp8_cache(*t), op, ": ", name, " has dtype ", t->scalar_type(),
                "; this operator reads a float8_e4m3fn KV cache (or the uint8 tensor SGLang stores it in). "
                "Use rvv_attn.decode_attention_cpu / rvv_attn.extend_attention_cpu for float caches");
  }
  checks::same_dtype(op, "v_buffer", v_buffer, "k_buffer", k_buffer);
  return {checked_fp8_scale(op, args.k_name, args.k_scale), checked_fp8_scale(op, args.v_name, args.v_scale)};
}

bool torch_saturates_e4m3() {
  static const bool saturates = c10::Float8_e4m3fn(1000.0f).x == 0x7e;
  return saturates;
}

void run_fp8_write(const Fp8Setup& s, const KvWriteParams& kv) {
  const Fp8KvWriteParams p{kv, s.k_scale, s.v_scale, torch_saturates_e4m3()};
  kernels().write_kv_fp8(p, torch_pool());
}

}  // namespace rvv_attn::ops
