"""Determinism: the same call gives bitwise the same result at any thread count and on every run.

Every operator splits its work into independent items (decode: sequence x KV
head x split, then sequence x query head; extend: sequence x query head x
query block; the KV writes: sequence) and computes each item the same way
whichever thread takes it, so torch.set_num_threads must not change a single
bit. Each case has more work items than the largest thread count tried.

The operators run their chunks on torch's threads (one chunk per thread of
torch.set_num_threads); test_the_pool_runs_chunks_at_the_same_time proves
they really overlap, so the comparison below is not between single-threaded
runs. (An earlier build used an inlined at::parallel_for whose OpenMP pragma
the library, compiled without OpenMP, ignored: every call ran on one thread.)
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from cases.decode import make_case
from cases.extend import Case as ExtendCase
from cases.int8 import DYN, int8_decode, int8_extend
from cases.kv_write import make_case as kv_write_case
from cases.kv_write import write

THREAD_COUNTS = [1, 2, 8]


@pytest.fixture
def restore_threads():
    saved = torch.get_num_threads()
    yield
    torch.set_num_threads(saved)


def _kv_write() -> tuple[torch.Tensor, ...]:
    k, v, key, value, loc = kv_write_case(12, 2, 40, 24, torch.bfloat16, slots=40, seed=5)
    write(dict(k_buffer=k, v_buffer=v, key=key, value=value, loc=loc))
    return k, v


def _decode() -> tuple[torch.Tensor, ...]:
    # 4 x 2 x 3 = 24 split items, 4 x 8 = 32 merge items.
    case = make_case([70, 1, 33, 130], 8, 2, 40, 24, torch.float32, 3, seed=6)  # float32: no rounding hides a bit
    case.run()
    return case.output, case.attn_logits, case.k_buffer, case.v_buffer


def _extend() -> tuple[torch.Tensor, ...]:
    # 3 sequences x 6 heads x >= 1 query blocks = 18+ items.
    case = ExtendCase(
        prefix=[40, 0, 17],
        extend=[37, 20, 70],
        heads=6,
        heads_kv=2,
        head_dim=40,
        head_dim_v=24,
        dtype=torch.float16,
        seed=7,
    ).build()
    return (case.run(),)


def _int8_decode() -> tuple[torch.Tensor, ...]:
    t = int8_decode([70, 1, 33, 130], 8, 2, 40, 24, torch.float32, DYN, 0.02, splits=3, magnitudes=True, seed=8)
    t.run()
    return t.case.output, t.case.attn_logits, t.case.k_buffer, t.case.v_buffer, t.k_scale_buf, t.v_scale_buf


def _int8_extend() -> tuple[torch.Tensor, ...]:
    t = int8_extend(
        ExtendCase(
            prefix=[40, 0, 17],
            extend=[37, 20, 70],
            heads=6,
            heads_kv=2,
            head_dim=40,
            head_dim_v=24,
            dtype=torch.bfloat16,
            seed=9,
        ),
        0.02,
        DYN,
        magnitudes=True,
    )
    out = t.check()
    a = t.case.inputs
    return out, a["k_buffer"], a["v_buffer"], t.k_scale_buf, t.v_scale_buf


CALLS: dict[str, Callable[[], tuple[torch.Tensor, ...]]] = {
    "decode_set_kv_buffer": _kv_write,
    "decode_attention_cpu": _decode,
    "extend_attention_cpu": _extend,
    "decode_attention_int8_cpu": _int8_decode,
    "extend_attention_int8_cpu": _int8_extend,
}


@pytest.mark.variant_independent
@pytest.mark.parametrize("threads", [1, 2])
def test_the_pool_runs_chunks_at_the_same_time(kernel_variant, restore_threads, threads):
    # Each of the `threads` chunks waits for all the others (up to 30 s): only
    # a pool that runs them at once sees all of them inside together.
    torch.set_num_threads(threads)
    assert torch.ops.rvv_attn.pool_concurrency_probe(30.0) == threads


@pytest.mark.parametrize("op", list(CALLS))
def test_bitwise_equal_at_every_thread_count_and_on_every_run(kernel_variant, restore_threads, op):
    results = {}
    for threads in THREAD_COUNTS + THREAD_COUNTS[::-1]:  # every count twice: repeated runs, too
        torch.set_num_threads(threads)
        results.setdefault(threads, []).append(CALLS[op]())
    first = results[THREAD_COUNTS[0]][0]
    for threads, runs in results.items():
        for run, outputs in enumerate(runs):
            for i, (a, b) in enumerate(zip(first, outputs)):
                assert torch.equal(
                    a.view(torch.uint8) if a.dtype != torch.int8 else a,
                    b.view(torch.uint8) if b.dtype != torch.int8 else b,
                ), f"{op}: output {i} at {threads} threads (run {run + 1}) differs from 1 thread"
