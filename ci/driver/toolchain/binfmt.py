"""Running riscv64 programs as if native: the pinned QEMU registered with the kernel's binfmt_misc.

The emulated test sessions start QEMU themselves (``qemu-riscv64 -L sysroot``)
and never need this. A native build on a board does: pip starts CMake, CMake
starts the compiler, the compiler starts its assembler, each a riscv64
program. Inside a chroot of a Debian riscv64 root those programs only run if
the kernel hands riscv64 ELF files to QEMU, which is what a binfmt_misc entry
does. The entry is named ``qemu-riscv64``, the name Debian's qemu-user-binfmt
and mmdebstrap use, and carries the F flag (the kernel opens the interpreter
at registration, so it works inside the chroot, where the host's path does
not exist).

``registered`` registers the entry for the duration of a block and removes it
after, unless it was there before, in which case it is used as it is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import MissingPrerequisite
from ..proc import log, run
from .host_packages import privilege_prefix

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
ENTRY = "qemu-riscv64"
# The ELF header of a riscv64 executable or shared object (64-bit, little-endian, e_machine 0xf3), and the
# mask that ignores the OS ABI byte and the executable/shared-object bit of e_type.
RISCV64_MAGIC = b"\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xf3\x00"
RISCV64_MASK = b"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff"


def escaped(data: bytes) -> str:
    return "".join(f"\\x{b:02x}" for b in data)


def registration(interpreter: Path, name: str = ENTRY) -> str:
    """The line written to binfmt_misc's ``register`` file: match by magic bytes, F (fix binary)."""
    return f":{name}:M::{escaped(RISCV64_MAGIC)}:{escaped(RISCV64_MASK)}:{interpreter}:F"


def interpreter_of(entry_text: str) -> str | None:
    """The interpreter line of a binfmt_misc entry file (``interpreter /usr/bin/qemu-riscv64-static``)."""
    for line in entry_text.splitlines():
        if line.startswith("interpreter "):
            return line.split(" ", 1)[1].strip()
    return None


def _write(path: Path, text: str) -> None:
    prefix = privilege_prefix()
    if prefix is None:
        raise MissingPrerequisite(
            f"writing {path} needs root",
            "run the session as root or with passwordless sudo (it registers QEMU with binfmt_misc)",
        )
    run([*prefix, "sh", "-c", f"printf '%s\\n' \"$1\" > {path}", "sh", text])


def _mounted() -> None:
    if (BINFMT_DIR / "register").exists():
        return
    prefix = privilege_prefix()
    if prefix is None:
        raise MissingPrerequisite("binfmt_misc is not mounted and this user cannot mount it", "run as root")
    run([*prefix, "mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)])


@contextlib.contextmanager
def registered(qemu: Path) -> Iterator[str]:
    """riscv64 programs run through QEMU while the block runs; yields the interpreter in use."""
    _mounted()
    entry = BINFMT_DIR / ENTRY
    if entry.exists():
        existing = interpreter_of(entry.read_text()) or "?"
        log(f"binfmt_misc already has {ENTRY} ({existing}): using it")
        yield existing
        return
    log(f"registering {qemu} with binfmt_misc as {ENTRY} (removed again at the end)")
    _write(BINFMT_DIR / "register", registration(qemu))
    try:
        yield str(qemu)
    finally:
        if entry.exists():
            _write(entry, "-1")
