"""Builds through scikit-build-core: the host (portable) install and the riscv64 wheel."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..paths import BUILD_DIR, PROJECT_ROOT, TOOLCHAINS_DIR, cache_root
from .vlens import Variant
from .vlens import variants as table_variants

TOOLCHAIN_FILE = TOOLCHAINS_DIR / "riscv64-clang19.cmake"
GCC_TOOLCHAIN_FILE = TOOLCHAINS_DIR / "riscv64-gcc.cmake"
RISCV_WHEEL_TAG = "py3-none-linux_riscv64"
LIBRARY = "librvv_attn_ops.so"
# The library's folder in the package is named after the torch it is built against (CMakeLists.txt writes
# the name into the build tree as LIBRARY_FOLDER_FILE).
LIBRARY_FOLDER_PREFIX = "torch-"
LIBRARY_FOLDER_FILE = "library_folder.txt"
# What a nox session needs to drive scikit-build-core without build isolation.
BUILD_REQUIREMENTS = ["scikit-build-core>=0.10", "setuptools-scm>=8", "cmake>=3.21", "ninja"]


# What each of BUILD_REQUIREMENTS leaves in a venv: checking files is instant,
# while pip's own "already satisfied" check costs seconds per session.
BUILD_TOOL_MODULES = ("scikit_build_core", "setuptools_scm")
BUILD_TOOL_PROGRAMS = ("cmake", "ninja")


def build_tools_present(venv_bin: Path) -> bool:
    """True when a venv already has what BUILD_REQUIREMENTS installs (a venv older than a new requirement has not)."""
    for module in BUILD_TOOL_MODULES:
        if not list(venv_bin.parent.glob(f"lib/python3*/site-packages/{module}")):
            return False
    return all((venv_bin / program).exists() for program in BUILD_TOOL_PROGRAMS)


def _launcher_define(launcher: str | None) -> list[str]:
    """The compiler launcher (ccache) as a scikit-build-core CMake define, or nothing."""
    return ["-C", f"cmake.define.CMAKE_CXX_COMPILER_LAUNCHER={launcher}"] if launcher else []


def host_install_args(
    build_dir: Path = BUILD_DIR / "host", extra_cmake: Sequence[str] = (), launcher: str | None = None
) -> list[str]:
    """``pip install`` arguments for the portable host build (incremental in ``build_dir``).

    clang-19 is the host compiler too: the same compiler everywhere, and no
    dependence on whichever g++ the host has.
    """
    args = [
        "install",
        "--no-build-isolation",
        "--no-deps",
        "--force-reinstall",
        "-C",
        f"build-dir={build_dir}",
        "-C",
        "cmake.define.CMAKE_CXX_COMPILER=clang++-19",
    ]
    args += _launcher_define(launcher)
    for define in extra_cmake:
        args += ["-C", f"cmake.define.{define}"]
    return args + [str(PROJECT_ROOT)]


def cross_wheel_args(
    sysroot: Path,
    out_dir: Path,
    variants: Sequence[Variant],
    build_dir: Path = BUILD_DIR / "riscv64",
    build_type: str = "Release",
    launcher: str | None = None,
    source: Path = PROJECT_ROOT,
    toolchain_file: Path = TOOLCHAIN_FILE,
    defines: Sequence[str] = (),
) -> list[str]:
    """``pip wheel`` arguments for the riscv64 wheel holding ``variants`` and the portable build, from ``source``
    (the checkout, or for a release the unpacked sdist); ``defines`` are more CMake definitions (NAME=VALUE)."""
    vlens = ";".join(str(v.vlen) for v in variants)
    cache = _launcher_define(launcher)
    extra = [arg for define in defines for arg in ("-C", f"cmake.define.{define}")]
    return [
        "wheel",
        "--no-build-isolation",
        "--no-deps",
        "-w",
        str(out_dir),
        *cache,
        "-C",
        f"build-dir={build_dir}",
        "-C",
        f"cmake.build-type={build_type}",
        "-C",
        f"cmake.toolchain-file={toolchain_file}",
        "-C",
        f"wheel.tags={RISCV_WHEEL_TAG}",
        "-C",
        "cmake.python-hints=false",
        "-C",
        f"cmake.define.RVV_ATTN_SYSROOT={sysroot}",
        "-C",
        f"cmake.define.RVV_ATTN_VLENS={vlens}",
        *extra,
        str(source),
    ]


def newest_wheel(out_dir: Path) -> Path:
    wheels = sorted(out_dir.glob(f"rvv_attn-*-{RISCV_WHEEL_TAG}.whl"), key=lambda p: p.stat().st_mtime)
    if not wheels:
        raise FileNotFoundError(f"no rvv_attn riscv64 wheel in {out_dir}")
    return wheels[-1]


def wheel_libraries(names: Sequence[str]) -> dict[str, str]:
    """{torch version built against: member} for the operator libraries among a wheel's ``names``
    (``rvv_attn/torch-2.6.0/librvv_attn_ops.so``; one per torch line the wheel supports)."""
    found = {}
    for name in names:
        parts = name.split("/")
        if len(parts) == 3 and parts[0] == "rvv_attn" and parts[1].startswith(LIBRARY_FOLDER_PREFIX):
            if parts[2] == LIBRARY:
                found[parts[1][len(LIBRARY_FOLDER_PREFIX) :]] = name
    return found


def stage_wheel(wheel: Path, stage: Path) -> Path:
    """Unpack the wheel into ``stage`` (put on the guest's PYTHONPATH): the tests import what the wheel ships.

    Skipped when ``stage`` already holds this very wheel (same path, size and mtime).
    """
    stat = wheel.stat()
    stamp = f"{wheel.resolve()} {stat.st_size} {stat.st_mtime_ns}\n"
    marker = stage / ".staged-from"
    if marker.exists() and marker.read_text() == stamp and list(stage.glob(f"rvv_attn/*/{LIBRARY}")):
        return stage
    if stage.exists():
        shutil.rmtree(stage)
    stage.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zf:
        if not wheel_libraries(zf.namelist()):
            raise FileNotFoundError(f"{wheel.name} holds no rvv_attn/{LIBRARY_FOLDER_PREFIX}<version>/{LIBRARY}")
        zf.extractall(stage)
    marker.write_text(stamp)
    return stage


@dataclass(frozen=True)
class CrossTree:
    """Where one riscv64 build lives: its CMake tree, the wheel it makes, and the wheel unpacked."""

    build: Path
    wheels: Path
    stage: Path


def cross_tree(only: Sequence[Variant] | None = None, build_dir: Path = BUILD_DIR) -> CrossTree:
    """The full build (portable + every VLEN), or one holding portable + ``only``.

    Each selection has a tree of its own, so switching between a one-VLEN
    session and a full one rebuilds nothing that either has compiled.
    """
    if only is None or {v.vlen for v in only} == {v.vlen for v in table_variants()}:
        return CrossTree(build_dir / "riscv64", build_dir / "wheels", build_dir / "stage-riscv64")
    suffix = "-".join(v.name for v in sorted(set(only), key=lambda v: v.vlen))
    return CrossTree(
        build_dir / f"riscv64-{suffix}", build_dir / f"wheels-{suffix}", build_dir / f"stage-riscv64-{suffix}"
    )


PACKAGE_DIR = PROJECT_ROOT / "python" / "rvv_attn"
# Written by the wheel build itself (setuptools-scm, from git), never into the tree:
# staged from the tree's wheel, whose dist-info the stage also holds.
WHEEL_GENERATED = ("_version.py",)


def stage_tree(tree: CrossTree, package_dir: Path = PACKAGE_DIR) -> Path:
    """Stage a configured tree's library with the package's Python files, without packing a wheel.

    For one-VLEN builds: pip + scikit-build-core re-run CMake's configure step
    and pack a wheel on every build (about 8 s here); ninja alone then only
    compiles what changed. The library is the tree's unstripped one. Files
    are replaced by rename, so a process that has the old library open keeps it.
    """
    stage = tree.stage
    (stage / "rvv_attn").mkdir(parents=True, exist_ok=True)
    (stage / ".staged-from").unlink(missing_ok=True)
    sources = {p.relative_to(package_dir): p for p in package_dir.rglob("*.py")}
    wanted = set(sources) | {Path(name) for name in WHEEL_GENERATED}
    for rel, source in sources.items():
        _replace(source, stage / "rvv_attn" / rel)
    _restore_wheel_generated(tree, stage)
    for old in (stage / "rvv_attn").rglob("*.py"):
        if old.relative_to(stage / "rvv_attn") not in wanted:
            old.unlink()
    folder = (tree.build / LIBRARY_FOLDER_FILE).read_text().strip()
    for old in (stage / "rvv_attn").glob(f"{LIBRARY_FOLDER_PREFIX}*/{LIBRARY}"):
        if old.parent.name != folder:  # from a build against another torch
            old.unlink()
    _replace(tree.build / LIBRARY, stage / "rvv_attn" / folder / LIBRARY)
    return stage


def stage_has_metadata(stage: Path) -> bool:
    """True when ``stage`` holds the package's dist-info, which only unpacking a wheel puts there.

    ``stage_tree`` refreshes the library and Python files of a stage made by ``stage_wheel``; a stage it
    made alone would lack the metadata (importlib.metadata.version("rvv-attn")) that the tests check.
    """
    return any(stage.glob("rvv_attn-*.dist-info"))


def _restore_wheel_generated(tree: CrossTree, stage: Path) -> None:
    try:
        wheel = newest_wheel(tree.wheels)
    except FileNotFoundError:
        return
    with zipfile.ZipFile(wheel) as zf:
        for name in WHEEL_GENERATED:
            target = stage / "rvv_attn" / name
            data = zf.read(f"rvv_attn/{name}")
            if not target.exists() or target.read_bytes() != data:
                target.write_bytes(data)


def _replace(source: Path, target: Path) -> None:
    if (
        target.exists()
        and target.stat().st_mtime_ns == source.stat().st_mtime_ns
        and target.stat().st_size == source.stat().st_size
    ):
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    shutil.copy2(source, partial)
    partial.replace(target)


VARIANTS_FILE = ".variants"


def record_variants(stage: Path, variants: Sequence[Variant]) -> Path:
    """Note in ``stage`` which variants its library holds (the emulated tests check it holds exactly those)."""
    (stage / VARIANTS_FILE).write_text(",".join(["portable", *(v.name for v in variants)]) + "\n")
    return stage


def recorded_variants(stage: Path) -> str | None:
    path = stage / VARIANTS_FILE
    return path.read_text().strip() if path.exists() else None


# Inputs of the wheel that ninja does not track (scikit-build-core copies them at packing time).
PACKAGED_OUTSIDE_CMAKE = (PROJECT_ROOT / "python", PROJECT_ROOT / "pyproject.toml")


def is_current(tree: CrossTree, ninja: str) -> bool:
    """True when ``tree``'s newest wheel is what building it now would produce (nothing to compile)."""
    try:
        wheel = newest_wheel(tree.wheels)
    except FileNotFoundError:
        return False
    if not (tree.build / "build.ninja").exists():
        return False
    plan = subprocess.run([ninja, "-C", str(tree.build), "-n"], capture_output=True, text=True)
    if plan.returncode != 0 or "no work to do" not in plan.stdout:
        return False
    inputs = [tree.build / "librvv_attn_ops.so"]
    for path in PACKAGED_OUTSIDE_CMAKE:
        inputs += [path] if path.is_file() else list(path.rglob("*"))
    newest_input = max((p.stat().st_mtime for p in inputs if p.exists()), default=0.0)
    return wheel.stat().st_mtime >= newest_input


# ccache: compiling the same source with the same flags in another build tree
# (a one-VLEN tree, the full tree, a fresh clone) is a cache hit. Paths under
# the checkout are hashed relative to it, so clones and worktrees share hits.
COMPILER_CACHE_PACKAGES: dict[str, str] = {"ccache": "/usr/bin/ccache"}


def compiler_cache_env(project_root: Path = PROJECT_ROOT) -> dict[str, str]:
    return {
        "CCACHE_DIR": str(cache_root() / "ccache"),
        "CCACHE_BASEDIR": str(project_root),
        "CCACHE_MAXSIZE": "5G",
        "CCACHE_NOHASHDIR": "1",
    }


# AddressSanitizer + UndefinedBehaviorSanitizer build of the portable kernels
# for the host. Any UB report is fatal, so a run that passes is clean.
SANITIZER_FLAGS = "-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
SANITIZER_DEFINES = [
    f"CMAKE_CXX_FLAGS={SANITIZER_FLAGS}",
    # The shared runtime, preloaded into python, which is not instrumented.
    "CMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined -shared-libasan",
]


def sanitizer_env(runtime: str) -> dict[str, str]:
    """Environment for running python with the sanitized library."""
    return {
        "LD_PRELOAD": runtime,
        # CPython and torch keep allocations alive until exit by design.
        "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:strict_init_order=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
    }


def check_sanitized(library: Path) -> None:
    """Fail unless ``library`` really carries ASan instrumentation (a run must not pass by accident)."""
    from ..proc import run

    undefined = run(["llvm-nm-19", "-D", "--undefined-only", str(library)])
    if "__asan_init" not in undefined or "__ubsan_handle" not in undefined:
        raise RuntimeError(f"{library} is not built with -fsanitize=address,undefined")
