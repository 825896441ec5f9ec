"""The demonstration command, on a tiny model: it runs both backends, reports agreement and labels its times."""

from __future__ import annotations

import pytest

from rvv_attn import demo

TINY = ["--layers", "1", "--hidden", "32", "--heads", "2", "--kv-heads", "1", "--head-dim", "16",
        "--intermediate", "64", "--vocab", "64", "--requests", "3", "--prompt-lens", "9,2", "--new-tokens", "3,2",
        "--chunk-size", "4", "--max-running", "2", "--no-progress"]


def test_demo_runs_both_backends_and_reports_agreement(capsys, monkeypatch):
    monkeypatch.setenv("RVV_ATTN_QEMU_CPU", "rv64,v=true,vlen=256")
    assert demo.main(TINY) == 0
    out = capsys.readouterr().out
    assert "agreement: all 3 requests give identical tokens (rvv, torch_native)" in out
    assert "emulated (qemu-riscv64 -cpu rv64,v=true,vlen=256)" in out and "emulated wall-clock seconds" in out
    table = out[out.index("summary ("):].splitlines()
    rows = [r for r in map(str.split, table) if r and r[0] in ("rvv", "torch_native") and r[1].isdigit()]
    # 9 + 2 + 9 prompt tokens prefilled; decode feeds back all but the last generated token: 2 + 1 + 2.
    assert [(r[0], int(r[1]), int(r[5])) for r in rows] == [("rvv", 20, 5), ("torch_native", 20, 5)]


def test_demo_int8_cache_on_one_backend(capsys, monkeypatch):
    monkeypatch.delenv("RVV_ATTN_QEMU_CPU", raising=False)
    assert demo.main(TINY + ["--kv-cache", "int8-static", "--backends", "rvv"]) == 0
    out = capsys.readouterr().out
    assert "KV cache int8-static (model float32)" in out and "; native;" in out and "agreement" not in out


@pytest.mark.parametrize("bad, message", [(["--backends", "rvv,flash"], "unknown backend flash"),
                                          (["--prompt-lens", "3,x"], "not a comma-separated list"),
                                          (["--kv-cache", "int4"], "invalid choice")])
@pytest.mark.variant_independent
def test_demo_rejects_bad_options(bad, message, capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(bad)
    assert message in capsys.readouterr().err
