"""Token ids checked before they reach the model, so a bad request gets an error instead of stopping the server.

SGLang 0.5.23 passes ``/generate``'s ``input_ids`` to the model unchecked
(it checks ``token_ids_logprob`` against the vocabulary, not the prompt). An
id outside the vocabulary reaches the embedding in the scheduler process,
which raises, and SGLang then takes the whole server down, whatever the
platform and attention backend. The plugin adds the check where SGLang checks
a prompt's length (``TokenizerManager._validate_one_request``, through its
hook registry), so the request gets SGLang's own error answer (HTTP 400) and
the server keeps serving.
"""

from __future__ import annotations

VALIDATE_REQUEST = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"


def out_of_vocabulary(input_ids, vocab_size: int) -> str | None:
    """The first id outside ``[0, vocab_size)``, as an error message; None if all are inside."""
    for position, token_id in enumerate(input_ids):
        if not 0 <= int(token_id) < vocab_size:
            return f"input_ids[{position}] = {int(token_id)} is outside the vocabulary; valid ids are [0, {vocab_size})"
    return None


def check_input_ids(original, manager, obj, input_ids, *args, **kwargs):
    """Around SGLang's per-request validation: refuse ids the model's embedding cannot look up."""
    vocab_size = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if vocab_size and input_ids:
        problem = out_of_vocabulary(input_ids, int(vocab_size))
        if problem:
            raise ValueError(problem)
    return original(manager, obj, input_ids, *args, **kwargs)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(VALIDATE_REQUEST, check_input_ids, HookType.AROUND)
