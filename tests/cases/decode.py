"""decode_attention_cpu cases: a paged batch with scattered slots, the float64 checks, the block size."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

import opcall
import rvv_attn
from cases.noise import unit_normal
from reference import decode_attention as reference_attention
from reference import decode_split_partials as reference_split_partials
from reference import write_kv as reference_write_kv
from tolerances import LSE_TOLERANCE, TOLERANCES, assert_close_to_reference

OP = rvv_attn.ops.decode_attention_cpu


def decode_block() -> int:
    """Tokens per KV block of the active variant's decode kernel (one online-softmax step)."""
    return int(rvv_attn.ops.decode_attention_blocking())


def expected_decode_block(variant: str) -> int:
    """The design's KV block: one float32 LMUL=4 vector, VLEN/32 * 4 tokens; the portable build uses vlen128's 16."""
    vlen = 128 if variant == "portable" else int(rvv_attn.runtime_info()["cpu_vlen"])
    assert variant in ("portable", f"vlen{vlen}")
    return vlen // 32 * 4


@dataclass
class Case:
    query: torch.Tensor
    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    output: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    loc: torch.Tensor
    attn_logits: torch.Tensor
    req_to_token: torch.Tensor
    req_pool_indices: torch.Tensor
    seq_lens: torch.Tensor
    sm_scale: float
    logit_cap: float
    extra: dict = field(default_factory=dict)
    before: dict | None = None  # the arguments as they were before the last run()

    def args(self) -> list:
        return [
            self.query,
            self.k_buffer,
            self.v_buffer,
            self.output,
            self.key,
            self.value,
            self.loc,
            self.attn_logits,
            self.req_to_token,
            self.req_pool_indices,
            self.seq_lens,
            self.sm_scale,
            self.logit_cap,
        ]

    def named_args(self) -> dict:
        return dict(zip(DECODE_ARGS, self.args()))

    def run(self) -> None:
        """Call the operator through opcall: the cache may change only at the loc rows."""
        self.before = opcall.call(OP, self.named_args(), decode_writes(self.named_args()))

    def _reference_inputs(self) -> tuple[dict, torch.Tensor, torch.Tensor]:
        """The inputs as they were before the call, and the cache after the reference KV write."""
        a = self.before or self.named_args()
        k, v = a["k_buffer"].clone(), a["v_buffer"].clone()
        reference_write_kv(k, v, a["key"], a["value"], a["loc"])
        return a, k, v

    def reference(self) -> torch.Tensor:
        """Expected output from the inputs as they were before the call: the KV write, then plain attention."""
        a, k, v = self._reference_inputs()
        return reference_attention(
            a["query"], k, v, a["req_to_token"], a["req_pool_indices"], a["seq_lens"], a["sm_scale"], a["logit_cap"]
        )

    def reference_splits(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Expected attn_logits contents: float64 partial outputs [B, H, S, Dv] and LSE [B, H, S]."""
        a, k, v = self._reference_inputs()
        return reference_split_partials(
            a["query"],
            k,
            v,
            a["req_to_token"],
            a["req_pool_indices"],
            a["seq_lens"],
            a["sm_scale"],
            a["logit_cap"],
            a["attn_logits"].shape[2],
        )


DECODE_ARGS = (
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


def decode_writes(a: dict) -> dict:
    """What decode may write: the new token's cache rows, every output row, every split of attn_logits."""
    return opcall.documented_writes("decode_attention_cpu", a)


def make_case(
    lens,
    heads,
    heads_kv,
    head_dim,
    head_dim_v,
    dtype,
    splits,
    map_dtype=torch.int64,
    strided=False,
    logit_cap=0.0,
    seed=0,
    spare_slots=7,
    padding=0,
    loc_slots=0,
) -> Case:
    """A batch whose sequences own scattered cache slots, in scattered pool rows.

    Map entries past each sequence's length hold out-of-range garbage: the
    operator must neither read nor check them. The new token of sequence b
    is its last one (slot req_to_token[row, len-1] = loc[b]), as in SGLang.

    ``padding`` rows follow the sequences as SGLang's CPU graph runner pads a
    short decode batch: loc 0, req_pool_indices 0, seq_lens 1. Slot 0 and pool
    row 0 are SGLang's reserved padding slot and row (the row is zeros), so
    the real sequences use neither. ``loc_slots`` > 0 draws loc at random,
    repeats allowed, from slots [0, loc_slots), as SGLang's own decode tests
    do, instead of each sequence's last slot.
    """
    g = torch.Generator().manual_seed(seed)
    reserved = 1 if padding else 0
    real = len(lens)
    batch = real + padding
    num_slots = sum(lens) + spare_slots + reserved
    max_reqs, max_context = real + 3 + reserved, max(lens, default=1) + 5

    def randn(*shape):
        return unit_normal(*shape, generator=g, dtype=dtype)

    slot_perm = reserved + torch.randperm(num_slots - reserved, generator=g)
    rows = reserved + torch.randperm(max_reqs - reserved, generator=g)[:real]
    req_to_token = torch.full((max_reqs, max_context), num_slots + 1000, dtype=map_dtype)
    loc = torch.empty(batch, dtype=torch.int64)
    used = 0
    for b, length in enumerate(lens):
        req_to_token[rows[b], :length] = slot_perm[used : used + length].to(map_dtype)
        loc[b] = slot_perm[used + length - 1]
        used += length
    if padding:
        req_to_token[0] = 0
        loc[real:] = 0
        rows = torch.cat([rows, torch.zeros(padding, dtype=rows.dtype)])
        lens = list(lens) + [1] * padding
    if loc_slots:
        loc = torch.randint(0, loc_slots, (batch,), generator=g)

    query, key, value = (
        randn(batch, heads, head_dim),
        randn(batch, heads_kv, head_dim),
        randn(batch, heads_kv, head_dim_v),
    )
    k_buffer, v_buffer = randn(num_slots, heads_kv, head_dim), randn(num_slots, heads_kv, head_dim_v)
    # NaN: anything the operator fails to write shows up.
    output = torch.full((batch, heads, head_dim_v), float("nan"), dtype=dtype)
    attn_logits = torch.full((batch, heads, splits, head_dim_v + 1), float("nan"))
    embed = opcall.embed
    if strided:
        # Views inside NaN-filled (int8: -128) base tensors, which opcall checks
        # after the call: a query slice of a fused QKV-like tensor with swapped
        # batch / head strides, caches carved out of wider pools (every other
        # slot, a spare head), new K/V sliced from fused rows, a padded output
        # and a padded attn_logits.
        query = embed(query, lead=(0, 0, 3), swap=(0, 1))
        k_buffer = embed(k_buffer, lead=(0, 1, 2), trail=(0, 0, 1))
        v_buffer = embed(v_buffer, lead=(0, 0, 0), step=(2, 1, 1))
        key = embed(key, lead=(0, 0, 0), trail=(0, 0, head_dim_v))
        value = embed(value, lead=(0, 0, 1), trail=(0, 0, 0))
        output = embed(output, lead=(0, 0, 0), trail=(0, 0, 4))
        attn_logits = embed(attn_logits, lead=(0, 0, 1, 0), trail=(0, 0, 0, 2))
    else:
        # Dense (contiguous) outputs with a sentinel row before and after:
        # a store one row off either end lands there.
        output = embed(output, lead=(1, 0, 0))
        attn_logits = embed(attn_logits, lead=(1, 0, 0, 0))
    return Case(
        query,
        k_buffer,
        v_buffer,
        output,
        key,
        value,
        loc,
        attn_logits,
        req_to_token,
        rows.to(torch.int64),
        torch.tensor(lens, dtype=torch.int64),
        # 2/sqrt(D): scores ~N(0, 4), a peaked softmax that the cap of 2 visibly changes.
        sm_scale=2.0 / math.sqrt(head_dim),
        logit_cap=logit_cap,
    )


def assert_matches_reference(case: Case, atol: float | None = None) -> None:
    """Output and attn_logits against the float64 references (``atol`` overrides the dtype's, e.g. for huge scores)."""
    expected = case.reference()
    assert not torch.isnan(case.output).any(), "output has NaN: some row was not written"
    if atol is None:
        assert_close_to_reference(case.output, expected)
    else:
        torch.testing.assert_close(
            case.output.double(), expected, atol=atol, rtol=TOLERANCES[case.output.dtype]["rtol"]
        )
    assert_attn_logits_match(case, atol)


def assert_attn_logits_match(case: Case, atol: float | None = None) -> None:
    """Each split's slot of attn_logits: its normalized partial output and its log-sum-exp (documented contents)."""
    partial, lse = case.reference_splits()
    logits = case.attn_logits
    filled = torch.isfinite(lse)
    assert torch.all(logits[..., -1][~filled] == float("-inf")), "an empty split must report log(0)"
    f32 = dict(TOLERANCES[torch.float32])
    lse_tol = dict(LSE_TOLERANCE)
    if atol is not None:  # the error of large scores reaches the LSE as is, the partial outputs as for the output
        f32["atol"] = atol
        lse_tol["atol"] = LSE_TOLERANCE["atol"] + atol
    torch.testing.assert_close(
        logits[..., -1][filled].double(), lse[filled], **lse_tol, msg=lambda m: f"attn_logits LSE: {m}"
    )
    torch.testing.assert_close(
        logits[..., :-1][filled].double(), partial[filled], **f32, msg=lambda m: f"attn_logits partial outputs: {m}"
    )
