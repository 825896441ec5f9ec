"""RISC-V Vector attention kernels as PyTorch operators (``torch.ops.rvv_attn``).

Importing the package loads the operator library, which holds a portable
build of every kernel and, in riscv64 builds, one RVV build per VLEN. The
variant that matches the CPU's VLEN is selected at run time; set
``RVV_ATTN_VARIANT`` (``auto``, ``portable``, ``vlen256``, ...) to force one.
A variant whose VLEN differs from the CPU's is refused with an error.

The library is built against one torch version (recorded in
``_build_info.TORCH_VERSION``); importing the package under a torch of another
major.minor raises ImportError before the library is loaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

from ._torch_guard import check_torch_version

__all__ = ["ops", "runtime_info", "select_variant", "use_variant", "library_path"]

library_path = Path(__file__).with_name("librvv_attn_ops.so")

try:  # both written by the build, so absent in a source tree that was never built
    from ._version import version as __version__
except ImportError:
    __version__ = "unknown"


def _load() -> None:
    if not library_path.exists():
        raise ImportError(
            f"rvv_attn: the operator library {library_path} is missing; "
            "the package was not built (install it with pip, or run `nox -s test-host`)"
        )
    from ._build_info import TORCH_VERSION

    check_torch_version(__version__, TORCH_VERSION, str(torch.__version__))
    torch.ops.load_library(str(library_path))


_load()
ops = torch.ops.rvv_attn
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
    from ._build_info import TORCH_VERSION

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
        "built_against_torch": TORCH_VERSION,
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
