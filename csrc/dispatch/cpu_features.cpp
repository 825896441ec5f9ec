#include "dispatch/cpu_features.h"

#if defined(__riscv) && defined(__linux__)
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdint>
#endif

namespace rvv_attn {
namespace {

#if defined(__riscv) && defined(__linux__)
// From the kernel's uapi <asm/hwprobe.h>. Spelled out because the sysroot's
// headers (Linux 6.12) predate Zvfbfmin's bit, and a wheel built against old
// headers must still see the extension on a newer kernel.
constexpr long kNrRiscvHwprobe = 258;
constexpr int64_t kKeyImaExt0 = 4;
constexpr uint64_t kImaV = 1ULL << 2;
constexpr uint64_t kExtZvfh = 1ULL << 30;
constexpr uint64_t kExtZvfbfmin = 1ULL << 53;
#ifdef __NR_riscv_hwprobe
static_assert(__NR_riscv_hwprobe == kNrRiscvHwprobe, "riscv_hwprobe syscall number");
#endif

struct HwprobePair {
  int64_t key;
  uint64_t value;
};

// True if the kernel answered; `ima_ext_0` then holds the extension bits
// that every CPU of this process has (an empty CPU set means all CPUs).
bool hwprobe_ima_ext_0(uint64_t* ima_ext_0) {
  HwprobePair pair{kKeyImaExt0, 0};
  if (syscall(kNrRiscvHwprobe, &pair, 1, 0, nullptr, 0) != 0) return false;  // ENOSYS before Linux 6.4
  // A kernel that does not know the key sets it to -1.
  if (pair.key != kKeyImaExt0) return false;
  *ima_ext_0 = pair.value;
  return true;
}

int read_vlen_bits() {
  unsigned long vlenb;
  // CSR 0xC22 is vlenb; the number, not the name, because this file is
  // compiled for rv64gc and the assembler only knows the name with V.
  asm volatile("csrr %0, 0xc22" : "=r"(vlenb));
  return static_cast<int>(vlenb * 8);
}
#endif

}  // namespace

CpuInfo detect_cpu(CpuProbe probe) {
  CpuInfo info;
#if defined(__riscv) && defined(__linux__)
  uint64_t ext = 0;
  if (probe == CpuProbe::kAuto && hwprobe_ima_ext_0(&ext)) {
    info.source = "riscv_hwprobe";
    info.has_vector = (ext & kImaV) != 0;
    info.has_zvfh = info.has_vector && (ext & kExtZvfh) != 0;
    info.has_zvfbfmin = info.has_vector && (ext & kExtZvfbfmin) != 0;
  } else {
    info.source = "AT_HWCAP";
    info.has_vector = (getauxval(AT_HWCAP) & (1UL << ('V' - 'A'))) != 0;
  }
  if (info.has_vector) info.vlen = read_vlen_bits();
#else
  (void)probe;
  info.source = "none (not riscv64 Linux)";
#endif
  return info;
}

std::vector<std::string> extension_names(const CpuInfo& cpu) {
  std::vector<std::string> names;
  if (cpu.has_vector) names.emplace_back("v");
  if (cpu.has_zvfh) names.emplace_back("zvfh");
  if (cpu.has_zvfbfmin) names.emplace_back("zvfbfmin");
  return names;
}

}  // namespace rvv_attn
