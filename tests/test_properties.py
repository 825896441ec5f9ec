"""Property-based differential tests against the float64 references, and invalid-input fuzzing.

Deterministic by default (see the hypothesis profiles in conftest.py);
HYPOTHESIS_PROFILE=dev runs many random examples.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from cases.kv_write import write
from reference import write_kv as reference_write_kv
from strategies import (
    built,
    decode_cases,
    decode_edge,
    decode_mutation,
    extend_cases,
    extend_edge,
    extend_mutation,
    int8_decode_cases,
    int8_decode_edge,
    int8_extend_cases,
    int8_extend_edge,
    kv_write_calls,
    kv_write_mutations,
)

NAN = float("nan")


@given(call=kv_write_calls())
def test_kv_write_matches_reference(kernel_variant, call):
    k_expected, v_expected = call.k_buffer.clone(), call.v_buffer.clone()
    reference_write_kv(k_expected, v_expected, call.key, call.value, call.loc)
    write(call.args())
    assert torch.equal(call.k_buffer, k_expected) and torch.equal(call.v_buffer, v_expected)


@given(call=kv_write_calls(), data=st.data())
def test_kv_write_rejects_invalid_calls_and_writes_nothing(kernel_variant, call, data):
    mutations = kv_write_mutations(call)
    name = data.draw(st.sampled_from(sorted(mutations)), label="mutation")
    replaced, message = mutations[name]
    args = {**call.args(), **replaced}
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        write(args)


@given(case=decode_cases())
@example(case=decode_edge(128, 1))
@example(case=decode_edge(256, 2, logit_cap=30.0))
def test_decode_matches_reference(kernel_variant, case):
    from cases.decode import assert_matches_reference

    case = built(case)
    case.run()
    assert_matches_reference(case)


@given(case=decode_cases(), data=st.data())
def test_decode_rejects_invalid_calls_and_writes_nothing(kernel_variant, case, data):
    message = decode_mutation(case, data)
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        case.run()


@given(case=extend_cases())
@example(case=extend_edge(128))
@example(case=extend_edge(256))
def test_extend_matches_reference(kernel_variant, case):
    case = built(case)
    case.check(case.run())


@given(case=extend_cases(), data=st.data())
def test_extend_rejects_invalid_calls_and_writes_nothing(kernel_variant, case, data):
    change, message = extend_mutation(case, data)
    # opcall checks that the rejected call changed no byte of any argument.
    with pytest.raises((RuntimeError, ValueError), match=re.escape(message)):
        case.run(**change)


@given(t=int8_decode_cases())
@example(t=int8_decode_edge(128, NAN, NAN))
@example(t=int8_decode_edge(256, 0.02, NAN))
def test_int8_decode_matches_reference(kernel_variant, t):
    built(t).check()


@given(t=int8_extend_cases())
@example(t=int8_extend_edge(128, NAN, 0.02))
@example(t=int8_extend_edge(256, NAN, NAN))
def test_int8_extend_matches_reference(kernel_variant, t):
    built(t).check()
