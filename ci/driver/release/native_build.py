"""The sdist built natively, as a board user builds it: inside a Debian riscv64 root, with its own compilers.

For a torch the release wheel has no library for (another distribution's
torch, a newer Debian torch), the sdist is the way in, built on the board
with the board's compiler. This runs exactly that, once per compiler of the
active torch line (GCC and clang from ``toolchains/torch_lines.json``): in a
chroot of the line's board root (``toolchain.board_root``), every program a
riscv64 one run by QEMU through binfmt_misc, it creates a venv with the
system's torch, ``pip install``s the sdist with no index and no build
isolation (the README's command), times it, and runs the operator tests
against the installed package at one VLEN (GCC 14 and later build the RVV
variants as clang does; cmake/RvvVariants.cmake says why older ones do not).

Slow by nature (the compilers themselves run under emulation): a session of
its own (``sdist-native``), never part of ``nox -t test``.
"""

from __future__ import annotations

import shlex
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import ConfigError, DriverError
from ..paths import BUILD_DIR, PROJECT_ROOT
from ..proc import Stopwatch, log, run
from ..session import Session
from ..testing import testrun
from ..toolchain import binfmt, board_root, build, torch_lines
from ..toolchain.board_root import Compiler
from ..toolchain.host_packages import privilege_prefix
from ..toolchain.prerequisites import ensure
from ..toolchain.vlens import Variant, by_vlen, variant_independent_lane
from .artefacts import RELEASE_REQUIREMENTS, release_sdist, reset_dir, sdist_command
from .install_test import NO_VECTOR, NO_VECTOR_CPU, QUICK_SELECTION

# Where the sdist and the tests go inside the root (the chroot's /root/rvv-attn).
GUEST_DIR = "/root/rvv-attn"
# The tests: every operator (float and int8, decode, extend, the KV write) plus the runtime and packaging
# checks, as the install test runs them without V; less the checks that start a second QEMU from the host
# (no host path exists in the chroot).
SELECTION = QUICK_SELECTION[NO_VECTOR]
DESELECT = "not fresh_process and not zvfh and not another_torch_minor"


@dataclass(frozen=True)
class Options:
    compilers: tuple[str, ...]
    variant: Variant
    pytest_args: tuple[str, ...]


def parse_posargs(posargs: Sequence[str], line: torch_lines.TorchLine) -> Options:
    """``--compilers=gcc,clang`` (default: every compiler of the line), ``--vlen=256``; the rest goes to
    pytest (default: the operator tests)."""
    known = [c.kind for c in board_root.compilers(line)]
    chosen, vlen, rest = known, variant_independent_lane(), []
    for arg in posargs:
        name, sep, value = arg.partition("=")
        if name == "--compilers" and sep:
            chosen = [c for c in value.split(",") if c]
            unknown = [c for c in chosen if c not in known]
            if unknown or not chosen:
                raise ConfigError(
                    f"--compilers={value}: unknown {', '.join(unknown) or '(none)'}; known: {', '.join(known)}"
                )
        elif name == "--vlen" and sep:
            if not value.isdigit():
                raise ConfigError(f"--vlen={value}: give a VLEN of toolchains/vlens.json, e.g. --vlen=256")
            vlen = int(value)
        else:
            rest.append(arg)
    return Options(tuple(chosen), by_vlen(vlen), tuple(rest))


def tested_variant(compiler: Compiler, variant: Variant) -> Variant | None:
    """The variant a build is tested at: ``variant``, for both compilers. Every line's GCC is 14 or later, which
    builds the RVV variants (cmake/RvvVariants.cmake); an older one would build the portable kernels only, tested
    on a CPU without V (None)."""
    major = compiler.package.rpartition("-")[2]
    return None if compiler.kind == "gcc" and major.isdigit() and int(major) < 14 else variant


def guest_cpu(variant: Variant | None) -> str:
    return variant.qemu_cpu() if variant else NO_VECTOR_CPU


def guest_script(sdist_name: str, compiler: Compiler, variant: Variant | None, pytest_args: Sequence[str]) -> str:
    """What runs inside the chroot: a venv with the system's torch, the sdist built into it, the tests (at
    ``variant``, or the portable build on a CPU without V)."""
    venv = f"{GUEST_DIR}/venv-{compiler.kind}"
    tests = list(pytest_args) or [*SELECTION, "-k", DESELECT]
    checks = {
        "RVV_ATTN_EXPECT_VARIANT": variant.name if variant else "portable",
        "RVV_ATTN_EXPECT_VLEN": str(variant.vlen if variant else 0),
        "RVV_ATTN_QEMU_CPU": guest_cpu(variant),
        "RVV_ATTN_TEST_PORTABLE": "1",
        "RVV_ATTN_EXPECT_INSTALLED_IN": venv,
    }
    lines = [
        "set -eu",
        f"cd {GUEST_DIR}",
        f"rm -rf {venv}",
        f"python3 -m venv --system-site-packages {venv}",
        "started=$(date +%s)",
        # The README's command for a board, with no index: everything must come from the system. Verbose, so
        # the build's progress ([12/45] ...) shows through this long step.
        f"CC={compiler.cc} CXX={compiler.cxx} {venv}/bin/pip install --verbose --no-index --no-cache-dir "
        f"--disable-pip-version-check --no-build-isolation --no-binary rvv-attn {sdist_name}",
        'echo "rvv-attn: the sdist built and installed in $(( $(date +%s) - started )) s"',
        f"{venv}/bin/python -P -c 'import rvv_attn; print(rvv_attn.runtime_info())'",
        f"env {' '.join(f'{k}={shlex.quote(v)}' for k, v in checks.items())} {venv}/bin/python -P -m pytest "
        f"--junitxml={GUEST_DIR}/junit-{compiler.kind}.xml -o junit_family=xunit2 {shlex.join(tests)}",
    ]
    return "\n".join(lines) + "\n"


def chroot_command(root: Path, script: str, qemu_cpu: str) -> list[str]:
    """``script`` in a chroot of ``root`` with /proc mounted, in a mount namespace of its own (the mount
    goes away with it), with a clean environment."""
    prefix = privilege_prefix()
    if prefix is None:
        raise DriverError("the native build needs root or passwordless sudo (chroot, mount)")
    # chroot lives in /usr/sbin, which a non-root PATH (sudo's included) may lack.
    chroot = shutil.which("chroot", path="/usr/sbin:/sbin:/usr/bin:/bin") or "chroot"
    inner = (
        f"mount -t proc proc {shlex.quote(str(root / 'proc'))} && exec {chroot} {shlex.quote(str(root))} "
        f"/usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8 QEMU_CPU={qemu_cpu} "
        f"/bin/sh {GUEST_DIR}/{script}"
    )
    return [*prefix, "unshare", "--mount", "--fork", "sh", "-c", inner]


@dataclass
class Result:
    compiler: Compiler
    seconds: float
    ok: bool
    summary: str

    tested: str = ""

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return f"{status} {self.compiler.cxx:<12} {self.seconds / 60:5.1f} min  {self.tested:<9} {self.summary}"


def run_session(session: Session, posargs: Sequence[str]) -> None:
    line = torch_lines.active_line()
    opts = parse_posargs(posargs, line)
    qemu, _sysroot = ensure()
    session.install(*build.BUILD_REQUIREMENTS, *RELEASE_REQUIREMENTS)
    dist = reset_dir(BUILD_DIR / "native-build" / "dist")
    with Stopwatch("building the sdist"):
        session.run("python", *sdist_command(dist), silent=True)
    sdist = release_sdist(dist)
    results = []
    with binfmt.registered(qemu):
        root = board_root.ensure_board_root(line)
        work = root / GUEST_DIR.lstrip("/")
        reset_dir(work)
        shutil.copy2(sdist, work / sdist.name)
        shutil.copytree(PROJECT_ROOT / "tests", work / "tests", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(PROJECT_ROOT / "pyproject.toml", work / "pyproject.toml")  # the markers and pytest options
        for compiler in (c for c in board_root.compilers(line) if c.kind in opts.compilers):
            script = f"build-{compiler.kind}.sh"
            variant = tested_variant(compiler, opts.variant)
            (work / script).write_text(guest_script(sdist.name, compiler, variant, opts.pytest_args))
            log(f"building {sdist.name} natively with {compiler.cxx} against {line.describe()} (under QEMU)")
            started = time.monotonic()
            try:
                run(chroot_command(root, script, guest_cpu(variant)), stream=True)
                ok = True
            except DriverError as err:
                log(str(err).splitlines()[0])
                ok = False
            junit = work / f"junit-{compiler.kind}.xml"
            outcome = testrun.parse_junit(junit) if junit.exists() else None
            label = f"sdist-native-{line.name}-{compiler.kind}"
            testrun.write_summary(label, 0 if ok else 1, outcome, wall_seconds=round(time.monotonic() - started))
            summary = outcome.line() if outcome else "no test ran"
            tested = variant.name if variant else "portable"
            results.append(Result(compiler, time.monotonic() - started, ok and outcome is not None, summary, tested))
    print("\n".join(["", f"native sdist builds against {line.describe()}:", *(r.line() for r in results)]))
    if not all(r.ok for r in results):
        raise DriverError("a native sdist build or its tests failed (above)")
