"""rvv-attn's start-up hook for SGLang: run by ``_rvv_attn_sglang_startup.pth`` when Python starts.

SGLang imports Triton at module level before any of its plugins can run
(``import sglang`` reaches ``sglang/srt/utils/common.py``'s ``import triton``),
in the launcher and again in every process it spawns. Triton has no riscv64
build, so on a board that first import fails. This hook is how rvv-attn's
stand-ins (``rvv_attn.sglang_plugin.standins``) reach SGLang's imports in
every one of those processes without the user copying anything: the wheel
installs it beside its package, and Python's ``site`` runs it in each
interpreter of that environment.

It costs a process that never imports SGLang one finder that compares a
module name: it imports nothing, not even torch. When a process first
imports ``sglang``, the finder steps aside and, for each stand-in whose real
package this environment lacks, routes SGLang's own imports of that name to
the stand-in. Set ``RVV_ATTN_SGLANG_STANDINS=0`` to turn it off.

This module lives outside the ``rvv_attn`` package on purpose: importing
``rvv_attn`` loads torch and the operator library, which every Python
process of the environment would then pay for at start.
"""

from __future__ import annotations

import importlib.util
import os
import sys

#: Set to 0 to keep the stand-ins away from SGLang.
SWITCH = "RVV_ATTN_SGLANG_STANDINS"
#: The package whose first import installs the stand-ins.
TRIGGER = "sglang"
#: The packages rvv-attn has stand-ins for (``rvv_attn.sglang_plugin.standins.STAND_INS``; a test keeps them equal).
STAND_INS = ("triton", "xgrammar")


class _FirstSGLangImport:
    """A meta path finder that finds nothing: it notices the first ``import sglang`` and installs the routing."""

    def find_spec(self, name, path=None, target=None):
        if name != TRIGGER:
            return None
        # A new list, not an edit in place: the import system is iterating over the old one right now.
        sys.meta_path = [f for f in sys.meta_path if f is not self]
        missing = [package for package in STAND_INS if importlib.util.find_spec(package) is None]
        if missing:
            _serve_stand_ins(missing)
        return None  # SGLang itself is found by the finders after this one


def _serve_stand_ins(names: list[str]) -> None:
    try:
        # Imported only now: the stand-ins' package loads torch and rvv-attn's operators.
        from rvv_attn.sglang_plugin import standins

        standins.install(names)
    except Exception as error:  # noqa: BLE001 - SGLang's own import error then says what is missing
        print(
            f"rvv-attn: cannot give SGLang its stand-ins for {', '.join(names)} ({type(error).__name__}: {error}); "
            f"SGLang's imports of them will fail",
            file=sys.stderr,
        )


def install() -> None:
    """Watch for the first ``import sglang`` (idempotent; a no-op when switched off or SGLang is already in)."""
    if os.environ.get(SWITCH, "1").strip() == "0":
        return
    if TRIGGER in sys.modules or any(isinstance(f, _FirstSGLangImport) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _FirstSGLangImport())


install()
