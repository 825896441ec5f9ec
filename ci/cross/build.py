"""Builds through scikit-build-core: the host (portable) install and the riscv64 wheel."""

from __future__ import annotations

import shutil
import zipfile
from collections.abc import Sequence
from pathlib import Path

from .paths import BUILD_DIR, PROJECT_ROOT, TOOLCHAINS_DIR
from .vlens import Variant

TOOLCHAIN_FILE = TOOLCHAINS_DIR / "riscv64-clang19.cmake"
RISCV_WHEEL_TAG = "py3-none-linux_riscv64"
# What a nox session needs to drive scikit-build-core without build isolation.
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "setuptools-scm>=8", "cmake>=3.21", "ninja"]


def host_install_args(build_dir: Path = BUILD_DIR / "host", extra_cmake: Sequence[str] = ()) -> list[str]:
    """``pip install`` arguments for the portable host build (incremental in ``build_dir``).

    clang-19 is the host compiler too: the same compiler everywhere, and no
    dependence on whichever g++ the host has.
    """
    args = [
        "install", "--no-build-isolation", "--no-deps", "--force-reinstall",
        "-C", f"build-dir={build_dir}",
        "-C", "cmake.define.CMAKE_CXX_COMPILER=clang++-19",
    ]
    for define in extra_cmake:
        args += ["-C", f"cmake.define.{define}"]
    return args + [str(PROJECT_ROOT)]


def cross_wheel_args(sysroot: Path, out_dir: Path, variants: Sequence[Variant],
                     build_dir: Path = BUILD_DIR / "riscv64", build_type: str = "Release") -> list[str]:
    """``pip wheel`` arguments for the riscv64 wheel holding ``variants`` and the portable build."""
    vlens = ";".join(str(v.vlen) for v in variants)
    return [
        "wheel", "--no-build-isolation", "--no-deps", "-w", str(out_dir),
        "-C", f"build-dir={build_dir}",
        "-C", f"cmake.build-type={build_type}",
        "-C", f"cmake.toolchain-file={TOOLCHAIN_FILE}",
        "-C", f"wheel.tags={RISCV_WHEEL_TAG}",
        "-C", "cmake.python-hints=false",
        "-C", f"cmake.define.RVV_ATTN_SYSROOT={sysroot}",
        "-C", f"cmake.define.RVV_ATTN_VLENS={vlens}",
        str(PROJECT_ROOT),
    ]


def newest_wheel(out_dir: Path) -> Path:
    wheels = sorted(out_dir.glob(f"rvv_attn-*-{RISCV_WHEEL_TAG}.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise FileNotFoundError(f"no rvv_attn riscv64 wheel in {out_dir}")
    return wheels[-1]


def stage_wheel(wheel: Path, stage: Path) -> Path:
    """Unpack the wheel into ``stage`` (put on the guest's PYTHONPATH): the tests import what the wheel ships."""
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(stage)
    lib = stage / "rvv_attn" / "librvv_attn_ops.so"
    if not lib.exists():
        raise FileNotFoundError(f"{wheel.name} holds no rvv_attn/librvv_attn_ops.so")
    return stage


# AddressSanitizer + UndefinedBehaviorSanitizer build of the portable kernels
# for the host. Any UB report is fatal, so a run that passes is clean.
SANITIZER_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
SANITIZER_DEFINES = [
    f"CMAKE_CXX_FLAGS={SANITIZER_FLAGS}",
    # The shared runtime, preloaded into python, which is not instrumented.
    "CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined -shared-libasan",
]


def sanitizer_env(runtime: str) -> dict[str, str]:
    """Environment for running python with the sanitized library."""
    return {
        "LD_PRELOAD": runtime,
        # CPython and torch keep allocations alive until exit by design.
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:strict_init_order=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


def check_sanitized(library: Path) -> None:
    """Fail unless ``library`` really carries ASan instrumentation (a run must not pass by accident)."""
    from .proc import run

    undefined = run(["llvm-nm-19", "-D", "--undefined-only", str(library)])
    if "__asan_init" not in undefined or "__ubsan_handle" not in undefined:
        raise RuntimeError(f"{library} is not built with -fsanitize=address,undefined")
