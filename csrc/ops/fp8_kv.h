// The float8_e4m3fn KV cache on the torch side, shared by
// decode_attention_fp8_cpu, extend_attention_fp8_cpu and the fp8 conversion
// operators: the cache's dtype and scales, the quantizing cache write, and
// the fp8 fields of the kernel parameters.
//
// A cache holds e4m3 codes as float8_e4m3fn, or as the uint8 tensor SGLang's
// pool allocates (it views it as float8_e4m3fn). value = e4m3 * k_scale
// (v_scale): one static scale per layer, as SGLang passes them (the
// layer's k_scale_float, 1.0 when the checkpoint has none).
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/kernel_api.h"

namespace rvv_attn::ops {

// The two extra arguments of the fp8 operators.
struct Fp8KvArgs {
  double k_scale;
  double v_scale;
  // The scales' argument names, for errors.
  const char* k_name = "k_scale";
  const char* v_name = "v_scale";
  // Extend: the new tokens are in the cache's scaled units (value / scale),
  // as SGLang 0.5.23's CPU backend leaves them (its pool's set_kv_buffer
  // divides K and V by the layer's scales in place before the call), so the
  // scales apply to them too. Otherwise they are attended as given.
  bool new_tokens_scaled = false;
};

// Checked fp8 arguments: the scales as the float32 the kernels use.
struct Fp8Setup {
  float k_scale, v_scale;
};

bool is_fp8_cache(const at::Tensor& t);

// ``scale`` as float32, finite and > 0; otherwise an error naming ``name``.
float checked_fp8_scale(const char* op, const char* name, double scale);

// k_buffer and v_buffer hold fp8 codes (the same dtype), the scales are
// usable. Reads no element.
Fp8Setup check_fp8_args(const char* op, const Fp8KvArgs& args, const at::Tensor& k_buffer, const at::Tensor& v_buffer);

// How the torch this library was built against converts a float beyond
// e4m3's range: its own scalar conversion says (saturating to 448 in newer
// torch, NaN in older), so the kernels follow the torch they run with.
bool torch_saturates_e4m3();

// Quantize the new float rows into the cache as SGLang's pool does;
// kv.loc[i] is the slot of row kv.rows[i] (null: row i), no slot repeated.
void run_fp8_write(const Fp8Setup& s, const KvWriteParams& kv);

// The fp8 fields of DecodeParams / ExtendParams.
template <typename P>
void set_fp8_params(P& p, const Fp8Setup& s) {
  p.kv_fp8 = true;
  p.scales = Int8Scales{};
  p.scales.k_scale = s.k_scale;
  p.scales.v_scale = s.v_scale;
}

}  // namespace rvv_attn::ops
