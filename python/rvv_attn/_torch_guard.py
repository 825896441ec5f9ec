"""The import-time check that torch is the one the operator library was built against.

torch's C++ ABI changes between minor versions: a library built against
torch 2.6 that is loaded by torch 2.7 fails with undefined symbols, or worse,
loads and misbehaves. Patch releases keep the ABI, and a local label such as
Debian's ``+debian`` does not change it, so major.minor is what must match.
"""

from __future__ import annotations

import re


def major_minor(version: str) -> tuple[int, int]:
    """``"2.6.0+debian"`` -> ``(2, 6)``; ValueError for a string that is not a version."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def mismatch_message(package_version: str, built: str, running: str) -> str:
    want = "{}.{}".format(*major_minor(built))
    return (
        f"rvv_attn {package_version} was built against torch {built}, but this Python has torch {running}; "
        f"its compiled operators need torch {want}.x (torch's C++ ABI changes between minor versions). "
        f"Either use torch {want} (on Debian trixie riscv64: `sudo apt install python3-torch`, in a venv "
        "created with --system-site-packages), or build rvv_attn against your torch from its source "
        "distribution: `pip install --no-binary rvv-attn --no-build-isolation rvv-attn` "
        "(needs CMake, Ninja and a C++17 compiler)."
    )


def check_torch_version(package_version: str, built: str, running: str) -> None:
    """Raise ImportError, naming both versions and what to do, if major.minor differ."""
    if major_minor(built) != major_minor(running):
        raise ImportError(mismatch_message(package_version, built, running))
