"""The stand-in's ``triton.runtime``: ``jit`` and the ``autotuner`` decorators (see the package's docstring)."""

from . import autotuner, jit

__all__ = ["autotuner", "jit"]
