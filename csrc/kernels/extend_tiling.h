// The extend kernel's score-tile shape: the one place BLOCK_M and BLOCK_N
// are chosen.
//
// BLOCK_N (keys per tile) is vec::kWideLanes, the lane count of one
// vec::VW (a float32 LMUL=8 register group), VLEN/4 in an RVV variant: twice
// decode's KV block. A score row s_i[0:BLOCK_N] is then a single wide
// vector and Q.K for a query row is D vector FMAs (vfmacc.vf) into it, each
// scalar multiplier feeding VLEN/4 keys (the LMUL=4 vector of the first
// design fed half as many, so the scalar load per FMA cost twice as much per
// key). BLOCK_M (query rows per tile) is 4096/BLOCK_N, a 16 KB f32 score
// tile, but at least 64 rows (so 32 KB at VLEN 512, 64 KB at 1024), so
// each gathered and widened K/V block is shared by at least 64 query rows
// at every VLEN.
//
//   VLEN      128  256  512  1024   portable
//   BLOCK_N    32   64  128   256         32
//   BLOCK_M   128   64   64    64        128
//
// The portable build has no VLEN; vec.h gives its VW the vlen128 lane count,
// so it runs the vlen128 blocking (and the same arithmetic) without
// intrinsics.
//
// Override either at build time with -DRVV_ATTN_EXTEND_BLOCK_N=<n> and/or
// -DRVV_ATTN_EXTEND_BLOCK_M=<m> (e.g. through CMAKE_CXX_FLAGS). BLOCK_N may
// not exceed the VW lane count (the score row is one wide vector); BLOCK_M
// defaults to max(64, 4096/BLOCK_N) whichever way BLOCK_N was set.
#pragma once

#include <cstdint>

#include "kernels/variant.h"
#include "kernels/vec.h"

#ifndef RVV_ATTN_EXTEND_BLOCK_N
#define RVV_ATTN_EXTEND_BLOCK_N (static_cast<int64_t>(vec::kWideLanes))
#endif

#ifndef RVV_ATTN_EXTEND_BLOCK_M
#define RVV_ATTN_EXTEND_BLOCK_M (4096 / (RVV_ATTN_EXTEND_BLOCK_N) > 64 ? 4096 / (RVV_ATTN_EXTEND_BLOCK_N) : 64)
#endif

namespace RVV_ATTN_NS {

struct ExtendTiling {
  static constexpr int64_t block_n = RVV_ATTN_EXTEND_BLOCK_N;
  static constexpr int64_t block_m = RVV_ATTN_EXTEND_BLOCK_M;
  static_assert(block_n >= 1 && block_m >= 1, "extend tile dimensions must be positive");
  static_assert(block_n <= static_cast<int64_t>(vec::kWideLanes),
                "BLOCK_N must fit one vec::VW (VLEN/4 floats): a score row is one wide vector");
};

}  // namespace RVV_ATTN_NS
