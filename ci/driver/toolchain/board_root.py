"""A board's Debian in a folder: a riscv64 root installed the way a board's system is, for native builds.

The test sysroot (``sysroot``) is extract-only: nothing of it ever runs but
Python and the libraries. A native build needs a system whose packages were
configured (compiler alternatives, CMake, pip), so this root is bootstrapped
with mmdebstrap's ``minbase`` variant, every maintainer script running under
QEMU through binfmt_misc (``binfmt.registered``). It holds the torch line's
packages plus what a board user installs to build the sdist: the line's GCC
and clang, CMake, Ninja, scikit-build-core, setuptools-scm, venv.

Built once per line and package set, under ``<cache>/board-root/``; like
the sysroot, a root without a completion marker is deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from ..paths import cache_lock, cache_root
from ..proc import Stopwatch, log, run
from . import archive, sysroot
from .host_packages import privilege_prefix
from .torch_lines import TorchLine

# Bump when the bootstrap changes, so existing roots are rebuilt.
RECIPE_VERSION = 1
MARKER = ".rvv-attn-board-root.json"
# What the sdist build needs on a board besides the compilers (scikit-build-core and setuptools-scm from
# Debian, so pip's --no-build-isolation finds them; python3-venv for the user's venv).
BUILD_PACKAGES = ("cmake", "ninja-build", "python3-scikit-build-core", "python3-setuptools-scm", "python3-venv")


@dataclass(frozen=True)
class Compiler:
    """A C++ compiler as a board user selects it: the Debian package and the CC/CXX it provides."""

    kind: str  # "gcc" or "clang"
    package: str  # "g++-14", "clang-19"

    @property
    def cc(self) -> str:
        return self.package.replace("g++-", "gcc-", 1) if self.kind == "gcc" else self.package

    @property
    def cxx(self) -> str:
        return self.package if self.kind == "gcc" else self.package.replace("clang-", "clang++-", 1)


def compilers(line: TorchLine) -> list[Compiler]:
    return [Compiler(kind, package) for kind, package in line.compilers]


def packages(line: TorchLine) -> tuple[str, ...]:
    return tuple(sorted({*line.packages, *BUILD_PACKAGES, *(c.package for c in compilers(line))}))


def key(line: TorchLine) -> str:
    canonical = json.dumps({"suite": line.suite, "packages": packages(line), "recipe": RECIPE_VERSION})
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def path(line: TorchLine) -> Path:
    return cache_root() / "board-root" / f"{line.suite}-riscv64-{key(line)}"


def mmdebstrap_command(line: TorchLine, archive_url: str, target: Path) -> list[str]:
    return sysroot.mmdebstrap("minbase", line.suite, line.rolling, packages(line), target, archive_url)


def ensure_board_root(line: TorchLine) -> Path:
    """The line's board root, bootstrapped if needed; needs binfmt_misc to run riscv64 programs (the caller
    holds ``binfmt.registered``)."""
    root = path(line)
    with cache_lock("board-root"):
        try:
            if json.loads((root / MARKER).read_text()).get("key") == key(line):
                return root
        except (OSError, ValueError):
            pass
        if root.exists():
            log(f"{root} is stale or half-built; removing it")
            shutil.rmtree(root)
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        prefix = privilege_prefix()
        with Stopwatch(
            f"bootstrapping a Debian {line.suite} riscv64 board root ({len(packages(line))} packages; every "
            "maintainer script runs under QEMU: about 15-30 minutes)"
        ):
            run(
                [*(prefix or []), *mmdebstrap_command(line, archive.debian_archive(), partial)],
                stream=True,
                hint="mmdebstrap needs root and binfmt_misc; see docs/board-build.md",
            )
        (partial / MARKER).write_text(
            json.dumps({"key": key(line), "suite": line.suite, "seconds": round(time.monotonic() - started)})
        )
        partial.rename(root)
        return root
