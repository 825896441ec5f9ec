"""Stand-in for xgrammar (see the stand-ins' package docstring): the names SGLang imports, none of them working.

xgrammar is a C++ extension with no riscv64 wheel and no Debian package.
SGLang's function-call parsers import it unconditionally, and its OpenAI
protocol models name ``StructuralTag`` in their request types, so the names
must exist for SGLang's server to import. Only constrained decoding (JSON
schema, regex, EBNF and structural-tag outputs) uses xgrammar, and every use
of this stand-in raises :class:`StandInError` saying so. On riscv64 the
rvv-attn plugin makes ``--grammar-backend none`` SGLang's default.

The request-type names are pydantic models (SGLang puts them in pydantic
``Union`` fields); validating a request against one fails with the same
message, so a request that asks for a structural tag gets a 400 naming
xgrammar rather than a crash.
"""

from __future__ import annotations

from typing import Any

import torch

from . import structural_tag
from .structural_tag import MESSAGE, StandInError, StandInModel, refusing_function

STAND_IN = True
__version__ = "0.0.0"  # not an xgrammar release


class _RefusingClass(type):
    """Metaclass of the engine-side names: constructing one, or reaching any class attribute, raises."""

    def __call__(cls, *_args: Any, **_kwargs: Any) -> Any:
        raise StandInError(f"xgrammar.{cls.__name__}: {MESSAGE}")

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return refusing_function(f"{cls.__name__}.{name}")


class CompiledGrammar(metaclass=_RefusingClass):
    pass


class Grammar(metaclass=_RefusingClass):
    pass


class GrammarCompiler(metaclass=_RefusingClass):
    pass


class GrammarMatcher(metaclass=_RefusingClass):
    pass


class TokenizerInfo(metaclass=_RefusingClass):
    pass


class VocabType(metaclass=_RefusingClass):
    pass


class StructuralTagItem(StandInModel):
    pass


class StructuralTag(StandInModel):
    pass


# xgrammar's token bitmask is int32 (one bit per vocabulary entry); SGLang reads the dtype when it allocates one.
bitmask_dtype = torch.int32
get_model_structural_tag = refusing_function("get_model_structural_tag")
get_bitmask_shape = refusing_function("get_bitmask_shape")
allocate_token_bitmask = refusing_function("allocate_token_bitmask")
apply_token_bitmask_inplace = refusing_function("apply_token_bitmask_inplace")

__all__ = [
    "CompiledGrammar",
    "Grammar",
    "GrammarCompiler",
    "GrammarMatcher",
    "StandInError",
    "StructuralTag",
    "StructuralTagItem",
    "TokenizerInfo",
    "VocabType",
    "allocate_token_bitmask",
    "apply_token_bitmask_inplace",
    "bitmask_dtype",
    "get_bitmask_shape",
    "get_model_structural_tag",
    "structural_tag",
]
