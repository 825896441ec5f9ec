// What the CPU offers, asked of the kernel, never probed by trial.
//
// Executing a vector instruction, or reading the vlenb CSR, on a CPU without
// the V extension raises SIGILL. So the vector state is touched only after
// the kernel has reported V: through the riscv_hwprobe syscall (Linux 6.4+,
// also implemented by qemu-riscv64's user mode), which also reports the
// vector sub-extensions, else through the V bit of AT_HWCAP (older kernels).
#pragma once

#include <string>
#include <vector>

namespace rvv_attn {

enum class CpuProbe {
  kAuto,   // riscv_hwprobe, falling back to AT_HWCAP if the kernel lacks it
  kHwcap,  // AT_HWCAP only (what a pre-6.4 kernel offers)
};

struct CpuInfo {
  bool has_vector = false;    // V, as reported by the kernel
  bool has_zvfh = false;      // vector half-precision arithmetic (riscv_hwprobe only)
  bool has_zvfbfmin = false;  // vector bfloat16 conversions (riscv_hwprobe only)
  int vlen = 0;               // bits, read from vlenb; 0 without V
  std::string source;         // "riscv_hwprobe", "AT_HWCAP", or "none (not riscv64 Linux)"
};

CpuInfo detect_cpu(CpuProbe probe = CpuProbe::kAuto);

// Lower-case names of the extensions seen, in a fixed order: "v", "zvfh", "zvfbfmin".
std::vector<std::string> extension_names(const CpuInfo& cpu);

}  // namespace rvv_attn
