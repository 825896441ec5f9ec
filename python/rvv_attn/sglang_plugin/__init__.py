"""SGLang's plugin entry point for rvv-attn.

SGLang runs every entry point of the group ``sglang.srt.plugins`` early in
each of its processes (launcher, engine, scheduler, workers), through
``sglang.srt.plugins.load_plugins()``. rvv-attn's wheel declares::

    [project.entry-points."sglang.srt.plugins"]
    rvv_attn = "rvv_attn.sglang_plugin:load"

:func:`load` then, in that process:

1. registers SGLang's CPU attention operator names in ``torch.ops.sgl_kernel``
   where they are absent (a real sgl-kernel build keeps its own: one log line
   names what was left alone);
2. registers the ``rvv`` attention backend in SGLang's registry and adds
   ``rvv`` to the ``--attention-backend`` choices;
3. closes what SGLang lacks on riscv64 (:mod:`.riscv64`): ``rvv`` as the
   attention backend for ``--device cpu`` when none is given (SGLang would
   pick ``intel_amx`` and fall back to ``torch_native``), ``--grammar-backend
   none`` where xgrammar is only a stand-in, ``USE_LIBUV=0`` for torch's
   process group, and RoPE's torch path. An explicit option always wins;
4. checks a request's token ids against the vocabulary before they reach the
   model (:mod:`.input_checks`): SGLang 0.5.23 does not, and an id outside it
   stops the whole server.

The stand-ins for Triton and xgrammar (:mod:`.standins`) are not installed
here: SGLang imports Triton before any plugin runs, so the wheel's start-up
hook (``_rvv_attn_sglang_startup``) installs them.

Each step logs and carries on when it fails: a plugin must never stop
SGLang from starting. Importing this module imports nothing of SGLang;
:func:`load` imports what it registers into.
"""

from __future__ import annotations

import importlib.util
import logging
import os

logger = logging.getLogger("rvv_attn.sglang")

#: The name ``--attention-backend`` takes to select rvv-attn's backend.
BACKEND_NAME = "rvv"

_loaded = False
#: After :func:`load`: the ``sgl_kernel`` names rvv-attn serves, and those another library defined first.
served: tuple[str, ...] = ()
left_alone: tuple[str, ...] = ()


def load() -> None:
    """Run once per process by SGLang's ``load_plugins()``; idempotent, never raises."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for step in (_report_stand_ins, _register_operator_names, _register_backend, _close_riscv64_gaps, _check_inputs):
        try:
            step()
        except Exception:  # noqa: BLE001 - a plugin failure must not stop SGLang
            logger.exception("rvv-attn: %s failed; SGLang goes on without it", step.__name__.strip("_"))


def _register_operator_names() -> None:
    # A real sgl-kernel build defines its names when its package is imported.
    # Import it first, if it is installed, so its definitions are the ones that
    # stand and rvv-attn only fills the gaps (the reverse order would make its
    # own registration fail on names already defined).
    if importlib.util.find_spec("sgl_kernel") is not None:
        try:
            import sgl_kernel  # noqa: F401
        except Exception as error:  # noqa: BLE001 - a broken sgl-kernel must not hide rvv-attn
            logger.warning("rvv-attn: sgl_kernel is installed but failed to import (%s)", error)

    from .. import ops

    global served, left_alone
    served, left_alone = (tuple(str(name) for name in names) for names in ops.register_absent_sglang_names())
    if left_alone:
        logger.info("rvv-attn: torch.ops.sgl_kernel already defines %s; left as they are", ", ".join(left_alone))
    logger.info("rvv-attn: serving torch.ops.sgl_kernel.{%s}", ",".join(served))


def create_backend(model_runner):
    """SGLang's factory for ``--attention-backend rvv``."""
    from .backend import RvvAttnBackend

    return RvvAttnBackend(model_runner)


def _register_backend() -> None:
    from sglang.srt.layers.attention import attention_registry

    if BACKEND_NAME not in attention_registry.ATTENTION_BACKENDS:
        attention_registry.register_attention_backend(BACKEND_NAME)(create_backend)
    # server_args is where SGLang offers the choices to extend (it imports them from arg_groups.choices).
    from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    logger.info("rvv-attn: attention backend %r registered", BACKEND_NAME)


def _close_riscv64_gaps() -> None:
    from . import riscv64

    riscv64.register_defaults()
    riscv64.tcp_store_without_libuv()
    riscv64.patch_rope()


def _check_inputs() -> None:
    from . import input_checks

    input_checks.register()


def _report_stand_ins() -> None:
    from . import standins

    if standins.routed():
        logger.info("rvv-attn: SGLang's imports of %s are served by rvv-attn's stand-ins", ", ".join(standins.routed()))


def process_summary() -> str:
    """What the plugin did in this process, for the backend's log line: SGLang runs plugins before it configures
    logging, so the plugin's own lines are often not printed."""
    from . import riscv64, standins

    parts = [f"{len(served)} sgl_kernel names served"]
    if standins.routed():
        parts.append(f"stand-ins for {', '.join(standins.routed())}")
    if riscv64.rope_patched:
        parts.append("RoPE on its torch path")
    return f"plugin loaded in process {os.getpid()}: " + ", ".join(parts)
