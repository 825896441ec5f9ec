// The library's TORCH_LIBRARY block: the variant and runtime controls.
// Every operator adds its schema with TORCH_LIBRARY_FRAGMENT in its own file
// of csrc/ops/.
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "dispatch/dispatch.h"
#include "kernels/kernel_api.h"
#include "ops/runtime.h"

namespace rvv_attn {
namespace {

std::vector<std::string> compiled_variant_names() {
  std::vector<std::string> names;
  for (const KernelTable* t : compiled_variants()) names.emplace_back(t->name);
  return names;
}

std::string select_variant_op(const std::string& name) {
  try {
    return select_variant(name);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, e.what());
  }
}

std::string active_variant() { return ops::kernels().name; }

int64_t cpu_vlen() { return detect_cpu().vlen; }

// (extensions seen, VLEN, how they were detected); probe "hwcap" skips
// riscv_hwprobe, as on a kernel older than 6.4.
std::tuple<std::vector<std::string>, int64_t, std::string> cpu_features(const std::string& probe) {
  TORCH_CHECK(probe == "auto" || probe == "hwcap", "rvv_attn.cpu_features: probe must be 'auto' or 'hwcap', got '",
              probe, "'");
  const CpuInfo cpu = detect_cpu(probe == "hwcap" ? CpuProbe::kHwcap : CpuProbe::kAuto);
  return {extension_names(cpu), cpu.vlen, cpu.source};
}

std::string selection_reason_op() {
  ops::kernels();
  return selection_reason();
}

}  // namespace
}  // namespace rvv_attn

TORCH_LIBRARY(rvv_attn, m) {
  m.def("compiled_variants() -> str[]", &rvv_attn::compiled_variant_names);
  m.def("select_variant(str name) -> str", &rvv_attn::select_variant_op);
  m.def("active_variant() -> str", &rvv_attn::active_variant);
  m.def("cpu_vlen() -> int", &rvv_attn::cpu_vlen);
  m.def("cpu_features(str probe=\"auto\") -> (str[], int, str)", &rvv_attn::cpu_features);
  m.def("selection_reason() -> str", &rvv_attn::selection_reason_op);
  m.def("pool_concurrency_probe(float timeout_seconds) -> int", &rvv_attn::ops::pool_concurrency_probe);
}
