"""Benchmark cases, run inside the emulated riscv64 target under the insn_count plugin.

Usage (by ci/driver/bench/run.py): python3 guest.py <cases.json> <variant>

For each case it builds the inputs (fixed seeds, shuffled cache slots), warms
the operator up once on a small shape of the same kind, then calls it once
between a start and an end mark. The marks are lseek(2) on an impossible file
descriptor that the plugin watches (bench/plugin/insn_count.c); the plugin
writes each region's counts, split by the kernel library's address range,
which this script announces first (read from /proc/self/maps). Region 0 is an
empty pair of marks: what issuing the marks costs outside the library.
One thread, so the count of a region is exact and repeatable.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import torch

import rvv_attn

MARK_FD = -21078
MARK_RANGE_LO, MARK_RANGE_HI, MARK_START, MARK_END = 0x5201, 0x5202, 0x5203, 0x5204
EMPTY_REGION = 0
STATIC_SCALE = 0.02
FP8_SCALE = 0.05  # codes ~N(0, 1) * 20 (most of e4m3's range), values ~N(0, 1)
# Every run uses caches of this many slots, whatever its cases, so a case sees
# the same data (and addresses) in a full run as in a subset. Sequences of a
# batch draw their slots independently from the first MAX_TOKENS (shared
# slots, as with a shared prefix); the last MAX_BATCH slots are the decode
# steps' new tokens, one per sequence. Filling a larger cache with random
# numbers under QEMU costs a minute and measures nothing.
MAX_TOKENS, MAX_BATCH = 4096, 64
CACHE_SLOTS = MAX_TOKENS + MAX_BATCH
# Decode at long context (one sequence): its own caches, built from the MAX_TOKENS ones (Caches.get).
LONG_TOKENS = 32768
LONG_SLOTS = LONG_TOKENS + MAX_BATCH
OPS = rvv_attn.ops


def mark(kind: int, value: int) -> None:
    try:
        os.lseek(MARK_FD, value, kind)
    except OSError:
        return  # EBADF, as intended: the call exists only for the plugin to see
    raise RuntimeError(f"lseek on fd {MARK_FD} succeeded: the benchmark marks would be ambiguous")


def library_text_range() -> tuple[int, int]:
    """The executable mappings of the operator library, from this process's /proc/self/maps."""
    lo, hi = None, None
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 6 and fields[5].endswith("librvv_attn_ops.so") and "x" in fields[1]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                lo = start if lo is None else min(lo, start)
                hi = end if hi is None else max(hi, end)
    if lo is None:
        raise RuntimeError("librvv_attn_ops.so has no executable mapping in /proc/self/maps")
    return lo, hi


class Caches:
    """KV caches shared by the cases (one per storage dtype and head shape), as large as the largest case needs.

    A case longer than MAX_TOKENS gets caches of LONG_SLOTS slots: the MAX_TOKENS ones repeated (filling 32k
    slots with random numbers would cost minutes under QEMU; the instruction counts do not depend on the values
    repeating). They are made only when such a case runs, after the others: the existing rows see the same
    allocations as before they existed.
    """

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self._made: dict[tuple, tuple[torch.Tensor, ...]] = {}

    def get(self, case: dict) -> tuple[torch.Tensor, ...]:
        dtype = case["dtype"] if case["dtype"] in ("bf16", "fp8") else "int8"
        shape = (dtype, case["heads_kv"], case["head_dim"], case["head_dim_v"], case.get("v_in_k", False))
        long = tokens_of(case) > MAX_TOKENS
        key = (*shape, long)
        if key not in self._made:
            if long:
                short = self.get({**case, "seq": MAX_TOKENS, "prefix": 0, "new": 0})
                copies = -(-LONG_SLOTS // self.slots)
                self._made[key] = tuple(t.repeat(copies, *([1] * (t.dim() - 1)))[:LONG_SLOTS] for t in short)
                if shape[-1]:  # keep V a view of K
                    k = self._made[key][0]
                    self._made[key] = (k, k[..., : shape[3]])
            else:
                self._made[key] = self._fresh(*shape)
        return self._made[key]

    def _fresh(self, dtype: str, hkv: int, d: int, dv: int, v_in_k: bool) -> tuple[torch.Tensor, ...]:
        g = torch.Generator().manual_seed(1)
        slots = self.slots
        if dtype in ("bf16", "fp8"):

            def rows(*shape):
                x = torch.randn(*shape, generator=g)
                return x.bfloat16() if dtype == "bf16" else (x * 20).to(torch.float8_e4m3fn)

            k = rows(slots, hkv, d)
            return (k, k[..., :dv]) if v_in_k else (k, rows(slots, hkv, dv))
        k = torch.randint(-127, 128, (slots, hkv, d), generator=g, dtype=torch.int8)
        v = torch.randint(-127, 128, (slots, hkv, dv), generator=g, dtype=torch.int8)
        ks = torch.rand(slots, hkv, generator=g) * 0.02 + 0.01
        vs = torch.rand(slots, hkv, generator=g) * 0.02 + 0.01
        return (k, v, ks, vs)


def tokens_of(case: dict) -> int:
    """Cache tokens a case's sequences span."""
    return case["seq"] if case["op"] == "decode" else case["prefix"] + case["new"]


def _token_map(g: torch.Generator, batch: int, length: int, own_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """req_to_token rows of shuffled slots (pool rows in shuffled order too) and the pool indices.

    ``own_last``: each sequence's last token gets a slot of its own (a decode step's new token).
    """
    tokens = MAX_TOKENS if length <= MAX_TOKENS else LONG_TOKENS
    if length > tokens or batch > MAX_BATCH:
        raise ValueError(f"a case with B={batch}, {length} tokens exceeds LONG_TOKENS/MAX_BATCH")
    rows = torch.randperm(batch + 2, generator=g)[:batch]
    req_to_token = torch.zeros(batch + 2, length, dtype=torch.int64)
    for b in range(batch):
        req_to_token[rows[b]] = torch.randperm(tokens, generator=g)[:length]
        if own_last:
            req_to_token[rows[b], -1] = tokens + b
    return req_to_token, rows.to(torch.int64)


def decode_call(case: dict, caches: Caches):
    b, s, h, hkv, d, dv = (case[k] for k in ("batch", "seq", "heads", "heads_kv", "head_dim", "head_dim_v"))
    g = torch.Generator().manual_seed(2)
    req_to_token, pools = _token_map(g, b, s, own_last=True)
    query = torch.randn(b, h, d, generator=g).bfloat16()
    key, value = torch.randn(b, hkv, d, generator=g).bfloat16(), torch.randn(b, hkv, dv, generator=g).bfloat16()
    loc = req_to_token[pools, s - 1].clone()
    kv = caches.get(case)
    if case["dtype"] == "bf16":
        # The new token is what the cache already holds there: writing it changes nothing that a later
        # case (or a subset run) reads.
        key, value = kv[0][loc].clone(), kv[1][loc].clone()
        if case["v_in_k"]:  # MLA: the new value is a view of the new key, as SGLang passes it
            value = key[..., :dv]
    seq_lens = torch.full((b,), s, dtype=torch.int64)
    output = torch.empty(b, h, dv, dtype=torch.bfloat16)
    logits = torch.empty(b, h, case["splits"], dv + 1)
    sm_scale = 1.0 / math.sqrt(d)
    if case["impl"] == "torch-sdpa":
        k_buf, v_buf = kv

        def native():
            k_buf[loc], v_buf[loc] = key, value
            for i in range(b):
                idx = req_to_token[pools[i], :s]
                k, v = k_buf[idx].transpose(0, 1), v_buf[idx].transpose(0, 1)
                out = torch.nn.functional.scaled_dot_product_attention(
                    query[i].unsqueeze(1), k, v, scale=sm_scale, enable_gqa=True
                )
                output[i] = out.squeeze(1)

        return native
    if case["dtype"] == "fp8":
        # As SGLang calls it: its pool has written the new token, so key = value = None.
        args = (query, *kv, output, None, None, loc, logits, req_to_token, pools, seq_lens, sm_scale, 0.0)
        return lambda: OPS.decode_attention_fp8_cpu(*args, FP8_SCALE, FP8_SCALE)
    if case["dtype"] == "bf16":
        args = (
            query,
            *kv,
            output,
            key,
            value,
            loc,
            logits,
            req_to_token,
            pools,
            seq_lens,
            sm_scale,
            0.0,
            False,
            case["window"] or -1,
            None,
            _sinks(case, g),
        )
        return lambda: OPS.decode_attention_cpu(*args)
    scale = STATIC_SCALE if case["dtype"] == "int8-static" else float("nan")
    args = (
        query,
        kv[0],
        kv[1],
        output,
        key,
        value,
        loc,
        logits,
        req_to_token,
        pools,
        seq_lens,
        sm_scale,
        0.0,
        kv[2],
        kv[3],
        scale,
        scale,
    )
    return lambda: OPS.decode_attention_int8_cpu(*args)


def extend_call(case: dict, caches: Caches):
    b, p, n, h, hkv, d, dv = (
        case[k] for k in ("batch", "prefix", "new", "heads", "heads_kv", "head_dim", "head_dim_v")
    )
    g = torch.Generator().manual_seed(3)
    req_to_token, pools = _token_map(g, b, p + n, own_last=False)
    q = torch.randn(b * n, h, d, generator=g).bfloat16()
    k_new = torch.randn(b * n, hkv, d, generator=g).bfloat16()
    v_new = torch.randn(b * n, hkv, dv, generator=g).bfloat16()
    o = torch.empty(b * n, h, dv, dtype=torch.bfloat16)
    seq_lens = torch.full((b,), p + n, dtype=torch.int64)
    ext_lens = torch.full((b,), n, dtype=torch.int64)
    starts = torch.arange(b, dtype=torch.int64) * n
    sm_scale = 1.0 / math.sqrt(d)
    kv = caches.get(case)
    if case["impl"] == "torch-sdpa":
        k_buf, v_buf = kv
        # New token i sees the prefix and new tokens 0..i.
        allowed = torch.arange(p + n).unsqueeze(0) <= (p + torch.arange(n)).unsqueeze(1)

        def native():
            for i in range(b):
                idx = req_to_token[pools[i], :p]
                rows = slice(i * n, (i + 1) * n)
                k = torch.cat([k_buf[idx], k_new[rows]]).transpose(0, 1)
                v = torch.cat([v_buf[idx], v_new[rows]]).transpose(0, 1)
                out = torch.nn.functional.scaled_dot_product_attention(
                    q[rows].transpose(0, 1), k, v, attn_mask=allowed, scale=sm_scale, enable_gqa=True
                )
                o[rows] = out.transpose(0, 1)

        return native
    common = (q, k_new, v_new, o, kv[0], kv[1], req_to_token, pools, seq_lens, ext_lens, starts, n, sm_scale, 0.0)
    if case["dtype"] == "bf16":
        options = (False, case["window"] or -1, None, _sinks(case, g))
        return lambda: OPS.extend_attention_cpu(*common, *options)
    if case["dtype"] == "fp8":
        return lambda: OPS.extend_attention_fp8_cpu(*common, FP8_SCALE, FP8_SCALE)
    scale = STATIC_SCALE if case["dtype"] == "int8-static" else float("nan")
    return lambda: OPS.extend_attention_int8_cpu(*common, kv[2], kv[3], scale, scale)


def _sinks(case: dict, g: torch.Generator) -> torch.Tensor | None:
    return torch.randn(case["heads"], generator=g) if case["sinks"] else None


def varlen_call(case: dict, caches: Caches):
    """A vision encoder's dense attention: ``batch`` images of ``new`` patches each."""
    images, patches, h, hkv, d, dv = (case[k] for k in ("batch", "new", "heads", "heads_kv", "head_dim", "head_dim_v"))
    g = torch.Generator().manual_seed(4)
    q = torch.randn(images * patches, h, d, generator=g).bfloat16()
    k = torch.randn(images * patches, hkv, d, generator=g).bfloat16()
    v = torch.randn(images * patches, hkv, dv, generator=g).bfloat16()
    cu = torch.arange(images + 1, dtype=torch.int32) * patches
    if case["impl"] == "torch-sdpa":
        out = torch.empty(images * patches, h, dv, dtype=torch.bfloat16)

        def native():
            for i in range(images):
                rows = slice(i * patches, (i + 1) * patches)
                out[rows] = torch.nn.functional.scaled_dot_product_attention(
                    q[rows].transpose(0, 1), k[rows].transpose(0, 1), v[rows].transpose(0, 1), enable_gqa=True
                ).transpose(0, 1)

        return native
    return lambda: OPS.flash_attn_varlen_func(q, k, v, cu, cu, patches, patches, False)


def make_call(case: dict, caches: Caches):
    return {"decode": decode_call, "extend": extend_call, "varlen": varlen_call}[case["op"]](case, caches)


def warm_up_shape(case: dict) -> dict:
    """A small case of the same operator, implementation and dtype: first-call work stays out of the count."""
    return {**case, "batch": 1, "seq": 32, "prefix": 16, "new": 16, "window": min(case["window"], 8)}


def main(cases_file: str, variant: str) -> None:
    with open(cases_file) as f:
        cases = json.load(f)
    torch.set_num_threads(1)
    rvv_attn.select_variant(variant)
    active = rvv_attn.runtime_info()["active_variant"]
    if active != variant:
        raise RuntimeError(f"asked for variant {variant}, the library runs {active}")
    caches = Caches(CACHE_SLOTS)
    lo, hi = library_text_range()
    mark(MARK_RANGE_LO, lo)
    mark(MARK_RANGE_HI, hi)
    mark(MARK_START, EMPTY_REGION)
    mark(MARK_END, EMPTY_REGION)
    warmed: set[tuple[str, str, str]] = set()
    for i, case in enumerate(cases, 1):
        started = time.monotonic()
        kind = (case["op"], case["impl"], case["dtype"])
        if kind not in warmed:
            make_call(warm_up_shape(case), caches)()
            warmed.add(kind)
        call = make_call(case, caches)
        mark(MARK_START, case["label"])
        call()
        mark(MARK_END, case["label"])
        print(
            f"[bench {variant}] [{i}/{len(cases)}] {case['id']}: {time.monotonic() - started:.1f} s",
            file=sys.stderr,
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
