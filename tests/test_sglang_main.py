"""SGLang main's attention contract: sliding window, sinks, encoder offset, cross attention, key/value None.

Every kernel result is compared with the float64 references in
reference.py (explicit visibility masks over decoder positions); every
call goes through opcall, so only the documented elements may change and a
refused call changes nothing. Window sizes are chosen around the active
variant's own block sizes (decode's KV block, extend's BLOCK_M / BLOCK_N),
where a range narrowed per split or per block could be off by one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import dataclass, field

import pytest
import torch

import opcall
import rvv_attn
from reference import decode_attention_options as reference_decode
from reference import extend_attention_options as reference_extend
from reference import quantize_int8
from tolerances import assert_close_to_reference

DYN = float("nan")


@dataclass
class Paged:
    """Requests in a paged cache laid out as SGLang does for encoder-decoder models.

    Row r of req_to_token holds the request's encoder tokens in columns
    [0, enc) and its decoder tokens in [enc, enc + len); slots are handed out
    shuffled. ``enc`` of all zeros is a decoder-only batch.
    """

    lens: list[int]
    enc: list[int]
    heads: int = 4
    heads_kv: int = 2
    head_dim: int = 32
    dtype: torch.dtype = torch.bfloat16
    seed: int = 0
    map_dtype: torch.dtype = torch.int32
    g: torch.Generator = field(init=False)

    def __post_init__(self) -> None:
        self.g = torch.Generator().manual_seed(self.seed)
        batch = len(self.lens)
        total = [e + n for e, n in zip(self.enc, self.lens)]
        self.num_slots = sum(total) + batch + 3
        free = torch.randperm(self.num_slots, generator=self.g).tolist()
        self.width = max(total) + 2
        self.req_to_token = torch.full((batch + 1, self.width), -1, dtype=self.map_dtype)
        self.req_pool_indices = torch.randperm(batch + 1, generator=self.g)[:batch].to(torch.int64)
        for b, n in enumerate(total):
            row = int(self.req_pool_indices[b])
            self.req_to_token[row, :n] = torch.tensor([free.pop() for _ in range(n)], dtype=self.map_dtype)
        self.spare = free
        self.k_buffer = self.randn(self.num_slots, self.heads_kv, self.head_dim)
        self.v_buffer = self.randn(self.num_slots, self.heads_kv, self.head_dim)
        self.encoder_lens = torch.tensor(self.enc, dtype=torch.int64)
        self.seq_lens = torch.tensor(self.lens, dtype=torch.int64)
        self.sm_scale = 1.0 / math.sqrt(self.head_dim)

    def randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=self.g).to(self.dtype)

    def sinks(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        # Sinks of the scores' size, so they move the result noticeably.
        return (torch.randn(self.heads, generator=self.g) * 2).to(dtype or self.dtype)


def decode_args(t: Paged, *, write: bool = True, splits: int = 3, **options) -> dict[str, object]:
    """A decode call whose new token (when ``write``) goes to the slot at the sequence's last position."""
    batch = len(t.lens)
    enc = options.get("encoder_lens")
    last = [(int(enc[b]) if enc is not None and b < enc.numel() else 0) + t.lens[b] - 1 for b in range(batch)]
    # (Clamped into the row: the calls meant to be refused may name columns past it.)
    loc = torch.tensor(
        [int(t.req_to_token[int(t.req_pool_indices[b]), min(max(last[b], 0), t.width - 1)]) for b in range(batch)]
    )
    args = dict(
        query=t.randn(batch, t.heads, t.head_dim),
        k_buffer=t.k_buffer,
        v_buffer=t.v_buffer,
        output=torch.empty(batch, t.heads, t.head_dim, dtype=t.dtype),
        key=t.randn(batch, t.heads_kv, t.head_dim) if write else None,
        value=t.randn(batch, t.heads_kv, t.head_dim) if write else None,
        loc=loc,
        attn_logits=torch.empty(batch, t.heads, splits, t.head_dim + 1),
        req_to_token=t.req_to_token,
        req_pool_indices=t.req_pool_indices,
        seq_lens=t.seq_lens,
        sm_scale=t.sm_scale,
        logit_cap=0.0,
    )
    args.update(options)
    return args


def run_decode(args: dict[str, object], name: str = "decode_attention_cpu") -> torch.Tensor:
    before = opcall.call_documented(name, args)
    window = args.get("sliding_window_size", -1)
    return reference_decode(
        args["query"],
        args["k_buffer"],
        args["v_buffer"],
        before["req_to_token"],
        before["req_pool_indices"],
        before["seq_lens"],
        args["sm_scale"],
        args["logit_cap"],
        window=window,
        sinks=args.get("sinks"),
        encoder_lens=args.get("encoder_lens"),
        cross=args.get("is_cross_attn", False),
    )


def extend_args(t: Paged, ext: list[int], **options) -> dict[str, object]:
    """An extend call whose last ext[b] decoder tokens of each request are new (their K/V already cached)."""
    tokens = sum(ext)
    ext_t = torch.tensor(ext, dtype=torch.int32)
    start = torch.cumsum(ext_t, 0, dtype=torch.int32) - ext_t
    k_extend, v_extend = t.randn(tokens, t.heads_kv, t.head_dim), t.randn(tokens, t.heads_kv, t.head_dim)
    args = dict(
        q_extend=t.randn(tokens, t.heads, t.head_dim),
        k_extend=k_extend,
        v_extend=v_extend,
        o_extend=torch.empty(tokens, t.heads, t.head_dim, dtype=t.dtype),
        k_buffer=t.k_buffer,
        v_buffer=t.v_buffer,
        req_to_token=t.req_to_token,
        req_pool_indices=t.req_pool_indices,
        seq_lens=t.seq_lens,
        extend_seq_lens=ext_t,
        extend_start_loc=start,
        max_len_extend=max(ext),
        sm_scale=t.sm_scale,
        logit_cap=0.0,
    )
    args.update(options)
    return args


def run_extend(args: dict[str, object], name: str = "extend_attention_cpu") -> torch.Tensor:
    before = opcall.call_documented(name, args)
    return reference_extend(
        before["q_extend"],
        before["k_extend"],
        before["v_extend"],
        before["k_buffer"],
        before["v_buffer"],
        before["req_to_token"],
        before["req_pool_indices"],
        before["seq_lens"],
        before["extend_seq_lens"],
        before["extend_start_loc"],
        args["sm_scale"],
        args["logit_cap"],
        window=args.get("sliding_window_size", -1),
        sinks=args.get("sinks"),
        encoder_lens=args.get("encoder_lens"),
        cross=args.get("is_cross_attn", False),
    )


def window_sizes(block: int, longest: int) -> list[int]:
    """W = 1, around one block, and longer than any sequence."""
    return sorted({1, max(block - 1, 1), block, block + 1, longest + 5})


# ---- decode -------------------------------------------------------------------------------------


def test_decode_sliding_window_at_block_boundaries(kernel_variant):
    block = int(rvv_attn.ops.decode_attention_blocking())
    lens = [2 * block + 3, block, 1, block + 1]
    t = Paged(lens=lens, enc=[0] * len(lens), seed=1)
    for window in window_sizes(block, max(lens)):
        args = decode_args(t, sliding_window_size=window)
        expected = run_decode(args)
        assert_close_to_reference(args["output"], expected)


@pytest.mark.parametrize("combo", ["window+sinks", "encoder+window", "encoder+sinks+window", "cross", "cross+sinks"])
def test_decode_options_combined(kernel_variant, combo):
    block = int(rvv_attn.ops.decode_attention_blocking())
    lens, enc = [block + 5, 3, 2 * block], [block + 2, 4, 0]
    t = Paged(lens=lens, enc=enc, heads=8, heads_kv=2, seed=2)
    options: dict[str, object] = {}
    if "window" in combo:
        options["sliding_window_size"] = block + 1
    if "sinks" in combo:
        options["sinks"] = t.sinks()
    if "encoder" in combo or "cross" in combo:
        options["encoder_lens"] = t.encoder_lens
    if "cross" in combo:
        options["is_cross_attn"] = True
    # Cross-attention layers pass no new K/V once the encoder's are cached.
    args = decode_args(t, write="cross" not in combo, **options)
    assert_close_to_reference(args["output"], run_decode(args))


def test_decode_cross_attention_over_no_encoder_token_gives_zeros(kernel_variant):
    t = Paged(lens=[4, 6], enc=[0, 5], seed=3)
    for sinks in (None, t.sinks(torch.float32)):
        args = decode_args(t, write=False, is_cross_attn=True, encoder_lens=t.encoder_lens, sinks=sinks)
        expected = run_decode(args)
        assert torch.equal(args["output"][0], torch.zeros_like(args["output"][0]))
        assert_close_to_reference(args["output"], expected)


def test_decode_sinks_match_softmax_with_a_dropped_column(kernel_variant):
    """float32 throughout, sinks far above and below the scores (the merge must not overflow)."""
    t = Paged(lens=[37, 9], enc=[0, 0], dtype=torch.float32, seed=4)
    sinks = torch.tensor([30.0, -30.0, 0.5, -0.5])
    args = decode_args(t, sinks=sinks)
    assert_close_to_reference(args["output"], run_decode(args))


# ---- extend -------------------------------------------------------------------------------------


def test_extend_sliding_window_at_block_boundaries(kernel_variant):
    block_m, block_n, _ = (int(x) for x in rvv_attn.ops.extend_attention_blocking(32, 32))
    lens = [block_n + block_m + 3, block_m + 1, 5]
    ext = [block_m + 2, block_m + 1, 2]
    t = Paged(lens=lens, enc=[0] * 3, seed=5)
    for window in window_sizes(block_n, max(lens)) + [block_m]:
        args = extend_args(t, ext, sliding_window_size=window)
        expected = run_extend(args)
        assert_close_to_reference(args["o_extend"], expected)


@pytest.mark.parametrize("combo", ["window+sinks", "encoder+window", "encoder+sinks", "cross", "cross+sinks"])
def test_extend_options_combined(kernel_variant, combo):
    block_m, block_n, _ = (int(x) for x in rvv_attn.ops.extend_attention_blocking(32, 32))
    lens, enc, ext = [block_m + block_n + 4, 6, block_m + 3], [3, 0, block_n + 1], [block_m + 1, 6, 2]
    t = Paged(lens=lens, enc=enc, heads=8, heads_kv=2, seed=6)
    options: dict[str, object] = {}
    if "window" in combo:
        options["sliding_window_size"] = block_m - 1
    if "sinks" in combo:
        options["sinks"] = t.sinks(torch.float32)
    if "encoder" in combo or "cross" in combo:
        options["encoder_lens"] = t.encoder_lens
    if "cross" in combo:
        options["is_cross_attn"] = True
    args = extend_args(t, ext, **options)
    if "cross" in combo:  # ignored in cross attention: SGLang may pass None
        args["k_extend"] = args["v_extend"] = None
    assert_close_to_reference(args["o_extend"], run_extend(args))


# ---- int8 caches --------------------------------------------------------------------------------


def _int8_cache(t: Paged) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """t's float cache quantized with dynamic per-(slot, head) scales: (k, v, k_scales, v_scales)."""
    k, ks = quantize_int8(t.k_buffer, None)
    v, vs = quantize_int8(t.v_buffer, None)
    return k, v, ks, vs


def test_int8_decode_and_extend_take_the_options(kernel_variant):
    block = int(rvv_attn.ops.decode_attention_blocking())
    t = Paged(lens=[block + 6, 5], enc=[4, 0], seed=7, dtype=torch.float32)
    k8, v8, ks, vs = _int8_cache(t)
    sinks = t.sinks()
    # The reference reads the dequantized cache; the new token's slot holds what the call writes.
    args = decode_args(t, sliding_window_size=block, sinks=sinks, encoder_lens=t.encoder_lens)
    args.update(k_buffer=k8, v_buffer=v8, k_scale_buf=ks, v_scale_buf=vs, k_scale=DYN, v_scale=DYN)
    opcall.call_documented("decode_attention_int8_cpu", args)
    k_deq, v_deq = k8.double() * ks.double()[..., None], v8.double() * vs.double()[..., None]
    expected = reference_decode(
        args["query"],
        k_deq,
        v_deq,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.sm_scale,
        0.0,
        window=block,
        sinks=sinks,
        encoder_lens=t.encoder_lens,
    )
    assert_close_to_reference(args["output"], expected)

    ext = [block + 1, 2]
    args = extend_args(t, ext, sliding_window_size=block - 1, sinks=sinks, encoder_lens=t.encoder_lens)
    args.update(k_buffer=k8, v_buffer=v8, k_scale_buf=ks, v_scale_buf=vs, k_scale=DYN, v_scale=DYN)
    before = opcall.call_documented("extend_attention_int8_cpu", args)
    # The new tokens are attended as given (float); the prefix through the int8 cache as it was.
    k_deq = before["k_buffer"].double() * before["k_scale_buf"].double()[..., None]
    v_deq = before["v_buffer"].double() * before["v_scale_buf"].double()[..., None]
    expected = reference_extend(
        args["q_extend"],
        args["k_extend"],
        args["v_extend"],
        k_deq,
        v_deq,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        args["extend_seq_lens"],
        args["extend_start_loc"],
        t.sm_scale,
        0.0,
        window=block - 1,
        sinks=sinks,
        encoder_lens=t.encoder_lens,
    )
    assert_close_to_reference(args["o_extend"], expected)


def test_int8_cross_attention_writes_nothing(kernel_variant):
    t = Paged(lens=[3, 2], enc=[7, 2], seed=8, dtype=torch.float32)
    k8, v8, ks, vs = _int8_cache(t)
    common = dict(
        k_buffer=k8,
        v_buffer=v8,
        k_scale_buf=ks,
        v_scale_buf=vs,
        k_scale=DYN,
        v_scale=DYN,
        is_cross_attn=True,
        encoder_lens=t.encoder_lens,
    )
    k_deq, v_deq = k8.double() * ks.double()[..., None], v8.double() * vs.double()[..., None]
    args = decode_args(t, write=False, **common)  # key/value None: opcall checks the caches stay as they were
    opcall.call_documented("decode_attention_int8_cpu", args)
    expected = reference_decode(
        args["query"],
        k_deq,
        v_deq,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.sm_scale,
        0.0,
        encoder_lens=t.encoder_lens,
        cross=True,
    )
    assert_close_to_reference(args["output"], expected)
    args = extend_args(t, [2, 1], **common)  # k_extend given, and ignored: no cache write either
    opcall.call_documented("extend_attention_int8_cpu", args)
    expected = reference_extend(
        args["q_extend"],
        None,
        None,
        k_deq,
        v_deq,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        args["extend_seq_lens"],
        args["extend_start_loc"],
        t.sm_scale,
        0.0,
        encoder_lens=t.encoder_lens,
        cross=True,
    )
    assert_close_to_reference(args["o_extend"], expected)


# ---- SGLang's own calling convention through torch.ops.sgl_kernel -----------------------------


def test_sgl_kernel_names_called_as_sglang_mains_backend_calls_them(kernel_variant):
    """int32 map, int64 lens, bf16 sinks [H], zeros encoder_lens (decoder-only), q viewed from [T, H * D]."""
    import rvv_attn.sglang

    assert set(rvv_attn.sglang.REGISTERED) >= {"decode_attention_cpu", "extend_attention_cpu"}
    sgl = torch.ops.sgl_kernel
    t = Paged(lens=[21, 8], enc=[0, 0], heads=8, heads_kv=2, seed=9)
    sinks = t.sinks(torch.bfloat16)
    zeros = torch.zeros(2, dtype=torch.int64)
    window = 7
    ext = [5, 8]
    a = extend_args(t, ext)
    # q, k and v as views of one fused projection [T, (H + 2 H_kv) * D], as SGLang's attention layers slice it.
    width = (t.heads + 2 * t.heads_kv) * t.head_dim
    qkv = t.randn(sum(ext), width)
    q = qkv[:, : t.heads * t.head_dim].view(sum(ext), t.heads, t.head_dim)
    k = qkv[:, t.heads * t.head_dim : (t.heads + t.heads_kv) * t.head_dim].view(sum(ext), t.heads_kv, t.head_dim)
    v = qkv[:, (t.heads + t.heads_kv) * t.head_dim :].view(sum(ext), t.heads_kv, t.head_dim)
    assert not (q.is_contiguous() or k.is_contiguous() or v.is_contiguous())
    a["k_extend"], a["v_extend"] = k, v
    sgl.extend_attention_cpu(
        q,
        a["k_extend"],
        a["v_extend"],
        a["o_extend"],
        t.k_buffer,
        t.v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        a["extend_seq_lens"],
        a["extend_start_loc"],
        max(ext),
        t.sm_scale,
        0.0,
        False,
        window + 1,
        zeros,
        sinks,
    )
    expected = reference_extend(
        q,
        a["k_extend"],
        a["v_extend"],
        t.k_buffer,
        t.v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        a["extend_seq_lens"],
        a["extend_start_loc"],
        t.sm_scale,
        0.0,
        window=window + 1,
        sinks=sinks,
        encoder_lens=zeros,
    )
    assert_close_to_reference(a["o_extend"], expected)

    d = decode_args(t, splits=8)
    # SGLang passes a non-contiguous query (a view of its qkv projection).
    qkv = t.randn(2, t.heads, 3 * t.head_dim)
    query = qkv[..., : t.head_dim]
    query.copy_(d["query"])
    sgl.decode_attention_cpu(
        query,
        t.k_buffer,
        t.v_buffer,
        d["output"],
        d["key"],
        d["value"],
        d["loc"],
        d["attn_logits"],
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.sm_scale,
        0.0,
        False,
        window + 1,
        zeros,
        sinks,
    )
    expected = reference_decode(
        query,
        t.k_buffer,
        t.v_buffer,
        t.req_to_token,
        t.req_pool_indices,
        t.seq_lens,
        t.sm_scale,
        0.0,
        window=window + 1,
        sinks=sinks,
        encoder_lens=zeros,
    )
    assert_close_to_reference(d["output"], expected)


@pytest.mark.variant_independent
def test_sgl_kernel_schemas_are_sglang_mains():
    import rvv_attn.sglang  # noqa: F401

    decode = torch.ops.sgl_kernel.decode_attention_cpu.default._schema
    names = [a.name for a in decode.arguments]
    assert names == [
        "query",
        "k_cache",
        "v_cahce",
        "output",
        "key",
        "value",
        "loc",
        "attn_logits",
        "req_to_token",
        "req_pool_indices",
        "seq_lens",
        "sm_scale",
        "logit_cap",
        "is_cross_attn",
        "sliding_window_size",
        "encoder_lens",
        "sinks",
    ]
    extend = torch.ops.sgl_kernel.extend_attention_cpu.default._schema
    assert [a.name for a in extend.arguments][:4] == ["q_extend", "k_extend", "v_extend", "o_extend"]
    # SGLang main's 19 (its last, tree_mask=None) and SGLang 0.5.23's is_causal=True.
    assert [a.name for a in extend.arguments][18:] == ["tree_mask", "is_causal"]
    assert str(extend.arguments[1].type) == "Optional[Tensor]"


@pytest.mark.host_only
def test_sglang_import_refuses_when_sgl_kernel_defines_a_name():
    """A real sgl-kernel build loaded first: the import names the clash and registers nothing."""
    script = (
        "import torch\n"
        "lib = torch.library.Library('sgl_kernel', 'DEF')\n"
        "lib.define('extend_attention_cpu(Tensor q) -> ()')\n"
        "import rvv_attn\n"
        "try:\n"
        "    import rvv_attn.sglang\n"
        "except RuntimeError as err:\n"
        "    print('refused:', err)\n"
        "print('decode registered:', hasattr(torch.ops.sgl_kernel, 'decode_attention_cpu'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert "refused:" in out and "sgl_kernel.extend_attention_cpu is already defined" in out
    assert "decode registered: False" in out


@pytest.mark.variant_independent
def test_sgl_kernel_names_have_no_fake_so_sglangs_graph_runner_can_register_its_own():
    """SGLang's CPU graph runner calls torch.library.register_fake("sgl_kernel::<name>") itself, which raises if a
    fake or Meta kernel exists. (rvv_attn's own names have fakes: tests/test_opcheck.py.)"""
    import rvv_attn.sglang

    def fake(*args, **kwargs):
        return None

    scope = torch.library.Library("sgl_kernel", "FRAGMENT")
    try:
        for name in rvv_attn.sglang.REGISTERED:
            torch.library.register_fake(f"sgl_kernel::{name}", fake, lib=scope)
    finally:
        scope._destroy()
    # Destroying the scope took the fakes away again: the next registration (another test, SGLang) works too.
    scope = torch.library.Library("sgl_kernel", "FRAGMENT")
    try:
        torch.library.register_fake("sgl_kernel::decode_attention_cpu", fake, lib=scope)
    finally:
        scope._destroy()


def _child(script: str) -> dict:
    """Run ``script`` in a fresh interpreter (registering operator names is process-wide) and return the JSON it
    prints last."""
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    return json.loads(child.stdout.strip().splitlines()[-1])


# A real sgl-kernel build loaded first, simulated: two of the names defined by another library, with its own
# schemas and CPU kernels.
_OTHER_LIBRARY = """
import json, torch
other = torch.library.Library("sgl_kernel", "DEF")
other.define("extend_attention_cpu(Tensor q) -> ()")
other.define("store_cache_cpu(Tensor k) -> ()")
other.impl("extend_attention_cpu", lambda q: None, "CPU")
other.impl("store_cache_cpu", lambda k: None, "CPU")
import rvv_attn
"""


@pytest.mark.host_only
def test_absent_names_are_registered_beside_another_library_in_a_fresh_process():
    out = _child(
        _OTHER_LIBRARY
        + """
served, skipped = torch.ops.rvv_attn.register_absent_sglang_names()
again = torch.ops.rvv_attn.register_absent_sglang_names()
try:
    import rvv_attn.sglang
    strict = "registered"
except RuntimeError as err:
    strict = str(err)
print(json.dumps(dict(
    served=list(served), skipped=list(skipped), again=[list(again[0]), list(again[1])], strict=strict,
    extend=str(torch.ops.sgl_kernel.extend_attention_cpu.default._schema),
    decode=[a.name for a in torch.ops.sgl_kernel.decode_attention_cpu.default._schema.arguments][:3],
    int8=hasattr(torch.ops.sgl_kernel, "extend_attention_int8_cpu"),
)))
"""
    )
    # The other library owns extend_attention_cpu, so rvv-attn adds no overload to it either.
    assert out["skipped"] == ["extend_attention_cpu", "extend_attention_cpu.kv_scales", "store_cache_cpu"]
    assert out["served"] == [
        "decode_attention_cpu",
        "decode_attention_cpu.kv_scales",
        "flash_attn_varlen_func",
        "decode_attention_int8_cpu",
        "extend_attention_int8_cpu",
    ]
    assert out["again"] == [out["served"], out["skipped"]], "a second call must report the same and register nothing"
    # The other library's operators are untouched; the absent ones are rvv-attn's.
    assert out["extend"] == "sgl_kernel::extend_attention_cpu(Tensor q) -> ()"
    assert out["decode"] == ["query", "k_cache", "v_cahce"] and out["int8"]
    # The strict registration (import rvv_attn.sglang) still refuses while another library holds a name.
    assert "sgl_kernel.extend_attention_cpu is already defined" in out["strict"]


@pytest.mark.host_only
@pytest.mark.parametrize("first", ["absent", "strict"])
def test_both_registrations_agree_when_no_other_library_is_loaded_in_a_fresh_process(first):
    absent = "list(map(list, torch.ops.rvv_attn.register_absent_sglang_names()))"
    strict = "list(torch.ops.rvv_attn.register_sglang_names())"
    calls = [absent, strict] if first == "absent" else [strict, absent]
    out = _child(f"import json, torch, rvv_attn\nprint(json.dumps([{calls[0]}, {calls[1]}]))\n")
    names = [
        "decode_attention_cpu",
        "decode_attention_cpu.kv_scales",
        "extend_attention_cpu",
        "extend_attention_cpu.kv_scales",
        "flash_attn_varlen_func",
        "store_cache_cpu",
        "decode_attention_int8_cpu",
        "extend_attention_int8_cpu",
    ]
    by_call = dict(zip([first, "strict" if first == "absent" else "absent"], out))
    assert by_call["absent"] == [names, []]
    assert by_call["strict"] == names


# ---- bad input: a clear error, nothing written ------------------------------------------------


def _refused(name: str, args: dict[str, object], match: str) -> None:
    with pytest.raises(RuntimeError, match=match):
        opcall.call_documented(name, args)


@pytest.mark.variant_independent
def test_bad_options_are_refused_before_anything_is_written():
    t = Paged(lens=[6, 4], enc=[2, 3], seed=10)
    sinks = t.sinks()
    cases = {
        "sinks of the wrong length": (dict(sinks=sinks[:3]), r"sinks.size\(0\) = 3 but the number of query heads"),
        "sinks of the wrong dtype": (dict(sinks=sinks.to(torch.float16)), r"sinks has dtype Half"),
        "sinks not finite": (dict(sinks=torch.tensor([0.0, float("inf"), 0.0, 0.0])), r"sinks\[1\] = inf"),
        "negative encoder length": (dict(encoder_lens=torch.tensor([2, -1])), r"encoder_lens\[1\] = -1 is negative"),
        "encoder length past the row": (
            dict(encoder_lens=torch.tensor([2, t.width])),
            r"encoder_lens\[1\] \+ .*\[1\] = .* exceeds req_to_token.size\(1\)",
        ),
        "encoder_lens of the wrong size": (dict(encoder_lens=torch.tensor([2])), r"encoder_lens.size\(0\) = 1"),
        "cross attention without encoder_lens": (dict(is_cross_attn=True), r"is_cross_attn=True needs encoder_lens"),
        "cross attention with a window": (
            dict(is_cross_attn=True, encoder_lens=t.encoder_lens, sliding_window_size=4),
            r"a sliding window applies to self attention",
        ),
    }
    for options, match in cases.values():
        args = decode_args(t, **options)
        args["loc"] = torch.tensor(t.spare[:2])  # valid slots whatever the options claim
        _refused("decode_attention_cpu", args, match)
        _refused("extend_attention_cpu", extend_args(t, [2, 1], **options), match)
    args = decode_args(t)
    args["value"] = None
    _refused("decode_attention_cpu", args, r"key and value must both be given or both be None")
    args = extend_args(t, [2, 1])
    args["k_extend"] = None
    _refused("extend_attention_cpu", args, r"k_extend and v_extend are required unless is_cross_attn=True")
    # A map entry in the encoder's columns out of range: found, though only the offset makes it reachable.
    bad = t.req_to_token.clone()
    bad[int(t.req_pool_indices[1]), 1] = t.num_slots
    _refused(
        "decode_attention_cpu",
        decode_args(t, req_to_token=bad, encoder_lens=t.encoder_lens, is_cross_attn=True, write=False),
        r"req_to_token\[.*is outside",
    )


def test_thirteen_argument_calls_still_work(kernel_variant):
    t = Paged(lens=[9, 3], enc=[0, 0], seed=11)
    args = decode_args(t)
    positional = [
        args[k]
        for k in (
            "query",
            "k_buffer",
            "v_buffer",
            "output",
            "key",
            "value",
            "loc",
            "attn_logits",
            "req_to_token",
            "req_pool_indices",
            "seq_lens",
            "sm_scale",
            "logit_cap",
        )
    ]
    rvv_attn.ops.decode_attention_cpu(*positional)
    expected = reference_decode(
        args["query"], t.k_buffer, t.v_buffer, t.req_to_token, t.req_pool_indices, t.seq_lens, t.sm_scale, 0.0
    )
    assert_close_to_reference(args["output"], expected)
