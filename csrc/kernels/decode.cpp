// Decode attention: split-KV online softmax, then a log-sum-exp merge.
//
// Pass 1, one work item per (sequence, KV head, split): the G = H / H_kv
// query heads sharing the KV head walk the split's tokens in blocks of
// vec::kBlockN. Per block the K rows are gathered through req_to_token and
// widened to float32 once (packed as a [D][kBlockN] panel), likewise the V
// rows ([kBlockN][Dv]), so each cache row is read once per group; then for
// each head
//   scores = Q . K_panel          (vector FMA over tokens, tail-undisturbed)
//   m' = max(m, max scores); p = exp(scores - m'); s = s*e^{m-m'} + sum p
//   acc = acc*e^{m-m'} + P . V_panel (vector FMA over Dv)
// and the split stores acc/s and m + log s into attn_logits.
// Pass 2, one work item per (sequence, query head): merge the non-empty
// splits weighted by exp(lse_i - max lse) and narrow into output.
//
// int8 KV cache (p.kv_int8): the same code with the cache read through
// vec::Int8Traits (vsext + vfwcvt to float32). A static K scale is folded
// into the query's sm_scale and a static V scale into the final 1/l; with
// dynamic scales the block's per-token scales are gathered before the
// block's GEMMs ("pre-gather"), then applied once per head and block: the
// score vector times the K scales, and the probabilities times the V scales
// before P.V (the softmax sum uses the unscaled probabilities).
//
// One template over the dtype; vec.h supplies the per-dtype loads/stores
// and the RVV or portable operations, so every variant runs this code.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "kernel_api.h"
#include "kernels/vec.h"
#include "variant.h"

namespace RVV_ATTN_NS {
namespace {

using rvv_attn::DecodeParams;
using rvv_attn::DType;
using vec::kBlockN;
using vec::VF;

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Tokens [begin, end) of split ``s``: equal ceil-sized parts, so trailing
// splits of a short sequence are empty.
inline void split_range(int64_t len, int64_t splits, int64_t s, int64_t* begin, int64_t* end) {
  const int64_t per = (len + splits - 1) / splits;
  *begin = s * per < len ? s * per : len;
  *end = *begin + per < len ? *begin + per : len;
}

inline float* logits_row(const DecodeParams& p, int64_t b, int64_t h, int64_t s) {
  return p.attn_logits + b * p.logits_stride_b + h * p.logits_stride_h + s * p.logits_stride_s;
}

// Per-worker scratch, carved out of one allocation.
struct Scratch {
  float* q;       // [G][D] query rows, float32, pre-scaled by sm_scale
  float* acc;     // [G][Dv] unnormalized output
  float* probs;   // [G][kBlockN] exp(score - m) of the current block
  float* k_pack;  // [D][kBlockN] the block's K rows, transposed
  float* v_pack;  // [kBlockN][Dv] the block's V rows
  float* m;       // [G] running max
  float* l;       // [G] running sum
  float* alpha;   // [G] rescale factor of the current block
  int64_t* v_off; // [kBlockN] byte offsets of the block's V rows

  static size_t floats(const DecodeParams& p) {
    const size_t g = static_cast<size_t>(p.heads / p.heads_kv);
    const size_t d = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.head_dim_v);
    return g * (d + dv + kBlockN + 3) + kBlockN * (d + dv);
  }
  bool allocate(const DecodeParams& p) {
    const size_t g = static_cast<size_t>(p.heads / p.heads_kv);
    const size_t d = static_cast<size_t>(p.head_dim), dv = static_cast<size_t>(p.head_dim_v);
    base = static_cast<float*>(std::malloc(floats(p) * sizeof(float) + kBlockN * sizeof(int64_t)));
    if (base == nullptr) return false;
    v_off = reinterpret_cast<int64_t*>(base);  // first, so it is 8-byte aligned
    q = base + 2 * kBlockN;
    acc = q + g * d;
    probs = acc + g * dv;
    k_pack = probs + g * kBlockN;
    v_pack = k_pack + kBlockN * d;
    m = v_pack + kBlockN * dv;
    l = m + g;
    alpha = l + g;
    return true;
  }
  void release() { std::free(base); }
  float* base = nullptr;
};

template <DType T, bool Q8>
struct Decode {
  using Tr = vec::Traits<T>;
  using Elem = typename Tr::Elem;
  using KvTr = vec::CacheTraits<T, Q8>;  // the cache's elements: Tr, or int8
  using KvElem = typename KvTr::Elem;

  // Pass 1 for work item (b, kv head hk, split s).
  static void split(const DecodeParams& p, Scratch& sc, int64_t item) {
    const int64_t splits = p.num_splits;
    const int64_t b = item / (p.heads_kv * splits), hk = (item / splits) % p.heads_kv, s = item % splits;
    const int64_t group = p.heads / p.heads_kv, h0 = hk * group;
    const int64_t d_k = p.head_dim, d_v = p.head_dim_v;
    int64_t begin, end;
    split_range(p.seq_lens[b], splits, s, &begin, &end);

    if (begin >= end) {
      // log(0): the merge skips it; zeros keep the buffer free of garbage.
      for (int64_t g = 0; g < group; ++g) {
        float* out = logits_row(p, b, h0 + g, s);
        std::memset(out, 0, static_cast<size_t>(d_v) * sizeof(float));
        out[d_v] = kNegInf;
      }
      return;
    }

    // Dynamic (NaN) scales are per token; static ones fold into q and 1/l.
    const vec::ScaleFold fold = vec::fold_scales<Q8>(p.scales, p.sm_scale);
    const bool k_dyn = fold.k_dynamic, v_dyn = fold.v_dynamic;
    const float q_scale = fold.q_scale, out_scale = fold.out_scale;
    for (int64_t g = 0; g < group; ++g) {
      const Elem* q = static_cast<const Elem*>(p.query) + b * p.query_stride_b + (h0 + g) * p.query_stride_h;
      for (int64_t c = 0; c < d_k;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_k - c));
        vec::store(sc.q + g * d_k + c, vec::mul(Tr::load(q + c, vl), q_scale, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      sc.m[g] = kNegInf;
      sc.l[g] = 0.0f;
    }
    std::memset(sc.acc, 0, static_cast<size_t>(group * d_v) * sizeof(float));

    const int64_t esz = static_cast<int64_t>(sizeof(KvElem));
    const char* map_row = static_cast<const char*>(p.req_to_token) +
                          p.req_pool_indices[b] * p.req_to_token_stride * (p.req_to_token_is_int64 ? 8 : 4);
    const KvElem* k_base = static_cast<const KvElem*>(p.k_buffer);
    const char* v_base = static_cast<const char*>(p.v_buffer);

    for (int64_t t0 = begin; t0 < end; t0 += static_cast<int64_t>(kBlockN)) {
      const size_t n = vec::setvl(static_cast<size_t>(end - t0));  // end - t0 >= kBlockN gives kBlockN
      const void* slots = map_row + t0 * (p.req_to_token_is_int64 ? 8 : 4);

      // Pack: K gathered column by column into a [D][kBlockN] panel, V row by row.
      const vec::VIdx k_off =
          vec::row_offsets(slots, p.req_to_token_is_int64, p.k_stride_t * esz, hk * p.k_stride_h * esz, n);
      for (int64_t d = 0; d < d_k; ++d) vec::store(sc.k_pack + d * kBlockN, KvTr::gather(k_base + d, k_off, n), n);
      vec::store_offsets(
          sc.v_off, vec::row_offsets(slots, p.req_to_token_is_int64, p.v_stride_t * esz, hk * p.v_stride_h * esz, n),
          n);
      for (size_t i = 0; i < n; ++i) {
        const KvElem* v = reinterpret_cast<const KvElem*>(v_base + sc.v_off[i]);
        for (int64_t c = 0; c < d_v;) {
          const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
          vec::store(sc.v_pack + i * d_v + c, KvTr::load(v + c, vl), vl);
          c += static_cast<int64_t>(vl);
        }
      }

      // Pre-gather the block's per-token scales (dynamic mode).
      VF k_scales = vec::zeros(), v_scales = vec::zeros();
      if (k_dyn) {
        k_scales = vec::Traits<DType::Float32>::gather(
            p.scales.k_scale_buf,
            vec::row_offsets(slots, p.req_to_token_is_int64, p.scales.k_scale_stride_t * 4, hk * p.scales.k_scale_stride_h * 4, n),
            n);
      }
      if (v_dyn) {
        v_scales = vec::Traits<DType::Float32>::gather(
            p.scales.v_scale_buf,
            vec::row_offsets(slots, p.req_to_token_is_int64, p.scales.v_scale_stride_t * 4, hk * p.scales.v_scale_stride_h * 4, n),
            n);
      }

      // Scores and the online-softmax update, head by head.
      for (int64_t g = 0; g < group; ++g) {
        const float* q = sc.q + g * d_k;
        VF score = vec::zeros();
        for (int64_t d = 0; d < d_k; ++d) score = vec::fmacc(score, q[d], vec::load(sc.k_pack + d * kBlockN, n), n);
        if (k_dyn) score = vec::mul(score, k_scales, n);
        if (p.logit_cap > 0.0f) score = vec::softcap(score, p.logit_cap, n);
        const float m_old = sc.m[g];
        const float block_max = vec::reduce_max(score, n);
        const float m_new = block_max > m_old ? block_max : m_old;
        const VF prob = vec::exp(vec::sub(score, m_new, n), n);
        // m_old = -inf on the first block: nothing accumulated yet to rescale.
        const float alpha = m_old == kNegInf ? 0.0f : vec::exp_scalar(m_old - m_new);
        sc.l[g] = sc.l[g] * alpha + vec::reduce_sum(prob, n);
        sc.m[g] = m_new;
        sc.alpha[g] = alpha;
        vec::store(sc.probs + g * kBlockN, v_dyn ? vec::mul(prob, v_scales, n) : prob, n);
      }

      // acc = acc * alpha + P . V_panel
      for (int64_t g = 0; g < group; ++g) {
        const float* prob = sc.probs + g * kBlockN;
        float* acc = sc.acc + g * d_v;
        for (int64_t c = 0; c < d_v;) {
          const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
          VF a = vec::mul(vec::load(acc + c, vl), sc.alpha[g], vl);
          for (size_t i = 0; i < n; ++i) a = vec::fmacc(a, prob[i], vec::load(sc.v_pack + i * d_v + c, vl), vl);
          vec::store(acc + c, a, vl);
          c += static_cast<int64_t>(vl);
        }
      }
    }

    for (int64_t g = 0; g < group; ++g) {
      float* out = logits_row(p, b, h0 + g, s);
      const float inv = out_scale / sc.l[g];
      for (int64_t c = 0; c < d_v;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
        vec::store(out + c, vec::mul(vec::load(sc.acc + g * d_v + c, vl), inv, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      out[d_v] = sc.m[g] + std::log(sc.l[g]);
    }
  }

  // Pass 2 for work item (b, query head h).
  static void merge(const DecodeParams& p, int64_t item) {
    const int64_t b = item / p.heads, h = item % p.heads, d_v = p.head_dim_v;
    const int64_t len = p.seq_lens[b];
    // Split 0 is never empty (len >= 1), so the max is finite unless the
    // data hold inf/NaN.
    float lse_max = kNegInf;
    float weight_sum = 0.0f;
    for (int64_t s = 0; s < p.num_splits; ++s) {
      int64_t begin, end;
      split_range(len, p.num_splits, s, &begin, &end);
      if (begin < end) lse_max = std::fmax(lse_max, logits_row(p, b, h, s)[d_v]);
    }
    for (int64_t s = 0; s < p.num_splits; ++s) {
      int64_t begin, end;
      split_range(len, p.num_splits, s, &begin, &end);
      if (begin < end) weight_sum += vec::exp_scalar(logits_row(p, b, h, s)[d_v] - lse_max);
    }
    const float inv = 1.0f / weight_sum;
    Elem* out = static_cast<Elem*>(p.output) + b * p.output_stride_b + h * p.output_stride_h;
    for (int64_t c = 0; c < d_v;) {
      const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
      VF a = vec::zeros();
      for (int64_t s = 0; s < p.num_splits; ++s) {
        int64_t begin, end;
        split_range(len, p.num_splits, s, &begin, &end);
        if (begin >= end) continue;
        const float* row = logits_row(p, b, h, s);
        a = vec::fmacc(a, vec::exp_scalar(row[d_v] - lse_max), vec::load(row + c, vl), vl);
      }
      Tr::store(out + c, vec::mul(a, inv, vl), vl);
      c += static_cast<int64_t>(vl);
    }
  }

  struct Ctx {
    const DecodeParams* p;
    int failed;  // set (atomically) by a worker whose scratch allocation failed
  };

  static bool run(const DecodeParams& p, const rvv_attn::ThreadPool& pool) {
    Ctx ctx{&p, 0};
    pool.run(p.batch * p.heads_kv * p.num_splits, &ctx, [](void* c, int64_t begin, int64_t end) {
      Ctx& x = *static_cast<Ctx*>(c);
      Scratch sc;
      if (!sc.allocate(*x.p)) {
        __atomic_store_n(&x.failed, 1, __ATOMIC_RELAXED);
        return;
      }
      for (int64_t i = begin; i < end; ++i) split(*x.p, sc, i);
      sc.release();
    });
    if (ctx.failed) return false;
    pool.run(p.batch * p.heads, &ctx, [](void* c, int64_t begin, int64_t end) {
      const Ctx& x = *static_cast<Ctx*>(c);
      for (int64_t i = begin; i < end; ++i) merge(*x.p, i);
    });
    return true;
  }
};

}  // namespace

bool decode_attention(const rvv_attn::DecodeParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.batch == 0 || p.heads == 0) return true;
  switch (p.dtype) {
    case DType::Float32: return p.kv_int8 ? Decode<DType::Float32, true>::run(p, pool)
                                          : Decode<DType::Float32, false>::run(p, pool);
    case DType::BFloat16: return p.kv_int8 ? Decode<DType::BFloat16, true>::run(p, pool)
                                           : Decode<DType::BFloat16, false>::run(p, pool);
    case DType::Float16: return p.kv_int8 ? Decode<DType::Float16, true>::run(p, pool)
                                          : Decode<DType::Float16, false>::run(p, pool);
  }
  return true;
}

}  // namespace RVV_ATTN_NS
