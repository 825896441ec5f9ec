"""torch.library.opcheck over every operator of both namespaces, and torch.compile through them.

opcheck runs each operator with small valid inputs under torch's schema
checker (it must write exactly the tensors its schema marks written and
return nothing aliased it does not declare), with fake tensors (the fake
implementations in ``rvv_attn._fake_ops``, or the one torch derives for an
operator that returns nothing) and through AOTAutograd with dynamic shapes,
comparing the results with eager ones.

The tests reach the kernels, so they are not ``variant_independent``; what
they check (schemas, fakes, tracing) is the same for every variant, and
torch.compile takes minutes under QEMU, so they run on the host only
(``test-host``, part of ``nox -t test``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch.testing._internal.optests import aot_autograd_check

import rvv_attn
import rvv_attn.sglang  # noqa: F401 - the sgl_kernel names are checked too
from cases.decode import make_case as decode_case
from cases.extend import Case as ExtendCase
from cases.int8 import DYN, int8_decode, int8_extend
from cases.kv_write import make_case as kv_write_case

pytestmark = pytest.mark.host_only


def _varlen_args() -> tuple:
    g = torch.Generator().manual_seed(4)
    q = torch.randn(9, 4, 16, generator=g)
    k = torch.randn(11, 2, 16, generator=g)
    v = torch.randn(11, 2, 8, generator=g)
    cu_q = torch.tensor([0, 5, 9], dtype=torch.int32)
    cu_k = torch.tensor([0, 6, 11], dtype=torch.int32)
    return q, k, v, cu_q, cu_k, 5, 6, True


def _store_cache_args() -> tuple:
    g = torch.Generator().manual_seed(5)
    k, v = torch.randn(3, 2, 8, generator=g), torch.randn(3, 2, 4, generator=g)
    k_cache, v_cache = torch.zeros(6, 2, 8), torch.zeros(6, 2, 4)
    return k, v, k_cache, v_cache, torch.tensor([4, 0, 4]), None


def _decode_args() -> tuple:
    return tuple(decode_case([5, 1, 18], 4, 2, 16, 8, torch.float32, 2, seed=6).args())


def _extend_args() -> tuple:
    inputs = ExtendCase(prefix=[3, 0], extend=[4, 2], head_dim=32, head_dim_v=32, seed=7).build().inputs
    return tuple(inputs.values())


def _int8_decode_args() -> tuple:
    t = int8_decode([4, 9], 4, 2, 16, 8, torch.float32, DYN, 0.05, seed=8)
    return (*t.case.args(), t.k_scale_buf, t.v_scale_buf, t.k_scale, t.v_scale)


def _int8_extend_args() -> tuple:
    t = int8_extend(ExtendCase(prefix=[5, 2], extend=[3, 4], head_dim=32, head_dim_v=32, seed=9), 0.05, DYN)
    return tuple(t.args().values())


# fp8 caches as the uint8 tensors SGLang stores them in: opcheck's schema test compares tensors with
# arithmetic torch does not implement for float8_e4m3fn.
def _fp8_decode_args() -> tuple:
    c = decode_case([4, 9], 4, 2, 16, 8, torch.float32, 2, seed=11)
    g = torch.Generator().manual_seed(12)
    c.k_buffer = torch.randn(c.k_buffer.shape, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    c.v_buffer = torch.randn(c.v_buffer.shape, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    return (*c.args(), 0.5, 0.25)


def _fp8_extend_args() -> tuple:
    inputs = ExtendCase(prefix=[5, 2], extend=[3, 4], head_dim=32, head_dim_v=32, seed=13).build().inputs
    g = torch.Generator().manual_seed(14)
    for name in ("k_buffer", "v_buffer"):
        inputs[name] = torch.randn(inputs[name].shape, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)
    return (*inputs.values(), 0.5, 0.25)


def _kv_scales_decode_args(fp8: bool) -> tuple:
    """SGLang 0.5.23's decode form: the scales right after the caches."""
    args = _fp8_decode_args() if fp8 else _decode_args()
    scales = args[-2:] if fp8 else (1.0, 1.0)
    core = args[:-2] if fp8 else args
    return (*core[:3], *scales, *core[3:])


def _kv_scales_extend_args(fp8: bool) -> tuple:
    args = _fp8_extend_args() if fp8 else _extend_args()
    scales = args[-2:] if fp8 else (1.0, 1.0)
    core = args[:-2] if fp8 else args
    return (*core[:6], *scales, *core[6:])


# Operator name -> a function making small valid positional arguments. The
# same arguments serve the sgl_kernel name of an operator (same argument order).
ARGUMENTS: dict[str, Callable[[], tuple]] = {
    "compiled_variants": lambda: (),
    "select_variant": lambda: (str(rvv_attn.ops.active_variant()),),
    "active_variant": lambda: (),
    "cpu_vlen": lambda: (),
    "cpu_features": lambda: ("auto",),
    "selection_reason": lambda: (),
    "pool_concurrency_probe": lambda: (0.01,),
    "kernel_table_lookups": lambda: (),
    "decode_attention_blocking": lambda: (),
    "extend_attention_blocking": lambda: (64, 48),
    "register_sglang_names": lambda: (),
    "register_absent_sglang_names": lambda: (),
    "decode_set_kv_buffer": lambda: (
        kv_write_case(3, 2, 8, 4, torch.float32, slots=6, seed=3)[:4] + (torch.tensor([5, 1, 5]),)
    ),
    "store_cache_cpu": _store_cache_args,
    "decode_attention_cpu": _decode_args,
    "extend_attention_cpu": _extend_args,
    "decode_attention_int8_cpu": _int8_decode_args,
    "extend_attention_int8_cpu": _int8_extend_args,
    "decode_attention_fp8_cpu": _fp8_decode_args,
    "extend_attention_fp8_cpu": _fp8_extend_args,
    "flash_attn_varlen_func": _varlen_args,
    "fp8_e4m3_quantize": lambda: (torch.randn(3, 5, generator=torch.Generator().manual_seed(10)), 0.5),
    "fp8_e4m3_dequantize": lambda: (torch.arange(0, 250, 17, dtype=torch.uint8), 2.0, torch.bfloat16),
    # sgl_kernel only: SGLang 0.5.23's overloads, on an fp8 cache (a float one is the default forms' case).
    "decode_attention_cpu.kv_scales": lambda: _kv_scales_decode_args(fp8=True),
    "extend_attention_cpu.kv_scales": lambda: _kv_scales_extend_args(fp8=True),
}
SGL_KERNEL_ONLY = {"decode_attention_cpu.kv_scales", "extend_attention_cpu.kv_scales"}
SGL_KERNEL_NAMES = list(rvv_attn.sglang.REGISTERED)


def _operators(namespace: str) -> set[str]:
    prefix = f"{namespace}::"
    return {name.removeprefix(prefix) for name in torch._C._dispatch_get_all_op_names() if name.startswith(prefix)}


def _returns_strings(op: torch._ops.OpOverload) -> bool:
    return any("str" in str(r.type) for r in op._schema.returns)


def _equal(actual, expected, **_) -> None:
    assert actual == expected, f"{actual!r} != {expected!r}"


def _opcheck(op: torch._ops.OpOverload, args: tuple) -> None:
    if not _returns_strings(op):
        torch.library.opcheck(op, args)
        return
    # opcheck compares AOTAutograd's results with torch.testing.assert_close,
    # which takes no strings: the same check with an exact comparison instead.
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_autograd_registration", "test_faketensor"))
    aot_autograd_check(op, args, {}, dynamic=True, assert_equals_fn=_equal, check_gradients="auto")


def test_every_operator_has_opcheck_arguments():
    assert _operators("rvv_attn") == set(ARGUMENTS) - SGL_KERNEL_ONLY
    assert set(SGL_KERNEL_NAMES) <= set(ARGUMENTS)


@pytest.fixture
def one_thread():
    """pool_concurrency_probe reports how many chunks ran at once: on one thread that is 1 on every run, so eager
    and compiled results agree."""
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(saved)


@pytest.mark.parametrize("name", sorted(set(ARGUMENTS) - SGL_KERNEL_ONLY))
def test_opcheck_rvv_attn(name, one_thread):
    _opcheck(getattr(torch.ops.rvv_attn, name).default, ARGUMENTS[name]())


def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, causal):
    return q.new_empty((q.shape[0], q.shape[1], v.shape[2]))


# What SGLang's CPU graph runner registers for the sgl_kernel names that return a tensor.
SGLANG_STYLE_FAKES = {"flash_attn_varlen_func": _varlen_fake}


@pytest.mark.parametrize("name", SGL_KERNEL_NAMES)
def test_opcheck_sgl_kernel(name, one_thread):
    packet, _, overload = name.partition(".")
    op = getattr(getattr(torch.ops.sgl_kernel, packet), overload or "default")
    assert bool(op._schema.returns) == (name in SGLANG_STYLE_FAKES)
    # rvv-attn leaves the sgl_kernel names without a fake: SGLang's CPU graph
    # runner registers its own. Do as it does, for this test only.
    scope = torch.library.Library("sgl_kernel", "FRAGMENT")
    try:
        if name in SGLANG_STYLE_FAKES:
            torch.library.register_fake(f"sgl_kernel::{name}", SGLANG_STYLE_FAKES[name], lib=scope)
        _opcheck(op, ARGUMENTS[name]())
    finally:
        scope._destroy()
