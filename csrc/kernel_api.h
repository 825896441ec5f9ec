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

// decode_attention_cpu after its KV write: one new query token per sequence
// attends over its cached tokens. All strides are in elements; the last
// dimension of every tensor is dense. Every index (pool rows, lengths, map
// entries) has been checked; seq_lens[b] >= 1.
struct DecodeParams {
  DType dtype;  // of query, k/v buffers and output
  int64_t batch, heads, heads_kv, head_dim, head_dim_v;
  int64_t num_splits;  // attn_logits.size(2)
  const void* query;
  int64_t query_stride_b, query_stride_h;
  const void* k_buffer;
  int64_t k_stride_t, k_stride_h;
  const void* v_buffer;
  int64_t v_stride_t, v_stride_h;
  void* output;
  int64_t output_stride_b, output_stride_h;
  // [B, H, num_splits, Dv + 1] float32 scratch: a split's normalized partial
  // output, then its log-sum-exp (-inf for an empty split).
  float* attn_logits;
  int64_t logits_stride_b, logits_stride_h, logits_stride_s;
  const void* req_to_token;  // int64 if req_to_token_is_int64, else int32
  bool req_to_token_is_int64;
  int64_t req_to_token_stride;  // between rows
  const int64_t* req_pool_indices;
  const int64_t* seq_lens;
  float sm_scale;
  float logit_cap;  // 0: no soft cap
};

// One compiled variant: the portable build or an RVV build for one VLEN.
struct KernelTable {
  const char* name;  // "portable", "vlen256", ...
  int vlen;          // VLEN in bits the code is only valid at; 0 for portable
  void (*write_kv)(const KvWriteParams&, const ThreadPool&);
  // Returns false if a worker could not allocate its scratch memory (the
  // outputs are then incomplete); true otherwise.
  bool (*decode_attention)(const DecodeParams&, const ThreadPool&);
};

}  // namespace rvv_attn
