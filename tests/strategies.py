"""Hypothesis strategies that build valid operator calls, and mutations that make them invalid."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from hypothesis import strategies as st

import opcall

FLOAT_DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@dataclass
class KvWriteCall:
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    loc: torch.Tensor
    outputs: tuple[str, ...] = field(default=("k_buffer", "v_buffer"))

    def args(self) -> dict[str, torch.Tensor]:
        return {
            "k_buffer": self.k_buffer,
            "v_buffer": self.v_buffer,
            "key": self.key,
            "value": self.value,
            "loc": self.loc,
        }


@st.composite
def kv_write_calls(draw, min_batch: int = 0) -> KvWriteCall:
    """Any valid decode_set_kv_buffer call: odd head dims, views, every float dtype."""
    batch = draw(st.integers(min_batch, 6))
    heads_kv = draw(st.integers(1, 4))
    # Dims around vector-register multiples at every VLEN (e16m8 at VLEN 128 is 64 lanes).
    dim = st.one_of(st.integers(1, 9), st.sampled_from([31, 32, 33, 63, 64, 65, 127, 128, 129, 257]))
    head_dim, head_dim_v = draw(dim), draw(dim)
    slots = draw(st.integers(max(batch, 1), 3 * batch + 4))
    dtype = draw(st.sampled_from(FLOAT_DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(dtype)

    pad = draw(st.integers(0, 3))  # > 0: the cache is a view into a wider, NaN-filled pool
    k_buffer = opcall.embed(randn(slots, heads_kv, head_dim), lead=(0, 0, pad), trail=(0, 0, 0))
    v_buffer = opcall.embed(randn(slots, heads_kv, head_dim_v), lead=(0, 0, 0), trail=(0, 0, pad))
    key = randn(batch, heads_kv, head_dim)
    value = randn(batch, heads_kv, head_dim_v)
    if draw(st.booleans()):
        loc = torch.randperm(slots, generator=g)[:batch].to(torch.int64)
    else:
        # Repeats allowed, as SGLang's padded batches and its tests draw loc: the last row naming a slot stays.
        loc = torch.randint(0, draw(st.integers(1, slots)), (batch,), generator=g)
    return KvWriteCall(k_buffer, v_buffer, key, value, loc)


def kv_write_mutations(call: KvWriteCall) -> dict[str, tuple[dict, str]]:
    """Named ways to break a valid call: replaced arguments and the error text they must cause."""
    slots = call.k_buffer.shape[0]
    batch = call.key.shape[0]
    muts: dict[str, tuple[dict, str]] = {
        "float64 key": ({"key": call.key.double()}, "key has dtype Double"),
        "float loc": ({"loc": call.loc.float()}, "loc must have dtype Int or Long"),
        "2-D key": ({"key": call.key.flatten(1)}, "key must be 3-D"),
        "extra head": ({"value": torch.cat([call.value, call.value[:, :1]], 1)}, "value.size(1)"),
        "longer loc": ({"loc": torch.arange(batch + 1, dtype=torch.int64)}, "loc.size(0)"),
        "wrong head dim": ({"key": torch.cat([call.key, call.key[:, :, :1]], 2)}, "key.size(2)"),
    }
    if batch:
        for name, slot in (("slot past the end", slots), ("negative slot", -1), ("huge slot", 2**40)):
            loc = call.loc.clone()
            loc[-1] = slot
            muts[name] = ({"loc": loc}, f"loc[{batch - 1}] = {slot} is outside")
    return muts


# ---- decode attention ----------------------------------------------------------------------------
# Lengths around the KV block sizes of every VLEN (16, 32, 64, 128 tokens per block).
BLOCK_EDGES = [1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 257]


@st.composite
def decode_cases(draw):
    """Any valid decode_attention_cpu call (built by the decode tests' make_case)."""
    from cases.decode import make_case

    batch = draw(st.integers(1, 4))
    lens = draw(st.lists(st.one_of(st.sampled_from(BLOCK_EDGES), st.integers(1, 300)), min_size=batch, max_size=batch))
    heads_kv = draw(st.integers(1, 3))
    group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    dim = st.one_of(st.integers(1, 9), st.sampled_from([31, 32, 33, 64, 80, 127, 128, 256]))
    head_dim, head_dim_v = draw(dim), draw(dim)
    return make_case(
        lens,
        heads_kv * group,
        heads_kv,
        head_dim,
        head_dim_v,
        draw(st.sampled_from(FLOAT_DTYPES)),
        draw(st.integers(1, 8)),
        map_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        strided=draw(st.booleans()),
        logit_cap=draw(st.sampled_from([0.0, 2.0, 30.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


def decode_mutation(case, data) -> str:
    """Break ``case`` in one drawn way (in place); return the error text it must cause."""
    batch = case.query.shape[0]
    b = data.draw(st.integers(0, batch - 1), label="sequence")
    row = int(case.req_pool_indices[b])
    slots = min(case.k_buffer.shape[0], case.v_buffer.shape[0])
    kind = data.draw(
        st.sampled_from(
            ["map entry", "pool row", "length", "negative length", "loc", "sm_scale", "logit_cap", "dtype"]
        ),
        label="mutation",
    )
    if kind == "map entry":
        t = data.draw(st.integers(0, int(case.seq_lens[b]) - 1), label="position")
        bad = data.draw(st.sampled_from([slots, slots + 12345, -1, -(2**31)]), label="entry")
        case.req_to_token[row, t] = bad
        return f"= {bad} is outside the KV cache"
    if kind == "pool row":
        bad = data.draw(st.sampled_from([case.req_to_token.shape[0], -1, 2**40]), label="row")
        case.req_pool_indices[b] = bad
        return f"req_pool_indices[{b}] = {bad} is outside"
    if kind == "length":
        bad = case.req_to_token.shape[1] + data.draw(st.integers(1, 1000), label="excess")
        case.seq_lens[b] = bad
        return f"seq_lens[{b}] = {bad} exceeds"
    if kind == "negative length":
        case.seq_lens[b] = -1
        return f"seq_lens[{b}] = -1 is negative"
    if kind == "loc":
        bad = data.draw(st.sampled_from([slots, -1, 2**62]), label="slot")
        case.loc[b] = bad
        return f"loc[{b}] = {bad} is outside"
    if kind == "sm_scale":
        case.sm_scale = data.draw(st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300]))
        return "sm_scale must be finite"
    if kind == "logit_cap":
        case.logit_cap = data.draw(st.sampled_from([-1.0, -1e-30, float("inf"), float("nan")]))
        return "logit_cap must be finite and >= 0"
    case.query = case.query.double()
    return "query has dtype Double"


# ---- extend attention ----------------------------------------------------------------------------
# Extend lengths around BLOCK_M / BLOCK_N of every VLEN (BLOCK_N 32..256, BLOCK_M 128..64) and the
# half key blocks (16..128) inside them.
EXTEND_EDGES = [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65]


@st.composite
def extend_cases(draw):
    """Any valid extend_attention_cpu call (built by the extend tests' Case)."""
    from cases.extend import Case

    batch = draw(st.integers(1, 3))
    lengths = st.one_of(st.sampled_from(EXTEND_EDGES), st.integers(0, 150))
    prefix = draw(st.lists(lengths, min_size=batch, max_size=batch))
    extend = draw(st.lists(lengths, min_size=batch, max_size=batch))
    heads_kv = draw(st.integers(1, 3))
    dim = st.one_of(st.integers(1, 9), st.sampled_from([31, 32, 33, 64, 80, 96, 128, 256]))
    return Case(
        prefix,
        extend,
        heads=heads_kv * draw(st.sampled_from([1, 2, 3, 8])),
        heads_kv=heads_kv,
        head_dim=draw(dim),
        head_dim_v=draw(dim),
        dtype=draw(st.sampled_from(FLOAT_DTYPES)),
        map_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        logit_cap=draw(st.sampled_from([0.0, 2.0])),
        strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    ).build()


def extend_mutation(case, data) -> tuple[dict, str]:
    """One drawn way to break ``case``: the replaced arguments and the error text they must cause."""
    a = case.inputs
    batch = len(case.prefix)
    b = data.draw(st.integers(0, batch - 1), label="sequence")
    slots = min(a["k_buffer"].shape[0], a["v_buffer"].shape[0])
    kinds = [
        "pool row",
        "extend longer than seq",
        "negative extend",
        "start past T",
        "max_len_extend",
        "sm_scale",
        "logit_cap",
        "dtype",
    ]
    if case.prefix[b]:
        kinds.append("map entry")
    kind = data.draw(st.sampled_from(kinds), label="mutation")
    if kind == "map entry":
        t = data.draw(st.integers(0, case.prefix[b] - 1), label="position")
        bad = data.draw(st.sampled_from([slots, -1, slots + 999]), label="entry")
        m = a["req_to_token"].clone()
        m[int(a["req_pool_indices"][b]), t] = bad
        return {"req_to_token": m}, f"= {bad} is outside the KV cache"
    if kind == "pool row":
        bad = data.draw(st.sampled_from([a["req_to_token"].shape[0], -1, 2**40]), label="row")
        rows = a["req_pool_indices"].clone()
        rows[b] = bad
        return {"req_pool_indices": rows}, f"req_pool_indices[{b}] = {bad} is outside"
    if kind == "extend longer than seq":
        ext = a["extend_seq_lens"].clone()
        ext[b] = int(a["seq_lens"][b]) + 1
        return {
            "extend_seq_lens": ext,
            "max_len_extend": max(int(ext.max()), a["max_len_extend"]),
        }, f"extend_seq_lens[{b}] = {int(ext[b])}"
    if kind == "negative extend":
        ext = a["extend_seq_lens"].clone()
        ext[b] = -1
        return {"extend_seq_lens": ext}, f"extend_seq_lens[{b}] = -1"
    if kind == "start past T":
        starts = a["extend_start_loc"].clone()
        starts[b] = a["q_extend"].shape[0] + data.draw(st.integers(0, 50), label="past")
        return {"extend_start_loc": starts}, f"extend_start_loc[{b}]"
    if kind == "max_len_extend":
        longest = int(a["extend_seq_lens"].max())
        if longest == 0:
            return {"max_len_extend": -1}, "max_len_extend"
        return {"max_len_extend": longest - 1}, "max_len_extend"
    if kind == "sm_scale":
        return {"sm_scale": data.draw(st.sampled_from([float("nan"), float("inf")]))}, "sm_scale"
    if kind == "logit_cap":
        return {"logit_cap": data.draw(st.sampled_from([-1.0, float("inf")]))}, "logit_cap"
    return {"q_extend": a["q_extend"].double()}, "q_extend has dtype Double"


# ---- int8 KV cache -------------------------------------------------------------------------------
# Scales: the static values and NaN (dynamic per-token scales), K and V drawn independently.
INT8_SCALES = [0.001, 0.01, 0.1, float("nan")]


@st.composite
def int8_decode_cases(draw):
    """Any valid decode_attention_int8_cpu call (built by test_int8_kv_cache.int8_decode), unit-scale data."""
    from cases.int8 import int8_decode

    batch = draw(st.integers(1, 3))
    lens = draw(st.lists(st.one_of(st.sampled_from(BLOCK_EDGES), st.integers(1, 150)), min_size=batch, max_size=batch))
    heads_kv = draw(st.integers(1, 3))
    dim = st.one_of(st.integers(1, 9), st.sampled_from([31, 32, 33, 64, 80, 128, 256]))
    return int8_decode(
        lens,
        heads_kv * draw(st.sampled_from([1, 2, 4])),
        heads_kv,
        draw(dim),
        draw(dim),
        draw(st.sampled_from(FLOAT_DTYPES)),
        draw(st.sampled_from(INT8_SCALES)),
        draw(st.sampled_from(INT8_SCALES)),
        splits=draw(st.integers(1, 4)),
        new_int8=draw(st.booleans()),
        zero_rows=draw(st.booleans()),
        logit_cap=draw(st.sampled_from([0.0, 2.0])),
        seed=draw(st.integers(0, 2**31 - 1)),
        unit_data=True,
    )


@st.composite
def int8_extend_cases(draw):
    """Any valid extend_attention_int8_cpu call (test_int8_kv_cache.int8_extend on an extend Case), unit-scale data."""
    from cases.extend import Case
    from cases.int8 import int8_extend

    batch = draw(st.integers(1, 3))
    lengths = st.one_of(st.sampled_from(EXTEND_EDGES), st.integers(0, 70))
    heads_kv = draw(st.integers(1, 3))
    dim = st.one_of(st.integers(1, 9), st.sampled_from([31, 32, 33, 64, 128, 256]))
    case = Case(
        draw(st.lists(lengths, min_size=batch, max_size=batch)),
        draw(st.lists(lengths, min_size=batch, max_size=batch)),
        heads=heads_kv * draw(st.sampled_from([1, 2, 4])),
        heads_kv=heads_kv,
        head_dim=draw(dim),
        head_dim_v=draw(dim),
        dtype=draw(st.sampled_from(FLOAT_DTYPES)),
        map_dtype=draw(st.sampled_from([torch.int32, torch.int64])),
        logit_cap=draw(st.sampled_from([0.0, 2.0])),
        strided=draw(st.booleans()),
        seed=draw(st.integers(0, 2**31 - 1)),
    )
    return int8_extend(
        case,
        draw(st.sampled_from(INT8_SCALES)),
        draw(st.sampled_from(INT8_SCALES)),
        new_int8=draw(st.booleans()),
        zero_rows=draw(st.booleans()),
        unit_data=True,
    )


# ---- explicit examples -----------------------------------------------------------------------------
class Deferred:
    """An @example argument built when the example runs, i.e. after kernel_variant selected a variant,
    so it can take its lengths from that variant's block."""

    def __init__(self, build, label: str):
        self.build, self.label = build, label

    def __repr__(self) -> str:
        return f"Deferred({self.label})"


def built(value):
    return value.build() if isinstance(value, Deferred) else value


def _block() -> int:
    import rvv_attn

    return int(rvv_attn.ops.decode_attention_blocking())


def decode_edge(head_dim: int, splits: int, logit_cap: float = 0.0) -> Deferred:
    """Decode at the active block's edges (k - 1, k, k + 1, 2k + 1 tokens)."""
    from cases.decode import make_case

    def build():
        k = _block()
        return make_case(
            [k - 1, k, k + 1, 2 * k + 1],
            2,
            1,
            head_dim,
            head_dim,
            torch.bfloat16,
            splits,
            strided=True,
            logit_cap=logit_cap,
            seed=head_dim + splits,
        )

    return Deferred(build, f"decode edges D={head_dim} splits={splits} cap={logit_cap}")


def extend_edge(head_dim: int) -> Deferred:
    """Extend with new-token counts crossing the active key block."""
    from cases.extend import Case

    def build():
        k = _block()
        return Case(
            [k - 1, 2 * k + 1],
            [2 * k + 1, k + 1],
            heads=2,
            heads_kv=1,
            head_dim=head_dim,
            head_dim_v=head_dim,
            strided=True,
            seed=head_dim,
        ).build()

    return Deferred(build, f"extend edges D={head_dim}")


def int8_decode_edge(head_dim: int, k_scale: float, v_scale: float) -> Deferred:
    from cases.int8 import int8_decode

    def build():
        k = _block()
        return int8_decode(
            [k - 1, 2 * k + 1],
            2,
            1,
            head_dim,
            head_dim,
            torch.float32,
            k_scale,
            v_scale,
            splits=2,
            magnitudes=True,
            seed=head_dim,
        )

    return Deferred(build, f"int8 decode edges D={head_dim} k_scale={k_scale} v_scale={v_scale}")


def int8_extend_edge(head_dim: int, k_scale: float, v_scale: float) -> Deferred:
    from cases.extend import Case
    from cases.int8 import int8_extend

    def build():
        k = _block()
        # sm_scale 0.5/sqrt(D): scores within the float32 budget of a dynamic K scale's extra rounding (see
        # test_block_boundaries.test_int8_extend_lengths_around_the_key_block; 7.1e-6 > 5e-6 at VLEN 512, D = 256).
        return int8_extend(
            Case(
                [k + 1, 0],
                [2 * k + 1, k - 1],
                heads=2,
                heads_kv=1,
                head_dim=head_dim,
                head_dim_v=head_dim,
                sm_scale=0.5 / math.sqrt(head_dim),
                seed=head_dim,
            ),
            k_scale,
            v_scale,
            magnitudes=True,
        )

    return Deferred(build, f"int8 extend edges D={head_dim} k_scale={k_scale} v_scale={v_scale}")
