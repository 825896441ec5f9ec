"""Variant selection and the VLEN guard."""

from __future__ import annotations

import os
import re

import pytest

import rvv_attn


def test_portable_variant_is_always_compiled_and_runnable():
    info = rvv_attn.runtime_info()
    assert info["compiled_variants"][0] == "portable"
    with rvv_attn.use_variant("portable") as name:
        assert name == "portable"
        assert rvv_attn.runtime_info()["active_variant"] == "portable"
    assert rvv_attn.runtime_info()["active_variant"] == info["active_variant"]


def test_unknown_variant_lists_the_compiled_ones():
    before = rvv_attn.runtime_info()["active_variant"]
    with pytest.raises(RuntimeError, match=r"unknown variant 'vlen999'.*portable"):
        rvv_attn.select_variant("vlen999")
    assert rvv_attn.runtime_info()["active_variant"] == before


@pytest.mark.rvv
def test_cpu_vlen_and_active_variant_are_what_the_session_asked_for():
    info = rvv_attn.runtime_info()
    expected_vlen = int(os.environ["RVV_ATTN_EXPECT_VLEN"])
    # Read from the CPU's vlenb, so a QEMU started at another VLEN shows here.
    assert info["cpu_vlen"] == expected_vlen
    assert info["active_variant"] == os.environ["RVV_ATTN_EXPECT_VARIANT"] == f"vlen{expected_vlen}"
    # ... and it is what automatic selection picks on this CPU.
    assert rvv_attn.select_variant("auto") == info["active_variant"]
    assert rvv_attn.runtime_info()["reason"].startswith("auto")


@pytest.mark.rvv
def test_the_library_holds_the_variants_the_session_built():
    expected = os.environ.get("RVV_ATTN_EXPECT_COMPILED")
    if not expected:
        pytest.skip("the session did not say which variants it built (RVV_ATTN_EXPECT_COMPILED)")
    assert rvv_attn.runtime_info()["compiled_variants"] == expected.split(",")


@pytest.mark.rvv
def test_variant_for_another_vlen_is_refused_with_both_vlens_named():
    info = rvv_attn.runtime_info()
    cpu = info["cpu_vlen"]
    others = [v for v in info["compiled_variants"] if v not in ("portable", f"vlen{cpu}")]
    if not others and os.environ.get("RVV_ATTN_EXPECT_COMPILED") == f"portable,vlen{cpu}":
        pytest.skip(
            f"this session built only portable + vlen{cpu}; the full build (nox -t test, test-toolchain, "
            "or a current full build reused by this session) holds the other VLENs and checks this"
        )
    assert others, "the emulated build should hold every VLEN variant from toolchains/vlens.json"
    for name in others:
        vlen = int(name.removeprefix("vlen"))
        pattern = rf"variant '{name}' is built for VLEN {vlen} but this CPU has VLEN {cpu}"
        with pytest.raises(RuntimeError, match=re.escape(pattern).replace(r"\ ", " ")):
            rvv_attn.select_variant(name)
        # The refused selection left the working one in place.
        assert rvv_attn.runtime_info()["active_variant"] == info["active_variant"]


# The child fails at import, before any vector instruction: the undisturbed run at this VLEN covers it
# (the child's torch import is ~20 s under QEMU).
@pytest.mark.rvv
@pytest.mark.policy_independent
def test_forcing_this_vlens_build_on_another_vlen_fails_cleanly_in_a_fresh_process():
    """The whole story end to end: this session's VLEN variant, forced on a CPU of another VLEN.

    The child is a second qemu-riscv64 started from inside the guest (QEMU
    passes execve of a host binary through), so the CPU really has the other
    VLEN. It must end with a Python RuntimeError naming both VLENs, never a
    signal: code built for one VLEN corrupts memory at another.
    """
    import subprocess
    import sys

    if not os.environ.get("RVV_ATTN_QEMU"):
        pytest.skip("needs qemu-riscv64 to make a CPU of another VLEN; a board has one VLEN (ci/board runs this)")
    this = int(os.environ["RVV_ATTN_EXPECT_VLEN"])
    other = 256 if this == 128 else 128
    cpu = os.environ["RVV_ATTN_QEMU_CPU"].replace(f"vlen={this},", f"vlen={other},")
    cmd = [
        os.environ["RVV_ATTN_QEMU"],
        "-L",
        os.environ["RVV_ATTN_SYSROOT"],
        "-cpu",
        cpu,
        sys.executable,
        "-c",
        "import rvv_attn",
    ]
    env = {**os.environ, "RVV_ATTN_VARIANT": f"vlen{this}"}
    child = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert child.returncode == 1, f"expected a Python error, got exit {child.returncode}: {child.stderr[-2000:]}"
    assert "RuntimeError" in child.stderr
    assert f"variant 'vlen{this}' is built for VLEN {this} but this CPU has VLEN {other}" in child.stderr


# Every tensor an operator writes is declared written (Tensor(x!)) in its
# schema, so torch.compile / functionalization see the side effect.
WRITTEN = {
    "decode_set_kv_buffer": {"k_buffer", "v_buffer"},
    "decode_attention_cpu": {"k_buffer", "v_buffer", "output", "attn_logits"},
    "extend_attention_cpu": {"o_extend"},
    "decode_attention_int8_cpu": {"k_buffer", "v_buffer", "output", "attn_logits", "k_scale_buf", "v_scale_buf"},
    "extend_attention_int8_cpu": {"o_extend", "k_buffer", "v_buffer", "k_scale_buf", "v_scale_buf"},
}


@pytest.mark.variant_independent
@pytest.mark.parametrize("op", sorted(WRITTEN))
def test_schemas_declare_exactly_the_tensors_each_operator_writes(op):
    schema = getattr(rvv_attn.ops, op).default._schema
    declared = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    assert declared == WRITTEN[op]
