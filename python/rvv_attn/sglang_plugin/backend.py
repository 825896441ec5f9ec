"""SGLang's ``rvv`` attention backend: SGLang's pools and batches, rvv-attn's kernels.

Selected with ``--attention-backend rvv`` (the plugin in
:mod:`rvv_attn.sglang_plugin` registers it, and makes it the default for
``--device cpu`` on riscv64). It implements SGLang's ``AttentionBackend``
the way SGLang's own CPU backends do, and calls ``torch.ops.rvv_attn``
directly, so it behaves the same whether or not a real sgl-kernel build
owns ``torch.ops.sgl_kernel``.

What it serves:

- decode and extend, with ``save_kv_cache`` on or off (decode writes the new
  token's K/V inside the kernel; extend writes through the pool's
  ``set_kv_buffer``, as SGLang's CPU backends do);
- each layer's sliding window (SGLang's ``sliding_window_size`` keys before
  the query, plus the query: ``window + 1`` in the kernels' terms) and
  attention sinks (the ``sinks`` keyword);
- encoder-decoder layers: cross attention reads the encoder's tokens through
  ``encoder_out_cache_loc``/``encoder_lens``; self attention skips them;
- encoder-only layers (no causal mask) without a cached prefix, through
  ``flash_attn_varlen_func``;
- MLA models on SGLang's MLA pool, whose value buffer is a view of the key
  buffer: the absorbed decode and the prefix-skipped prefill;
- hybrid sliding-window pools (``SWAKVPool``): a window layer's indices are
  translated into its own sub-pool;
- SGLang's CPU graph runner (``--enable-torch-compile``): its capture hooks,
  and its padding rows, which all write slot 0 (a call's repeated slots are
  written in batch order, last write wins, before any read).

- an fp8 KV cache (``--kv-cache-dtype fp8_e4m3``: SGLang's pool holds
  float8_e4m3fn codes, quantized with each layer's ``k_scale``/``v_scale``,
  1.0 when the checkpoint has none), through the ``*_fp8_cpu`` operators;
  the new tokens are quantized exactly as the pool's ``set_kv_buffer`` does.

- speculative decoding's target-verify batches (every request extends by
  its draft tokens; a token tree's ``custom_mask`` becomes the kernel's tree
  mask, as SGLang's CPU backend passes it when ``tree_topk != 1``) and the
  draft model's extend batches. That serves NGRAM, which has no draft model.
  EAGLE also needs multi-step draft decoding backends, which SGLang builds
  from a fixed table of its own backends (speculative/draft_utils.py): it
  refuses ``--attention-backend rvv`` for EAGLE at startup.

It refuses, with an error naming what is missing, an encoder-only layer with
a cached prefix. (SGLang's CPU path has no int8 pool, so the int8 operators
of ``torch.ops.rvv_attn`` have none to serve.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType
from sglang.srt.mem_cache.memory_pool import KVWriteLoc

from .. import ops, runtime_info

try:
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
except ImportError:  # an SGLang without hybrid sliding-window pools
    SWAKVPool = ()

if TYPE_CHECKING:
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

#: Decode splits per sequence (FlashDecoding): the ``attn_logits`` scratch is
#: ``[B, H, DECODE_SPLITS, Dv + 1]``. The kernel merges them itself; more
#: splits only help long contexts with few sequences.
DECODE_SPLITS = 8

logger = logging.getLogger("rvv_attn.sglang")


class RvvAttnBackend(AttentionBackend):
    """SGLang's ``AttentionBackend`` on ``torch.ops.rvv_attn``."""

    def __init__(self, model_runner) -> None:
        super().__init__()
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.use_mla = bool(getattr(model_runner, "use_mla_backend", False))
        self.hybrid_swa = isinstance(self.token_to_kv_pool, SWAKVPool) and self.token_to_kv_pool.swa_layer_nums > 0
        self.forward_metadata: ExtendMetadata | None = None
        self.swa_out_cache_loc: torch.Tensor | None = None
        self._swa_rows: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        # attn_logits scratch per (heads, Dv): the kernel writes every element
        # it reads, so it needs no zeroing and is reused, growing with B.
        self._decode_scratch: dict[tuple[int, int], torch.Tensor] = {}
        info = runtime_info()
        from . import process_summary

        logger.info(
            "rvv-attn: the rvv attention backend serves this model (kernel variant %s: %s); %s",
            info["active_variant"],
            info["reason"],
            process_summary(),
        )

    # ---- per-batch metadata ------------------------------------------------

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        mode = forward_batch.forward_mode
        if mode.is_target_verify():
            self.forward_metadata = ExtendMetadata.verify(forward_batch)
        elif mode.is_decode_or_idle():
            self.forward_metadata = None
        else:  # extend, mixed, split prefill, the draft model's extend
            self.forward_metadata = ExtendMetadata.of(forward_batch)
        self._bind_swa(forward_batch.out_cache_loc)

    def _bind_swa(self, out_cache_loc: torch.Tensor | None) -> None:
        self._swa_rows = None
        if self.hybrid_swa and out_cache_loc is not None:
            self.swa_out_cache_loc = self.token_to_kv_pool.translate_loc_from_full_to_swa(out_cache_loc)
        else:
            self.swa_out_cache_loc = None

    def _is_window_layer(self, layer: RadixAttention) -> bool:
        return self.hybrid_swa and bool(self.token_to_kv_pool.layers_mapping[layer.layer_id][1])

    def _window_pool_rows(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor):
        """This batch's ``req_to_token`` rows translated into the sliding-window sub-pool.

        ``req_to_token`` holds full-pool slots; a window layer's buffers are
        smaller, so its reads must go through the sub-pool's slot numbers.
        Returns the translated table and the ``req_pool_indices`` that address
        it (row b is sequence b). Computed once per forward pass.
        """
        if self._swa_rows is None:
            rows = self.req_to_token_pool.req_to_token[req_pool_indices, : int(seq_lens.max())]
            translated = self.token_to_kv_pool.translate_loc_from_full_to_swa(rows).to(torch.int32)
            self._swa_rows = (req_pool_indices, translated, torch.arange(rows.shape[0], dtype=torch.int64))
        return self._swa_rows[1], self._swa_rows[2]

    # ---- SGLang's CPU graph runner (torch.compile) ------------------------------

    def get_cpu_graph_seq_len_fill_value(self) -> int:
        # Padding rows get seq_len 1, out_cache_loc 0 and pool row 0: one key,
        # SGLang's reserved slot 0, written by every padding row.
        return 1

    def init_cpu_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def init_forward_metadata_capture_cpu_graph(
        self, bs, num_tokens, req_pool_indices, seq_lens, out_cache_loc, encoder_lens, forward_mode, spec_info
    ) -> None:
        # The runner captures decode only.
        self.forward_metadata = None
        self._bind_swa(out_cache_loc)

    # ---- forward -------------------------------------------------------------

    def forward_decode(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        sinks: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        key_buffer, value_buffer = self._buffers(layer)
        heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        output = q.new_empty((q.shape[0], heads * dv))
        cache_loc = forward_batch.encoder_out_cache_loc if layer.is_cross_attention else forward_batch.out_cache_loc
        req_to_token = self.req_to_token_pool.req_to_token
        req_pool_indices = forward_batch.req_pool_indices
        seq_lens = forward_batch.seq_lens  # int32 or int64: the kernels take either
        if self._is_window_layer(layer) and not layer.is_cross_attention:
            cache_loc = self.swa_out_cache_loc
            req_to_token, req_pool_indices = self._window_pool_rows(req_pool_indices, seq_lens)
        # The kernel writes this step's K/V itself (all writes before any read);
        # into an fp8 cache quantized as the pool's set_kv_buffer would.
        write = save_kv_cache and k is not None and v is not None
        arguments = (
            q.view(-1, heads, dk),
            key_buffer,
            value_buffer,
            output.view(-1, heads, dv),
            k if write else None,
            v if write else None,
            cache_loc,
            self._decode_logits(seq_lens.shape[0], heads, dv),
            req_to_token,
            req_pool_indices,
            seq_lens,
            layer.scaling,
            float(layer.logit_cap or 0.0),
        )
        options = (layer.is_cross_attention, _kernel_window(layer), forward_batch.encoder_lens, sinks)
        if key_buffer.dtype == torch.float8_e4m3fn:
            ops.decode_attention_fp8_cpu(*arguments, *_fp8_scales(layer), *options)
        else:
            ops.decode_attention_cpu(*arguments, *options)
        return output

    def forward_extend(
        self,
        q: torch.Tensor,
        k: torch.Tensor | None,
        v: torch.Tensor | None,
        layer: RadixAttention,
        forward_batch: ForwardBatch,
        save_kv_cache: bool = True,
        sinks: torch.Tensor | None = None,
        **kwargs,
    ) -> torch.Tensor:
        meta = self.forward_metadata
        if meta is None:
            raise RuntimeError("forward_extend before init_forward_metadata for an extend batch")
        key_buffer, value_buffer = self._buffers(layer)
        heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        output = q.new_empty((q.shape[0], heads * dv))
        fp8 = key_buffer.dtype == torch.float8_e4m3fn
        if save_kv_cache and k is not None and v is not None:
            if layer.is_cross_attention:
                where = KVWriteLoc(forward_batch.encoder_out_cache_loc)
            else:
                where = KVWriteLoc(forward_batch.out_cache_loc, self.swa_out_cache_loc)
            if fp8:
                # The pool quantizes: x / scale in x's dtype, then torch's conversion (None: scale 1). It
                # divides in place, and the kernel attends the new tokens as given: it gets copies.
                k_scale, v_scale = getattr(layer, "k_scale_float", None), getattr(layer, "v_scale_float", None)
                cache_k = k if k_scale is None else k.clone()
                cache_v = v if v_scale is None else v.clone()
                self.token_to_kv_pool.set_kv_buffer(layer, where, cache_k, cache_v, k_scale=k_scale, v_scale=v_scale)
            else:
                self.token_to_kv_pool.set_kv_buffer(layer, where, k, v)

        if layer.attn_type == AttentionType.ENCODER_ONLY and not layer.is_cross_attention:
            return self._encoder_only(q, k, v, layer, meta, output)

        req_to_token = self.req_to_token_pool.req_to_token
        req_pool_indices = forward_batch.req_pool_indices
        if self._is_window_layer(layer) and not layer.is_cross_attention:
            req_to_token, req_pool_indices = self._window_pool_rows(req_pool_indices, meta.seq_lens)
        new_k = None if k is None else k.view(-1, layer.tp_k_head_num, k.shape[-1])
        new_v = None if v is None else v.view(-1, layer.tp_v_head_num, v.shape[-1])
        arguments = (
            q.view(-1, heads, dk),
            new_k,
            new_v,
            output.view(-1, heads, dv),
            key_buffer,
            value_buffer,
            req_to_token,
            req_pool_indices,
            meta.seq_lens,
            meta.extend_seq_lens,
            meta.extend_start_loc,
            meta.max_extend_len,
            layer.scaling,
            float(layer.logit_cap or 0.0),
        )
        options = (layer.is_cross_attention, _kernel_window(layer), forward_batch.encoder_lens, sinks, meta.tree_mask)
        if fp8:
            # The new tokens are attended as given, the prefix as the cache holds it (as SGLang's CPU backend).
            ops.extend_attention_fp8_cpu(*arguments, *_fp8_scales(layer), *options)
        else:
            ops.extend_attention_cpu(*arguments, *options)
        return output

    def _encoder_only(self, q, k, v, layer, meta: ExtendMetadata, output: torch.Tensor) -> torch.Tensor:
        # Bidirectional attention among a sequence's new tokens: the varlen
        # kernel without its causal mask. A cached prefix would need keys the
        # varlen kernel cannot see.
        if bool((meta.prefix_lens != 0).any()):
            raise NotImplementedError(
                f"encoder-only layer {layer.layer_id}: a cached prefix (prefix lengths "
                f"{meta.prefix_lens.tolist()}) is not served; disable the radix cache (--disable-radix-cache)"
            )
        if k is None or v is None:
            raise ValueError(f"encoder-only layer {layer.layer_id}: k and v are required")
        cu_seqlens = torch.zeros(meta.extend_seq_lens.shape[0] + 1, dtype=torch.int32)
        torch.cumsum(meta.extend_seq_lens, 0, out=cu_seqlens[1:])
        heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
        result = ops.flash_attn_varlen_func(
            q.view(-1, heads, dk),
            k.view(-1, layer.tp_k_head_num, dk),
            v.view(-1, layer.tp_v_head_num, dv),
            cu_seqlens,
            cu_seqlens,
            meta.max_extend_len,
            meta.max_extend_len,
            False,
        )
        output.view(-1, heads, dv).copy_(result)
        return output

    def _buffers(self, layer: RadixAttention) -> tuple[torch.Tensor, torch.Tensor]:
        key_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        value_buffer = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        if key_buffer.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn):
            raise NotImplementedError(
                f"layer {layer.layer_id}: KV cache dtype {key_buffer.dtype} is not served by the rvv backend "
                "(float32, bfloat16, float16 and float8_e4m3fn are); start SGLang without --kv-cache-dtype, "
                "or with --kv-cache-dtype fp8_e4m3"
            )
        return key_buffer, value_buffer

    def _decode_logits(self, batch: int, heads: int, v_head_dim: int) -> torch.Tensor:
        scratch = self._decode_scratch.get((heads, v_head_dim))
        if scratch is None or scratch.shape[0] < batch:
            scratch = torch.empty((batch, heads, DECODE_SPLITS, v_head_dim + 1), dtype=torch.float32)
            self._decode_scratch[(heads, v_head_dim)] = scratch
        return scratch[:batch]

    def support_triton(self) -> bool:
        return False


def _fp8_scales(layer: RadixAttention) -> tuple[float, float]:
    # The layer's dequantization scales, 1.0 when the checkpoint has none (as SGLang's CPU backend passes them).
    return (getattr(layer, "k_scale_float", None) or 1.0, getattr(layer, "v_scale_float", None) or 1.0)


def _kernel_window(layer: RadixAttention) -> int:
    # SGLang's window counts the keys before the query; the kernels count the
    # query's own key too. -1 (no window) becomes 0, the kernels' "off".
    window = getattr(layer, "sliding_window_size", -1)
    return window + 1 if window is not None and window >= 0 else 0


@dataclass(frozen=True)
class ExtendMetadata:
    """What every layer of one extend batch shares."""

    seq_lens: torch.Tensor
    extend_seq_lens: torch.Tensor
    extend_start_loc: torch.Tensor
    prefix_lens: torch.Tensor
    max_extend_len: int
    tree_mask: torch.Tensor | None = None  # speculative verify: [B * L * L] bool, L draft tokens each

    @classmethod
    def of(cls, forward_batch: ForwardBatch) -> ExtendMetadata:
        extend_seq_lens = forward_batch.extend_seq_lens
        lengths = getattr(forward_batch, "extend_seq_lens_cpu", None)
        longest = max(lengths) if lengths else int(extend_seq_lens.max())
        prefix_lens = getattr(forward_batch, "extend_prefix_lens", None)
        return cls(
            seq_lens=forward_batch.seq_lens,
            extend_seq_lens=extend_seq_lens,
            extend_start_loc=forward_batch.extend_start_loc,
            prefix_lens=forward_batch.seq_lens - extend_seq_lens if prefix_lens is None else prefix_lens,
            max_extend_len=int(longest),
        )

    @classmethod
    def verify(cls, forward_batch: ForwardBatch) -> ExtendMetadata:
        """A target-verify batch carries no extend fields: every request extends by the draft's L tokens after
        its seq_lens committed ones (as SGLang's CPU backend derives them). A token tree (tree_topk != 1: EAGLE's
        topk > 1, NGRAM's -1) comes with spec_info.custom_mask, SGLang's CPU layout [B * L * L]; a chain
        (tree_topk 1) is the causal mask, and gets none."""
        spec = forward_batch.spec_info
        if spec is None:
            raise RuntimeError("a target-verify batch without spec_info: the draft tokens' count is unknown")
        draft, batch = int(spec.draft_token_num), forward_batch.batch_size
        committed = forward_batch.seq_lens.to(torch.int64)
        tree_mask = None
        if getattr(spec, "tree_topk", 1) != 1:
            custom_mask = getattr(spec, "custom_mask", None)
            if custom_mask is not None and custom_mask.numel() > 0:
                tree_mask = custom_mask
        return cls(
            seq_lens=committed + draft,
            extend_seq_lens=torch.full((batch,), draft, dtype=torch.int64),
            extend_start_loc=torch.arange(0, batch * draft, draft, dtype=torch.int64),
            prefix_lens=committed,
            max_extend_len=draft,
            tree_mask=tree_mask,
        )
