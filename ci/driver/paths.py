"""Where things live: the project tree and the per-user cache (XDG)."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TOOLCHAINS_DIR = PROJECT_ROOT / "toolchains"
# Selects a torch line other than the default (toolchain/torch_lines.py).
LINE_ENV = "RVV_ATTN_TORCH_LINE"


def line_folder(environ: dict[str, str] | None = None) -> str:
    """``torch2.14`` when a torch line is chosen explicitly, else empty: its builds must not share trees (CMake
    caches a sysroot and a torch) with the default line's."""
    env = os.environ if environ is None else environ
    chosen = env.get(LINE_ENV, "").strip().removeprefix("torch")
    return f"torch{chosen}" if chosen else ""


# Build trees, the staged wheel and test results; RVV_ATTN_BUILD_DIR moves
# them (e.g. to keep two concurrent builds apart). BUILD_DIR is the active
# torch line's part of BUILD_ROOT; the release builds, which build every line,
# live in BUILD_ROOT itself.
BUILD_ROOT = Path(os.environ.get("RVV_ATTN_BUILD_DIR") or PROJECT_ROOT / "build").resolve()
BUILD_DIR = BUILD_ROOT / line_folder()


def cache_root(environ: dict[str, str] | None = None) -> Path:
    """The cache shared by every checkout of this user: sysroot, QEMU, apt state.

    ``RVV_ATTN_CACHE`` overrides it; otherwise ``$XDG_CACHE_HOME/rvv-attn``
    (``~/.cache/rvv-attn``).  Shared, so a second clone (and CI on the same
    machine) reuses a sysroot that is already built.
    """
    env = os.environ if environ is None else environ
    if env.get("RVV_ATTN_CACHE"):
        return Path(env["RVV_ATTN_CACHE"]).expanduser()
    xdg = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME", str(Path.home()))) / ".cache")
    return Path(xdg).expanduser() / "rvv-attn"


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Serialize one cache step (building the sysroot, fetching QEMU) across processes.

    Two checkouts or sessions started together would otherwise build the same
    folder at once; the second now waits and then finds it done.
    """
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / f"{name}.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
