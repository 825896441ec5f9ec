"""The riscv64 sysroot of a torch line: Debian (trixie, forky) with Python and PyTorch, built without emulation.

mmdebstrap's ``extract`` variant unpacks the packages without running any
maintainer script, so no riscv64 code runs during the build.  What those
scripts would have done and the project needs is done here by hand
(``fix_up``), then the Python trees are byte-compiled once under QEMU.

A sysroot is used only if its completion marker matches the manifest's key;
a stale or half-built one is deleted and rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from ..errors import IntegrityError
from ..paths import cache_lock, cache_root
from ..proc import Stopwatch, log, run
from . import archive, host_packages, torch_lines
from .guest_commands import guest_command
from .private_apt import KEYRING
from .torch_lines import TorchLine

# Bump when fix_up/byte-compiling change, so existing caches are rebuilt.
RECIPE_VERSION = 1
MARKER = ".rvv-attn-sysroot.json"
# The environment of python3 run under QEMU for byte-compiling.
GUEST_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
ARCH = "riscv64"
TRIPLET = "riscv64-linux-gnu"
# Links a merged-/usr system has and an extract-only root lacks.
MERGED_USR_LINKS = {"lib": "usr/lib", "bin": "usr/bin", "sbin": "usr/sbin"}
# clang finds the C++ headers as lib/gcc/<triplet>/14/../../../../include/...;
# ninja shortens that to <root>/include/... when it checks the dependency
# files, and without this link every header looks missing, so every build
# recompiled everything.
BUILD_LINKS = {"include": "usr/include"}
# update-alternatives names -> candidate providers, in order of preference.
ALTERNATIVES = {
    "libblas.so.3": ["blas/libblas.so.3", "openblas-pthread/libblas.so.3"],
    "liblapack.so.3": ["lapack/liblapack.so.3", "openblas-pthread/liblapack.so.3"],
}


@dataclass(frozen=True)
class Manifest:
    suite: str
    arch: str
    packages: tuple[str, ...]
    # Not part of the key: what the build checks and records, not what it puts in.
    torch: str = ""
    rolling: bool = False
    lock_file: Path | None = None

    @classmethod
    def for_line(cls, line: TorchLine | None = None) -> Manifest:
        """The sysroot of ``line`` (default: the active line, see torch_lines)."""
        line = line or torch_lines.active_line()
        return cls(line.suite, ARCH, line.packages, line.torch, line.rolling, line.lock_file)

    def key(self) -> str:
        canonical = json.dumps(
            {"suite": self.suite, "arch": self.arch, "packages": sorted(self.packages), "recipe": RECIPE_VERSION},
            sort_keys=True,
        )
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def path(self) -> Path:
        return cache_root() / "sysroot" / f"{self.suite}-{self.arch}-{self.key()}"


def mmdebstrap(
    variant: str, suite: str, rolling: bool, packages: Sequence[str], target: Path, archive_url: str, *extra: str
) -> list[str]:
    """An mmdebstrap command line for a riscv64 root of ``suite`` (the test sysroot, a board root)."""
    source = f"deb [signed-by={KEYRING}] {archive_url} {suite} main"
    # A testing suite's Release file is valid for about a week; a mirror frozen at some date (and a
    # snapshot archive) serves it expired. The signature is still checked, and the lock records and
    # check_torch_line checks what the archive served.
    stale_ok = ["--aptopt=Acquire::Check-Valid-Until false"] if rolling else []
    return [
        "mmdebstrap",
        f"--variant={variant}",
        f"--architectures={ARCH}",
        *stale_ok,
        f"--include={','.join(packages)}",
        *extra,
        suite,
        str(target),
        source,
    ]


def mmdebstrap_command(manifest: Manifest, archive_url: str, target: Path) -> list[str]:
    # Keep the downloaded .debs: their file names are the exact versions that
    # went in (an extract-only root has no dpkg status). take_deb_versions
    # records and then deletes them.
    return mmdebstrap(
        "extract", manifest.suite, manifest.rolling, manifest.packages, target, archive_url, "--skip=cleanup/apt/cache"
    )


def take_deb_versions(root: Path) -> dict[str, str]:
    """Read the versions from the kept .debs, then delete them (about 300 MB)."""
    archives = root / "var/cache/apt/archives"
    debs = sorted(archives.glob("*.deb"))
    if not debs:
        raise FileNotFoundError(f"no .deb files left in {archives}: cannot record the sysroot's versions")
    versions = parse_deb_names("\n".join(d.name for d in debs))
    for d in debs:
        d.unlink()
    return versions


def parse_deb_names(text: str) -> dict[str, str]:
    """``name_version_arch.deb`` (epoch colon URL-encoded) -> {name: version}."""
    versions = {}
    for line in text.split():
        m = re.fullmatch(r"([^_]+)_([^_]+)_([^_]+)\.deb", line.strip())
        if m:
            versions[m.group(1)] = m.group(2).replace("%3a", ":")
    return dict(sorted(versions.items()))


def check_torch_line(manifest: Manifest, versions: dict[str, str]) -> None:
    """A rolling suite may have moved on to another torch: then this line cannot be built from it any more."""
    served = versions.get("python3-torch", "")
    if not manifest.torch or not served:
        return
    upstream = served.split(":", 1)[-1]
    if not (upstream == manifest.torch or upstream.startswith(manifest.torch + ".")):
        raise IntegrityError(
            f"Debian {manifest.suite} now serves python3-torch {served}, not torch {manifest.torch}.x",
            f"add a line for it to toolchains/torch_lines.json (docs/toolchain.md, 'Torch lines'), or point "
            f"{archive.ARCHIVE_ENV} at an archive that still has {manifest.torch}",
        )


def host_pin(line: TorchLine, debian_package: str, pypi_name: str) -> str:
    """``hypothesis==6.130.5`` from the line's lock (``python3-hypothesis 6.130.5-2``), so the host draws test
    examples with the same generator as the emulated target; the bare name where the lock has none."""
    versions = parse_lock(line.lock_file.read_text()) if line.lock_file.exists() else {}
    debian = versions.get(debian_package)
    if not debian:
        return pypi_name
    upstream = debian.split(":", 1)[-1].rsplit("-", 1)[0].split("+", 1)[0]
    return f"{pypi_name}=={upstream}"


def format_lock(manifest: Manifest, versions: dict[str, str]) -> str:
    lines = [
        f"# riscv64 sysroot lock: Debian {manifest.suite}/{manifest.arch}, {len(versions)} packages.",
        "# Written by the sysroot build (ci/driver/toolchain/sysroot.py); commit it when it changes.",
    ]
    lines += [f"{name} {version}" for name, version in versions.items()]
    return "\n".join(lines) + "\n"


def parse_lock(text: str) -> dict[str, str]:
    versions = {}
    for line in text.splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split()
            versions[name] = version
    return versions


def lock_drift(old: dict[str, str], new: dict[str, str]) -> list[str]:
    changes = []
    for name in sorted(old.keys() | new.keys()):
        if old.get(name) != new.get(name):
            changes.append(f"{name}: {old.get(name, '-')} -> {new.get(name, '-')}")
    return changes


def fix_up(root: Path) -> None:
    """Do what the skipped maintainer scripts would have done, as far as we need it.

    Idempotent and cheap: it also runs on every use of a complete sysroot, so
    a link added here reaches existing caches without a rebuild.
    """
    for link, target in {**MERGED_USR_LINKS, **BUILD_LINKS}.items():
        path = root / link
        if not path.exists() and not path.is_symlink():
            path.symlink_to(target)
    libdir = root / "usr/lib" / TRIPLET
    for name, candidates in ALTERNATIVES.items():
        link = libdir / name
        if link.exists():
            continue
        for candidate in candidates:
            if (libdir / candidate).exists():
                if link.is_symlink():
                    link.unlink()
                link.symlink_to(candidate)
                break
        else:
            raise FileNotFoundError(f"no provider of {name} in {libdir} (tried {', '.join(candidates)})")
    # Under ``qemu-riscv64 -L root`` a path that exists in the root shadows the
    # host's; an empty /tmp there would hide the host's temporary files.
    tmp = root / "tmp"
    if tmp.is_dir() and not any(tmp.iterdir()):
        tmp.rmdir()


def python_trees(root: Path) -> list[Path]:
    """The trees to byte-compile: the standard library and each dist-package, one by one for progress."""
    stdlib = sorted(p for p in (root / "usr/lib").glob("python3.*") if p.is_dir())
    dist = root / "usr/lib/python3/dist-packages"
    packages = sorted(p for p in dist.iterdir() if p.is_dir() and not p.name.endswith((".dist-info", ".egg-info")))
    return stdlib + packages


def largest_first(trees: list[Path]) -> list[Path]:
    """Most .py files first: torch and sympy (about half the work) start at once, small trees fill in after."""
    return sorted(trees, key=lambda t: sum(1 for _ in t.rglob("*.py")), reverse=True)


def byte_compile(root: Path, qemu: Path, jobs: int | None = None) -> None:
    """Write .pyc files once, under QEMU, through the root's real host path.

    Without them ``import torch`` under QEMU takes about twice as long.  Host
    paths are used because QEMU's ``-L`` redirect cannot create new files.
    """
    compile_trees(largest_first(python_trees(root)), qemu, root, root, jobs)


def compile_trees(trees: list[Path], qemu: Path, root: Path, shown_from: Path, jobs: int | None = None) -> None:
    """``compileall`` each tree with the root's python3 under QEMU, in the order given, logging each one done
    (its path relative to ``shown_from``). compileall's own worker pool fails under QEMU, so parallelism comes
    from one QEMU process per tree, as many at once as there are cores (or ``jobs``)."""
    done = 0

    def compile_tree(tree: Path) -> tuple[Path, float]:
        start = time.monotonic()
        cmd = guest_command(qemu, root, None, ["python3", "-m", "compileall", "-q", "-j", "1", str(tree)])
        run(cmd, env=GUEST_ENV)
        return tree, time.monotonic() - start

    with ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1) as pool:
        for future in as_completed([pool.submit(compile_tree, t) for t in trees]):
            tree, seconds = future.result()
            done += 1
            log(f"  byte-compiled [{done}/{len(trees)}] {tree.relative_to(shown_from)} ({seconds:.0f} s)")


def is_complete(root: Path, key: str, marker: str = MARKER) -> bool:
    """Whether ``root`` was finished for ``key`` (its marker file, written last, says so)."""
    try:
        return json.loads((root / marker).read_text()).get("key") == key
    except (OSError, ValueError):
        return False


def ensure_sysroot(qemu: Path, manifest: Manifest | None = None) -> Path:
    """Return a complete sysroot for the manifest, building it if needed."""
    manifest = manifest or Manifest.for_line()
    root = manifest.path()
    key = manifest.key()
    with cache_lock("sysroot"):
        if is_complete(root, key):
            fix_up(root)
            return root
        return _build(manifest, root, key, qemu)


def _build(manifest: Manifest, root: Path, key: str, qemu: Path) -> Path:
    if root.exists():
        log(f"{root} is stale or half-built; removing it")
        shutil.rmtree(root)
    partial = root.with_name(root.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.parent.mkdir(parents=True, exist_ok=True)
    archive_url = archive.debian_archive()
    started = time.monotonic()
    with Stopwatch(f"building the riscv64 sysroot ({manifest.suite}, {len(manifest.packages)} packages, ~1.1 GB)"):
        prefix = host_packages.privilege_prefix()
        # As root, mmdebstrap needs no user namespaces (which some hosts, e.g.
        # Ubuntu 24.04 with AppArmor, forbid); the tree is handed back after.
        run(
            [*(prefix or []), *mmdebstrap_command(manifest, archive_url, partial)],
            stream=True,
            hint="mmdebstrap needs root, passwordless sudo or unprivileged user namespaces; "
            "see README, Troubleshooting",
        )
        if prefix:
            run([*prefix, "chown", "-R", f"{os.getuid()}:{os.getgid()}", str(partial)])
        versions = take_deb_versions(partial)
        check_torch_line(manifest, versions)
        fix_up(partial)
    with Stopwatch("byte-compiling the sysroot's Python trees under QEMU (about 2-4 minutes)"):
        byte_compile(partial, qemu)
    record_lock(manifest, versions)
    (partial / MARKER).write_text(
        json.dumps(
            {
                "key": key,
                "suite": manifest.suite,
                "packages": len(versions),
                "build_seconds": round(time.monotonic() - started),
                "size_bytes": tree_size(partial),
            },
            indent=2,
        )
    )
    partial.rename(root)
    return root


def record_lock(manifest: Manifest, versions: dict[str, str]) -> None:
    lock_file = manifest.lock_file
    if lock_file is None:
        return
    old = parse_lock(lock_file.read_text()) if lock_file.exists() else {}
    drift = lock_drift(old, versions)
    if not drift:
        return
    lock_file.write_text(format_lock(manifest, versions))
    if old:
        log(
            f"the archive served other versions than {lock_file.name} records ({len(drift)} changes); "
            "the file is updated, commit it:"
        )
        for line in drift[:20]:
            log(f"  {line}")


def tree_size(root: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            p = Path(dirpath) / name
            if not p.is_symlink():
                total += p.stat().st_size
    return total
