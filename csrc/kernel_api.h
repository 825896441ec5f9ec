// The narrow interface between the torch binding and the kernels.
//
// Kernel translation units include this header, <riscv_vector.h> and the
// standard library only: no torch headers, so each per-VLEN compile takes
// seconds, not the best part of a minute. The binding validates every input
// and hands the kernels raw pointers, element strides and a thread pool.
#pragma once

#include <cstdint>

namespace rvv_attn {

// Element type of query/key/value/output tensors.
enum class DType : int32_t { Float32 = 0, BFloat16 = 1, Float16 = 2 };

inline int dtype_bytes(DType t) { return t == DType::Float32 ? 4 : 2; }

// The torch thread pool, passed in so kernels need no torch header.
// ``run(n, ctx, body)`` calls ``body(ctx, begin, end)`` over a partition of
// [0, n); ``body`` must not throw.
struct ThreadPool {
  void (*run)(int64_t n, void* ctx, void (*body)(void* ctx, int64_t begin, int64_t end));
};

// decode_set_kv_buffer: k_buffer[loc[b], h, :] = key[b, h, :] (and V).
// All strides are in elements; the last dimension of every tensor is dense.
// ``loc`` has been checked: every slot is in range and none repeats.
struct KvWriteParams {
  DType dtype;
  int64_t batch, heads_kv, head_dim, head_dim_v;
  const void* key;
  int64_t key_stride_b, key_stride_h;
  const void* value;
  int64_t value_stride_b, value_stride_h;
  void* k_buffer;
  int64_t k_buffer_stride_t, k_buffer_stride_h;
  void* v_buffer;
  int64_t v_buffer_stride_t, v_buffer_stride_h;
  const int64_t* loc;
};

// One compiled variant: the portable build or an RVV build for one VLEN.
struct KernelTable {
  const char* name;  // "portable", "vlen256", ...
  int vlen;          // VLEN in bits the code is only valid at; 0 for portable
  void (*write_kv)(const KvWriteParams&, const ThreadPool&);
};

}  // namespace rvv_attn
