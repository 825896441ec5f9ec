"""The demonstration job under QEMU (demo-vlenN): the command line and environment of `python -m rvv_attn.demo`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .. import toolchain
from ..paths import BUILD_DIR
from ..proc import Stopwatch
from ..session import Session
from ..toolchain.guest_commands import guest_command, guest_env
from ..toolchain.vlens import Variant

DEMO_MODULE = "rvv_attn.demo"


def demo_command(
    qemu: Path, sysroot: Path, stage: Path, variant: Variant, demo_args: Sequence[str]
) -> tuple[list[str], dict[str, str]]:
    """Command and environment for the demo at ``variant``'s VLEN.

    The variant is forced (RVV_ATTN_VARIANT), so a wheel without it fails at
    import instead of quietly running the portable build; RVV_ATTN_QEMU_CPU
    tells the demo its times are emulated.
    """
    cmd = guest_command(qemu, sysroot, variant, ["python3", "-m", DEMO_MODULE, *demo_args])
    tmp = BUILD_DIR / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = guest_env(stage, tmp, extra={"RVV_ATTN_VARIANT": variant.name, "RVV_ATTN_QEMU_CPU": variant.qemu_cpu()})
    return cmd, env


def run_demo(session: Session, variant: Variant, demo_args: Sequence[str]) -> None:
    """A demo-vlenN session: the demo at ``variant``'s VLEN, against the library built for it."""
    qemu_bin, root = toolchain.ensure()
    stage = toolchain.stage_for(session, root, [variant])
    cmd, env = demo_command(qemu_bin, root, stage, variant, demo_args)
    with Stopwatch(f"demo under QEMU at VLEN {variant.vlen} (importing torch alone takes ~20 s)"):
        session.run(*cmd, env=env, include_outer_env=False, external=True)
