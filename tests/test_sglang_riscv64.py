"""What the plugin changes for SGLang on riscv64, and the token-id check, each on its own.

(SGLang's own server exercising all of it together: tests/test_sglang_server.py.)
"""

from __future__ import annotations

import logging
import os

import pytest

from rvv_attn.sglang_plugin import input_checks, riscv64


@pytest.mark.variant_independent
def test_ids_outside_the_vocabulary_are_named():
    assert input_checks.out_of_vocabulary([0, 5, 255], 256) is None
    assert input_checks.out_of_vocabulary([5, 263, 6], 256) == (
        "input_ids[1] = 263 is outside the vocabulary; valid ids are [0, 256)"
    )
    assert "input_ids[0] = -1" in input_checks.out_of_vocabulary([-1], 256)


@pytest.mark.variant_independent
def test_the_check_refuses_before_sglangs_own_validation_runs():
    class Manager:
        class model_config:  # noqa: N801 - SGLang's attribute name
            vocab_size = 16

    calls = []

    def sglang_validation(manager, obj, input_ids):
        calls.append(input_ids)

    input_checks.check_input_ids(sglang_validation, Manager(), None, [1, 2])
    with pytest.raises(ValueError, match=r"input_ids\[0\] = 99"):
        input_checks.check_input_ids(sglang_validation, Manager(), None, [99])
    assert calls == [[1, 2]], "a refused request must not reach SGLang's validation"


@pytest.mark.variant_independent
def test_use_libuv_defaults_to_zero_on_riscv64_only(monkeypatch):
    monkeypatch.delenv(riscv64.LIBUV_SWITCH, raising=False)
    monkeypatch.setattr(riscv64, "is_riscv64", lambda: False)
    assert riscv64.tcp_store_without_libuv() is False and riscv64.LIBUV_SWITCH not in os.environ
    monkeypatch.setattr(riscv64, "is_riscv64", lambda: True)
    assert riscv64.tcp_store_without_libuv() is True
    assert os.environ[riscv64.LIBUV_SWITCH] == "0"
    monkeypatch.setenv(riscv64.LIBUV_SWITCH, "1")
    assert riscv64.tcp_store_without_libuv() is False, "an explicit setting wins"


@pytest.mark.variant_independent
def test_rope_patch_does_nothing_on_another_sglang_and_says_so(monkeypatch, caplog):
    monkeypatch.setattr(riscv64, "is_riscv64", lambda: True)
    with caplog.at_level(logging.WARNING, logger="rvv_attn.sglang"):
        assert riscv64.patch_rope("0.5.24") is False
    assert "not applied" in caplog.text and riscv64.ROPE_PATCH_TESTED_WITH in caplog.text
    monkeypatch.setattr(riscv64, "is_riscv64", lambda: False)
    assert riscv64.patch_rope(riscv64.ROPE_PATCH_TESTED_WITH) is False


@pytest.mark.sglang
def test_rope_patch_turns_sglangs_vllm_branch_off_for_the_tested_version(monkeypatch):
    import importlib

    from sglang.version import __version__

    module = importlib.import_module(riscv64.ROPE_MODULE)
    monkeypatch.setattr(module, "_is_cpu", False)  # what SGLang computes on riscv64
    monkeypatch.setattr(riscv64, "is_riscv64", lambda: True)
    monkeypatch.setattr(riscv64, "rope_patched", False)
    assert riscv64.patch_rope(__version__) is (__version__ == riscv64.ROPE_PATCH_TESTED_WITH)
    assert module._is_cpu is (__version__ == riscv64.ROPE_PATCH_TESTED_WITH)


@pytest.mark.sglang
@pytest.mark.parametrize(
    "stand_in, asked, expected",
    [(True, None, "none"), (True, "xgrammar", "xgrammar"), (False, None, "xgrammar")],
)
def test_grammar_backend_defaults_to_none_only_where_xgrammar_is_a_stand_in(monkeypatch, stand_in, asked, expected):
    from sglang.srt.arg_groups import serving_hook
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    monkeypatch.setattr(riscv64, "xgrammar_is_stand_in", lambda: stand_in)
    server_args = ServerArgs(model_path="unused", device="cpu", grammar_backend=asked)
    riscv64.default_grammar_backend(serving_hook.handle_grammar_backend, server_args)
    assert resolving_view(server_args).grammar_backend == expected
