"""What every session that builds for or runs in the emulated target needs first."""

from __future__ import annotations

from pathlib import Path

from . import host_packages, qemu, sysroot
from .torch_lines import TorchLine


def ensure(line: TorchLine | None = None) -> tuple[Path, Path]:
    """Host packages, pinned QEMU and the sysroot of ``line`` (default: the active torch line): each step is a
    no-op when already done."""
    host_packages.ensure_host_packages()
    qemu_bin = qemu.ensure_qemu()
    return qemu_bin, sysroot.ensure_sysroot(qemu_bin, sysroot.Manifest.for_line(line))
