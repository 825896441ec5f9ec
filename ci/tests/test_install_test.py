"""The install test's configurations, options and guest command lines."""

from __future__ import annotations

from pathlib import Path

import pytest

from driver.errors import ConfigError
from driver.release import install_test
from driver.toolchain.vlens import Variant, variants

TABLE = (Variant(128), Variant(256))


def test_configurations_are_no_v_then_every_vlen_of_the_table():
    configs = install_test.configurations(TABLE)
    assert [c.name for c in configs] == ["novector", "vlen128", "vlen256"]
    assert configs[0].qemu_cpu == "rv64,v=false" and configs[0].expected_variant == "portable"
    assert configs[2].qemu_cpu == Variant(256).qemu_cpu() and configs[2].expected_variant == "vlen256"
    assert [c.vlen for c in install_test.configurations()][1:] == [v.vlen for v in variants()]


def test_quick_plan_runs_every_operator_without_v_and_the_runtime_checks_at_one_vlen():
    (novector, selection), (first, runtime) = install_test.quick_plan(TABLE)
    assert novector.name == "novector" and first.name == "vlen128"
    files = tuple(a for a in runtime if not a.startswith("--"))
    assert files == ("tests/test_runtime.py", "tests/test_packaging.py", "tests/test_board_checks.py")
    assert set(files[:2]) < set(selection)
    root = Path(__file__).resolve().parents[2]
    # The two second-interpreter checks left out here exist under these names (a rename would silently run them).
    deselected = [a.removeprefix("--deselect=") for a in runtime if a.startswith("--deselect=")]
    assert deselected == list(install_test.QUICK_SECOND_INTERPRETER)
    for node in deselected:
        path, name = node.split("::")
        assert f"def {name}(" in (root / path).read_text(), node
    for path in selection:
        assert (root / path).is_file(), path
    # Between them the selected files call every operator the library registers.
    called = "".join((root / path).read_text() for path in selection)
    for op in (
        "decode_set_kv_buffer",
        "decode_attention_cpu",
        "extend_attention_cpu",
        "decode_attention_int8_cpu",
        "extend_attention_int8_cpu",
    ):
        assert op in called, op


def test_options_are_split_from_pytest_arguments(tmp_path):
    wheel = tmp_path / "rvv_attn-1.0-py3-none-manylinux_2_39_riscv64.whl"
    wheel.write_bytes(b"")
    opts, rest = install_test.parse_posargs(
        ["--configs=vlen256,novector", f"--wheel={tmp_path}", "-x", "tests/a"], TABLE
    )
    assert [c.name for c in opts.configs] == ["vlen256", "novector"]
    assert opts.wheel == wheel  # a folder means its one release wheel
    assert rest == ["-x", "tests/a"]
    defaults, rest = install_test.parse_posargs(["-k", "x"], TABLE)
    assert [c.name for c in defaults.configs] == ["novector", "vlen128", "vlen256"] and defaults.wheel is None
    assert rest == ["-k", "x"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--configs=vlen4096"], "unknown configuration vlen4096; known: novector, vlen128, vlen256"),
        (["--configs="], "--configs needs a value"),
        (["--wheel=/nonexistent/x.whl"], "no such file or folder"),
    ],
)
def test_bad_options_say_what_is_known(args, message):
    with pytest.raises(ConfigError, match=message):
        install_test.parse_posargs(args, TABLE)


def test_guest_commands_install_without_an_index_and_test_without_the_checkout(tmp_path):
    qemu, root, venv = Path("/q/qemu-riscv64"), tmp_path, tmp_path / "venv"
    (root / "usr/bin").mkdir(parents=True)
    (root / "usr/bin/python3").touch()
    create = install_test.create_venv_command(qemu, root, venv)
    assert create[:5] == [str(qemu), "-L", str(root), "-cpu", "rv64,v=false"]
    assert create[5:] == [
        str(root / "usr/bin/python3"),
        "-m",
        "venv",
        "--system-site-packages",
        "--without-pip",
        str(venv),
    ]
    pip = install_test.pip_install_command(qemu, root, venv, Path("dist/w.whl"))
    assert pip[5:9] == [str(venv / "bin/python3"), "-m", "pip", "install"] and "--no-index" in pip
    assert pip[-1] == "dist/w.whl"
    config = install_test.configurations(TABLE)[2]
    test = install_test.pytest_command(qemu, root, venv, config, ["tests"], Path("j.xml"))
    assert test[4] == config.qemu_cpu and test[5:9] == [str(venv / "bin/python3"), "-P", "-m", "pytest"]


def test_guest_environment_has_no_pythonpath_and_no_forced_variant(tmp_path):
    config = install_test.configurations(TABLE)[0]
    host = {"PYTHONPATH": "/work/build/stage", "RVV_ATTN_VARIANT": "vlen256", "HOME": "/root"}
    env = install_test.pytest_env(config, tmp_path / "venv", tmp_path, Path("/q"), Path("/s"), host)
    assert "PYTHONPATH" not in env and "RVV_ATTN_VARIANT" not in env
    assert env["RVV_ATTN_EXPECT_VARIANT"] == "portable" and env["RVV_ATTN_EXPECT_VLEN"] == "0"
    assert env["RVV_ATTN_EXPECT_INSTALLED_IN"] == str(tmp_path / "venv")
    assert env["RVV_ATTN_QEMU_CPU"] == "rv64,v=false"
    assert env["PIP_CONFIG_FILE"] == "/dev/null"
