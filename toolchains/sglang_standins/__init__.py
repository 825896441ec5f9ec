"""Import stand-ins for the riscv64 SGLang test environment: packages that cannot exist on riscv64.

Each stand-in is a subpackage here, listed with its reason in
toolchains/sglang.json (``stand_ins``). They are served to SGLang's own modules
only: ``install()`` (run at interpreter start by a ``.pth`` file of the
environment) routes an ``import triton`` written in a module named ``sglang``
or ``sglang.*`` to ``sglang_standins.triton``. Nothing is registered under the
real name, so every other package (torch above all, which switches its
compiler to Triton code paths when a package named ``triton`` imports) sees
what a riscv64 machine has: no Triton.
"""

from __future__ import annotations

import builtins
import importlib
from typing import Any

# The modules given the stand-ins, and the names the stand-ins replace.
CLIENTS = ("sglang",)
STAND_INS = ("triton",)

_real_import = builtins.__import__


def _is_client(globals_: dict[str, Any] | None) -> bool:
    name = (globals_ or {}).get("__name__") or ""
    return any(name == c or name.startswith(c + ".") for c in CLIENTS)


def _stand_in_for(name: str) -> str | None:
    for real in STAND_INS:
        if name == real or name.startswith(real + "."):
            return f"{__name__}.{name}"
    return None


def _import(name: str, globals=None, locals=None, fromlist=(), level: int = 0):  # noqa: A002 - __import__'s names
    target = _stand_in_for(name) if level == 0 and _is_client(globals) else None
    if target is None:
        return _real_import(name, globals, locals, fromlist, level)
    module = importlib.import_module(target)
    if fromlist:
        # `from triton.language import x`: the named module itself; its submodules are attributes already.
        return module
    # `import triton.language [as tl]`: the top-level package; the statement walks the attributes.
    return importlib.import_module(_stand_in_for(name.partition(".")[0]))


def install() -> None:
    """Route SGLang's imports of the stand-in names here (idempotent)."""
    if builtins.__import__ is not _import:
        builtins.__import__ = _import
