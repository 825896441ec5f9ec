// Run-time choice of the kernel variant.
//
// An RVV variant built with -mrvv-vector-bits=zvl is valid at exactly one
// VLEN: run at another it reads and writes past its buffers. The dispatcher
// therefore reads the CPU's VLEN (vlenb, once the kernel reports V) and never lets a variant run on a
// CPU whose VLEN differs; asking for one raises an error naming both VLENs.
#pragma once

#include <string>
#include <vector>

#include "dispatch/cpu_features.h"
#include "kernels/kernel_api.h"

namespace rvv_attn {

// Every variant compiled into this library, portable first.
const std::vector<const KernelTable*>& compiled_variants();

// Select by name: "auto" (the VLEN match if compiled, else portable),
// "portable" or "vlen<N>". Throws std::invalid_argument, with a message that
// names the request, the CPU's VLEN and the compiled variants, when the
// request is unknown or cannot run on this CPU. Returns the selected name.
std::string select_variant(const std::string& request);

// The selected table; on first use selects from $RVV_ATTN_VARIANT (default auto).
const KernelTable& active_table();

// Why the active variant was chosen (for runtime_info()).
std::string selection_reason();

}  // namespace rvv_attn
