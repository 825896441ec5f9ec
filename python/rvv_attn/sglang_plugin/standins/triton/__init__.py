"""Stand-in for Triton in the riscv64 SGLang test environment (listed, with the reason, in toolchains/sglang.json).

Triton compiles GPU kernels and has no riscv64 build. SGLang imports it at
module level and wraps its GPU kernels with ``triton.jit``, ``triton.autotune``
(with ``triton.Config`` lists) and ``triton.heuristics``; this package exists
so that those modules import. It computes nothing: launching or calling a
decorated function raises ``StandInError``. ``cdiv`` and ``next_power_of_2`` are
plain integer helpers with Triton's results, because SGLang calls them on the
host side of CPU code paths too.
"""

from __future__ import annotations

from . import language, runtime
from .runtime.autotuner import Config, autotune, heuristics
from .runtime.jit import JITFunction, StandInError, jit

# Not a Triton release: code comparing versions must not take it for one.
__version__ = "0.0.0"
STAND_IN = True


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    n -= 1
    for shift in (1, 2, 4, 8, 16, 32):
        n |= n >> shift
    return n + 1


__all__ = [
    "Config",
    "JITFunction",
    "StandInError",
    "autotune",
    "cdiv",
    "heuristics",
    "jit",
    "language",
    "next_power_of_2",
    "runtime",
]
