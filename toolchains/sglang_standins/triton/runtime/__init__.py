"""The stand-in's ``triton.runtime``: only ``jit`` (see the package's docstring)."""

from . import jit

__all__ = ["jit"]
