"""RISC-V Vector attention kernels as PyTorch operators (``torch.ops.rvv_attn``).

Importing the package loads the operator library, which holds a portable
build of every kernel and, in riscv64 builds, one RVV build per VLEN. The
variant that matches the CPU's VLEN is selected at run time; set
``RVV_ATTN_VARIANT`` (``auto``, ``portable``, ``vlen256``, ...) to force one.
A variant whose VLEN differs from the CPU's is refused with an error.

Each library is built against one torch version and lives in a folder named
after it (``rvv_attn/torch-2.6.0/``); a wheel may carry one per supported
torch line. Import loads the one whose major.minor is the running torch's, and
raises ImportError, naming the lines it has, when none is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from ._torch_guard import major_minor, pick_library, shipped_libraries

__all__ = ["ops", "runtime_info", "select_variant", "use_variant", "library_path"]

try:  # written by the build, so absent in a source tree that was never built
    from ._version import version as __version__
except ImportError:
    __version__ = "unknown"


def _load() -> tuple[str, Path]:
    libraries = shipped_libraries(Path(__file__).parent)
    if not libraries:
        raise ImportError(
            f"rvv_attn: no operator library in {Path(__file__).parent} (torch-<version>/librvv_attn_ops.so); "
            "the package was not built (install it with pip, or run `nox -s test-host`)"
        )
    built, path = pick_library(__version__, libraries, str(torch.__version__))
    torch.ops.load_library(str(path))
    return built, path


_built_against_torch, library_path = _load()
ops = torch.ops.rvv_attn
# Shapes of the tensor-returning operators for torch.compile (no kernel runs).
from . import _fake_ops  # noqa: E402, F401

# Select now, so a bad RVV_ATTN_VARIANT fails at import with the dispatcher's
# message (it names the requested and the CPU's VLEN), not at the first call.
ops.active_variant()


def runtime_info() -> dict[str, object]:
    """What the library was built with and what it runs on.

    ``cpu_extensions`` lists the vector extensions the kernel reports (``v``,
    ``zvfh``, ``zvfbfmin``), ``cpu_detection`` how they were asked for
    (``riscv_hwprobe``, or ``AT_HWCAP`` on kernels before 6.4, which report V
    only). ``cpu_vlen`` is read from the CPU (vlenb) only when V is reported,
    else 0.
    """
    extensions, vlen, detection = ops.cpu_features()
    return {
        "cpu_vlen": int(vlen),
        "cpu_extensions": list(extensions),
        "cpu_detection": str(detection),
        "compiled_variants": list(ops.compiled_variants()),
        "active_variant": str(ops.active_variant()),
        "reason": str(ops.selection_reason()),
        "version": __version__,
        "torch": str(torch.__version__),
        "built_against_torch": _built_against_torch,
        "torch_lines": sorted(shipped_libraries(Path(__file__).parent), key=major_minor),
    }


def select_variant(name: str) -> str:
    """Select ``auto``, ``portable`` or ``vlen<N>``; raises RuntimeError if it cannot run here."""
    return str(ops.select_variant(name))


@contextlib.contextmanager
def use_variant(name: str) -> Iterator[str]:
    """Run a block with another variant, then restore the previous one."""
    previous = str(ops.active_variant())
    selected = select_variant(name)
    try:
        yield selected
    finally:
        select_variant(previous)
