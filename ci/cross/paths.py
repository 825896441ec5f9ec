"""Where things live: the project tree and the per-user cache (XDG)."""

from __future__ import annotations

import os
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parents[2]
TOOLCHAINS_DIR = PROJECT_ROOT / "toolchains"
# Build trees, the staged wheel and test results; RVV_ATTN_BUILD_DIR moves
# them (e.g. to keep two concurrent builds apart).
BUILD_DIR = Path(os.environ.get("RVV_ATTN_BUILD_DIR") or PROJECT_ROOT / "build").resolve()


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
