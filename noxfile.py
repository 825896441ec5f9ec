"""nox sessions for rvv-attn: set up the cross toolchain, build, test under QEMU.

The logic lives in ci/cross (importable and unit tested); the sessions only
string its steps together. `nox -l` lists them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

sys.path.insert(0, str(Path(__file__).parent / "ci"))

from cross import build, host, qemu, sysroot, testrun, vlens  # noqa: E402
from cross.errors import CrossError  # noqa: E402
from cross.paths import BUILD_DIR  # noqa: E402
from cross.proc import Stopwatch, log  # noqa: E402
from cross.runner import guest_command, guest_env  # noqa: E402

nox.options.sessions = ["test-host"]
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_external_run = True

# The host's torch for the portable build and test-host. Pinned: a looser
# spec can pull a multi-GB CUDA build.
HOST_TORCH = os.environ.get("RVV_ATTN_HOST_TORCH", "torch==2.13.0")
TEST_REQUIREMENTS = ["pytest>=8", "hypothesis>=6.100", "numpy"]


def _fail(session: nox.Session, err: CrossError) -> None:
    session.error(str(err))


def _toolchain(session: nox.Session) -> tuple[Path, Path]:
    """Host packages, pinned QEMU and sysroot: each step is a no-op when already done."""
    try:
        host.ensure_host_packages()
        qemu_bin = qemu.ensure_qemu()
        root = sysroot.ensure_sysroot(qemu_bin)
    except CrossError as err:
        _fail(session, err)
    return qemu_bin, root


def _cross_build(session: nox.Session, root: Path) -> Path:
    """Build (incrementally) the riscv64 wheel with every VLEN variant and unpack it for the guest."""
    session.install(*build.BUILD_REQUIREMENTS)
    wheels = BUILD_DIR / "wheels"
    with Stopwatch("cross-building the riscv64 wheel (portable + all VLEN variants)"):
        session.run("python", "-m", "pip", *build.cross_wheel_args(root, wheels, vlens.variants()), silent=True)
    return build.stage_wheel(build.newest_wheel(wheels), BUILD_DIR / "stage-riscv64")


@nox.session
def setup(session: nox.Session) -> None:
    """Install host prerequisites, fetch the pinned QEMU and build the riscv64 sysroot (cached)."""
    qemu_bin, root = _toolchain(session)
    log(f"qemu-riscv64: {qemu_bin} ({qemu.qemu_version(qemu_bin)})")
    log(f"sysroot: {root}")


@nox.session(name="test-host")
def test_host(session: nox.Session) -> None:
    """Build the portable kernels for this host and run the suite natively (plus the driver's unit tests)."""
    try:
        host.ensure_host_packages()
    except CrossError as err:
        _fail(session, err)
    session.install(HOST_TORCH, *TEST_REQUIREMENTS, *build.BUILD_REQUIREMENTS)
    with Stopwatch("building the portable kernels for the host"):
        session.run("python", "-m", "pip", *build.host_install_args(), silent=True)
    args = session.posargs or ["tests", "ci/tests"]
    session.run("python", "-m", "pytest", *args)


def _test_vlen(session: nox.Session, variant: vlens.Variant) -> None:
    qemu_bin, root = _toolchain(session)
    stage = _cross_build(session, root)
    agnostic = os.environ.get("RVV_ATTN_AGNOSTIC_ONES", "") not in ("", "0")
    label = f"test-{variant.name}" + ("-agnostic" if agnostic else "")
    code, outcome = testrun.run_emulated_pytest(qemu_bin, root, stage, variant, session.posargs or ["tests"],
                                                agnostic_ones=agnostic, label=label)
    testrun.print_summary(label, code, outcome)
    if code != 0:
        session.error(f"{label}: pytest exited with {code}; logs in {testrun.results_dir(label)}")


def _shell_vlen(session: nox.Session, variant: vlens.Variant) -> None:
    if not session.posargs:
        session.error(f"give a command after --, e.g. nox -s shell-{variant.name} -- python3 -c 'import rvv_attn'")
    qemu_bin, root = _toolchain(session)
    stage = _cross_build(session, root)
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    cmd = guest_command(qemu_bin, root, variant, session.posargs)
    session.run(*cmd, env=guest_env(stage, tmp), include_outer_env=False, external=True)


for _variant in vlens.variants():

    @nox.session(name=f"test-{_variant.name}", tags=["test"])
    def _test(session: nox.Session, variant: vlens.Variant = _variant) -> None:
        _test_vlen(session, variant)

    _test.__doc__ = (f"Cross-build and run the suite under qemu-riscv64 at VLEN {_variant.vlen} "
                     f"({_variant.board}); RVV_ATTN_AGNOSTIC_ONES=1 fills agnostic lanes with ones.")

    @nox.session(name=f"shell-{_variant.name}")
    def _shell(session: nox.Session, variant: vlens.Variant = _variant) -> None:
        _shell_vlen(session, variant)

    _shell.__doc__ = (f"Run any command (after --) in the emulated target at VLEN {_variant.vlen} "
                      "with rvv_attn importable, e.g. -- python3 -m pytest other/tests")


@nox.session(default=False)
def wheel(session: nox.Session) -> None:
    """Build the riscv64 wheel with every VLEN variant into dist/ (it picks the variant at run time)."""
    _qemu, root = _toolchain(session)
    session.install(*build.BUILD_REQUIREMENTS)
    out = Path("dist")
    session.run("python", "-m", "pip", *build.cross_wheel_args(root, out, vlens.variants()), silent=True)
    log(f"wheel: {build.newest_wheel(out)}")


@nox.session(name="pin-qemu", default=False)
def pin_qemu(session: nox.Session) -> None:
    """Re-pin qemu-user to the archive's current trixie version (writes toolchains/qemu.lock.json)."""
    try:
        pin = qemu.repin()
    except CrossError as err:
        _fail(session, err)
    log(f"pinned {pin.package} {pin.version} sha256 {pin.sha256}; commit toolchains/qemu.lock.json")
