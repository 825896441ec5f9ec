"""The demo's ``sglang`` backend: the model's attention through SGLang's own classes.

Each batch the demo's engine prepares is restated as SGLang's
``ForwardBatch``; each attention layer is an SGLang ``RadixAttention``; the
KV cache is SGLang's ``MHATokenToKVPool`` (the demo's pool only hands out
slot numbers) and ``req_to_token`` is SGLang's ``ReqToTokenPool`` sharing
the demo's table. SGLang's ``RadixAttention.forward`` then calls the
``rvv`` backend (:mod:`rvv_attn.sglang_plugin.backend`), as it does in a server.
If its tokens match the demo's own backends, the path from SGLang's model
side to the kernels is the one the demo already proves.

Needs SGLang's Python package; float caches only (SGLang's CPU path has
no int8 cache).
"""

from __future__ import annotations

import importlib

import torch

from ..serving.backends import AttentionBackend, AttentionLayer, BackendUnavailableError
from ..serving.batch import ForwardBatch, ForwardMode
from ..serving.pools import Int8KVPool, KVPool, ReqToTokenPool


def _import_sglang():
    names = {
        "pools": "sglang.srt.mem_cache.memory_pool",
        "batch_info": "sglang.srt.model_executor.forward_batch_info",
        "radix": "sglang.srt.layers.radix_attention",
        "context": "sglang.srt.model_executor.forward_context",
    }
    try:
        return {key: importlib.import_module(module) for key, module in names.items()}
    except ImportError as error:
        raise BackendUnavailableError(
            f"attention backend 'sglang' needs SGLang's Python package ({error}); "
            "run the demo in the test-sglang environment, or choose 'rvv' or 'torch_native'"
        ) from error


class SGLangRadixBackend(AttentionBackend):
    """The demo's backend interface on top of SGLang's pools, ForwardBatch and RadixAttention."""

    name = "sglang"

    def __init__(self, num_heads: int, v_head_dim: int) -> None:
        super().__init__(num_heads, v_head_dim)
        self.sgl = _import_sglang()
        from .backend import RvvAttnBackend

        self._backend_class = RvvAttnBackend
        self._pools: tuple[ReqToTokenPool, KVPool] | None = None
        self._layers: dict[int, object] = {}
        self._batch: tuple[ForwardBatch, object] | None = None

    def _bind(self, batch: ForwardBatch) -> None:
        """SGLang's pools for the demo's, made on the first batch (the demo's pools are made before us)."""
        if self._pools is not None:
            return
        demo_rows, demo_kv = batch.req_to_token_pool, batch.token_to_kv_pool
        if isinstance(demo_kv, Int8KVPool):
            raise BackendUnavailableError("attention backend 'sglang': SGLang's CPU path has no int8 KV cache")
        pools = self.sgl["pools"]
        req_to_token_pool = pools.ReqToTokenPool(
            size=demo_rows.max_reqs, max_context_len=demo_rows.max_context_len, device="cpu", enable_memory_saver=False
        )
        # One table: the demo's engine writes the slots, SGLang's backend reads them.
        req_to_token_pool.req_to_token = demo_rows.req_to_token
        kv_pool = pools.MHATokenToKVPool(
            size=demo_kv.size,
            page_size=1,
            dtype=demo_kv.dtype,
            head_num=demo_kv.heads_kv,
            head_dim=demo_kv.head_dim,
            layer_num=demo_kv.num_layers,
            device="cpu",
            enable_memory_saver=False,
            v_head_dim=demo_kv.head_dim_v,
        )
        runner = type("ModelRunner", (), {})()
        runner.device, runner.use_mla_backend = "cpu", False
        runner.req_to_token_pool, runner.token_to_kv_pool = req_to_token_pool, kv_pool
        self.backend = self._backend_class(runner)
        self._pools = (demo_rows, demo_kv)

    def _radix(self, layer: AttentionLayer):
        radix = self._layers.get(layer.layer_id)
        if radix is None:
            radix = self.sgl["radix"].RadixAttention(
                num_heads=layer.num_heads,
                head_dim=layer.head_dim,
                scaling=layer.scaling,
                num_kv_heads=layer.num_kv_heads,
                layer_id=layer.layer_id,
                logit_cap=layer.logit_cap,
                v_head_dim=layer.v_head_dim,
                sliding_window_size=layer.sliding_window_size,
            )
            self._layers[layer.layer_id] = radix
        return radix

    def init_forward_metadata(self, batch: ForwardBatch) -> None:
        self._bind(batch)
        info = self.sgl["batch_info"]
        decode = batch.forward_mode is ForwardMode.DECODE
        fb = info.ForwardBatch(
            forward_mode=info.ForwardMode.DECODE if decode else info.ForwardMode.EXTEND,
            batch_size=batch.batch_size,
            input_ids=torch.zeros(batch.num_tokens, dtype=torch.int64),
            req_pool_indices=batch.req_pool_indices,
            seq_lens=batch.seq_lens,
            out_cache_loc=batch.out_cache_loc,
            seq_lens_sum=int(batch.seq_lens.sum()),
        )
        fb.positions = batch.positions
        if not decode:
            fb.extend_seq_lens = batch.extend_seq_lens
            fb.extend_prefix_lens = batch.extend_prefix_lens
            fb.extend_start_loc = batch.extend_start_loc
            fb.extend_seq_lens_cpu = batch.extend_seq_lens.tolist()
            fb.extend_prefix_lens_cpu = batch.extend_prefix_lens.tolist()
        self.backend.init_forward_metadata(fb)
        self._batch = (batch, fb)

    def forward(self, q, k, v, layer: AttentionLayer, batch: ForwardBatch, save_kv_cache: bool = True):
        if self._batch is None or self._batch[0] is not batch:
            self.init_forward_metadata(batch)
        fb = self._batch[1]
        extra = {} if layer.sinks is None else {"sinks": layer.sinks}
        context = self.sgl["context"]
        with context.forward_context(context.ForwardContext(attn_backend=self.backend)):
            out = self._radix(layer)(q.reshape(q.shape[0], -1), k, v, fb, save_kv_cache=save_kv_cache, **extra)
        return out.view(q.shape[0], -1)
