// The KV-cache write (decode_set_kv_buffer), split into validation and
// execution so that an operator doing more (decode attention) can validate
// everything it gets before the first write.
#pragma once

#include <ATen/core/Tensor.h>

#include "kernels/kernel_api.h"

namespace rvv_attn::ops {

struct PreparedKvWrite {
  KvWriteParams params;  // params.loc points into ``loc``, params.rows into ``rows`` (or is null)
  at::Tensor loc;        // contiguous int64 copy (or the argument) kept alive
  at::Tensor rows;       // int64 source rows of the entries, when they are not 0, 1, ...
};

// A call's cache writes take effect in entry order, so when several entries
// name one slot the last of them wins (SGLang pads a decode batch with rows
// that all write slot 0, and its tests write the cache by indexed
// assignment). The kernels write entries in parallel, in no fixed order;
// handing them only each slot's last entry makes the result the same for
// every thread count and VLEN. Reduces params (loc, rows, batch) to those
// entries, in entry order, storing the new arrays in ``prepared``; a call
// whose slots are distinct is left as it is.
void keep_last_write_per_slot(PreparedKvWrite& prepared);

// All checks on k_buffer, v_buffer, key, value and loc, errors prefixed with
// ``op``: ranks, dtypes (float32/bfloat16/float16, all equal),
// matching sizes, dense last dimensions, every slot in range (loc may be
// int32 or int64; a repeated slot is resolved by keep_last_write_per_slot,
// so params may hold fewer entries than key has rows). Memory overlap is the
// caller's to check.
// Reads nothing but loc and writes nothing. With ``int8_cache`` the
// buffers must be int8 instead and key/value may be int8 or any float dtype
// (the caller checks them against its query); params.dtype is then key's
// float dtype (Float32 for int8 keys), and params go to run_int8_write.
// With ``fp8_cache`` the buffers hold fp8 codes (checked by the caller)
// and key/value must share a float dtype (params.dtype, for run_fp8_write).
PreparedKvWrite prepare_kv_write(const char* op, const at::Tensor& k_buffer, const at::Tensor& v_buffer,
                                 const at::Tensor& key, const at::Tensor& value, const at::Tensor& loc,
                                 bool int8_cache = false, bool fp8_cache = false);

// k_buffer[loc[b]] = key[b], v_buffer[loc[b]] = value[b] with the active variant.
void run_kv_write(const PreparedKvWrite& prepared);

}  // namespace rvv_attn::ops
