"""int8 KV cache cases for decode_attention_int8_cpu / extend_attention_int8_cpu, and how to call them."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

import opcall
import rvv_attn
from cases.decode import make_case
from cases.extend import Case as ExtendCase
from cases.noise import unit_normal
from reference import decode_attention as reference_decode
from reference import dequantize_int8, quantize_int8, write_kv_int8
from reference import extend_attention as reference_extend
from tolerances import assert_close_to_reference

DECODE = rvv_attn.ops.decode_attention_int8_cpu
EXTEND = rvv_attn.ops.extend_attention_int8_cpu
NAN = float("nan")
DYN = NAN  # k_scale / v_scale = NaN selects per-token scales


def is_dynamic(scale: float) -> bool:
    return math.isnan(scale)


def _rows(
    shape, scale: float, g: torch.Generator, magnitudes: bool, zero_rows: bool, unit_data: bool = False
) -> torch.Tensor:
    """Float rows for a cache or new tokens.

    Static scale s: N(0, 1) * 40 s, so int8 codes spread over ~[-127, 127]
    and the tails clamp. Dynamic: every row (token, head) gets its own
    magnitude, 10^U(-3, 0.5) with ``magnitudes`` (rows 3000x apart), else 1.
    ``zero_rows``: every 5th token's rows are all zero. ``unit_data``: N(0, 1)
    whatever the scale (a small static scale then clamps most codes).
    """
    x = unit_normal(*shape, generator=g)
    if unit_data:
        pass
    elif not is_dynamic(scale):
        x = x * (40 * scale)
    elif magnitudes:
        x = x * torch.pow(10.0, torch.rand(*shape[:-1], 1, generator=g) * 3.5 - 3)
    if zero_rows:
        x[::5] = 0
    return x


def call_int8(op, args: dict, new_slots) -> dict:
    """An int8 operator through opcall with its documented writes (the new tokens' rows and dynamic scales of
    float rows, the batch's output rows and attn_logits); ``new_slots`` must be where they go."""
    name = op._qualified_op_name.split("::")[-1] if hasattr(op, "_qualified_op_name") else str(op).split(".")[-1]
    writes = opcall.documented_writes(name, args)
    return opcall.call(op, args, writes)


# ---- decode ------------------------------------------------------------------------------------
@dataclass
class Int8Decode:
    case: object  # test_decode_attention.Case, its k/v buffers int8, key/value float or int8
    k_scale_buf: torch.Tensor
    v_scale_buf: torch.Tensor
    k_scale: float
    v_scale: float

    def run(self, **change) -> None:
        c = self.case
        args = dict(
            query=c.query,
            k_buffer=c.k_buffer,
            v_buffer=c.v_buffer,
            output=c.output,
            key=c.key,
            value=c.value,
            loc=c.loc,
            attn_logits=c.attn_logits,
            req_to_token=c.req_to_token,
            req_pool_indices=c.req_pool_indices,
            seq_lens=c.seq_lens,
            sm_scale=c.sm_scale,
            logit_cap=c.logit_cap,
            k_scale_buf=self.k_scale_buf,
            v_scale_buf=self.v_scale_buf,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )
        args.update(change)
        call_int8(DECODE, args, args["loc"])

    def expected(self, logit_cap: float | None = None):
        """(k cache, v cache, k scales, v scales, output float64) the operator must produce."""
        c = self.case
        k, v = c.k_buffer.clone(), c.v_buffer.clone()
        ks, vs = self.k_scale_buf.clone(), self.v_scale_buf.clone()
        write_kv_int8(k, ks, c.key, c.loc.tolist(), self.k_scale)
        write_kv_int8(v, vs, c.value, c.loc.tolist(), self.v_scale)
        out = reference_decode(
            c.query,
            dequantize_int8(k, ks, self.k_scale),
            dequantize_int8(v, vs, self.v_scale),
            c.req_to_token,
            c.req_pool_indices,
            c.seq_lens,
            c.sm_scale,
            c.logit_cap if logit_cap is None else logit_cap,
        )
        return k, v, ks, vs, out

    def check(self) -> None:
        k, v, ks, vs, out = self.expected()
        self.run()
        assert torch.equal(self.case.k_buffer, k), "k_buffer differs from the reference quantization"
        assert torch.equal(self.case.v_buffer, v), "v_buffer differs from the reference quantization"
        torch.testing.assert_close(self.k_scale_buf, ks, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(self.v_scale_buf, vs, rtol=0, atol=0, equal_nan=True)
        assert not torch.isnan(self.case.output).any(), "output has NaN: some row was not written"
        assert_close_to_reference(self.case.output, out)


def _quantized_cache(x: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """An int8 cache holding x, and its scale buffer (NaN everywhere in static mode: it must not be read)."""
    q, s = quantize_int8(x, None if is_dynamic(scale) else scale)
    s = s if is_dynamic(scale) else torch.full_like(s, NAN)
    # Contiguous, with a sentinel slot before and after (-128 / NaN): a store one slot off lands there.
    return opcall.embed(q, lead=(1, 0, 0)), opcall.embed(s, lead=(1, 0))


def int8_decode(
    lens,
    heads,
    heads_kv,
    head_dim,
    head_dim_v,
    dtype,
    k_scale,
    v_scale,
    splits=3,
    new_int8=False,
    magnitudes=False,
    zero_rows=False,
    logit_cap=0.0,
    seed=0,
    unit_data=False,
    padding=0,
    loc_slots=0,
) -> Int8Decode:
    c = make_case(
        lens,
        heads,
        heads_kv,
        head_dim,
        head_dim_v,
        dtype,
        splits,
        logit_cap=logit_cap,
        seed=seed,
        padding=padding,
        loc_slots=loc_slots,
    )
    g = torch.Generator().manual_seed(seed + 100)
    slots = c.k_buffer.shape[0]

    c.k_buffer, k_sb = _quantized_cache(
        _rows((slots, heads_kv, head_dim), k_scale, g, magnitudes, zero_rows, unit_data), k_scale
    )
    c.v_buffer, v_sb = _quantized_cache(
        _rows((slots, heads_kv, head_dim_v), v_scale, g, magnitudes, zero_rows, unit_data), v_scale
    )
    batch = c.query.shape[0]
    key = _rows((batch, heads_kv, head_dim), k_scale, g, magnitudes, zero_rows, unit_data).to(dtype)
    value = _rows((batch, heads_kv, head_dim_v), v_scale, g, magnitudes, zero_rows, unit_data).to(dtype)
    if new_int8:
        # Already quantized by the caller, who also stores dynamic scales.
        key, k_new = quantize_int8(key, None if is_dynamic(k_scale) else k_scale)
        value, v_new = quantize_int8(value, None if is_dynamic(v_scale) else v_scale)
        # In batch order: a slot named twice keeps its last row's scale, as it keeps its codes.
        for b, slot in enumerate(c.loc.tolist()):
            if is_dynamic(k_scale):
                k_sb[slot] = k_new[b]
            if is_dynamic(v_scale):
                v_sb[slot] = v_new[b]
    else:
        # Stale garbage where the new rows' scales go: they must be overwritten.
        k_sb[c.loc] = -5.0 if is_dynamic(k_scale) else NAN
        v_sb[c.loc] = -5.0 if is_dynamic(v_scale) else NAN
    c.key, c.value = key, value
    return Int8Decode(c, k_sb, v_sb, k_scale, v_scale)


# ---- extend ------------------------------------------------------------------------------------
@dataclass
class Int8Extend:
    case: ExtendCase  # built; k_buffer/v_buffer int8, k_extend/v_extend float or int8
    k_scale_buf: torch.Tensor
    v_scale_buf: torch.Tensor
    k_scale: float
    v_scale: float

    def args(self, **change) -> dict:
        a = dict(
            self.case.inputs,
            k_scale_buf=self.k_scale_buf,
            v_scale_buf=self.v_scale_buf,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )
        a.update(change)
        return a

    def new_slots(self) -> tuple[list[int], list[int]]:
        """(rows of k_extend, their cache slots req_to_token[row_b, prefix_b + i])."""
        a = self.case.inputs
        rows, slots = [], []
        for b in range(len(self.case.prefix)):
            pool = int(a["req_pool_indices"][b])
            for i in range(self.case.extend[b]):
                rows.append(int(a["extend_start_loc"][b]) + i)
                slots.append(int(a["req_to_token"][pool, self.case.prefix[b] + i]))
        return rows, slots

    def expected(self, logit_cap: float | None = None):
        a = self.case.inputs
        k, v = a["k_buffer"].clone(), a["v_buffer"].clone()
        ks, vs = self.k_scale_buf.clone(), self.v_scale_buf.clone()
        rows, slots = self.new_slots()
        write_kv_int8(k, ks, a["k_extend"][rows], slots, self.k_scale)
        write_kv_int8(v, vs, a["v_extend"][rows], slots, self.v_scale)
        kd, vd = dequantize_int8(k, ks, self.k_scale), dequantize_int8(v, vs, self.v_scale)
        if a["k_extend"].dtype == torch.int8:
            # int8 new tokens: the values the cache holds, with its scales.
            k_new = torch.zeros(a["k_extend"].shape, dtype=torch.float64)
            v_new = torch.zeros(a["v_extend"].shape, dtype=torch.float64)
            k_new[rows], v_new[rows] = kd[slots], vd[slots]
        else:
            # Float new tokens are attended as given; only later steps see them quantized.
            k_new, v_new = a["k_extend"].double(), a["v_extend"].double()
        out = reference_extend(
            a["q_extend"],
            k_new,
            v_new,
            kd,
            vd,
            a["req_to_token"],
            a["req_pool_indices"],
            a["seq_lens"],
            a["extend_seq_lens"],
            a["extend_start_loc"],
            a["sm_scale"],
            self.case.logit_cap if logit_cap is None else logit_cap,
        )
        return k, v, ks, vs, out

    def check(self, **change) -> torch.Tensor:
        k, v, ks, vs, ref = self.expected(change.get("logit_cap"))
        args = self.args(**change)
        call_int8(EXTEND, args, self.new_slots()[1])
        assert torch.equal(args["k_buffer"], k), "k_buffer differs from the reference quantization"
        assert torch.equal(args["v_buffer"], v), "v_buffer differs from the reference quantization"
        torch.testing.assert_close(args["k_scale_buf"], ks, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(args["v_scale_buf"], vs, rtol=0, atol=0, equal_nan=True)
        self.case.check(args["o_extend"], ref)
        return args["o_extend"]


def int8_extend(
    case: ExtendCase, k_scale, v_scale, new_int8=False, magnitudes=False, zero_rows=False, unit_data=False
) -> Int8Extend:
    """Turn a float extend case into an int8 one: its cache quantized, new-token slots in its map."""
    case = replace(case).build()
    a = case.inputs
    g = torch.Generator().manual_seed(case.seed + 200)
    # Room for the new tokens: fresh slots past the prefixes' ones.
    used = a["k_buffer"].shape[0]
    total_new = sum(case.extend)
    slots = used + total_new + 3
    hkv, d, dv = case.heads_kv, case.head_dim, case.head_dim_v
    a["k_buffer"], k_sb = _quantized_cache(
        _rows((slots, hkv, d), k_scale, g, magnitudes, zero_rows, unit_data), k_scale
    )
    a["v_buffer"], v_sb = _quantized_cache(
        _rows((slots, hkv, dv), v_scale, g, magnitudes, zero_rows, unit_data), v_scale
    )
    fresh = (used + torch.randperm(total_new + 3, generator=g)).tolist()
    for b in range(len(case.prefix)):
        pool = int(a["req_pool_indices"][b])
        for i in range(case.extend[b]):
            a["req_to_token"][pool, case.prefix[b] + i] = fresh.pop()
    tokens = a["q_extend"].shape[0]
    k_new = _rows((tokens, hkv, d), k_scale, g, magnitudes, zero_rows, unit_data).to(case.dtype)
    v_new = _rows((tokens, hkv, dv), v_scale, g, magnitudes, zero_rows, unit_data).to(case.dtype)
    t = Int8Extend(case, k_sb, v_sb, k_scale, v_scale)
    rows, new_slots = t.new_slots()
    if new_int8:
        k_new, k_s = quantize_int8(k_new, None if is_dynamic(k_scale) else k_scale)
        v_new, v_s = quantize_int8(v_new, None if is_dynamic(v_scale) else v_scale)
        # In row order: a slot named twice keeps its last row's scale, as it keeps its codes.
        for row, slot in zip(rows, new_slots):
            if is_dynamic(k_scale):
                k_sb[slot] = k_s[row]
            if is_dynamic(v_scale):
                v_sb[slot] = v_s[row]
    elif new_slots:
        k_sb[new_slots] = -5.0 if is_dynamic(k_scale) else NAN
        v_sb[new_slots] = -5.0 if is_dynamic(v_scale) else NAN
    if not case.strided:
        a["k_extend"], a["v_extend"] = k_new, v_new
    else:
        # Views inside sentinel-filled (NaN / -128) base tensors, as fused K/V rows.
        a["k_extend"] = opcall.embed(k_new, lead=(0, 0, 0), trail=(0, 0, dv))
        a["v_extend"] = opcall.embed(v_new, lead=(0, 0, d), trail=(0, 0, 0))
    return t
