"""extend_attention_cpu cases: prefix + new tokens over a paged cache, the rows it may write, the blocking."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

import opcall
import rvv_attn
from cases.noise import unit_normal
from reference import extend_attention as reference_extend
from tolerances import assert_close_to_reference

OP = rvv_attn.ops.extend_attention_cpu
SENTINEL = 123.0  # exact in every dtype: rows the op must not touch keep it


def blocking(head_dim: int = 64, head_dim_v: int = 64) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, arena bytes per worker) as the active variant reports them."""
    bm, bn, arena = rvv_attn.ops.extend_attention_blocking(head_dim, head_dim_v)
    return int(bm), int(bn), int(arena)


def expected_blocking(variant: str) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) the design gives ``variant`` (csrc/kernels/extend_tiling.h).

    An RVV variant runs only at the CPU's VLEN (read from vlenb): BLOCK_N is
    VLEN/4 keys (one float32 LMUL=8 vector), BLOCK_M = 4096/BLOCK_N rows (a
    16 KB score tile) but at least 64 rows. The portable build uses vlen128's shape.
    """
    vlen = 128 if variant == "portable" else int(rvv_attn.runtime_info()["cpu_vlen"])
    assert variant in ("portable", f"vlen{vlen}")
    block_n = vlen // 4
    return max(64, 4096 // block_n), block_n


@dataclass
class Case:
    prefix: list[int]
    extend: list[int]
    heads: int = 4
    heads_kv: int = 2
    head_dim: int = 32
    head_dim_v: int = 32
    dtype: torch.dtype = torch.float32
    map_dtype: torch.dtype = torch.int64
    logit_cap: float = 0.0
    sm_scale: float | None = None  # default 1/sqrt(D)
    strided: bool = False  # q/k/v/o as views with non-dense outer strides
    seed: int = 0
    inputs: dict = field(default_factory=dict, repr=False)
    before: dict | None = field(default=None, repr=False)  # the arguments before the last run()

    def build(self) -> Case:
        """Random inputs: shuffled cache slots and pool rows, a spare row between extend ranges."""
        g = torch.Generator().manual_seed(self.seed)
        batch = len(self.prefix)
        h, hkv, d, dv = self.heads, self.heads_kv, self.head_dim, self.head_dim_v

        def randn(*shape):
            return unit_normal(*shape, generator=g, dtype=self.dtype)

        # Extend ranges in a shuffled order with one unowned row before each.
        order = torch.randperm(batch, generator=g).tolist()
        starts, row = [0] * batch, 0
        for b in order:
            row += 1
            starts[b] = row
            row += self.extend[b]
        tokens = row + 1
        q, k, v = randn(tokens, h, d), randn(tokens, hkv, d), randn(tokens, hkv, dv)
        o = torch.full((tokens, h, dv), SENTINEL, dtype=self.dtype)
        if self.strided:
            # Views inside NaN-filled base tensors (checked by opcall after the call).
            q = opcall.embed(q, lead=(0, 1, 3), trail=(0, 0, 0))
            k = opcall.embed(k, lead=(0, 0, 0), trail=(0, 0, dv))
            v = opcall.embed(v, lead=(0, 0, d), trail=(0, 0, 0))
            o = opcall.embed(o, lead=(0, 0, 0), step=(2, 1, 1))
        else:
            # Contiguous, with a sentinel row before and after.
            o = opcall.embed(o, lead=(1, 0, 0))
        slots = sum(self.prefix) + 5
        k_buffer, v_buffer = randn(slots, hkv, d), randn(slots, hkv, dv)
        pool_rows = batch + 2
        width = max([p + e for p, e in zip(self.prefix, self.extend)] + [1]) + 3
        # Entries past a prefix are never valid slots: reading one would fail loudly.
        req_to_token = torch.full((pool_rows, width), -1, dtype=self.map_dtype)
        perm = torch.randperm(slots, generator=g)
        pools = torch.randperm(pool_rows, generator=g)[:batch]
        used = 0
        for b in range(batch):
            req_to_token[pools[b], : self.prefix[b]] = perm[used : used + self.prefix[b]].to(self.map_dtype)
            used += self.prefix[b]
        self.inputs = dict(
            q_extend=q,
            k_extend=k,
            v_extend=v,
            o_extend=o,
            k_buffer=k_buffer,
            v_buffer=v_buffer,
            req_to_token=req_to_token,
            req_pool_indices=pools.to(torch.int64),
            seq_lens=torch.tensor([p + e for p, e in zip(self.prefix, self.extend)], dtype=torch.int64),
            extend_seq_lens=torch.tensor(self.extend, dtype=torch.int64),
            extend_start_loc=torch.tensor(starts, dtype=torch.int64),
            max_len_extend=max(self.extend + [0]),
            sm_scale=self.sm_scale if self.sm_scale is not None else 1.0 / math.sqrt(d),
            logit_cap=self.logit_cap,
        )
        return self

    def run(self, **change) -> torch.Tensor:
        """Call the operator through opcall (only the sequences' rows of o_extend may change)."""
        args = dict(self.inputs)
        args.update(change)
        self.before = opcall.call(OP, args, extend_writes(args))
        return args["o_extend"]

    def reference(self, logit_cap: float | None = None) -> torch.Tensor:
        """From the inputs as they were before the last run() (or now, before any)."""
        a = self.before or self.inputs
        return reference_extend(
            a["q_extend"],
            a["k_extend"],
            a["v_extend"],
            a["k_buffer"],
            a["v_buffer"],
            a["req_to_token"],
            a["req_pool_indices"],
            a["seq_lens"],
            a["extend_seq_lens"],
            a["extend_start_loc"],
            a["sm_scale"],
            self.logit_cap if logit_cap is None else logit_cap,
        )

    def check(self, out: torch.Tensor, ref: torch.Tensor | None = None) -> None:
        ref = self.reference() if ref is None else ref
        owned = ~torch.isnan(ref[:, 0, 0])
        assert_close_to_reference(out[owned], ref[owned])
        assert torch.all(out[~owned] == SENTINEL), "rows outside every extend range were written"


def owned_rows(a: dict) -> list[int]:
    """Rows of o_extend that some sequence owns (extend_start_loc[b] ..+ extend_seq_lens[b])."""
    return [
        r
        for start, n in zip(a["extend_start_loc"].tolist(), a["extend_seq_lens"].tolist())
        for r in range(start, start + max(n, 0))
    ]


def extend_writes(a: dict) -> dict:
    """What extend may write: the sequences' rows of o_extend, nothing else."""
    return opcall.documented_writes("extend_attention_cpu", a)


def token_tree_masks(batch: int, draft: int, g: torch.Generator) -> torch.Tensor:
    """Speculative decoding's verify masks in SGLang's CPU layout, flat bool [B * L * L]: per request a random
    token tree (draft token 0 the root, each later one's parent an earlier one), token i seeing its ancestors
    and itself, as EAGLE's verify step does."""
    masks = torch.zeros(batch, draft, draft, dtype=torch.bool)
    for b in range(batch):
        for i in range(draft):
            if i:
                masks[b, i] = masks[b, int(torch.randint(0, i, (1,), generator=g))]
            masks[b, i, i] = True
    return masks.flatten()
