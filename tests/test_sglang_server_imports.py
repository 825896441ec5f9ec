"""Every module SGLang's server processes import at start imports here, with the stand-ins and nothing else.

The modules are found by importing SGLang's entry modules, as a server's
processes do (here in the test process, whose interpreter started with the
wheel's start-up hook like SGLang's own): the launcher
(``sglang.launch_server`` and ``sglang serve``'s ``sglang.cli.main``), the
HTTP server it imports for the default mode, and the modules of the
functions SGLang's ``Engine`` starts its tokenizer manager, scheduler and
detokenizer with (read from the ``Engine`` class, not listed here). A
module-level import that fails on riscv64 (a missing package, a stand-in
too small) fails this test long before a board's server would.

It also checks what the stand-ins must not do: no module named ``triton``
or ``xgrammar`` is registered (torch must still see no Triton), and none of
the five Rust extensions compiled for x86-64 only is imported.
"""

from __future__ import annotations

import platform

import pytest

pytestmark = pytest.mark.sglang

LAUNCHERS = ("sglang.launch_server", "sglang.cli.main")
# What run_server imports for the default (HTTP) mode.
HTTP_SERVER = "sglang.srt.entrypoints.http_server"
ENGINE = "sglang.srt.entrypoints.engine"
ENGINE_PROCESS_FUNCTIONS = ("init_tokenizer_manager_func", "run_scheduler_process_func", "run_detokenizer_process_func")
# Compiled for x86-64 only in SGLang's wheel (left out of the riscv64 environment).
RUST_EXTENSIONS = (
    "sglang.srt.rust_extensions._server",
    "sglang.srt.rust_extensions._grpc",
    "sglang.srt.rust_extensions._multimodal",
    "sglang.srt.rust_extensions._bench",
    "sglang.srt.mem_cache.rust_tree_core.mem_cache",
)


@pytest.fixture(scope="module")
def report() -> dict:
    """Import the entry modules, then the Engine's process modules; what happened."""
    import importlib
    import sys

    import torch.utils._triton

    from rvv_attn.sglang_plugin import standins

    errors: dict[str, str] = {}

    def try_import(name: str) -> None:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - reported by name
            errors[name] = f"{type(error).__name__}: {error}"

    for name in (*LAUNCHERS, HTTP_SERVER, ENGINE):
        try_import(name)
    engine = sys.modules.get(ENGINE)
    derived = sorted({getattr(engine.Engine, f).__module__ for f in ENGINE_PROCESS_FUNCTIONS}) if engine else []
    for name in derived:
        try_import(name)
    return {
        "errors": errors,
        "process_modules": derived,
        "sglang_modules": sum(1 for m in sys.modules if m == "sglang" or m.startswith("sglang.")),
        "real_names": sorted(n for n in ("triton", "xgrammar") if n in sys.modules),
        "rust_extensions": sorted(m for m in RUST_EXTENSIONS if m in sys.modules),
        "torch_has_triton": bool(torch.utils._triton.has_triton()),
        "routed": list(standins.routed()),
    }


def test_every_server_module_imports(report):
    assert report["errors"] == {}
    assert set(report["process_modules"]) >= {
        "sglang.srt.managers.scheduler",
        "sglang.srt.managers.detokenizer_manager",
    }
    assert report["sglang_modules"] > 500, "importing the server's entry modules pulls in most of SGLang"


def test_no_rust_extension_is_imported(report):
    assert report["rust_extensions"] == []


@pytest.mark.skipif(platform.machine() != "riscv64", reason="the host's torch comes with the real Triton")
def test_stand_ins_stay_private_to_sglang(report):
    assert report["routed"] == ["triton", "xgrammar"]
    assert report["real_names"] == [], "a stand-in must never be registered under the real name"
    assert report["torch_has_triton"] is False
