"""RISC-V Vector attention kernels as PyTorch operators (``torch.ops.rvv_attn``).

Importing the package loads the operator library, which holds a portable
build of every kernel and, in riscv64 builds, one RVV build per VLEN. The
variant that matches the CPU's VLEN is selected at run time; set
``RVV_ATTN_VARIANT`` (``auto``, ``portable``, ``vlen256``, ...) to force one.
A variant whose VLEN differs from the CPU's is refused with an error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch

__all__ = ["ops", "runtime_info", "select_variant", "use_variant", "library_path"]
__version__ = "0.1.0"

library_path = Path(__file__).with_name("librvv_attn_ops.so")


def _load() -> None:
    if not library_path.exists():
        raise ImportError(
            f"rvv_attn: the operator library {library_path} is missing; "
            "the package was not built (install it with pip, or run `nox -s test-host`)"
        )
    torch.ops.load_library(str(library_path))


_load()
ops = torch.ops.rvv_attn
# Select now, so a bad RVV_ATTN_VARIANT fails at import with the dispatcher's
# message (it names the requested and the CPU's VLEN), not at the first call.
ops.active_variant()


def runtime_info() -> dict[str, object]:
    """What the library was built with and what it runs on.

    ``cpu_vlen`` is read from the CPU (vlenb), 0 without the V extension.
    """
    return {
        "cpu_vlen": int(ops.cpu_vlen()),
        "compiled_variants": list(ops.compiled_variants()),
        "active_variant": str(ops.active_variant()),
        "reason": str(ops.selection_reason()),
        "torch": torch.__version__,
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
