"""The cross toolchain: what builds the kernels for riscv64 and runs them under QEMU.

- ``prerequisites``: ``ensure()``, what every emulated session needs first (host packages, QEMU, sysroot);
- ``host_packages``: the host's apt packages (clang-19, lld, ccache, ...), installed when missing;
- ``private_apt`` and ``archive``: an apt of the driver's own, and the Debian archive it fetches from;
- ``qemu``: the pinned qemu-user, fetched and checked (and re-pinned by pin-qemu);
- ``sysroot``: the riscv64 Debian sysroot with Python and PyTorch;
- ``vlens``: the VLEN table (toolchains/vlens.json): the variants, their CPUs and lanes;
- ``torch_lines``: the torch-line table (toolchains/torch_lines.json): each line's Debian suite, host torch, lock;
- ``guest_commands``: command lines and environments of programs run in the emulated target;
- ``build``: the scikit-build-core builds (the host install, the riscv64 wheel, the staged trees);
- ``build_steps``: those builds as steps of a nox session;
- ``binfmt`` and ``board_root``: riscv64 programs run as native (binfmt_misc) and a Debian root installed as on
  a board, for the native sdist build.
"""

from .build import SANITIZER_DEFINES
from .build_steps import cross_build, host_build, sanitizer_env, stage_for
from .host_packages import SANITIZER_PACKAGES, ensure_host_packages
from .prerequisites import ensure
from .qemu import qemu_version
from .qemu import repin as repin_qemu
from .sysroot import host_pin
from .torch_lines import TorchLine, active_line, lines, other_lines
from .vlens import Variant, portable_lane, variants

__all__ = [
    "SANITIZER_DEFINES",
    "SANITIZER_PACKAGES",
    "TorchLine",
    "Variant",
    "active_line",
    "cross_build",
    "ensure",
    "ensure_host_packages",
    "host_build",
    "host_pin",
    "lines",
    "other_lines",
    "portable_lane",
    "qemu_version",
    "repin_qemu",
    "sanitizer_env",
    "stage_for",
    "variants",
]
