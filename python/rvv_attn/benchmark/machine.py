"""What the figures were measured on: CPU, clock, threads and pinning, and whether the CPU is emulated.

Everything is read from files and the environment through small functions that
take the text, so each is tested on recorded samples (tests/test_benchmark.py).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

CPUFREQ = Path("/sys/devices/system/cpu/cpu0/cpufreq")
# /proc/cpuinfo keys worth keeping (RISC-V Linux: isa, uarch, mvendorid/marchid/mimpid, "model name" on newer
# kernels; x86: model name, flags are left out).
CPUINFO_KEYS = ("model name", "uarch", "isa", "mvendorid", "marchid", "mimpid", "mmu", "cpu MHz")
# Variables that decide torch's threads and their pinning.
THREAD_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_NUM_THREADS", "TORCH_")
# Set by the project's emulated runner (ci/driver/toolchain/guest_commands.py, the test and install-test
# sessions), and by qemu-user's own options given as variables.
EMULATION_ENV = ("RVV_ATTN_EMULATED", "RVV_ATTN_QEMU_CPU", "QEMU_CPU", "QEMU_LD_PREFIX")


def parse_cpuinfo(text: str) -> dict[str, object]:
    """The first processor's fields of interest, and how many processors the text lists."""
    first: dict[str, str] = {}
    processors = 0
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if not sep:
            continue
        if key == "processor":
            processors += 1
        if processors <= 1 and key in CPUINFO_KEYS and key not in first:
            first[key] = value
    return {**first, "processors": processors}


def emulation(env: Mapping[str, str], cpuinfo: Mapping[str, object], machine: str) -> str | None:
    """Why these times are emulated (a sentence), or None on real hardware.

    The runner's variables say it first. Failing those, QEMU's user mode writes its own /proc/cpuinfo:
    ``uarch : qemu`` (10.0; older versions no uarch line) and never the machine IDs (``mvendorid``) that the
    Linux kernel writes on real RISC-V hardware.
    """
    for name in EMULATION_ENV:
        if env.get(name):
            return f"{name}={env[name]}"
    if cpuinfo.get("uarch") == "qemu":
        return "/proc/cpuinfo says uarch qemu"
    if machine == "riscv64" and cpuinfo.get("processors") and not ({"uarch", "mvendorid"} & set(cpuinfo)):
        return "/proc/cpuinfo has no uarch or mvendorid line, as QEMU's user mode writes it"
    return None


def read_text(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def clock_info(cpufreq: Path = CPUFREQ) -> dict[str, object]:
    """cpu0's clock as the OS reports it (kHz in sysfs, reported in MHz), and the governor; {} when absent."""
    info: dict[str, object] = {}
    for name in ("cpuinfo_max_freq", "scaling_max_freq", "scaling_cur_freq", "cpuinfo_min_freq"):
        text = read_text(cpufreq / name)
        if text and text.strip().isdigit():
            info[f"{name}_mhz"] = int(text.strip()) / 1000
    governor = read_text(cpufreq / "scaling_governor")
    if governor:
        info["governor"] = governor.strip()
    return info


def cycle_clock_mhz(clock: Mapping[str, object], override: float | None) -> tuple[float | None, str]:
    """The clock that turns seconds into cycles, and where it came from.

    Under sustained load a K1 runs at its maximum clock with the usual governors, so the maximum is the
    assumption; ``--clock-mhz`` replaces it (e.g. with what the board's datasheet or a fixed governor says).
    """
    if override:
        return override, "--clock-mhz"
    for name in ("scaling_max_freq_mhz", "cpuinfo_max_freq_mhz"):
        if clock.get(name):
            return float(clock[name]), f"{name.removesuffix('_mhz')} (cpu0, assumed under load)"
    return None, "unknown: the OS reports no clock; give --clock-mhz"


def affinity() -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None


def usable_cpus() -> int:
    cpus = affinity()
    return len(cpus) if cpus else (os.cpu_count() or 1)


def thread_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in sorted(env.items()) if k.startswith(THREAD_ENV_PREFIXES)}


def describe(env: Mapping[str, str] | None = None, cpuinfo_text: str | None = None) -> dict[str, object]:
    """The machine: CPU, clock, threads and pinning, kernel, and the emulation verdict."""
    env = os.environ if env is None else env
    text = read_text(Path("/proc/cpuinfo")) if cpuinfo_text is None else cpuinfo_text
    cpu = parse_cpuinfo(text or "")
    machine = platform.machine()
    return {
        "machine": machine,
        "kernel": platform.release(),
        "cpu": cpu,
        "clock": clock_info(),
        "cpu_count": os.cpu_count(),
        "affinity": affinity(),
        "thread_env": thread_env(env),
        "emulated": emulation(env, cpu, machine),
    }


def cpu_name(description: Mapping[str, object]) -> str:
    """One line for the header: model name or uarch, and the ISA string (shortened)."""
    cpu = description.get("cpu") or {}
    name = cpu.get("model name") or cpu.get("uarch") or description.get("machine") or "unknown CPU"
    if cpu.get("uarch") and cpu.get("uarch") != name:
        name = f"{name} ({cpu['uarch']})"
    isa = str(cpu.get("isa") or "")
    return f"{name}, isa {isa[:60]}{'...' if len(isa) > 60 else ''}" if isa else str(name)
