"""riscv64 cross GCCs, to check what GCC makes of the RVV kernels (``./ci/nox -s gcc-check``).

Debian and Ubuntu package them as ``g++-<N>-riscv64-linux-gnu`` (Ubuntu 24.04 has 14). A host that has a
version installed uses it; the versions it lacks come from an amd64 Debian forky root with GCC 14, 15 and 16
and clang-21, built once with mmdebstrap (about 2 GB, 1-2 minutes) and cached, where they run through chroot. For
gcc-check, sources are staged into the folder the compiler sees, so nothing of the host is mounted into the
root; a whole package build (test-gcc) goes through ``compiler_script``, which shows the checkout, the build
tree and the sysroot inside the root at their own paths, in a mount namespace that ends with each compile.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError
from ..paths import cache_lock, cache_root
from ..proc import Stopwatch, log, run
from . import archive, host_packages
from .private_apt import KEYRING, apt_candidate

VERSIONS = (14, 15, 16)
# forky's clang, the one a forky board builds the sdist with (docs/release.md); its riscv64 headers and
# libraries are the GCC cross packages' (clang finds them under /usr/lib/gcc-cross).
CLANG_VERSION = 21
SUITE = "forky"
MARKER = ".rvv-attn-cross-gcc.json"


def package(version: int) -> str:
    return f"g++-{version}-riscv64-linux-gnu"


def driver_name(version: int) -> str:
    return f"riscv64-linux-gnu-g++-{version}"


@dataclass(frozen=True)
class CrossGcc:
    """A riscv64 compiler: a GCC (``kind`` "gcc") or the root's clang (``kind`` "clang"; always in the root)."""

    version: int
    root: Path | None = None  # None: installed on the host
    kind: str = "gcc"

    @property
    def name(self) -> str:
        return f"{self.kind}{self.version}"

    @property
    def driver(self) -> list[str]:
        """The compiler command: GCC's cross driver, or clang told the target (it finds the GCC cross files)."""
        if self.kind == "clang":
            return [f"clang++-{self.version}", "--target=riscv64-linux-gnu"]
        return [driver_name(self.version)]

    def stage(self, build_dir: Path) -> Path:
        """The folder to put sources in and compile in (inside the root when the compiler lives there)."""
        return self.root / "work" if self.root else build_dir

    def command(self, args: Sequence[str], folder: Path, prefix: Sequence[str] = ()) -> list[str]:
        """Compile in ``folder`` (a path below ``stage``) with ``args`` relative to it."""
        if self.root is None:
            return [*self.driver, *args]
        inside = "/" + str(folder.relative_to(self.root))
        return [*prefix, "chroot", str(self.root), "env", "-C", inside, *self.driver, *args]

    def version_line(self, prefix: Sequence[str] = ()) -> str:
        """The first line of ``g++ --version`` (it names the exact release)."""
        folder = self.root / "work" if self.root else Path.cwd()
        return run(self.command(["--version"], folder, prefix)).splitlines()[0]


def compiler_script(gcc: CrossGcc, script: Path, shared: Sequence[Path], prefix: Sequence[str] = ()) -> Path:
    """A compiler command for CMake (``RVV_ATTN_CROSS_GXX``): ``gcc`` itself when the host has it, else a script
    at ``script`` that runs it in its root with the folders ``shared`` at their own paths.

    Each call gets a private mount namespace (``unshare --mount``): the bind mounts exist only while that one
    compiler runs and never show on the host, so removing the root can never reach into the checkout. The
    compiler runs as the calling user (``chroot --userspec``), so what it writes belongs to them.
    """
    if gcc.root is None:
        found = shutil.which(driver_name(gcc.version))
        if found is None:
            raise ConfigError(f"{driver_name(gcc.version)} is not on PATH", f"install {package(gcc.version)}")
        return Path(found)
    folders = " ".join(shlex.quote(str(folder)) for folder in shared)
    inner = (
        "root=$1; shift; "
        f"for folder in {folders}; do "
        'mkdir -p "$root$folder" && mount --bind "$folder" "$root$folder" || exit 125; done; '
        f'exec chroot --userspec={os.getuid()}:{os.getgid()} "$root" '
        f'env -C "$PWD" TMPDIR=/tmp {shlex.join(gcc.driver)} "$@"'
    )
    command = [*prefix, "unshare", "--mount", "--propagation", "private", "sh", "-c", inner, "sh", str(gcc.root)]
    lines = [
        "#!/bin/sh",
        f"# riscv64 GCC {gcc.version} from {gcc.root}; written by ci/driver/toolchain/cross_gcc.py.",
        f'exec {shlex.join(command)} "$@"',
    ]
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text("\n".join(lines) + "\n")
    script.chmod(0o755)
    return script


def root_key(versions: Sequence[int] = VERSIONS, suite: str = SUITE) -> str:
    return f"{suite}-amd64-gcc{'-'.join(str(v) for v in versions)}-clang{CLANG_VERSION}"


def mmdebstrap_command(target: Path, archive_url: str, versions: Sequence[int] = VERSIONS) -> list[str]:
    """An amd64 root of forky with the cross compilers (apt variant: chroot needs a working dpkg root)."""
    return [
        "mmdebstrap",
        "--variant=apt",
        "--architectures=amd64",
        # forky is a testing suite: a mirror frozen at some date serves its Release file expired. The
        # signature is still checked.
        "--aptopt=Acquire::Check-Valid-Until false",
        f"--include={','.join([*(package(v) for v in versions), f'clang-{CLANG_VERSION}'])}",
        SUITE,
        str(target),
        f"deb [signed-by={KEYRING}] {archive_url} {SUITE} main",
    ]


def host_versions(which=shutil.which, versions: Sequence[int] = VERSIONS) -> list[int]:
    return [v for v in versions if which(driver_name(v))]


def host_archive_offers(pkg: str) -> bool:
    """Whether the host's apt sources have ``pkg`` (Debian trixie and Ubuntu 24.04 have GCC 14's; bookworm not)."""
    if not shutil.which("apt-cache"):
        return False
    policy = subprocess.run(["apt-cache", "policy", pkg], capture_output=True, text=True, check=False).stdout
    return apt_candidate(policy) is not None


def ensure(versions: Sequence[int] = VERSIONS) -> list[CrossGcc]:
    """The cross GCCs of ``versions``: the host's where installed or its archive has them (the distribution's own
    build, e.g. the GCC 14.2 a trixie or Ubuntu 24.04 board has), the rest from the cached forky root."""
    on_host = host_versions(versions=versions)
    offered = [v for v in versions if v not in on_host and host_archive_offers(package(v))]
    if offered:
        host_packages.ensure_host_packages({package(v): f"/usr/bin/{driver_name(v)}" for v in offered})
        on_host += offered
    compilers = {v: CrossGcc(v) for v in on_host}
    missing = [v for v in versions if v not in compilers]
    if missing:
        root = ensure_root()
        compilers.update({v: CrossGcc(v, root) for v in missing})
    return [compilers[v] for v in versions]


def root_clang() -> CrossGcc:
    """The root's clang (built with the root if need be)."""
    return CrossGcc(CLANG_VERSION, ensure_root(), kind="clang")


def ensure_root() -> Path:
    key = root_key()
    root = cache_root() / "cross-gcc" / key
    with cache_lock("cross-gcc"):
        try:
            if json.loads((root / MARKER).read_text()).get("key") == key:
                return root
        except (OSError, ValueError):
            pass
        prefix = host_packages.privilege_prefix()
        if prefix is None:
            raise ConfigError(
                "the forky root with riscv64 GCC needs root or passwordless sudo (mmdebstrap, chroot)",
                f"run as root, or install {', '.join(package(v) for v in VERSIONS)} on the host",
            )
        host_packages.ensure_host_packages()
        partial = root.with_name(root.name + ".partial")
        # A root built through sudo belongs to root: remove it the same way.
        run([*prefix, "rm", "-rf", str(root), str(partial)])
        partial.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        what = f"riscv64 GCC {', '.join(map(str, VERSIONS))} and clang-{CLANG_VERSION}"
        with Stopwatch(f"building an amd64 {SUITE} root with {what} (~2 GB)"):
            run([*prefix, *mmdebstrap_command(partial, archive.debian_archive())], stream=True)
        # The top folder and work/ (where sources are staged) belong to the user; the rest stays root's.
        owner = [f"{os.getuid()}:{os.getgid()}"]
        run([*prefix, "install", "-d", "-o", str(os.getuid()), "-g", str(os.getgid()), str(partial / "work")])
        run([*prefix, "chown", *owner, str(partial)])
        (partial / MARKER).write_text(json.dumps({"key": key, "build_seconds": round(time.monotonic() - started)}))
        partial.rename(root)
        # Roots of other keys (an older compiler list) would only take space.
        stale = [p for p in root.parent.iterdir() if p.is_dir() and p != root]
        if stale:
            run([*prefix, "rm", "-rf", *map(str, stale)])
            log(f"removed the riscv64 compiler roots of other keys: {', '.join(p.name for p in stale)}")
        log(f"riscv64 GCC root: {root}")
        return root
