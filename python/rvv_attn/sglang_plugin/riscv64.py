"""What SGLang's server lacks on riscv64, closed by the plugin in each SGLang process.

Through SGLang's hook registry (argument resolution, so an explicit option
always wins):

- :func:`default_cpu_backend`: ``--device cpu`` without
  ``--attention-backend`` resolves to ``rvv`` (SGLang would pick
  ``intel_amx`` and fall back to ``torch_native``);
- :func:`default_grammar_backend`: where xgrammar is rvv-attn's stand-in,
  no ``--grammar-backend`` resolves to ``none`` (SGLang would build an
  xgrammar backend when it loads the tokenizer, and the stand-in refuses).

Through the environment (:func:`tcp_store_without_libuv`): Debian's riscv64
torch is built without libuv, which torch's TCPStore uses by default, so
SGLang's ``init_process_group`` fails unless ``USE_LIBUV=0`` is set.

Through one patch that no SGLang mechanism can replace (:func:`patch_rope`):
SGLang's ``is_cpu()`` is true on x86-64 and arm64 hosts only, and its
``RotaryEmbedding`` then imports ``vllm._custom_ops`` on riscv64. The patch
is applied only to the SGLang version it was tested with; on another it
logs that it did nothing.
"""

from __future__ import annotations

import importlib
import logging
import os
import platform

logger = logging.getLogger("rvv_attn.sglang")

#: The SGLang release whose files the RoPE patch was read from and tested with.
ROPE_PATCH_TESTED_WITH = "0.5.23"
#: The module whose ``_is_cpu`` decides, and only decides (one use, in ``RotaryEmbedding.__init__``), whether
#: RoPE takes the torch path or imports a GPU kernel.
ROPE_MODULE = "sglang.srt.layers.rotary_embedding.base"

#: After :func:`patch_rope` in this process: whether it changed SGLang.
rope_patched = False

CPU_BACKEND_DEFAULTS = "sglang.srt.arg_groups.platform_hook.handle_cpu_backends"
GRAMMAR_BACKEND_DEFAULTS = "sglang.srt.arg_groups.serving_hook.handle_grammar_backend"


def is_riscv64() -> bool:
    return platform.machine().lower() == "riscv64"


def default_cpu_backend(original, server_args, *args, **kwargs):
    """Around SGLang's CPU defaults: choose ``rvv`` where SGLang would choose nothing that serves riscv64."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    from . import BACKEND_NAME

    view = resolving_view(server_args)
    if view.device == "cpu" and view.attention_backend is None and is_riscv64():
        declare_resolution(server_args, "rvv_attn", attention_backend=BACKEND_NAME)
        logger.info("rvv-attn: --device cpu on riscv64 without --attention-backend: using %r", BACKEND_NAME)
    return original(server_args, *args, **kwargs)


def xgrammar_is_stand_in() -> bool:
    from . import standins

    return "xgrammar" in standins.routed()


def default_grammar_backend(original, server_args, *args, **kwargs):
    """Around SGLang's grammar default: ``none`` where xgrammar is only a stand-in and nothing was asked for."""
    from sglang.srt.arg_groups.overrides import declare_resolution, resolving_view

    if resolving_view(server_args).grammar_backend is None and xgrammar_is_stand_in():
        declare_resolution(server_args, "rvv_attn", grammar_backend="none")
        logger.info("rvv-attn: xgrammar is not installed (no riscv64 build): --grammar-backend none")
    return original(server_args, *args, **kwargs)


def register_defaults() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(CPU_BACKEND_DEFAULTS, default_cpu_backend, HookType.AROUND)
    HookRegistry.register(GRAMMAR_BACKEND_DEFAULTS, default_grammar_backend, HookType.AROUND)


#: The variable torch's TCP rendezvous reads to choose its store's backend (libuv unless it is "0").
LIBUV_SWITCH = "USE_LIBUV"


def tcp_store_without_libuv() -> bool:
    """On riscv64, default ``USE_LIBUV=0`` for SGLang's process group (an explicit setting wins); True if set."""
    if not is_riscv64() or LIBUV_SWITCH in os.environ:
        return False
    os.environ[LIBUV_SWITCH] = "0"
    logger.info("rvv-attn: USE_LIBUV=0 (Debian's riscv64 torch has no libuv for its TCPStore)")
    return True


def patch_rope(sglang_version: str | None = None) -> bool:
    """On riscv64, let SGLang's RotaryEmbedding take its torch path; True if the patch was applied."""
    if not is_riscv64():
        return False
    if sglang_version is None:
        import sglang

        sglang_version = str(sglang.__version__)
    if sglang_version != ROPE_PATCH_TESTED_WITH:
        logger.warning(
            "rvv-attn: SGLang %s is not %s, the version the RoPE patch was tested with: not applied (if "
            "RotaryEmbedding then fails to import vllm, this SGLang needs another way to run RoPE on riscv64)",
            sglang_version,
            ROPE_PATCH_TESTED_WITH,
        )
        return False
    module = importlib.import_module(ROPE_MODULE)
    if getattr(module, "_is_cpu", None) is not False:
        logger.info("rvv-attn: %s._is_cpu is %r: RoPE patch not needed", ROPE_MODULE, getattr(module, "_is_cpu", None))
        return False
    module._is_cpu = True
    global rope_patched
    rope_patched = True
    logger.info(
        "rvv-attn: set %s._is_cpu = True (SGLang %s's is_cpu() knows x86-64 and arm64 only): RotaryEmbedding uses "
        "its torch path on riscv64 instead of importing vllm",
        ROPE_MODULE,
        sglang_version,
    )
    return True
