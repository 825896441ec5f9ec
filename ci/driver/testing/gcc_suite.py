"""``./ci/nox -s test-gcc``: the package built with a riscv64 GCC, RVV variants included, and the suite run
against it under QEMU, as test-vlenN runs it against the clang build.

gcc-check looks at the decode kernel alone across compilers and levels; this is the whole library (every
operator, the dispatcher, the registration) from GCC, the compiler a board's Debian or Ubuntu gives its
users. The compiler is the host's ``riscv64-linux-gnu-g++-N`` where installed, else the cached forky root's
(``cross_gcc``); CMake drives it through toolchains/riscv64-gcc.cmake.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .. import toolchain
from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import Stopwatch, log
from ..session import Session
from ..toolchain import build, cross_gcc, host_packages
from ..toolchain.build_steps import install_build_tools
from ..toolchain.vlens import Variant, by_vlen, parse_vlens_option
from . import testrun

# GCC 14: Debian trixie's and Ubuntu 24.04's compiler, the one that built the decode kernel wrong before.
DEFAULT_VERSIONS = (14,)
DEFAULT_VLENS = (256,)


@dataclass(frozen=True)
class Options:
    versions: tuple[int, ...] = DEFAULT_VERSIONS
    vlens: tuple[int, ...] = DEFAULT_VLENS
    pytest_args: tuple[str, ...] = ()


def parse_posargs(posargs: Sequence[str]) -> Options:
    """``--gcc=14,16`` and ``--vlens=128,256`` (or ``all``) first; the rest goes to pytest (default: tests)."""
    versions, vlens, rest = DEFAULT_VERSIONS, DEFAULT_VLENS, []
    for arg in posargs:
        name, sep, value = arg.partition("=")
        items = [x.strip() for x in value.split(",") if x.strip()]
        if name == "--gcc" and sep:
            if not items or not all(x.isdigit() and int(x) in cross_gcc.VERSIONS for x in items):
                raise ConfigError(
                    f"--gcc={value}: give GCC major versions from {', '.join(map(str, cross_gcc.VERSIONS))}",
                    "e.g. ./ci/nox -s test-gcc -- --gcc=14,16",
                )
            versions = tuple(int(x) for x in items)
        elif name == "--vlens" and sep:
            try:
                vlens = tuple(parse_vlens_option(value))
            except ValueError as err:
                raise ConfigError(f"--vlens={value}: {err}", "or --vlens=all") from err
            if not vlens:
                raise ConfigError(f"--vlens={value}: give VLENs of toolchains/vlens.json, or all")
        else:
            rest.append(arg)
    return Options(versions, vlens, tuple(rest))


def shared_folders(sysroot: Path, project_root: Path = PROJECT_ROOT, build_dir: Path = BUILD_DIR) -> list[Path]:
    """What a compiler in a root must see at its own path: the sources, the build tree, the sysroot."""
    folders = [project_root, sysroot]
    if not build_dir.is_relative_to(project_root):
        folders.append(build_dir)
    return folders


def build_with(session: Session, gcc: cross_gcc.CrossGcc, sysroot: Path, variants: Sequence[Variant]) -> Path:
    """The riscv64 wheel (portable + ``variants``) built by ``gcc``, unpacked into its stage folder."""
    tree = build.cross_tree(variants, build_dir=BUILD_DIR / gcc.name)
    prefix = host_packages.privilege_prefix() or []
    if gcc.root is not None and not prefix and os.getuid() != 0:
        raise ConfigError(
            f"{gcc.name} lives in {gcc.root}: running it needs root or passwordless sudo (unshare, chroot)",
            f"or install {cross_gcc.package(gcc.version)} on the host",
        )
    cxx = cross_gcc.compiler_script(gcc, tree.build.parent / f"{gcc.name}-g++", shared_folders(sysroot), prefix)
    log(f"{gcc.name}: {gcc.version_line(prefix)}" + (f" (in {gcc.root})" if gcc.root else ""))
    what = f"portable + {', '.join(v.name for v in variants)}"
    with Stopwatch(f"cross-building the riscv64 wheel with {gcc.name} ({what}; incremental)"):
        args = build.cross_wheel_args(
            sysroot,
            tree.wheels,
            variants,
            build_dir=tree.build,
            toolchain_file=build.GCC_TOOLCHAIN_FILE,
            defines=[f"RVV_ATTN_CROSS_GXX={cxx}"],
        )
        session.run("python", "-m", "pip", *args, silent=True)
    stage = build.stage_wheel(build.newest_wheel(tree.wheels), tree.stage)
    return build.record_variants(stage, sorted(variants, key=lambda v: v.vlen))


def run_session(session: Session, posargs: Sequence[str]) -> None:
    options = parse_posargs(posargs)
    qemu, sysroot = toolchain.ensure()
    install_build_tools(session)
    variants = [by_vlen(v) for v in options.vlens]
    outcomes: list[tuple[str, int]] = []
    for gcc in cross_gcc.ensure(options.versions):
        stage = build_with(session, gcc, sysroot, variants)
        for variant in variants:
            label = f"test-{gcc.name}-{variant.name}"
            code, outcome = testrun.run_emulated_pytest(
                qemu,
                sysroot,
                stage,
                variant,
                list(options.pytest_args) or ["tests"],
                label=label,
                jobs=os.cpu_count() or 1,
            )
            testrun.print_summary(label, code, outcome)
            outcomes.append((label, code))
    failed = [label for label, code in outcomes if code != 0]
    if failed:
        raise DriverError(
            f"the suite failed against the GCC build: {', '.join(failed)}",
            f"logs and JUnit XML in {testrun.results_dir(failed[0])}; the clang build at the same VLEN: "
            f"./ci/nox -s test-{failed[0].rsplit('-', 1)[-1]}",
        )
