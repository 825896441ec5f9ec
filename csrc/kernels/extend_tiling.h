// The extend kernel's score-tile shape: the one place BLOCK_M and BLOCK_N
// are chosen.
//
// BLOCK_N (keys per tile) is vec::kBlockN, the KV block size vec.h derives
// from the VLEN for both attention kernels: the lane count of one vec::VF
// (a float32 LMUL=4 register group), VLEN/8 in an RVV variant. A
// score row s_i[0:BLOCK_N] is then a single vector and Q.K for one query
// row is D vector FMAs (vfmacc.vf) into it. BLOCK_M (query rows per tile) is
// 1024/BLOCK_N, so the f32 score tile is 4 KB at every VLEN: it stays in L1
// next to K^T and the V block, and a narrower vector unit gets more rows per
// tile to amortise each K/V gather over.
//
//   VLEN      128  256  512  1024   portable
//   BLOCK_N    16   32   64   128         16
//   BLOCK_M    64   32   16     8         64
//
// The portable build has no VLEN; vec.h gives its VF the vlen128 lane count,
// so it runs the vlen128 blocking (and the same arithmetic) without
// intrinsics.
//
// Override either at build time with -DRVV_ATTN_EXTEND_BLOCK_N=<n> and/or
// -DRVV_ATTN_EXTEND_BLOCK_M=<m> (e.g. through CMAKE_CXX_FLAGS). BLOCK_N may
// not exceed the VF lane count (the score row is one vector); BLOCK_M
// defaults to 1024/BLOCK_N whichever way BLOCK_N was set.
#pragma once

#include <cstdint>

#include "kernels/vec.h"
#include "variant.h"

#ifndef RVV_ATTN_EXTEND_BLOCK_N
#define RVV_ATTN_EXTEND_BLOCK_N (static_cast<int64_t>(vec::kBlockN))
#endif

#ifndef RVV_ATTN_EXTEND_BLOCK_M
#define RVV_ATTN_EXTEND_BLOCK_M (1024 / (RVV_ATTN_EXTEND_BLOCK_N))
#endif

namespace RVV_ATTN_NS {

struct ExtendTiling {
  static constexpr int64_t block_n = RVV_ATTN_EXTEND_BLOCK_N;
  static constexpr int64_t block_m = RVV_ATTN_EXTEND_BLOCK_M;
  static_assert(block_n >= 1 && block_m >= 1, "extend tile dimensions must be positive");
  static_assert(block_n <= static_cast<int64_t>(vec::kLanes),
                "BLOCK_N must fit one vec::VF (VLEN/8 floats): the score row is one vector");
};

}  // namespace RVV_ATTN_NS
