"""SGLang's own plugin loader finds rvv-attn through the installed wheel's entry point, as a served process does.

SGLang's engine starts its scheduler processes with the ``spawn`` method and
each calls ``sglang.srt.plugins.load_plugins()``; these tests do the same in
spawned children, so nothing imported by pytest or by the test module can
make the result look right. Both children start together (two interpreters
that import torch and SGLang: the slow part under QEMU).
"""

from __future__ import annotations

import importlib.metadata
import multiprocessing
import os
import queue
import sys
import time
from collections.abc import Iterator

import pytest

pytestmark = pytest.mark.sglang
# The children are what costs (each imports torch and SGLang under QEMU): -t test's quick share leaves them out.
spawns = pytest.mark.sglang_spawn

GROUP = "sglang.srt.plugins"
ENTRY_POINT = "rvv_attn"
TARGET = "rvv_attn.sglang_plugin:load"
PLUGIN_MODULE = TARGET.split(":")[0]
# Generous: under QEMU each child imports torch and SGLang.
CHILD_TIMEOUT = 1800


def load_plugins_in_child(allow: str | None, results: multiprocessing.Queue) -> None:
    """In a fresh interpreter: what exists before and after SGLang's load_plugins()."""
    try:
        if allow is None:
            os.environ.pop("SGLANG_PLUGINS", None)
        else:
            os.environ["SGLANG_PLUGINS"] = allow
        import torch
        from sglang.srt.layers.attention import attention_registry
        from sglang.srt.plugins import load_plugins

        def state() -> dict[str, bool]:
            return {
                "rvv_backend": "rvv" in attention_registry.ATTENTION_BACKENDS,
                "decode_op": hasattr(torch.ops.sgl_kernel, "decode_attention_cpu"),
                # The module itself is imported at SGLang's first import where the wheel's start-up hook serves
                # the stand-ins (they live in it); what counts is whether SGLang ran its load().
                "plugin_loaded": bool(getattr(sys.modules.get(PLUGIN_MODULE), "_loaded", False)),
            }

        before = state()
        load_plugins()
        results.put({"allow": allow, "before": before, "after": state()})
    except BaseException as err:  # reported to the parent, which fails the test with it
        results.put({"allow": allow, "error": f"{type(err).__name__}: {err}"})


@pytest.fixture(scope="module")
def children() -> Iterator[dict[str | None, dict]]:
    """Both children's reports, keyed by their SGLANG_PLUGINS (None: unset)."""
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    allows = (None, "other")
    procs = [ctx.Process(target=load_plugins_in_child, args=(allow, results)) for allow in allows]
    for proc in procs:
        proc.start()
    reports = {}
    deadline = time.monotonic() + CHILD_TIMEOUT
    try:
        while len(reports) < len(procs):
            try:
                report = results.get(timeout=5)
            except queue.Empty:
                # A child that could not start (or died) reports nothing: fail now, not at the timeout.
                dead = [(a, p.exitcode) for a, p in zip(allows, procs) if p.exitcode is not None and a not in reports]
                if dead or time.monotonic() > deadline:
                    pytest.fail(f"spawned children without a report (SGLANG_PLUGINS, exit code): {dead or 'timeout'}")
                continue
            reports[report["allow"]] = report
    finally:
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
    yield reports


def test_entry_point_is_in_the_installed_metadata():
    found = [ep for ep in importlib.metadata.entry_points(group=GROUP) if ep.name == ENTRY_POINT]
    assert len(found) == 1, f"entry points of {GROUP}: {importlib.metadata.entry_points(group=GROUP)}"
    (ep,) = found
    assert ep.value == TARGET
    assert ep.dist is not None and ep.dist.name.replace("_", "-") == "rvv-attn"


@spawns
def test_load_plugins_in_a_spawned_process_registers_rvv(children):
    report = children[None]
    assert "error" not in report, report.get("error")
    assert report["before"] == {"rvv_backend": False, "decode_op": False, "plugin_loaded": False}, (
        "SGLang's import alone already registered rvv-attn: the test would prove nothing"
    )
    assert report["after"] == {"rvv_backend": True, "decode_op": True, "plugin_loaded": True}


@spawns
def test_sglang_plugins_allow_list_skips_rvv_attn(children):
    report = children["other"]
    assert "error" not in report, report.get("error")
    assert report["after"] == {"rvv_backend": False, "decode_op": False, "plugin_loaded": False}
