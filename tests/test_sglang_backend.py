"""The ``rvv`` attention backend driven by SGLang's own classes.

SGLang's ``ReqToTokenPool``, ``MHATokenToKVPool``/``MLATokenToKVPool``,
``ForwardBatch`` and ``RadixAttention`` layers run decode and extend
batches through the backend, and the outputs are compared with SGLang's
own ``torch_native`` backend on the same batches (and with the float64
references of tests/reference.py where torch_native has no counterpart:
attention sinks, MLA's prefix-skipped prefill). Needs SGLang's Python
package: the ``sglang`` marker, run by the test-sglang session.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

import reference
from cases.extend import token_tree_masks
from tolerances import TOLERANCES, assert_close_to_reference

pytestmark = pytest.mark.sglang


# How far SGLang's torch_native output may be from rvv's. Both are checked
# against the float64 reference too (tolerances.py), so this bound only has to
# cover torch_native's own error: in float32, SDPA's float32 accumulation
# (the same 5e-6 class as the kernels', doubled for two independent results)
# and one rounding each; in bfloat16, SDPA's CPU kernel also rounds the
# softmax weights P to bfloat16 before P @ V, each off by up to 2**-9
# relative, which moves an output by up to sum_i p_i |v_i| 2**-9 <= 2**-9
# max|v| (atol below, from the values the test drew), and the two outputs'
# roundings to bfloat16, half an ulp each: one ulp, 2**-7 relative.
def _backend_tolerance(dtype: torch.dtype, values: torch.Tensor) -> dict[str, float]:
    if dtype == torch.float32:
        return {"atol": 1e-5, "rtol": 2.0**-23}
    return {"atol": 2.0**-9 * float(values.abs().max()), "rtol": 2.0**-7}


POOL_ROWS = 6
CONTEXT = 96
SLOTS = 512


@pytest.fixture(scope="module")
def sgl() -> types.SimpleNamespace:
    """SGLang's modules the tests drive (an ImportError fails the test: the session provides SGLang)."""
    names = {
        "pools": "sglang.srt.mem_cache.memory_pool",
        "batch_info": "sglang.srt.model_executor.forward_batch_info",
        "radix": "sglang.srt.layers.radix_attention",
        "context": "sglang.srt.model_executor.forward_context",
        "native": "sglang.srt.layers.attention.torch_native_backend",
        "runtime": "sglang.srt.runtime_context",
    }
    ns = types.SimpleNamespace(**{key: importlib.import_module(module) for key, module in names.items()})
    from rvv_attn.sglang_plugin.backend import RvvAttnBackend

    ns.RvvAttnBackend = RvvAttnBackend
    return ns


class Setup:
    """Pools, a model runner stand-in as SGLang's backends read it, and both backends over copies of one cache."""

    def __init__(self, sgl, pool_kind: str, dtype: torch.dtype, layers, generator: torch.Generator):
        self.sgl, self.dtype, self.layers, self.gen = sgl, dtype, layers, generator
        self.req_to_token_pool = sgl.pools.ReqToTokenPool(
            size=POOL_ROWS, max_context_len=CONTEXT, device="cpu", enable_memory_saver=False
        )
        self.pool_kind = pool_kind
        self.pools = {name: self._make_pool() for name in ("rvv", "native")}
        for layer in layers:  # one cache content, copied into both pools
            rvv_k, rvv_v = self._buffers("rvv", layer)
            rvv_k.copy_(torch.randn(rvv_k.shape, generator=generator).to(dtype))
            if pool_kind == "mha":
                rvv_v.copy_(torch.randn(rvv_v.shape, generator=generator).to(dtype))
            native_k, native_v = self._buffers("native", layer)
            native_k.copy_(rvv_k)
            native_v.copy_(rvv_v)
        self.backends = {
            "rvv": sgl.RvvAttnBackend(self._runner("rvv")),
            "native": sgl.native.TorchNativeAttnBackend(self._runner("native")),
        }

    def _make_pool(self):
        layer = self.layers[0]
        if self.pool_kind == "mla":
            return self.sgl.pools.MLATokenToKVPool(
                size=SLOTS,
                page_size=1,
                dtype=self.dtype,
                kv_lora_rank=layer.v_head_dim,
                qk_rope_head_dim=layer.qk_head_dim - layer.v_head_dim,
                layer_num=len(self.layers),
                device="cpu",
                enable_memory_saver=False,
            )
        return self.sgl.pools.MHATokenToKVPool(
            size=SLOTS,
            page_size=1,
            dtype=self.dtype,
            head_num=layer.tp_k_head_num,
            head_dim=layer.qk_head_dim,
            layer_num=len(self.layers),
            device="cpu",
            enable_memory_saver=False,
            v_head_dim=layer.v_head_dim,
        )

    def _runner(self, name: str):
        return types.SimpleNamespace(
            device="cpu",
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool=self.pools[name],
            use_mla_backend=self.pool_kind == "mla",
        )

    def _buffers(self, name: str, layer):
        pool = self.pools[name]
        return pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)

    def place(self, prefix_lens: list[int], new_lens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Give each sequence a pool row and distinct slots (slot 0 stays SGLang's padding slot).

        Returns (req_pool_indices, out_cache_loc): the rows, and the slots of the new tokens in batch order.
        """
        rows = torch.randperm(POOL_ROWS, generator=self.gen)[: len(prefix_lens)] + 1
        slots = torch.randperm(SLOTS - 1, generator=self.gen) + 1
        out, used = [], 0
        for row, prefix, new in zip(rows.tolist(), prefix_lens, new_lens):
            mine = slots[used : used + prefix + new]
            used += prefix + new
            self.req_to_token_pool.req_to_token[row, : prefix + new] = mine.to(torch.int32)
            out.append(mine[prefix:])
        return rows.to(torch.int64), torch.cat(out).to(torch.int64)

    def batch(self, mode: str, prefix_lens: list[int], new_lens: list[int]):
        batch_info = self.sgl.batch_info
        rows, out_cache_loc = self.place(prefix_lens, new_lens)
        seq_lens = torch.tensor([p + n for p, n in zip(prefix_lens, new_lens)], dtype=torch.int64)
        tokens = sum(new_lens)
        forward_mode = batch_info.ForwardMode.DECODE if mode == "decode" else batch_info.ForwardMode.EXTEND
        fb = batch_info.ForwardBatch(
            forward_mode=forward_mode,
            batch_size=len(prefix_lens),
            input_ids=torch.zeros(tokens, dtype=torch.int64),
            req_pool_indices=rows,
            seq_lens=seq_lens,
            out_cache_loc=out_cache_loc,
            seq_lens_sum=int(seq_lens.sum()),
        )
        fb.seq_lens_cpu = seq_lens.clone()
        if mode == "extend":
            new = torch.tensor(new_lens, dtype=torch.int64)
            fb.extend_seq_lens = new.to(torch.int32)
            fb.extend_prefix_lens = torch.tensor(prefix_lens, dtype=torch.int32)
            fb.extend_start_loc = (torch.cumsum(new, 0) - new).to(torch.int32)
            fb.extend_seq_lens_cpu = list(new_lens)
            fb.extend_prefix_lens_cpu = list(prefix_lens)
        return fb

    def run(self, name: str, layer, fb, q, k, v, **kwargs) -> torch.Tensor:
        backend = self.backends[name]
        backend.init_forward_metadata(fb)
        ctx = self.sgl.context.ForwardContext(attn_backend=backend)
        with self.sgl.context.forward_context(ctx):
            return layer(q, k, v, fb, **kwargs)


def _layer(sgl, layer_id: int, heads: int, kv_heads: int, head_dim: int, v_head_dim: int | None = None, **kw):
    return sgl.radix.RadixAttention(
        num_heads=heads,
        head_dim=head_dim,
        scaling=head_dim**-0.5,
        num_kv_heads=kv_heads,
        layer_id=layer_id,
        v_head_dim=v_head_dim if v_head_dim is not None else -1,
        **kw,
    )


def _inputs(setup: Setup, layer, tokens: int):
    gen, dtype = setup.gen, setup.dtype
    q = torch.randn(tokens, layer.tp_q_head_num * layer.qk_head_dim, generator=gen).to(dtype)
    k = torch.randn(tokens, layer.tp_k_head_num * layer.qk_head_dim, generator=gen).to(dtype)
    v = torch.randn(tokens, layer.tp_v_head_num * layer.v_head_dim, generator=gen).to(dtype)
    return q, k, v


def _assert_backends_agree(rvv: torch.Tensor, native: torch.Tensor, values: torch.Tensor) -> None:
    assert rvv.shape == native.shape
    torch.testing.assert_close(rvv.double(), native.double(), **_backend_tolerance(rvv.dtype, values))


def _reference(setup: Setup, layer, fb, q, k, v, sinks=None) -> torch.Tensor:
    """The float64 reference of one layer call, read from the rvv pool after the call (new K/V written)."""
    key_buffer, value_buffer = setup._buffers("rvv", layer)
    window = layer.sliding_window_size + 1 if layer.sliding_window_size >= 0 else -1
    heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
    common = dict(window=window, sinks=sinks)
    req_to_token = setup.req_to_token_pool.req_to_token
    if fb.forward_mode.is_decode():
        return reference.decode_attention_options(
            q.view(-1, heads, dk),
            key_buffer,
            value_buffer,
            req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            layer.scaling,
            0.0,
            **common,
        )
    return reference.extend_attention_options(
        q.view(-1, heads, dk),
        k.view(-1, layer.tp_k_head_num, dk),
        v.view(-1, layer.tp_v_head_num, dv),
        key_buffer,
        value_buffer,
        req_to_token,
        fb.req_pool_indices,
        fb.seq_lens,
        fb.extend_seq_lens,
        fb.extend_start_loc,
        layer.scaling,
        0.0,
        **common,
    )


def _check(setup: Setup, layer, fb, q, k, v, outputs: dict[str, torch.Tensor]) -> None:
    heads, dv = layer.tp_q_head_num, layer.v_head_dim
    assert_close_to_reference(outputs["rvv"].view(-1, heads, dv), _reference(setup, layer, fb, q, k, v))
    _assert_backends_agree(outputs["rvv"], outputs["native"], setup._buffers("native", layer)[1])


MHA_LAYERS = {  # (heads, kv_heads, head_dim, extra RadixAttention arguments)
    "gqa": (4, 2, 64, {}),
    "window": (4, 2, 64, {"sliding_window_size": 5}),
    "mha_d128": (2, 2, 128, {}),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("kind", sorted(MHA_LAYERS))
@pytest.mark.parametrize("save_kv_cache", [True, False], ids=["save", "nosave"])
def test_extend_matches_torch_native(sgl, kind, dtype, save_kv_cache):
    heads, kv_heads, head_dim, extra = MHA_LAYERS[kind]
    layer = _layer(sgl, 0, heads, kv_heads, head_dim, **extra)
    setup = Setup(sgl, "mha", dtype, [layer], torch.Generator().manual_seed(7))
    prefix_lens, new_lens = [0, 9, 30], [5, 12, 3]
    fb = setup.batch("extend", prefix_lens, new_lens)
    q, k, v = _inputs(setup, layer, sum(new_lens))
    outputs = {}
    for name in ("rvv", "native"):
        if not save_kv_cache:  # torch_native reads new tokens from the cache: write them as SGLang would
            setup.pools[name].set_kv_buffer(
                layer,
                sgl.pools.KVWriteLoc(fb.out_cache_loc),
                k.view(-1, kv_heads, head_dim),
                v.view(-1, kv_heads, head_dim),
            )
        outputs[name] = setup.run(name, layer, fb, q, k, v, save_kv_cache=save_kv_cache)
    _check(setup, layer, fb, q, k, v, outputs)
    rvv_k, rvv_v = setup._buffers("rvv", layer)
    assert torch.equal(rvv_k[fb.out_cache_loc].flatten(1), k) and torch.equal(rvv_v[fb.out_cache_loc].flatten(1), v)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("kind", sorted(MHA_LAYERS))
def test_decode_matches_torch_native(sgl, kind, dtype):
    heads, kv_heads, head_dim, extra = MHA_LAYERS[kind]
    layer = _layer(sgl, 0, heads, kv_heads, head_dim, **extra)
    setup = Setup(sgl, "mha", dtype, [layer], torch.Generator().manual_seed(11))
    prefix_lens = [1, 17, 40, 6]
    fb = setup.batch("decode", prefix_lens, [1] * len(prefix_lens))
    q, k, v = _inputs(setup, layer, len(prefix_lens))
    outputs = {name: setup.run(name, layer, fb, q, k, v) for name in ("rvv", "native")}
    _check(setup, layer, fb, q, k, v, outputs)
    for name in ("rvv", "native"):  # both wrote the new token's K/V where SGLang said
        key_buffer, value_buffer = setup._buffers(name, layer)
        assert torch.equal(key_buffer[fb.out_cache_loc].flatten(1), k)
        assert torch.equal(value_buffer[fb.out_cache_loc].flatten(1), v)


def test_two_layers_one_batch(sgl):
    """A window layer beside a full one, in one pool and one batch, as a model's layers share them."""
    layers = [_layer(sgl, 0, 4, 2, 64), _layer(sgl, 1, 4, 2, 64, sliding_window_size=3)]
    setup = Setup(sgl, "mha", torch.bfloat16, layers, torch.Generator().manual_seed(3))
    fb = setup.batch("decode", [12, 25], [1, 1])
    for layer in layers:
        q, k, v = _inputs(setup, layer, 2)
        outputs = {name: setup.run(name, layer, fb, q, k, v) for name in ("rvv", "native")}
        _check(setup, layer, fb, q, k, v, outputs)


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_sinks_layer_matches_reference(sgl, mode):
    """torch_native takes no sinks, so the float64 reference stands in for it here."""
    layer = _layer(sgl, 0, 4, 2, 64)
    setup = Setup(sgl, "mha", torch.bfloat16, [layer], torch.Generator().manual_seed(5))
    prefix_lens = [3, 20]
    new_lens = [1, 1] if mode == "decode" else [4, 6]
    fb = setup.batch(mode, prefix_lens, new_lens)
    q, k, v = _inputs(setup, layer, sum(new_lens))
    sinks = torch.randn(4, generator=setup.gen)
    out = setup.run("rvv", layer, fb, q, k, v, sinks=sinks).view(-1, 4, 64)
    key_buffer, value_buffer = setup._buffers("rvv", layer)
    req_to_token = setup.req_to_token_pool.req_to_token
    if mode == "decode":
        ref = reference.decode_attention_options(
            q.view(-1, 4, 64),
            key_buffer,
            value_buffer,
            req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            layer.scaling,
            0.0,
            sinks=sinks,
        )
    else:
        ref = reference.extend_attention_options(
            q.view(-1, 4, 64),
            k.view(-1, 2, 64),
            v.view(-1, 2, 64),
            key_buffer,
            value_buffer,
            req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            fb.extend_seq_lens,
            fb.extend_start_loc,
            layer.scaling,
            0.0,
            sinks=sinks,
        )
    assert_close_to_reference(out, ref)
    without = setup.run("native", layer, fb, q, k, v).view(-1, 4, 64)
    assert (out.double() - without.double()).abs().max() > 1e-2, "the sinks changed nothing"


MLA_RANK, MLA_ROPE = 128, 64  # DeepSeek: 512 and 64; an MLA view is D = Dv + 64 (docs/sglang.md)


def test_mla_absorbed_decode_matches_torch_native(sgl):
    """DeepSeek's decode on SGLang's MLA pool: one latent KV head, V a view of K's first columns."""
    layer = _layer(sgl, 0, 8, 1, MLA_RANK + MLA_ROPE, v_head_dim=MLA_RANK)
    setup = Setup(sgl, "mla", torch.bfloat16, [layer], torch.Generator().manual_seed(13))
    fb = setup.batch("decode", [9, 33, 2], [1, 1, 1])
    q = torch.randn(3, 8 * (MLA_RANK + MLA_ROPE), generator=setup.gen).to(torch.bfloat16)
    k = torch.randn(3, MLA_RANK + MLA_ROPE, generator=setup.gen).to(torch.bfloat16)
    # The MLA pool's own write (torch_native's path) asks whether decode context
    # parallelism is on; a server publishes that, a single process states it.
    with sgl.runtime.get_parallel().override(dcp_enabled=False):
        outputs = {name: setup.run(name, layer, fb, q, k, k[:, :MLA_RANK]) for name in ("rvv", "native")}
    _check(setup, layer, fb, q, k, k[:, :MLA_RANK], outputs)
    key_buffer, _ = setup._buffers("rvv", layer)
    assert torch.equal(key_buffer[fb.out_cache_loc].flatten(1), k)


def test_mla_prefix_skipped_prefill_matches_reference(sgl):
    """DeepSeek's prefill without a prefix: per-head K/V (not the latent cache), nothing saved by attention."""
    heads, qk_dim, v_dim = 4, 48, 32
    latent = _layer(sgl, 0, 8, 1, MLA_RANK + MLA_ROPE, v_head_dim=MLA_RANK)
    setup = Setup(sgl, "mla", torch.bfloat16, [latent], torch.Generator().manual_seed(17))
    layer = _layer(sgl, 0, heads, heads, qk_dim, v_head_dim=v_dim)
    new_lens = [7, 3]
    fb = setup.batch("extend", [0, 0], new_lens)
    q = torch.randn(10, heads * qk_dim, generator=setup.gen).to(torch.bfloat16)
    k = torch.randn(10, heads * qk_dim, generator=setup.gen).to(torch.bfloat16)
    v = torch.randn(10, heads * v_dim, generator=setup.gen).to(torch.bfloat16)
    before = setup._buffers("rvv", latent)[0].clone()
    out = setup.run("rvv", layer, fb, q, k, v, save_kv_cache=False).view(10, heads, v_dim)
    ref = reference.flash_attn_varlen(
        q.view(10, heads, qk_dim),
        k.view(10, heads, qk_dim),
        v.view(10, heads, v_dim),
        torch.tensor([0, 7, 10]),
        torch.tensor([0, 7, 10]),
        causal=True,
    )
    assert_close_to_reference(out, ref)
    assert torch.equal(setup._buffers("rvv", latent)[0], before), "the latent cache was written"


@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_torch_compile_fullgraph_matches_eager(sgl, mode):
    """SGLang's CPU graph path compiles the model's forward; the backend's steps must trace without a break."""
    layer = _layer(sgl, 0, 4, 2, 64, sliding_window_size=6)
    setup = Setup(sgl, "mha", torch.float32, [layer], torch.Generator().manual_seed(19))
    new_lens = [1, 1, 1] if mode == "decode" else [3, 5, 2]
    fb = setup.batch(mode, [4, 0, 13], new_lens)
    q, k, v = _inputs(setup, layer, sum(new_lens))
    kv_shape = (-1, layer.tp_k_head_num, layer.qk_head_dim)
    backend = setup.backends["rvv"]
    backend.init_forward_metadata(fb)
    step = backend.forward_decode if mode == "decode" else backend.forward_extend

    def forward(q, k, v):
        return step(q, k.view(kv_shape), v.view(kv_shape), layer, fb)

    eager = forward(q, k, v)
    compiled = torch.compile(forward, fullgraph=True, backend="aot_eager")(q, k, v)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=0)


def test_cpu_graph_padded_decode_batch(sgl):
    """SGLang's CPU graph runner pads a short decode batch to a captured size with rows on pool row 0,
    seq_len 1 and out_cache_loc 0: every padding row writes slot 0. All writes land before any read,
    the last one wins, and the real rows are unaffected."""
    layer = _layer(sgl, 0, 4, 2, 64)
    setup = Setup(sgl, "mha", torch.bfloat16, [layer], torch.Generator().manual_seed(23))
    fb = setup.batch("decode", [8, 21], [1, 1])
    padding = 3
    fill = setup.backends["rvv"].get_cpu_graph_seq_len_fill_value()
    fb.batch_size = 2 + padding
    fb.req_pool_indices = torch.cat([fb.req_pool_indices, torch.zeros(padding, dtype=torch.int64)])
    fb.seq_lens = torch.cat([fb.seq_lens, torch.full((padding,), fill, dtype=torch.int64)])
    fb.out_cache_loc = torch.cat([fb.out_cache_loc, torch.zeros(padding, dtype=torch.int64)])
    fb.seq_lens_sum = int(fb.seq_lens.sum())
    q, k, v = _inputs(setup, layer, fb.batch_size)
    outputs = {name: setup.run(name, layer, fb, q, k, v) for name in ("rvv", "native")}
    _check(setup, layer, fb, q, k, v, outputs)
    key_buffer, value_buffer = setup._buffers("rvv", layer)
    assert torch.equal(key_buffer[0].flatten(), k[-1]) and torch.equal(value_buffer[0].flatten(), v[-1])


@pytest.mark.parametrize("model", ["llama", "gpt-oss"])
def test_demo_through_sglang_agrees_token_for_token(sgl, model, capsys):
    """The demo's model generates through SGLang's ForwardBatch, RadixAttention and pool (the backend
    'sglang') and through the demo's own backends; every request's tokens must be identical."""
    from rvv_attn import demo

    tiny = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "16"]
    tiny += ["--intermediate", "64", "--vocab", "64", "--requests", "3", "--prompt-lens", "9,2,13"]
    run = tiny + ["--new-tokens", "3,2,4", "--chunk-size", "4", "--max-running", "2", "--no-progress"]
    run += ["--model", model, "--window", "4", "--sglang"]
    assert demo.main(run) == 0, capsys.readouterr().out
    assert "(rvv, torch_native, sglang)" in capsys.readouterr().out


@pytest.mark.parametrize("mode", ["decode", "extend"])
@pytest.mark.parametrize("scales", [None, (0.05, 0.02)], ids=["scale1", "scaled"])
def test_fp8_pool_matches_its_reference_and_the_bf16_pool(sgl, mode, scales):
    """--kv-cache-dtype fp8_e4m3: SGLang's pool holds float8_e4m3fn codes (in uint8), quantized with the
    layer's k_scale/v_scale. The output is the float64 attention over the dequantized cache (the new tokens
    as given in extend), the new rows are the pool's own codes, and the output differs from the bf16 pool's
    by no more than the quantization moves the float64 reference."""
    layer = _layer(sgl, 0, 4, 2, 64)
    if scales is not None:
        layer.k_scale_float, layer.v_scale_float = scales
    k_scale, v_scale = scales or (1.0, 1.0)
    setups = {
        dtype: Setup(sgl, "mha", dtype, [layer], torch.Generator().manual_seed(29))
        for dtype in (torch.float8_e4m3fn, torch.bfloat16)
    }
    # One cache content: unit-normal bf16 values, and the pool's quantization of them (codes of ~20 sigma
    # with the small scales).
    values = torch.randn(
        setups[torch.bfloat16]._buffers("rvv", layer)[0].shape, generator=torch.Generator().manual_seed(3)
    )
    for i, scale in enumerate((k_scale, v_scale)):
        x = values.to(torch.bfloat16)
        setups[torch.bfloat16]._buffers("rvv", layer)[i].copy_(x)
        setups[torch.float8_e4m3fn]._buffers("rvv", layer)[i].copy_(reference.fp8_pool_quantize(x, scale))
    prefix_lens = [3, 40, 17]
    new_lens = [1, 1, 1] if mode == "decode" else [5, 2, 9]
    g = torch.Generator().manual_seed(31)
    q = torch.randn(sum(new_lens), 4 * 64, generator=g).to(torch.bfloat16)
    k = torch.randn(sum(new_lens), 2 * 64, generator=g).to(torch.bfloat16)
    v = torch.randn(sum(new_lens), 2 * 64, generator=g).to(torch.bfloat16)
    outputs, references = {}, {}
    for dtype, setup in setups.items():
        fb = setup.batch(mode, prefix_lens, new_lens)
        k_in, v_in = k.clone(), v.clone()
        outputs[dtype] = setup.run("rvv", layer, fb, q, k_in, v_in).view(-1, 4, 64)
        assert torch.equal(k_in, k) and torch.equal(v_in, v), "the backend changed the layer's k/v"
        key_buffer, value_buffer = setup._buffers("rvv", layer)
        if dtype == torch.float8_e4m3fn:
            # The new rows are the pool's codes for them, and the reference reads the cache's values.
            for buffer, new, scale in ((key_buffer, k, k_scale), (value_buffer, v, v_scale)):
                codes = reference.fp8_pool_quantize(new.view(-1, 2, 64), scale)
                assert torch.equal(buffer[fb.out_cache_loc].view(torch.uint8), codes.view(torch.uint8))
            key_buffer = key_buffer.to(torch.float64) * k_scale
            value_buffer = value_buffer.to(torch.float64) * v_scale
        references[dtype] = _reference_on(setup, layer, fb, q, k, v, key_buffer, value_buffer)
        assert_close_to_reference(outputs[dtype], references[dtype])
    fp8, bf16 = torch.float8_e4m3fn, torch.bfloat16
    quantization = (references[fp8] - references[bf16]).abs()
    assert quantization.max() > 0, "the fp8 cache holds the bf16 values exactly: nothing was quantized"
    # Each output is within bf16's tolerance of its own reference (checked above), so the two outputs differ by
    # at most what quantizing the cache moved the reference, plus both tolerances.
    tol = TOLERANCES[torch.bfloat16]
    slack = tol["rtol"] * (references[fp8].abs() + references[bf16].abs()) + 2 * tol["atol"]
    assert ((outputs[fp8].double() - outputs[bf16].double()).abs() <= quantization + slack).all()
    # e4m3 keeps 3 mantissa bits (each value within 2^-4 relative): scores of unit-normal q . k / 8 move by
    # about 2^-4 of their ~1 magnitude, outputs (convex combinations of unit-normal values) by as much: a
    # wrongly applied scale on either side would move them by far more.
    assert quantization.max() < 0.25, "quantizing unit-normal values by e4m3 moved the output by more than expected"


def _reference_on(setup: Setup, layer, fb, q, k, v, key_buffer, value_buffer) -> torch.Tensor:
    """_reference over the given cache buffers (an fp8 cache's values in float64)."""
    heads, dk, dv = layer.tp_q_head_num, layer.qk_head_dim, layer.v_head_dim
    req_to_token = setup.req_to_token_pool.req_to_token
    if fb.forward_mode.is_decode():
        return reference.decode_attention(
            q.view(-1, heads, dk),
            key_buffer,
            value_buffer,
            req_to_token,
            fb.req_pool_indices,
            fb.seq_lens,
            layer.scaling,
            0.0,
        )
    return reference.extend_attention_options(
        q.view(-1, heads, dk),
        k.view(-1, layer.tp_k_head_num, dk).double(),
        v.view(-1, layer.tp_v_head_num, dv).double(),
        key_buffer,
        value_buffer,
        req_to_token,
        fb.req_pool_indices,
        fb.seq_lens,
        fb.extend_seq_lens,
        fb.extend_start_loc,
        layer.scaling,
        0.0,
    )


@pytest.mark.parametrize("mode", ["decode", "extend"])
@pytest.mark.parametrize("cache", ["bf16", "fp8", "fp8-scaled"])
def test_sglangs_own_cpu_backend_drives_the_sgl_kernel_names(sgl, mode, cache, monkeypatch):
    """SGLang 0.5.23's IntelAMXAttnBackend, as shipped, calls torch.ops.sgl_kernel.decode_attention_cpu /
    extend_attention_cpu with its argument lists (the scales after the caches; tree_mask and is_causal last):
    `import rvv_attn.sglang` serves them. Its `import sgl_kernel` (a package with no riscv64 build) is given an
    empty module. With an fp8 pool it writes the cache itself, dividing the new K/V by the layer's scales in
    place, so extend's new tokens reach the kernel in the cache's units."""
    import sys

    import rvv_attn.sglang  # noqa: F401 - the sgl_kernel names

    monkeypatch.setitem(sys.modules, "sgl_kernel", types.ModuleType("sgl_kernel"))
    amx = importlib.import_module("sglang.srt.layers.attention.intel_amx_backend")
    dtype = torch.bfloat16 if cache == "bf16" else torch.float8_e4m3fn
    layer = _layer(sgl, 0, 4, 2, 64)
    k_scale, v_scale = (0.05, 0.02) if cache == "fp8-scaled" else (1.0, 1.0)
    if cache == "fp8-scaled":
        layer.k_scale_float, layer.v_scale_float = k_scale, v_scale
    setup = Setup(sgl, "mha", dtype, [layer], torch.Generator().manual_seed(37))
    runner = setup._runner("rvv")
    runner.model_config = types.SimpleNamespace(context_len=CONTEXT, num_attention_heads=4)
    # What a server publishes before building its backend, as a single CPU process without speculative decoding
    # reads it: one attention tensor-parallel rank, no draft tokens.
    monkeypatch.setattr(amx, "get_parallel", lambda: types.SimpleNamespace(attn_tp_size=1))
    monkeypatch.setattr(amx, "get_spec", lambda: types.SimpleNamespace(speculative_num_draft_tokens=None))
    setup.backends["amx"] = amx.IntelAMXAttnBackend(runner)
    prefix_lens = [4, 33, 12]
    new_lens = [1, 1, 1] if mode == "decode" else [6, 3, 8]
    fb = setup.batch(mode, prefix_lens, new_lens)
    g = torch.Generator().manual_seed(41)
    q = torch.randn(sum(new_lens), 4 * 64, generator=g).to(torch.bfloat16)
    k = torch.randn(sum(new_lens), 2 * 64, generator=g).to(torch.bfloat16)
    v = torch.randn(sum(new_lens), 2 * 64, generator=g).to(torch.bfloat16)
    out = setup.run("amx", layer, fb, q, k.clone(), v.clone()).view(-1, 4, 64)
    key_buffer, value_buffer = setup._buffers("rvv", layer)
    if dtype == torch.float8_e4m3fn:
        key_buffer, value_buffer = key_buffer.to(torch.float64) * k_scale, value_buffer.to(torch.float64) * v_scale
    # The new tokens as the kernel receives them: divided in bf16 by the pool, times the scale in the kernel.
    k_seen = k.clone().div_(k_scale).double() * k_scale if cache == "fp8-scaled" else k
    v_seen = v.clone().div_(v_scale).double() * v_scale if cache == "fp8-scaled" else v
    assert_close_to_reference(out, _reference_on(setup, layer, fb, q, k_seen, v_seen, key_buffer, value_buffer))


@pytest.mark.parametrize("tree", [True, False], ids=["tree", "chain"])
@pytest.mark.parametrize("cache", [torch.bfloat16, torch.float8_e4m3fn], ids=["bf16", "fp8"])
def test_target_verify_batch_with_a_token_tree(sgl, tree, cache):
    """Speculative decoding's verify step (NGRAM, EAGLE): SGLang hands a TARGET_VERIFY batch with no extend fields;
    each request extends by its L draft tokens after its committed ones. A token tree comes as spec_info's
    custom_mask in SGLang's CPU layout [B * L * L] (tree_topk != 1); a chain (tree_topk 1) is plain causal."""
    layer = _layer(sgl, 0, 4, 2, 64)
    setup = Setup(sgl, "mha", cache, [layer], torch.Generator().manual_seed(43))
    committed, draft = [5, 21, 12], 6
    fb = setup.batch("decode", committed, [draft] * 3)  # slots for the draft tokens; the mode set below
    fb.forward_mode = sgl.batch_info.ForwardMode.TARGET_VERIFY
    fb.seq_lens = torch.tensor(committed, dtype=torch.int64)  # SGLang's verify batch: the committed tokens
    g = torch.Generator().manual_seed(47)
    mask = token_tree_masks(3, draft, g)
    fb.spec_info = types.SimpleNamespace(
        draft_token_num=draft, tree_topk=2 if tree else 1, custom_mask=mask if tree else None
    )
    q = torch.randn(3 * draft, 4 * 64, generator=g).to(torch.bfloat16)
    k = torch.randn(3 * draft, 2 * 64, generator=g).to(torch.bfloat16)
    v = torch.randn(3 * draft, 2 * 64, generator=g).to(torch.bfloat16)
    out = setup.run("rvv", layer, fb, q, k, v).view(-1, 4, 64)
    key_buffer, value_buffer = setup._buffers("rvv", layer)
    if cache == torch.float8_e4m3fn:
        key_buffer, value_buffer = key_buffer.to(torch.float64), value_buffer.to(torch.float64)
    ref = reference.extend_attention_options(
        q.view(-1, 4, 64),
        k.view(-1, 2, 64).double(),
        v.view(-1, 2, 64).double(),
        key_buffer,
        value_buffer,
        setup.req_to_token_pool.req_to_token,
        fb.req_pool_indices,
        fb.seq_lens + draft,
        torch.full((3,), draft),
        torch.arange(0, 3 * draft, draft),
        layer.scaling,
        0.0,
        tree_mask=mask if tree else None,
    )
    assert_close_to_reference(out, ref)
