"""Command lines and environments for running programs inside the emulated target."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..paths import BUILD_DIR, cache_root
from .vlens import Variant

# A CPU without V, for steps that run no kernel (byte-compiling).
SCALAR_CPU = "rv64"
# Variables passed from the host to the guest; the rest of the host
# environment (a venv's PATH, PYTHONPATH, ...) means nothing there.
PASS_THROUGH = ("HOME", "TERM", "COLUMNS", "HYPOTHESIS_PROFILE", "HYPOTHESIS_STORAGE_DIRECTORY", "CI")


def guest_program(sysroot: Path, program: str) -> str:
    """Map ``python3`` (or any bare name) to the sysroot's binary."""
    if "/" in program:
        return program
    for d in ("usr/bin", "usr/sbin"):
        candidate = sysroot / d / program
        if candidate.exists() or candidate.is_symlink():
            return str(candidate)
    raise FileNotFoundError(f"{program} is not in the sysroot's /usr/bin ({sysroot})")


def guest_command(
    qemu: Path, sysroot: Path, variant: Variant | None, argv: Sequence[str], agnostic_ones: bool = False
) -> list[str]:
    cpu = variant.qemu_cpu(agnostic_ones) if variant else SCALAR_CPU
    return [str(qemu), "-L", str(sysroot), "-cpu", cpu, guest_program(sysroot, argv[0]), *argv[1:]]


def guest_env(
    stage: Path | None, tmpdir: Path, host_env: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    host_env = os.environ if host_env is None else host_env
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": str(tmpdir), "PYTHONDONTWRITEBYTECODE": "1"}
    # Tells programs their clock is QEMU's (python -m rvv_attn.benchmark labels its times emulated).
    env["RVV_ATTN_EMULATED"] = "qemu-riscv64"
    # Hypothesis (forky's 6.155; trixie's 6.130 does not do this) harvests constants from the source of every
    # imported module outside site-packages when pytest has collected a property test, and torch in the
    # sysroot's dist-packages counts as such: ~2,200 files parsed under QEMU, about 2.5 min in each fresh clone
    # while the cache was its .hypothesis/. The cache is keyed by each file's content (the tests keep no example
    # database), so one per user serves every checkout and torch line.
    env["HYPOTHESIS_STORAGE_DIRECTORY"] = str(cache_root(dict(host_env)) / "hypothesis")
    for name in PASS_THROUGH:
        if name in host_env:
            env[name] = host_env[name]
    env.update({k: v for k, v in host_env.items() if k.startswith("RVV_ATTN_")})
    if stage is not None:
        env["PYTHONPATH"] = str(stage)
    if extra:
        env.update(extra)
    return env


def staged_guest_env(stage: Path) -> dict[str, str]:
    """``guest_env`` for ``stage`` with the build tree's scratch folder (build/tmp) as TMPDIR."""
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return guest_env(stage, tmp)
