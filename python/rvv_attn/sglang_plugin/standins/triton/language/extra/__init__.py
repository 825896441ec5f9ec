"""The stand-in's ``triton.language.extra``: ``libdevice`` is imported by name; its functions are used only in
kernel bodies."""

from types import ModuleType

libdevice = ModuleType("triton.language.extra.libdevice", "Device math functions: used only inside Triton kernels.")

__all__ = ["libdevice"]
