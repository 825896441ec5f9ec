"""The stand-in's ``xgrammar.structural_tag``: the format models SGLang's tool-call parsers build, all refusing."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

MESSAGE = (
    "xgrammar is not installed (it has no riscv64 build); rvv-attn gives SGLang only an import stand-in for it. "
    "Constrained decoding (json_schema, regex, ebnf, structural tags) needs the real package: on riscv64 run "
    "SGLang with --grammar-backend none (the rvv-attn plugin's default there) and requests without constraints"
)


class StandInError(RuntimeError, ValueError):
    """A use of the xgrammar stand-in. A ValueError too, so that pydantic turns it into a validation error."""


def refusing_function(name: str) -> Callable[..., Any]:
    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise StandInError(f"xgrammar.{name}: {MESSAGE}")

    refuse.__name__ = refuse.__qualname__ = name.rpartition(".")[2]
    return refuse


class StandInModel(BaseModel):
    """A pydantic model that no input validates against (the real one is xgrammar's)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="before")
    @classmethod
    def _refuse(cls, _data: Any) -> Any:
        raise StandInError(f"xgrammar.{cls.__name__}: {MESSAGE}")


class Format(StandInModel):
    pass


class AnyTextFormat(Format):
    pass


class AnyTokensFormat(Format):
    pass


class ConstStringFormat(Format):
    pass


class ExcludeTokenFormat(Format):
    pass


class JSONSchemaFormat(Format):
    pass


class OptionalFormat(Format):
    pass


class OrFormat(Format):
    pass


class RegexFormat(Format):
    pass


class SequenceFormat(Format):
    pass


class StarFormat(Format):
    pass


class TagFormat(Format):
    pass


class TagsWithSeparatorFormat(Format):
    pass


class TokenFormat(Format):
    pass


class TriggeredTagsFormat(Format):
    pass
