"""``triton.jit`` of the stand-in: it keeps the decorated function and refuses to run it."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any


class StandInError(RuntimeError):
    """A Triton kernel was launched in an environment that has only the import stand-in."""


class JITFunction:
    def __init__(self, fn: Callable[..., Any], **options: Any) -> None:
        self.fn = fn
        self.options = options
        functools.update_wrapper(self, fn)

    def _refuse(self, *_args: Any, **_kwargs: Any) -> Any:
        raise StandInError(
            f"{self.fn.__module__}.{self.fn.__qualname__} is a Triton kernel; Triton has no riscv64 build and this "
            "environment has only rvv-attn's import stand-in for it (rvv_attn.sglang_plugin.standins), which "
            "cannot run kernels: choose an SGLang option that does not use Triton"
        )

    __call__ = _refuse
    run = _refuse

    def __getitem__(self, _grid: Any) -> Callable[..., Any]:
        return self._refuse


def jit(fn: Callable[..., Any] | None = None, **options: Any) -> Any:
    """``@triton.jit`` and ``@triton.jit(...)``."""
    if fn is None:
        return lambda f: JITFunction(f, **options)
    return JITFunction(fn, **options)
