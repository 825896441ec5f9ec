"""What rvv-attn's SGLang plugin does in the process that runs it, checked with SGLang's own modules.

(That SGLang's ``load_plugins()`` finds the entry point in a spawned process
is tests/test_sglang_plugin_discovery.py.) The plugin's effects are
process-wide, as they are in SGLang, so each test states what it needs
rather than relying on order.
"""

from __future__ import annotations

import importlib
import platform

import pytest
import torch

pytestmark = pytest.mark.sglang


@pytest.fixture(scope="module")
def plugin():
    from rvv_attn import sglang_plugin

    sglang_plugin.load()
    from sglang.srt.plugins.hook_registry import HookRegistry

    HookRegistry.apply_hooks()  # as load_plugins() does after running the plugins
    return sglang_plugin


def test_backend_is_registered_and_selectable(plugin):
    from sglang.srt.layers.attention import attention_registry

    choices = importlib.import_module("sglang.srt.arg_groups.choices").ATTENTION_BACKEND_CHOICES
    assert attention_registry.ATTENTION_BACKENDS["rvv"] is plugin.create_backend
    assert choices.count("rvv") == 1
    plugin.load()  # a second call (SGLang guards, but a user may call it too) adds nothing
    assert choices.count("rvv") == 1


def test_backend_factory_builds_the_rvv_backend(plugin):
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    from rvv_attn.sglang_plugin.backend import RvvAttnBackend

    runner = type("Runner", (), {})()
    runner.device = "cpu"
    runner.use_mla_backend = False
    runner.req_to_token_pool = ReqToTokenPool(size=2, max_context_len=8, device="cpu", enable_memory_saver=False)
    runner.token_to_kv_pool = MHATokenToKVPool(
        size=16,
        page_size=1,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=64,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    assert isinstance(attention_registry.ATTENTION_BACKENDS["rvv"](runner), RvvAttnBackend)


def test_sgl_kernel_attention_names_are_served(plugin):
    # No sgl-kernel build here: every name is rvv-attn's.
    assert plugin.left_alone == ()
    for name in ("decode_attention_cpu", "extend_attention_cpu", "flash_attn_varlen_func", "store_cache_cpu"):
        assert name in plugin.served
        assert hasattr(torch.ops.sgl_kernel, name), name


def _resolved_backend(**arguments) -> str:
    from sglang.srt.arg_groups import platform_hook
    from sglang.srt.arg_groups.overrides import resolving_view
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="unused", device="cpu", **arguments)
    platform_hook.handle_cpu_backends(server_args)  # the step of SGLang's resolution the plugin wraps
    return resolving_view(server_args).attention_backend


def test_rvv_is_the_cpu_default_on_riscv64(plugin, monkeypatch):
    if platform.machine() != "riscv64":  # on the host, say the machine is what the hook asks about
        monkeypatch.setattr(plugin.riscv64, "is_riscv64", lambda: True)
    assert _resolved_backend() == "rvv"
    assert _resolved_backend(attention_backend="torch_native") == "torch_native", "an explicit choice must win"


def test_other_machines_keep_sglangs_default(plugin, monkeypatch):
    monkeypatch.setattr(plugin.riscv64, "is_riscv64", lambda: False)
    assert _resolved_backend() == "intel_amx"  # SGLang's own choice, which it later maps to torch_native


def test_cpu_graph_runner_registers_its_fakes_after_the_plugin(plugin):
    """SGLang's --enable-torch-compile path registers a fake for each sgl_kernel name it calls, through
    its own register_cpu_compile_fake; a name that already had a fake or Meta kernel would make it
    raise. (Its register_fake_ops also covers ~40 operators only a full sgl-kernel build defines,
    shm_allreduce first, so that function as a whole needs one: docs/sglang.md.)"""
    from sglang.srt.model_executor import cpu_graph_runner

    assert plugin.served, "the plugin served no sgl_kernel name"
    for name in plugin.served:
        cpu_graph_runner.register_cpu_compile_fake(name)(lambda *args, **kwargs: None)
    assert set(plugin.served) <= cpu_graph_runner._CPU_COMPILE_FAKE_OPS
