"""SGLang's CPU attention operator names, served by rvv-attn.

``import rvv_attn.sglang`` registers ``torch.ops.sgl_kernel.decode_attention_cpu``,
``extend_attention_cpu``, ``flash_attn_varlen_func``, ``store_cache_cpu``,
``decode_attention_int8_cpu`` and ``extend_attention_int8_cpu`` with SGLang
main's schemas (the four trailing
arguments ``is_cross_attn, sliding_window_size, encoder_lens, sinks`` have
defaults, so the older 13-argument calls work too), and SGLang 0.5.23's
forms of decode and extend (the fp8 cache's ``key_scale``/``value_scale``
after the caches; extend's ``tree_mask`` and ``is_causal``) as their
overloads ``kv_scales``: a call picks the form its arguments fit. The calls
go straight to rvv-attn's C++ operators. If another library (a real sgl-kernel build)
already defines one of these names, the import raises RuntimeError naming it
and registers nothing.

Beside a real sgl-kernel build (an SGLang plugin that fills in what it
lacks), call ``torch.ops.rvv_attn.register_absent_sglang_names()`` instead
of importing this module: it registers only the names no library defines
and returns ``(served, skipped)``, the names rvv-attn serves and those it
left to the other library.

No name gets a fake implementation: SGLang's CPU graph runner registers its
own (``torch.library.register_fake``), which fails if one exists.
"""

from __future__ import annotations

from . import ops

#: The names registered in torch.ops.sgl_kernel.
REGISTERED: tuple[str, ...] = tuple(str(n) for n in ops.register_sglang_names())

__all__ = ["REGISTERED"]
