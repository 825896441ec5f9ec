"""nox sessions for rvv-attn: set up the cross toolchain, build, test under QEMU, benchmark, release.

The logic lives in ci/driver (importable and unit tested); the sessions only
string its steps together. `nox -l` lists them; `nox -t test` runs the whole
matrix (host, every VLEN and the agnostic-policy lanes, two emulated
configurations at a time) and ends with each session's wall time and each
configuration's result and slowest test files.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent / "ci"))

from driver import bench, lint, release, sglang, testing, toolchain
from driver import warm as warm_targets
from driver.errors import DriverError
from driver.paths import BUILD_DIR, PROJECT_ROOT, line_folder
from driver.proc import log
from driver.session import reported_errors

nox.options.sessions = ["test-host"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True

# The torch line every session builds and tests against (toolchains/torch_lines.json): the first, or the one
# RVV_ATTN_TORCH_LINE names. Another line's venvs (another host torch) live apart from the default's.
try:
    LINE = toolchain.active_line()
except DriverError as err:
    sys.exit(f"rvv-attn: {err}")
if line_folder():
    nox.options.envdir = str(PROJECT_ROOT / ".nox" / line_folder())
# The host's torch for the portable build and test-host. Pinned: a looser
# spec can pull a multi-GB CUDA build.
HOST_TORCH = os.environ.get("RVV_ATTN_HOST_TORCH", LINE.host_torch)
# hypothesis pinned to the sysroot's python3-hypothesis (the line's lock in toolchains/):
# the host and the emulated runs then draw examples from the same generator.
HYPOTHESIS = toolchain.host_pin(LINE, "python3-hypothesis", "hypothesis")
TEST_REQUIREMENTS = ["pytest>=8", HYPOTHESIS, "numpy", *lint.WORKFLOW_TEST_REQUIREMENTS]
HOST_REQUIREMENTS = [HOST_TORCH, *TEST_REQUIREMENTS]
# Sessions of one `nox` invocation share this module: the summary session
# reports only what this invocation ran.
RUN_STARTED = time.time()


def _session(*, timed: bool = False, doc: str | None = None, **kwargs) -> Callable:
    """``nox.session`` with the driver's errors reported as the session's error; ``timed``: the wall time is
    recorded for the summary session (sessions of `nox -t test`); ``doc`` replaces the docstring."""

    def register(func: Callable[[nox.Session], None]):
        func.__doc__ = doc or func.__doc__

        @functools.wraps(func)
        def run(session: nox.Session) -> None:
            with testing.session_clock(session.name) if timed else contextlib.nullcontext():
                with reported_errors(session):
                    func(session)

        return nox.session(**kwargs)(run)

    return register


@_session()
def setup(session: nox.Session) -> None:
    """Install host prerequisites, fetch the pinned QEMU and build every torch line's riscv64 sysroot (all cached)."""
    for line in toolchain.lines():
        qemu_bin, root = toolchain.ensure(line)
        log(f"sysroot of {line.describe()}: {root}")
    log(f"qemu-riscv64: {qemu_bin} ({toolchain.qemu_version(qemu_bin)})")


@_session(name="test-host", timed=True)
def test_host(session: nox.Session) -> None:
    """Build the portable kernels for this host and run the suite natively, plus the driver's unit tests."""
    toolchain.host_build(session, HOST_REQUIREMENTS)
    testing.pytest_in_session(session, "test-host", session.posargs or ["tests", "ci/tests"])


@_session(name="test-toolchain", timed=True)
def test_toolchain(session: nox.Session) -> None:
    """Check the toolchain: QEMU pin, sysroot fix-ups, the wheel's variants, incremental rebuilds, the agnostic lane."""
    qemu_bin, root = toolchain.ensure()
    wheel_path = toolchain.cross_build(session, root)
    session.install("pytest>=8")
    env = {
        "RVV_ATTN_QEMU": str(qemu_bin),
        "RVV_ATTN_SYSROOT": str(root),
        "RVV_ATTN_WHEEL": str(wheel_path),
        "RVV_ATTN_CROSS_BUILD": str(BUILD_DIR / "riscv64"),
    }
    testing.pytest_in_session(session, "test-toolchain", session.posargs or ["ci/toolchain_tests"], env)


@_session(name="lint", tags=["test"], default=False, timed=True)
def lint_session(session: nox.Session) -> None:
    """Lint: ruff check and format, clang-format over csrc/ and bench/plugin/, actionlint, the docs' relative links."""
    session.install(*lint.LINT_REQUIREMENTS)
    toolchain.ensure_host_packages(lint.CLANG_FORMAT_PACKAGES)
    lint.run_all(PROJECT_ROOT, Path(session.bin))


def _register_vlen_sessions(variant: toolchain.Variant) -> None:
    docs = testing.vlen_session_docs(variant, portable_lane=variant.vlen == toolchain.portable_lane())

    # `nox -t test` runs this configuration in test-emulated, beside the others; this session is for one VLEN.
    @_session(name=f"test-{variant.name}", timed=True, doc=docs["test"])
    def test(session: nox.Session) -> None:
        testing.emulated_suite(session, variant, False, session.posargs)

    @_session(name=f"test-{variant.name}-agnostic", tags=["agnostic"], default=False, timed=True, doc=docs["agnostic"])
    def test_agnostic(session: nox.Session) -> None:
        testing.emulated_suite(session, variant, True, session.posargs)

    @_session(name=f"shell-{variant.name}", default=False, doc=docs["shell"])
    def shell(session: nox.Session) -> None:
        testing.guest_shell(session, variant, session.posargs)

    @_session(name=f"demo-{variant.name}", default=False, doc=docs["demo"])
    def demo_session(session: nox.Session) -> None:
        testing.run_demo(session, variant, session.posargs)


for _variant in toolchain.variants():
    _register_vlen_sessions(_variant)


@_session(name="test-emulated", tags=["test"], timed=True)
def test_emulated(session: nox.Session) -> None:
    """Every VLEN and the agnostic lanes under QEMU, several at a time: the emulated part of `nox -t test`.

    Each configuration runs as in its test-vlenN[-agnostic] session, in its own process, log and JUnit XML
    (build/results/test-<configuration>/); the tests marked variant_independent run in one of them only
    (variant_independent_lane in toolchains/vlens.json). Beside them, two more processes run test-host and
    sanitize, and test-toolchain, install-test-quick and bench-check (nox -s ...). Options before the pytest arguments:
    --jobs=N (default: the number of cores, plus one while sessions run beside), --configs=vlen128,vlen1024-agnostic,
    --beside=none (the default with --configs or pytest arguments) or --beside=sanitize,bench-check (each --beside
    one more process).
    """
    testing.matrix.run_session(session, session.posargs)


@_session(default=False, timed=True)
def sanitize(session: nox.Session) -> None:
    """Run the suite on the host against an AddressSanitizer + UBSan build of the portable kernels."""
    toolchain.ensure_host_packages(toolchain.SANITIZER_PACKAGES)
    toolchain.host_build(session, HOST_REQUIREMENTS, BUILD_DIR / "host-sanitize", toolchain.SANITIZER_DEFINES)
    # test_selection checks the conftest's test selection in child pytests, and the SGLang stand-in and riscv64
    # tests are plain Python with child interpreters: none reaches a kernel, under ASan they cost ~30 s, and
    # test-host runs them.
    default = [
        "tests",
        "--ignore=tests/test_selection.py",
        "--ignore=tests/test_sglang_standins.py",
        "--ignore=tests/test_sglang_riscv64.py",
    ]
    testing.pytest_in_session(session, "sanitize", session.posargs or default, toolchain.sanitizer_env(session))


@_session(name="gcc-check", python=False, default=False, timed=True)
def gcc_check(session: nox.Session) -> None:
    """Build the decode kernel alone with riscv64 GCC 14/15/16 and clang-19/21 at -O1..-O3 per VLEN; run it in QEMU.

    Options: --compilers=gcc14,clang21  --levels=O2  --vlens=256 (each a subset; default all). GCCs the host
    lacks, and clang-21, come from a cached amd64 Debian forky root (docs/gcc.md).
    """
    testing.gcc_check.run_session(session.posargs)


@_session(name="test-gcc", default=False, timed=True)
def test_gcc(session: nox.Session) -> None:
    """Build the package with riscv64 GCC, RVV variants included, and run the suite against it under QEMU.

    Options before the pytest arguments: --gcc=14,16 (default 14, the compiler of Debian trixie and Ubuntu
    24.04)  --vlens=128,256 or all (default 256). GCCs the host lacks come from gcc-check's cached root.
    """
    testing.gcc_suite.run_session(session, session.posargs)


@_session(name="repro", default=False)
def repro_matrix(session: nox.Session) -> None:
    """Run tests (after --) on the host and at every VLEN x {undisturbed, all-ones agnostic}; print the matrix.

    Options before the pytest arguments: --vlens=128,256  --policies=agnostic  --no-host
    --stop-at-first-failure  --jobs=N  --gdb [--gdb-port=1234] (wait for gdb-multiarch at the first VLEN).
    """
    opts, pytest_args = testing.repro.parse_posargs(session.posargs)
    testing.repro.run_session(session, opts, pytest_args, HOST_REQUIREMENTS)


@_session(python=False, default=False)
def warm(session: nox.Session) -> None:
    """Start warm targets (emulated Python with torch imported; a fresh fork per run): -- --vlens=256, or --stop.

    Options: --vlens=128,256 (or all)  --policies=undisturbed,agnostic (or all; default undisturbed)
    --idle-timeout=900 (seconds without a request before a target exits)  --stop (stop every target).
    Without options: list the running targets. shell-vlenN, test-vlenN and repro use a matching one.
    """
    warm_targets.run_session(session.posargs, report=log)


@_session(default=False)
def wheel(session: nox.Session) -> None:
    """Build the sdist, then from it the manylinux riscv64 wheel with a library per torch line (auditwheel-checked)."""
    release.release_artefacts(session)


@_session(name="check-dist", default=False)
def check_dist(session: nox.Session) -> None:
    """Check dist/ before publishing: one manylinux wheel and its sdist, versions equal to the tag (-- --tag=vX.Y.Z)."""
    session.install(*release.RELEASE_REQUIREMENTS)
    tag = release.parse_tag_option(session.posargs)
    wheel_path, sdist = release.checked_artefacts(tag=tag)
    session.run("twine", "check", "--strict", str(wheel_path), str(sdist))
    log(f"ready to publish {tag}: {wheel_path.name}, {sdist.name}")


@_session(name="sdist-native", default=False)
def sdist_native(session: nox.Session) -> None:
    """Build the sdist natively in an emulated Debian riscv64 root of the torch line, with its GCC and clang.

    As a board user does: pip install --no-build-isolation --no-binary into a venv with the system's torch,
    then the operator tests against it at VLEN 256. Slow (the compilers run under QEMU); registers QEMU with
    binfmt_misc while it runs. Options: --compilers=gcc,clang  --vlen=256; pytest arguments follow.
    """
    release.native_build.run_session(session, session.posargs)


@_session(name="ci-matrix", python=False, default=False)
def ci_matrix_outputs(session: nox.Session) -> None:
    """Print the GitHub Actions matrices (VLEN and torch-line tables) as name=json lines for $GITHUB_OUTPUT."""
    print(release.ci_matrix.outputs(), end="", flush=True)


@_session(name="install-test", default=False)
def install_test_all(session: nox.Session) -> None:
    """pip install the release wheel into a venv in the emulated target; run the suite at every VLEN and without V.

    Options before the pytest arguments: --configs=novector,vlen128,...  --wheel=PATH (skip building it).
    """
    opts, pytest_args = release.install_test.parse_posargs(session.posargs)
    release.install_test.run_session(session, [(c, tuple(pytest_args) or ("tests",)) for c in opts.configs], opts.wheel)


@_session(name="install-test-quick", default=False, timed=True)
def install_test_quick(session: nox.Session) -> None:
    """The install test's share of `nox -t test`: every operator without V, the runtime checks at one VLEN."""
    release.install_test.run_session(session, release.install_test.quick_plan(), None)


@_session(name="pin-qemu", default=False)
def pin_qemu(session: nox.Session) -> None:
    """Re-pin qemu-user to the archive's current trixie version (rewrites toolchains/qemu.lock.json)."""
    pin = toolchain.repin_qemu()
    log(f"pinned {pin.package} {pin.version} sha256 {pin.sha256}; commit toolchains/qemu.lock.json")


@_session(name="bench", default=False)
def bench_session(session: nox.Session) -> None:
    """Count instructions of every kernel at every VLEN and torch's SDPA; write build/results/bench, check the baseline.

    Options: --update-baseline (this run becomes bench/baseline.json, its renderings in bench/results and the
    tables of docs/benchmarks.md), --jobs=N (emulated processes at once; default: the number of cores),
    --only=decode,vlen128 (only the rows whose name contains one of these; with --update-baseline they
    replace their rows of the baseline).
    """
    bench.run_session(session, session.posargs)


@_session(name="bench-check", default=False, timed=True)
def bench_check(session: nox.Session) -> None:
    """Check the instruction-count plugin on a known loop, and one decode and one extend shape against the baseline."""
    bench.check_session(session, session.posargs)


def _sglang_share_rides_on(line: toolchain.TorchLine) -> bool:
    """SGLang's share of `nox -t test` runs beside the quick run of SGLang's line (lines other than the default
    have one; ask only of those)."""
    return line.torch == SGLANG_TABLE.torch


def _register_torch_line_sessions(line: toolchain.TorchLine) -> None:
    also_beside = ("test-sglang-quick",) if _sglang_share_rides_on(line) else ()
    docs = testing.torch_line_runs.session_docs(line, also_beside)

    @_session(name=f"test-{line.name}", python=False, default=False, doc=docs["full"])
    def full(session: nox.Session) -> None:
        cmd, env = testing.torch_line_runs.line_run(line, False, session.posargs)
        session.run(*cmd, env=env, external=True)

    @_session(name=f"test-{line.name}-quick", python=False, tags=["test"], default=False, timed=True, doc=docs["quick"])
    def quick(session: nox.Session) -> None:
        cmd, env = testing.torch_line_runs.line_run(line, True, session.posargs, also_beside=also_beside)
        session.run(*cmd, env=env, external=True)


SGLANG_TABLE = sglang.environment.load()
SGLANG_DOC = (
    f"SGLang {SGLANG_TABLE.sglang.version}'s real package: the tests marked sglang, on the host and in "
    "the riscv64 target at the table's VLEN (toolchains/sglang.json; torch line chosen by it).\n\n"
    "Options before the pytest arguments: --only=host or --only=target. Default pytest arguments: "
    "-m 'sglang and not sglang_server' tests (test-sglang-server runs the server tests)."
)

BOARD_STEPS_DOC = (
    "Run docs/sglang.md's board steps as written in a fresh Debian riscv64 root under QEMU, ending with a served "
    "request (slow: apt configures every package under emulation)."
)

if LINE.torch == SGLANG_TABLE.torch:

    @_session(name="test-sglang", default=False, timed=True, doc=SGLANG_DOC)
    def test_sglang(session: nox.Session) -> None:
        sglang.run_session(session, LINE, HOST_REQUIREMENTS, session.posargs)

    @_session(name="sglang-board-steps", default=False, timed=True, doc=BOARD_STEPS_DOC)
    def sglang_board_steps(session: nox.Session) -> None:
        sglang.session.board_steps_session(session, LINE)

else:

    @_session(name="sglang-board-steps", python=False, default=False, doc=BOARD_STEPS_DOC)
    def sglang_board_steps_on_its_line(session: nox.Session) -> None:
        cmd, env = testing.torch_line_runs.nested_run(SGLANG_TABLE.torch, ["sglang-board-steps"], session.posargs)
        session.run(*cmd, env=env, external=True)

    @_session(name="test-sglang", python=False, default=False, doc=SGLANG_DOC)
    def test_sglang_on_its_line(session: nox.Session) -> None:
        cmd, env = testing.torch_line_runs.nested_run(SGLANG_TABLE.torch, ["test-sglang"], session.posargs)
        session.run(*cmd, env=env, external=True)


# On another torch line than the default, SGLang's share runs beside that line's quick run (test-<line>-quick),
# not as a session of `nox -t test` after it.
SGLANG_BESIDE_LINE_RUN = any(_sglang_share_rides_on(line) for line in toolchain.other_lines())


@_session(
    name="test-sglang-quick", python=False, tags=[] if SGLANG_BESIDE_LINE_RUN else ["test"], default=False, timed=True
)
def test_sglang_quick(session: nox.Session) -> None:
    """The share of `nox -t test` for SGLang's real package: the tests marked sglang in the riscv64 target at
    VLEN 256, less those marked sglang_spawn (test-sglang runs them and adds the host). `nox -t test` runs it
    beside the quick run of SGLang's torch line where that is not the default line."""
    posargs = session.posargs or sglang.session.QUICK_POSARGS
    cmd, env = testing.torch_line_runs.nested_run(SGLANG_TABLE.torch, ["test-sglang"], posargs)
    session.run(*cmd, env=env, external=True)


@_session(name="test-sglang-server", python=False, default=False, timed=True)
def test_sglang_server(session: nox.Session) -> None:
    """SGLang's own server (python -m sglang.launch_server) in the riscv64 target at VLEN 256, serving two small
    models through the rvv backend; tokens compared with transformers (tests marked sglang_server; slow)."""
    posargs = session.posargs or sglang.session.SERVER_POSARGS
    cmd, env = testing.torch_line_runs.nested_run(SGLANG_TABLE.torch, ["test-sglang"], posargs)
    session.run(*cmd, env=env, external=True)


# Sessions of their own for the lines other than the default, only while the default line is active.
for _line in [] if line_folder() else toolchain.other_lines():
    _register_torch_line_sessions(_line)


@_session(python=False, tags=["test"], default=False)
def summary(session: nox.Session) -> None:
    """Print each session's wall time, then each test configuration's result and slowest files (last of -t test)."""
    print("\n".join(testing.summary_lines(RUN_STARTED)))
