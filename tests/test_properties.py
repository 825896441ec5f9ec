"""Property-based differential tests against the float64 references, and invalid-input fuzzing.

Deterministic by default (see the hypothesis profiles in conftest.py);
HYPOTHESIS_PROFILE=dev runs many random examples.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import rvv_attn
from reference import write_kv as reference_write_kv
from strategies import (decode_cases, decode_mutation, extend_cases, extend_mutation, int8_decode_cases,
                        int8_extend_cases, kv_write_calls, kv_write_mutations)


@given(call=kv_write_calls())
def test_kv_write_matches_reference(kernel_variant, call):
    k_expected, v_expected = call.k_buffer.clone(), call.v_buffer.clone()
    reference_write_kv(k_expected, v_expected, call.key, call.value, call.loc)
    rvv_attn.ops.decode_set_kv_buffer(**call.args())
    assert torch.equal(call.k_buffer, k_expected) and torch.equal(call.v_buffer, v_expected)


@given(call=kv_write_calls(), data=st.data())
def test_kv_write_rejects_invalid_calls_and_writes_nothing(kernel_variant, call, data):
    mutations = kv_write_mutations(call)
    name = data.draw(st.sampled_from(sorted(mutations)), label="mutation")
    replaced, message = mutations[name]
    args = {**call.args(), **replaced}
    before = {k: args[k].clone() for k in call.outputs}
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        rvv_attn.ops.decode_set_kv_buffer(**args)
    for k in call.outputs:
        assert torch.equal(args[k], before[k]), f"{k} changed although the call was rejected ({name})"


@given(case=decode_cases())
def test_decode_matches_reference(kernel_variant, case):
    from test_decode_attention import assert_matches_reference

    case.run()
    assert_matches_reference(case)


@given(case=decode_cases(), data=st.data())
def test_decode_rejects_invalid_calls_and_writes_nothing(kernel_variant, case, data):
    message = decode_mutation(case, data)
    watched = {"k_buffer": case.k_buffer, "v_buffer": case.v_buffer, "output": case.output,
               "attn_logits": case.attn_logits}
    before = {k: t.clone() for k, t in watched.items()}
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        case.run()
    for k, t in watched.items():
        torch.testing.assert_close(t, before[k], rtol=0, atol=0, equal_nan=True, msg=f"{k} was written")


@given(case=extend_cases())
def test_extend_matches_reference(kernel_variant, case):
    case.check(case.run())


@given(case=extend_cases(), data=st.data())
def test_extend_rejects_invalid_calls_and_writes_nothing(kernel_variant, case, data):
    change, message = extend_mutation(case, data)
    out = case.inputs["o_extend"]
    before = out.clone()
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        case.run(**change)
    assert torch.equal(out, before), "o_extend changed although the call was rejected"


@given(t=int8_decode_cases())
def test_int8_decode_matches_reference(kernel_variant, t):
    t.check()


@given(t=int8_extend_cases())
def test_int8_extend_matches_reference(kernel_variant, t):
    t.check()
