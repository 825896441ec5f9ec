"""The stand-in's ``triton.language``: the names SGLang's modules touch when they are imported.

``constexpr``, ``tensor`` and the scalar types appear in kernel signatures (annotations are
evaluated at import before Python 3.14); the rest of the language is used
only inside kernel bodies, which never run here.
"""

from . import extra


class constexpr:  # noqa: N801 - Triton's name
    def __init__(self, value: object = None) -> None:
        self.value = value


class tensor:  # noqa: N801 - Triton's name
    """Only an annotation here."""


class dtype:  # noqa: N801 - Triton's name
    """A scalar type by name: an annotation, or an argument of kernel-body calls that never run here."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"triton.language.{self.name}"


_SCALAR_TYPES = (
    "int1 int8 int16 int32 int64 uint8 uint16 uint32 uint64 float16 bfloat16 float32 float64 "
    "float8e4nv float8e5 float8e4b8 float8e5b16 float8e4b15"
).split()
globals().update({name: dtype(name) for name in _SCALAR_TYPES})

__all__ = ["constexpr", "dtype", "extra", "tensor", *_SCALAR_TYPES]
