"""Import stand-ins for packages SGLang imports that cannot exist on riscv64.

Each stand-in is a subpackage here:

- ``triton``: Triton compiles GPU kernels and has no riscv64 build. SGLang
  imports it at module level (its memory pools, its scheduler's kernel
  modules) and wraps kernels with ``triton.jit``/``autotune``/``heuristics``.
  The stand-in lets those modules import; launching a kernel raises.
- ``xgrammar``: a C++ extension with no riscv64 wheel and no Debian package.
  SGLang's function-call parsers import it unconditionally; constrained
  decoding (JSON schema, regex, EBNF, structural tags) is the only thing it
  does. Every use of the stand-in raises an error that names it.

They are served to SGLang's own modules only: :func:`install` routes an
``import triton`` (or ``xgrammar``) written in a module named ``sglang`` or
``sglang.*`` to the stand-in. Nothing is registered under the real name, so
every other package (torch above all, which switches its compiler to Triton
code paths when a package named ``triton`` imports) sees what a riscv64
machine has: no Triton. rvv-attn's start-up hook
(``_rvv_attn_sglang_startup``) calls :func:`install` when a process first
imports SGLang, for the stand-ins whose real package is absent.
"""

from __future__ import annotations

import builtins
import importlib
import logging
from collections.abc import Iterable
from typing import Any

logger = logging.getLogger("rvv_attn.sglang")

#: The modules given the stand-ins, and the names the stand-ins replace.
CLIENTS = ("sglang",)
STAND_INS = ("triton", "xgrammar")

_real_import = builtins.__import__
_routed: set[str] = set()


def _is_client(globals_: dict[str, Any] | None) -> bool:
    name = (globals_ or {}).get("__name__") or ""
    return any(name == c or name.startswith(c + ".") for c in CLIENTS)


def _stand_in_for(name: str) -> str | None:
    for real in _routed:
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


def install(names: Iterable[str] = STAND_INS) -> None:
    """Route SGLang's imports of ``names`` (stand-ins of this package) to the stand-ins (idempotent)."""
    names = tuple(names)
    unknown = [n for n in names if n not in STAND_INS]
    if unknown:
        raise ValueError(f"no stand-in for {', '.join(unknown)}; rvv-attn has stand-ins for {', '.join(STAND_INS)}")
    _routed.update(names)
    if builtins.__import__ is not _import:
        builtins.__import__ = _import
    logger.info("rvv-attn: SGLang's imports of %s get rvv-attn's stand-ins (not installed here)", ", ".join(names))


def routed() -> tuple[str, ...]:
    """The names whose SGLang imports go to a stand-in in this process."""
    return tuple(sorted(_routed))
