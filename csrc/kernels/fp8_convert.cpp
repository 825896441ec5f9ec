// float8_e4m3fn <-> float conversions of contiguous runs: the operators
// fp8_e4m3_dequantize / fp8_e4m3_quantize, and through them the tests of the
// vector conversions (vec::E4m3Codes) that every fp8 kernel is built on.
#include <cstdint>

#include "kernels/kernel_api.h"
#include "kernels/variant.h"
#include "kernels/vec.h"

namespace RVV_ATTN_NS {
namespace {

using rvv_attn::DType;
using rvv_attn::Fp8ConvertParams;

// Elements per work item: enough to amortise a task, small enough that a
// few thousand elements still spread over the threads.
constexpr int64_t kChunk = 4096;

template <typename Body>
void for_chunks(const Fp8ConvertParams& p, const rvv_attn::ThreadPool& pool) {
  struct Ctx {
    const Fp8ConvertParams* p;
  } ctx{&p};
  auto body = [](void* c, int64_t begin, int64_t end) {
    const Fp8ConvertParams& q = *static_cast<Ctx*>(c)->p;
    for (int64_t chunk = begin; chunk < end; ++chunk) {
      const int64_t first = chunk * kChunk;
      const int64_t last = first + kChunk < q.count ? first + kChunk : q.count;
      Body::run(q, first, last);
    }
  };
  pool.run((p.count + kChunk - 1) / kChunk, &ctx, body);
}

template <DType T>
struct Dequantize {
  static void run(const Fp8ConvertParams& p, int64_t first, int64_t last) {
    using Tr = vec::Traits<T>;
    const auto* src = static_cast<const uint8_t*>(p.src);
    auto* dst = static_cast<typename Tr::Elem*>(p.dst);
    for (int64_t i = first; i < last;) {
      const size_t vl = vec::setvl(static_cast<size_t>(last - i));
      Tr::store(dst + i, vec::mul(vec::E4m3Codes::load(src + i, vl), p.scale, vl), vl);
      i += static_cast<int64_t>(vl);
    }
  }
};

template <DType T>
struct Quantize {
  static void run(const Fp8ConvertParams& p, int64_t first, int64_t last) {
    vec::quantize_e4m3_row<T>(static_cast<uint8_t*>(p.dst) + first,
                              static_cast<const typename vec::Traits<T>::Elem*>(p.src) + first, last - first, p.scale,
                              p.saturate);
  }
};

template <template <DType> class Body>
void dispatch(const Fp8ConvertParams& p, const rvv_attn::ThreadPool& pool) {
  if (p.count == 0) return;
  switch (p.dtype) {
    case DType::Float32: return for_chunks<Body<DType::Float32>>(p, pool);
    case DType::BFloat16: return for_chunks<Body<DType::BFloat16>>(p, pool);
    case DType::Float16: return for_chunks<Body<DType::Float16>>(p, pool);
    case DType::Bytes: return;  // not a float dtype (the binding refuses it)
  }
}

}  // namespace

void fp8_dequantize(const Fp8ConvertParams& p, const rvv_attn::ThreadPool& pool) { dispatch<Dequantize>(p, pool); }

void fp8_quantize(const Fp8ConvertParams& p, const rvv_attn::ThreadPool& pool) { dispatch<Quantize>(p, pool); }

}  // namespace RVV_ATTN_NS
