// GCC 14's RISC-V vsetvl pass overwrites a live register: a reduced test case.
//
// Reduced (cvise) from csrc/kernels/decode.cpp as it was before vec::zeros()
// took a constant AVL, the float16 decode kernel at VLEN 128. Compile only:
//   riscv64-linux-gnu-g++-14 -march=rv64gcv_zvl128b -mabi=lp64d -mrvv-vector-bits=zvl -std=c++17 -O1 -w \
//     -S gcc14_vsetvl_edge.cpp -o edge.s -dumpbase edge -fdump-rtl-vsetvl-details
//   python3 vsetvl_clobbers.py edge*.vsetvl     # exit 0 and a CLOBBER line: the fault is there
// In edge.s, split()'s `div` computing `per` (ceil(len / splits)) is followed
// by `vsetvli a5,zero,e32,m4,ta,ma`, which the pass put on a control-flow edge
// for zeros()' __riscv_vsetvlmax_e32m4() while keeping its destination a5:
// per is replaced by VLMAX and a split ends after one KV block.
// GCC 14.2 (Debian trixie) shows it here. 14.4 (forky) does not on this
// reduced file but still builds the whole kernel wrong (ci/gcc/decode_check.cpp
// fails with it); 15.3 and 16.2 print no CLOBBER line and build it right.
// Reduced against 14.2, so it is not minimal for other versions: docs/gcc.md.
typedef signed char __int8_t;
typedef unsigned short int __uint16_t;
typedef signed int __int32_t;
typedef signed long int __int64_t;
typedef __int8_t int8_t;
typedef __int32_t int32_t;
typedef __int64_t int64_t;
typedef __uint16_t uint16_t;
typedef unsigned long int uintptr_t;
typedef long int ptrdiff_t;
typedef long unsigned int size_t;
namespace std {
template <class T> constexpr const T &min(const T &a, const T &b);
float log(float x);
template <class T> struct numeric_limits {
  static constexpr T infinity() { return __builtin_inff(); }
};
} // namespace std
namespace rvv_attn {
enum class DType : int32_t {
  Float32 = 0,
  BFloat16 = 1,
  Float16 = 2,
  Bytes = 3
};
struct ThreadPool {
  void (*run)(int64_t n, void *ctx,
              void (*body)(void *ctx, int64_t begin, int64_t end));
};
struct KvWriteParams {};
struct Int8Scales {
  float *k_scale_buf;
  int64_t k_scale_stride_t, k_scale_stride_h;
  float *v_scale_buf;
  int64_t v_scale_stride_t, v_scale_stride_h;
};
struct DecodeParams {
  int64_t batch, heads, heads_kv, head_dim, head_dim_v;
  int64_t num_splits;
  const void *query;
  int64_t query_stride_b, query_stride_h;
  const void *k_buffer;
  int64_t k_stride_t, k_stride_h;
  const void *v_buffer;
  int64_t v_stride_t, v_stride_h;
  float *attn_logits;
  int64_t logits_stride_b, logits_stride_h, logits_stride_s;
  const void *req_to_token;
  bool req_to_token_is_int64;
  int64_t req_to_token_stride;
  const int64_t *req_pool_indices;
  const int64_t *kv_first;
  const int64_t *kv_lens;
  float sm_scale;
  float logit_cap;
  Int8Scales scales;
};
struct ExtendParams {};
struct KvQuantWriteParams {};
} // namespace rvv_attn
extern "C" {
#pragma riscv intrinsic "vector"
}
namespace rvv_attn::vlen128 {
namespace vec {
constexpr int kLmul = 4;
constexpr size_t kLanes = static_cast<size_t>(128) / 32 * kLmul;
constexpr size_t kBlockN = kLanes;
float exp_scalar(float x);
struct ScaleFold {
  bool k_dynamic, v_dynamic;
  float q_scale, out_scale;
};
template <bool Q8>
ScaleFold fold_scales(const rvv_attn::Int8Scales &s, float sm_scale);
template <DType T> struct Traits;
template <DType T, bool Q8> struct KvWords;
} // namespace vec
} // namespace rvv_attn::vlen128
namespace rvv_attn::vlen128 {
namespace vec {
using VF = vfloat32m4_t;
constexpr bool kStagedWidening = 128 == 256;
using VIdx = vuint64m8_t;
size_t setvl(size_t n);
inline VF zeros() {
  return __riscv_vfmv_v_f_f32m4(0.0f, __riscv_vsetvlmax_e32m4());
}
VF load(const float *p, size_t vl);
void store(float *p, VF v, size_t vl);
VF mul(VF x, float a, size_t vl);
VF sub(VF x, float a, size_t vl);
float reduce_max(VF x, size_t vl);
float reduce_sum(VF x, size_t vl);
VF softcap(VF x, float cap, size_t vl);
VIdx row_offsets(const void *map, bool map_is_int64, int64_t row_bytes,
                 int64_t base_bytes, size_t vl);
void store_offsets(int64_t *dst, VIdx off, size_t vl);
void add_to_offsets(int64_t *dst, int64_t bytes, size_t vl);
namespace detail {
inline VF widen_f16_words(vuint32m4_t w, size_t vl) {
  const vuint32m4_t sign =
      __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x8000u, vl), 16, vl);
  const vuint32m4_t mag =
      __riscv_vsll_vx_u32m4(__riscv_vand_vx_u32m4(w, 0x7fffu, vl), 13, vl);
  vuint32m4_t bits = __riscv_vreinterpret_v_f32m4_u32m4(__riscv_vfmul_vf_f32m4(
      __riscv_vreinterpret_v_u32m4_f32m4(mag), 0x1p112f, vl));
  bits = __riscv_vmerge_vvm_u32m4(
      bits, __riscv_vor_vx_u32m4(mag, 0x7f800000u, vl),
      __riscv_vmsgeu_vx_u32m4_b8(mag, 0x0f800000u, vl), vl);
  return __riscv_vreinterpret_v_u32m4_f32m4(
      __riscv_vor_vv_u32m4(bits, sign, vl));
}
inline VF widen_f16(vuint16m2_t h, size_t vl) {
  return widen_f16_words(__riscv_vzext_vf2_u32m4(h, vl), vl);
}
} // namespace detail
template <> struct Traits<DType::Float32> {
  using Elem = float;
  static VF gather(const Elem *base, VIdx off, size_t vl);
};
template <> struct Traits<DType::Float16> {
  using Elem = uint16_t;
  static VF load(const Elem *p, size_t vl) {
    return detail::widen_f16(__riscv_vle16_v_u16m2(p, vl), vl);
  }
  static VF gather(const Elem *base, VIdx off, size_t vl);
};
VF mul(VF x, VF y, size_t vl);
struct Int8Traits {
  using Elem = int8_t;
};
void store_strided(float *p, ptrdiff_t stride_bytes, VF x, size_t vl);
VF exp_nonpositive(VF x, size_t vl);
using VIdx32 = vuint32m4_t;
bool fits_u32(VIdx off, size_t vl);
VIdx32 narrow_offsets(VIdx off, size_t vl);
struct HalfwordRows {
  using Raw = vuint16m2_t;
  using Half = vuint32m4_t;
};
template <> struct KvWords<DType::Float16, false> : HalfwordRows {
  static constexpr int kCols = 2;
  ;
  static VF load(const uint16_t *p, size_t vl) {
    return Traits<DType::Float16>::load(p, vl);
  }
};
} // namespace vec
} // namespace rvv_attn::vlen128
namespace rvv_attn::vlen128 {
namespace vec {
template <DType T, bool kInt8> struct CacheTraitsOf {
  using type = Traits<T>;
};
template <DType T, bool kInt8>
using CacheTraits = typename CacheTraitsOf<T, kInt8>::type;
inline void fill_zero(float *dst, int64_t n) {
  const VF zero = zeros();
  for (int64_t c = 0; c < n;) {
    const size_t vl = setvl(static_cast<size_t>(n - c));
    store(dst + c, zero, vl);
    c += static_cast<int64_t>(vl);
  }
}
} // namespace vec
} // namespace rvv_attn::vlen128
namespace rvv_attn::vlen128 {
namespace {
using vec::kBlockN;
using vec::VF;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
inline void split_range(int64_t len, int64_t splits, int64_t s, int64_t *begin,
                        int64_t *end) {
  const int64_t per = (len + splits - 1) / splits;
  *begin = s * per < len ? s * per : len;
  *end = *begin + per < len ? *begin + per : len;
}
inline float *logits_row(const DecodeParams &p, int64_t b, int64_t h,
                         int64_t s) {
  return p.attn_logits + b * p.logits_stride_b + h * p.logits_stride_h +
         s * p.logits_stride_s;
}
constexpr int64_t kPassHeads = 4;
struct Scratch {
  float *q;
  float *acc;
  float *scores;
  float *probs;
  float *m;
  float *l;
  float *alpha;
  int64_t *rows;
  bool allocate(const DecodeParams &p);
  void release();
  float *base = nullptr;
};
;
template <int NH>
void fma_heads(VF &s0, VF &s1, VF &s2, VF &s3, const float *w, VF x, size_t vl);
template <int NH>
void store_heads(float *out, size_t stride, VF s0, VF s1, VF s2, VF s3,
                 size_t vl);
template <DType T, bool Q8> struct Decode {
  using Tr = vec::Traits<T>;
  using Elem = typename Tr::Elem;
  using KvTr = vec::CacheTraits<T, Q8>;
  using KvElem = typename KvTr::Elem;
  using Words = vec::KvWords<T, Q8>;
  static constexpr int64_t kCols = Words::kCols;
  template <int NH, typename Idx>
  static void scores_by_words(const char *k_rows, Idx off, int64_t words,
                              const float *q, size_t n, float *out);
  ;
  ;
  ;
  template <int NH>
  static void scores_by_columns(const KvElem *k_rows, vec::VIdx off, int64_t d0,
                                int64_t d_k, const float *q, size_t n,
                                float *out) {
    VF s0 = vec::load(out, n), s1 = s0, s2 = s0, s3 = s0;
    if constexpr (NH > 1)
      s1 = vec::load(out + kBlockN, n);
    if constexpr (NH > 2)
      s2 = vec::load(out + 2 * kBlockN, n);
    if constexpr (NH > 3)
      s3 = vec::load(out + 3 * kBlockN, n);
    for (int64_t d = d0; d < d_k; ++d)
      fma_heads<NH>(s0, s1, s2, s3, q + d * NH,
                    KvTr::gather(k_rows + d, off, n), n);
    store_heads<NH>(out, kBlockN, s0, s1, s2, s3, n);
  }
  template <int NH>
  static void accumulate_pv(const int64_t *rows, const float *probs, size_t n,
                            float *acc, int64_t d_v, const float *alpha,
                            size_t vl) {
    VF a0 = vec::mul(vec::load(acc, vl), alpha[0], vl), a1 = a0, a2 = a0,
       a3 = a0;
    if constexpr (NH > 1)
      a1 = vec::mul(vec::load(acc + d_v, vl), alpha[1], vl);
    if constexpr (NH > 2)
      a2 = vec::mul(vec::load(acc + 2 * d_v, vl), alpha[2], vl);
    if constexpr (NH > 3)
      a3 = vec::mul(vec::load(acc + 3 * d_v, vl), alpha[3], vl);
    size_t i = 0;
    if constexpr (vec::kStagedWidening) {
      i = accumulate_pv_staged<NH>(rows, probs, n, a0, a1, a2, a3, vl);
      probs += i * NH;
    }
    for (; i + 2 <= n; i += 2, probs += 2 * NH) {
      const VF v = Words::load(row_ptr(rows[i]), vl);
      const VF v_next = Words::load(row_ptr(rows[i + 1]), vl);
      fma_heads<NH>(a0, a1, a2, a3, probs, v, vl);
      fma_heads<NH>(a0, a1, a2, a3, probs + NH, v_next, vl);
    }
    if (i < n)
      fma_heads<NH>(a0, a1, a2, a3, probs, Words::load(row_ptr(rows[i]), vl),
                    vl);
    store_heads<NH>(acc, static_cast<size_t>(d_v), a0, a1, a2, a3, vl);
  }
  template <int NH>
  static size_t accumulate_pv_staged(const int64_t *rows, const float *probs,
                                     size_t n, VF &a0, VF &a1, VF &a2, VF &a3,
                                     size_t vl);
  static const KvElem *row_ptr(int64_t address);
  template <typename Idx>
  static void pass_scores(int64_t nh, const char *k_rows, Idx off,
                          int64_t words, const float *q, size_t n, float *out) {
    switch (nh) {
    case 1:
      return scores_by_words<1>(k_rows, off, words, q, n, out);
    case 2:
      return scores_by_words<2>(k_rows, off, words, q, n, out);
    case 3:
      return scores_by_words<3>(k_rows, off, words, q, n, out);
    default:
      return scores_by_words<4>(k_rows, off, words, q, n, out);
    }
  }
  static void pass_scores_tail(int64_t nh, const KvElem *k_rows, vec::VIdx off,
                               int64_t d0, int64_t d_k, const float *q,
                               size_t n, float *out) {
    switch (nh) {
    case 1:
      return scores_by_columns<1>(k_rows, off, d0, d_k, q, n, out);
    case 2:
      return scores_by_columns<2>(k_rows, off, d0, d_k, q, n, out);
    case 3:
      return scores_by_columns<3>(k_rows, off, d0, d_k, q, n, out);
    default:
      return scores_by_columns<4>(k_rows, off, d0, d_k, q, n, out);
    }
  }
  static void pass_pv(int64_t nh, const int64_t *rows, const float *probs,
                      size_t n, float *acc, int64_t d_v, const float *alpha,
                      size_t vl) {
    switch (nh) {
    case 1:
      return accumulate_pv<1>(rows, probs, n, acc, d_v, alpha, vl);
    case 2:
      return accumulate_pv<2>(rows, probs, n, acc, d_v, alpha, vl);
    case 3:
      return accumulate_pv<3>(rows, probs, n, acc, d_v, alpha, vl);
    default:
      return accumulate_pv<4>(rows, probs, n, acc, d_v, alpha, vl);
    }
  }
  static void split(const DecodeParams &p, Scratch &sc, int64_t item) {
    const int64_t splits = p.num_splits;
    const int64_t b = item / (p.heads_kv * splits),
                  hk = (item / splits) % p.heads_kv, s = item % splits;
    const int64_t group = p.heads / p.heads_kv, h0 = hk * group;
    const int64_t d_k = p.head_dim, d_v = p.head_dim_v;
    int64_t begin, end;
    split_range(p.kv_lens[b], splits, s, &begin, &end);
    if (begin >= end) {
      for (int64_t g = 0; g < group; ++g) {
        float *out = logits_row(p, b, h0 + g, s);
        vec::fill_zero(out, d_v);
        out[d_v] = kNegInf;
      }
      return;
    }
    const vec::ScaleFold fold = vec::fold_scales<Q8>(p.scales, p.sm_scale);
    const bool k_dyn = fold.k_dynamic, v_dyn = fold.v_dynamic;
    const float q_scale = fold.q_scale, out_scale = fold.out_scale;
    for (int64_t g = 0; g < group; ++g) {
      const Elem *q = static_cast<const Elem *>(p.query) +
                      b * p.query_stride_b + (h0 + g) * p.query_stride_h;
      const int64_t g0 = g / kPassHeads * kPassHeads,
                    nh = std::min(kPassHeads, group - g0);
      float *q_t = sc.q + g0 * d_k + (g - g0);
      for (int64_t c = 0; c < d_k;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_k - c));
        vec::store_strided(q_t + c * nh, nh * 4,
                           vec::mul(Tr::load(q + c, vl), q_scale, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      sc.m[g] = kNegInf;
      sc.l[g] = 0.0f;
    }
    vec::fill_zero(sc.acc, group * d_v);
    const int64_t esz = static_cast<int64_t>(sizeof(KvElem));
    const bool map64 = p.req_to_token_is_int64;
    const char *map_row =
        static_cast<const char *>(p.req_to_token) +
        (p.req_pool_indices[b] * p.req_to_token_stride + p.kv_first[b]) *
            (map64 ? 8 : 4);
    const char *k_rows =
        static_cast<const char *>(p.k_buffer) + hk * p.k_stride_h * esz;
    const char *v_rows =
        static_cast<const char *>(p.v_buffer) + hk * p.v_stride_h * esz;
    const bool aligned = reinterpret_cast<uintptr_t>(k_rows) % 4 == 0 &&
                         (p.k_stride_t * esz) % 4 == 0;
    const int64_t words = aligned ? d_k / kCols : 0;
    for (int64_t t0 = begin; t0 < end; t0 += static_cast<int64_t>(kBlockN)) {
      const size_t n = vec::setvl(static_cast<size_t>(
          std::min(end - t0, static_cast<int64_t>(kBlockN))));
      const void *slots = map_row + t0 * (map64 ? 8 : 4);
      VF k_scales = vec::zeros(), v_scales = vec::zeros();
      if (k_dyn) {
        k_scales = vec::Traits<DType::Float32>::gather(
            p.scales.k_scale_buf,
            vec::row_offsets(slots, map64, p.scales.k_scale_stride_t * 4,
                             hk * p.scales.k_scale_stride_h * 4, n),
            n);
      }
      if (v_dyn) {
        v_scales = vec::Traits<DType::Float32>::gather(
            p.scales.v_scale_buf,
            vec::row_offsets(slots, map64, p.scales.v_scale_stride_t * 4,
                             hk * p.scales.v_scale_stride_h * 4, n),
            n);
      }
      for (int64_t g0 = 0; g0 < group; g0 += kPassHeads) {
        const int64_t nh = std::min(kPassHeads, group - g0);
        const float *q = sc.q + g0 * d_k;
        const vec::VIdx k_off =
            vec::row_offsets(slots, map64, p.k_stride_t * esz, 0, n);
        if (words > 0) {
          if (vec::fits_u32(k_off, n)) {
            pass_scores(nh, k_rows, vec::narrow_offsets(k_off, n), words, q, n,
                        sc.scores);
          } else {
            pass_scores(nh, k_rows, k_off, words, q, n, sc.scores);
          }
        } else {
          for (int64_t h = 0; h < nh; ++h)
            vec::store(sc.scores + h * kBlockN, vec::zeros(), n);
        }
        if (words * kCols < d_k) {
          pass_scores_tail(
              nh, reinterpret_cast<const KvElem *>(k_rows),
              vec::row_offsets(slots, map64, p.k_stride_t * esz, 0, n),
              words * kCols, d_k, q, n, sc.scores);
        }
        for (int64_t h = 0; h < nh; ++h) {
          const int64_t g = g0 + h;
          VF score = vec::load(sc.scores + h * kBlockN, n);
          if (k_dyn)
            score = vec::mul(score, k_scales, n);
          if (p.logit_cap > 0.0f)
            score = vec::softcap(score, p.logit_cap, n);
          const float m_old = sc.m[g];
          const float block_max = vec::reduce_max(score, n);
          const float m_new = block_max > m_old ? block_max : m_old;
          const VF prob = vec::exp_nonpositive(vec::sub(score, m_new, n), n);
          const float alpha =
              m_old == kNegInf ? 0.0f : vec::exp_scalar(m_old - m_new);
          sc.l[g] = sc.l[g] * alpha + vec::reduce_sum(prob, n);
          sc.m[g] = m_new;
          sc.alpha[g] = alpha;
          vec::store_strided(sc.probs + g0 * kBlockN + h, nh * 4,
                             v_dyn ? vec::mul(prob, v_scales, n) : prob, n);
        }
      }
      vec::store_offsets(
          sc.rows,
          vec::row_offsets(
              slots, map64, p.v_stride_t * esz,
              static_cast<int64_t>(reinterpret_cast<uintptr_t>(v_rows)), n),
          n);
      for (int64_t c = 0, rows_at = 0; c < d_v;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
        if (c != rows_at) {
          vec::add_to_offsets(sc.rows, (c - rows_at) * esz, n);
          rows_at = c;
        }
        for (int64_t g0 = 0; g0 < group; g0 += kPassHeads) {
          pass_pv(std::min(kPassHeads, group - g0), sc.rows,
                  sc.probs + g0 * kBlockN, n, sc.acc + g0 * d_v + c, d_v,
                  sc.alpha + g0, vl);
        }
        c += static_cast<int64_t>(vl);
      }
    }
    for (int64_t g = 0; g < group; ++g) {
      float *out = logits_row(p, b, h0 + g, s);
      const float inv = out_scale / sc.l[g];
      for (int64_t c = 0; c < d_v;) {
        const size_t vl = vec::setvl(static_cast<size_t>(d_v - c));
        vec::store(out + c,
                   vec::mul(vec::load(sc.acc + g * d_v + c, vl), inv, vl), vl);
        c += static_cast<int64_t>(vl);
      }
      out[d_v] = sc.m[g] + std::log(sc.l[g]);
    }
  }
  static void merge(const DecodeParams &p, int64_t item);
  struct Ctx {
    const DecodeParams *p;
    int failed;
  };
  static bool run(const DecodeParams &p, const rvv_attn::ThreadPool &pool) {
    Ctx ctx{&p, 0};
    pool.run(p.batch * p.heads_kv * p.num_splits, &ctx,
             [](void *c, int64_t begin, int64_t end) {
               Ctx &x = *static_cast<Ctx *>(c);
               Scratch sc;
               if (!sc.allocate(*x.p)) {
                 __atomic_store_n(&x.failed, 1, 0);
                 return;
               }
               for (int64_t i = begin; i < end; ++i)
                 split(*x.p, sc, i);
               sc.release();
             });
    if (ctx.failed)
      return false;
    pool.run(p.batch * p.heads, &ctx, [](void *c, int64_t begin, int64_t end) {
      const Ctx &x = *static_cast<Ctx *>(c);
      for (int64_t i = begin; i < end; ++i)
        merge(*x.p, i);
    });
    return true;
  }
};
} // namespace
bool decode_attention(const rvv_attn::DecodeParams &p,
                      const rvv_attn::ThreadPool &pool) {
  return Decode<DType::Float16, false>::run(p, pool);
}
} // namespace rvv_attn::vlen128
