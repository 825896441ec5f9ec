"""The cycle estimator's pure parts (ci/driver/bench/cycles.py); the llvm-mca checks are in bench/tests."""

from __future__ import annotations

import pytest

from driver.bench import cycles


def test_march_becomes_the_attributes_llvm_mca_needs():
    assert cycles.mattr_for("rv64gcv_zvl256b") == "+m,+a,+f,+d,+zicsr,+zifencei,+c,+v,+zvl256b"
    assert cycles.mattr_for("rv64gc") == "+m,+a,+f,+d,+zicsr,+zifencei,+c"
    with pytest.raises(ValueError, match="rv64"):
        cycles.mattr_for("rv32gc")


def test_instruction_lengths_follow_the_encoding():
    # c.addi (2 bytes), addi (4 bytes), c.nop (2 bytes)
    code = bytes.fromhex("0505") + bytes.fromhex("13054500") + bytes.fromhex("0100")
    assert cycles.instruction_lengths(code) == [2, 4, 2]
    with pytest.raises(ValueError, match="ends inside"):
        cycles.instruction_lengths(bytes.fromhex("130545"))
    with pytest.raises(ValueError, match="longer than 32 bits"):
        cycles.instruction_lengths(bytes.fromhex("3f000000"))


def test_a_vtype_names_its_instruments_and_refuses_what_rvv_has_not():
    assert cycles.VType(16, 32).instruments() == ["# LLVM-MCA-RISCV-LMUL M4", "# LLVM-MCA-RISCV-SEW E16"]
    assert cycles.VType(32, 4).label == "e32mf2"
    with pytest.raises(ValueError):
        cycles.VType(24, 8)
    with pytest.raises(ValueError):
        cycles.VType(32, 3)


def test_each_block_is_a_region_with_its_own_vtype():
    text = cycles.region_source(
        [("b0", cycles.VType(32, 8), ["vfmacc.vv v8, v16, v24"]), ("b1", None, ["addi a0, a0, 1"])]
    )
    lines = text.splitlines()
    assert lines[0] == "# LLVM-MCA-BEGIN b0" and lines[4] == "# LLVM-MCA-END b0"
    assert "# LLVM-MCA-RISCV-LMUL M1" in lines[1:4]
    assert lines[5:] == ["# LLVM-MCA-BEGIN b1", "addi a0, a0, 1", "# LLVM-MCA-END b1"]
