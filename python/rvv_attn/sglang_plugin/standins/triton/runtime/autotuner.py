"""``triton.autotune``, ``triton.heuristics`` and ``triton.Config`` of the stand-in.

SGLang's kernel modules apply them at import, so they must accept Triton's
arguments; the kernel they wrap still refuses to run. ``autotune`` keeps
Triton's keyword names because SGLang inspects its signature (it looks for
``cache_results`` to decide which arguments to pass).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Config:
    """One autotuning candidate: kernel meta-parameters and launch options, kept as given."""

    def __init__(
        self,
        kwargs: dict[str, Any],
        num_warps: int = 4,
        num_stages: int = 3,
        num_ctas: int = 1,
        maxnreg: int | None = None,
        pre_hook: Callable[..., Any] | None = None,
        **options: Any,
    ) -> None:
        self.kwargs = dict(kwargs)
        self.num_warps = num_warps
        self.num_stages = num_stages
        self.num_ctas = num_ctas
        self.maxnreg = maxnreg
        self.pre_hook = pre_hook
        self.options = options

    def all_kwargs(self) -> dict[str, Any]:
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages, "num_ctas": self.num_ctas}

    def __repr__(self) -> str:
        return f"Config({self.kwargs}, num_warps={self.num_warps}, num_stages={self.num_stages})"


def autotune(
    configs: list[Config],
    key: list[str],
    prune_configs_by: dict[str, Any] | None = None,
    reset_to_zero: list[str] | None = None,
    restore_value: list[str] | None = None,
    pre_hook: Callable[..., Any] | None = None,
    post_hook: Callable[..., Any] | None = None,
    warmup: int | None = None,
    rep: int | None = None,
    use_cuda_graph: bool = False,
    do_bench: Callable[..., Any] | None = None,
    cache_results: bool = False,
) -> Callable[[Any], Any]:
    """Keeps the decorated kernel (which refuses to run) and records the candidates on it."""

    def decorate(kernel: Any) -> Any:
        kernel.configs = list(configs)
        return kernel

    return decorate


def heuristics(values: dict[str, Callable[[dict[str, Any]], Any]]) -> Callable[[Any], Any]:
    """Keeps the decorated kernel (which refuses to run)."""

    def decorate(kernel: Any) -> Any:
        kernel.heuristics = dict(values)
        return kernel

    return decorate
