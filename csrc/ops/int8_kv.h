// The int8 KV cache on the torch side, shared by decode_attention_int8_cpu
// and extend_attention_int8_cpu: checks of the scale arguments and of every
// scale the kernels will read, the quantizing cache write, and the int8
// fields of the kernel parameters.
//
// Scale modes, chosen for K and V independently:
//   static   k_scale finite and > 0: value = int8 * k_scale for every token;
//            k_scale_buf is neither read nor written.
//   dynamic  k_scale NaN: value = int8 * k_scale_buf[slot, kv_head]; a float
//            row written this call gets scale max|x| / 127 (float32; 1.0 if
//            that is 0, e.g. an all-zero row), stored at [slot, kv_head].
// Any other k_scale (0, negative, infinite) is an error.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "kernels/kernel_api.h"
#include "ops/token_map.h"

namespace rvv_attn::ops {

// The four extra arguments of the int8 operators.
struct Int8KvArgs {
  at::Tensor k_scale_buf;
  at::Tensor v_scale_buf;
  double k_scale;
  double v_scale;
};

// Checked int8 arguments: scales as float32 (NaN = dynamic).
struct Int8Setup {
  at::Tensor k_scale_buf, v_scale_buf;
  float k_scale, v_scale;
  bool k_dyn, v_dyn;
};

// The caches are int8; the scale buffers float32 [k_buffer.size(0), H_kv]
// (resp. v_buffer); the scales static or NaN. Reads no element.
Int8Setup check_int8_args(const char* op, const Int8KvArgs& args, const at::Tensor& k_buffer,
                          const at::Tensor& v_buffer);

// New K/V for an int8 cache: both int8, or both ``float_dtype`` (the
// query's). Returns true for int8.
bool check_new_kv_dtype(const char* op, const char* key_name, const at::Tensor& key, const char* value_name,
                        const at::Tensor& value, const char* query_name, const at::Tensor& query);

// Float rows to be quantized must be finite (NaN/inf have no int8 code).
// ``rows``: the rows of ``t`` that will be written (undefined: all).
void check_finite_rows(const char* op, const char* name, const at::Tensor& t, const at::Tensor& rows);

// Every dynamic-mode scale the attention will read: for each sequence b the
// slots in its map columns [first, first + length) (see CheckedTokenMaps) and every
// KV head. Slots listed in ``fresh`` (written with a computed scale this
// call) are skipped. Each must be finite and > 0.
void check_read_scales(const char* op, const Int8Setup& s, const token_map::CheckedTokenMaps& maps,
                       const std::vector<bool>& fresh_k, const std::vector<bool>& fresh_v);

// Quantize (or copy) the new rows into the cache; kv.loc[i] is the slot of
// row kv.rows[i] (null: row i), no slot repeated (keep_last_write_per_slot).
void run_int8_write(const Int8Setup& s, const KvWriteParams& kv, bool src_int8);

// The scale buffers and scales as the kernels take them.
Int8Scales kernel_scales(const Int8Setup& s);

// The int8 fields of DecodeParams / ExtendParams.
template <typename P>
void set_int8_params(P& p, const Int8Setup& s) {
  p.kv_int8 = true;
  p.scales = kernel_scales(s);
}

}  // namespace rvv_attn::ops
