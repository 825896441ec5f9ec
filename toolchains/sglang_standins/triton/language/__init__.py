"""The stand-in's ``triton.language``: the names SGLang's modules touch when they are imported.

``constexpr`` appears in kernel signatures (evaluated at import before Python
3.14); the rest of the language is used only inside kernel bodies, which
never run here.
"""

from . import extra


class constexpr:  # noqa: N801 - Triton's name
    def __init__(self, value: object = None) -> None:
        self.value = value


__all__ = ["constexpr", "extra"]
