"""Which operator library to load: the one built against the running torch's major.minor.

torch's C++ ABI changes between minor versions: a library built against
torch 2.6 that is loaded by torch 2.7 fails with undefined symbols, or worse,
loads and misbehaves. Patch releases keep the ABI, and a local label such as
Debian's ``+debian`` does not change it, so major.minor is what must match.

A wheel may carry one library per supported torch line, each in a folder
named after the torch it was built against: ``rvv_attn/torch-2.6.0/``,
``rvv_attn/torch-2.14.1/``. The choice is made before any library is loaded.
"""

from __future__ import annotations

import re
from pathlib import Path

LIBRARY_NAME = "librvv_attn_ops.so"
FOLDER_PREFIX = "torch-"


def major_minor(version: str) -> tuple[int, int]:
    """``"2.6.0+debian"`` -> ``(2, 6)``; ValueError for a string that is not a version."""
    match = re.match(r"\s*v?(\d+)\.(\d+)", version)
    if not match:
        raise ValueError(f"not a torch version: {version!r}")
    return int(match.group(1)), int(match.group(2))


def line_name(version: str) -> str:
    """``"2.14.1"`` -> ``"2.14"``."""
    return "{}.{}".format(*major_minor(version))


def shipped_libraries(package_dir: Path) -> dict[str, Path]:
    """{torch version built against: library} for each ``torch-<version>/`` folder of the package."""
    found = {}
    for folder in sorted(package_dir.glob(f"{FOLDER_PREFIX}*")):
        library = folder / LIBRARY_NAME
        version = folder.name[len(FOLDER_PREFIX) :]
        if library.is_file() and re.fullmatch(r"\d+\.\d+(\.\d+)*", version):
            found[version] = library
    return found


def mismatch_message(package_version: str, built: list[str], running: str) -> str:
    lines = " and ".join(f"torch {line_name(v)}" for v in built)
    return (
        f"rvv_attn {package_version} has compiled operators for {lines} (built against torch "
        f"{', '.join(built)}), but this Python has torch {running} (torch's C++ ABI changes between minor "
        f"versions). Either run it with one of those torch lines (on Debian riscv64: trixie's python3-torch is "
        "2.6, forky's is 2.14; `sudo apt install python3-torch`, in a venv created with --system-site-packages), "
        "or build rvv_attn against your torch from its source distribution: "
        "`pip install --no-binary rvv-attn --no-build-isolation rvv-attn` "
        "(needs CMake, Ninja and a C++ compiler with RVV intrinsics: GCC 14 or newer, or clang)."
    )


def pick_library(package_version: str, libraries: dict[str, Path], running: str) -> tuple[str, Path]:
    """The (built-against version, library) whose major.minor is the running torch's; ImportError naming the
    shipped lines and what to do when none is."""
    want = major_minor(running)
    matching = sorted((v for v in libraries if major_minor(v) == want), key=lambda v: [int(p) for p in v.split(".")])
    if not matching:
        raise ImportError(mismatch_message(package_version, sorted(libraries, key=major_minor), running))
    return matching[-1], libraries[matching[-1]]
