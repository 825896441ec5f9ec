"""The demonstration command, on a tiny model: it runs both backends, reports agreement and labels its times."""

from __future__ import annotations

import pytest

from rvv_attn import demo

TINY = [
    "--layers",
    "1",
    "--hidden",
    "32",
    "--heads",
    "2",
    "--kv-heads",
    "1",
    "--head-dim",
    "16",
    "--intermediate",
    "64",
    "--vocab",
    "64",
    "--requests",
    "3",
    "--prompt-lens",
    "9,2",
    "--new-tokens",
    "3,2",
    "--chunk-size",
    "4",
    "--max-running",
    "2",
    "--no-progress",
]


def test_demo_runs_both_backends_and_reports_agreement(capsys, monkeypatch):
    monkeypatch.setenv("RVV_ATTN_QEMU_CPU", "rv64,v=true,vlen=256")
    assert demo.main(TINY) == 0
    out = capsys.readouterr().out
    assert "agreement: all 3 requests give identical tokens (rvv, torch_native)" in out
    assert "emulated (qemu-riscv64 -cpu rv64,v=true,vlen=256)" in out and "emulated wall-clock seconds" in out
    table = out[out.index("summary (") :].splitlines()
    rows = [r for r in map(str.split, table) if r and r[0] in ("rvv", "torch_native") and r[1].isdigit()]
    # 9 + 2 + 9 prompt tokens prefilled; decode feeds back all but the last generated token: 2 + 1 + 2.
    assert [(r[0], int(r[1]), int(r[5])) for r in rows] == [("rvv", 20, 5), ("torch_native", 20, 5)]


def test_demo_gpt_oss_model_agrees_across_backends(capsys, monkeypatch):
    monkeypatch.delenv("RVV_ATTN_QEMU_CPU", raising=False)
    # A 4-token window: the 9-token prompts and their generations outrun it.
    assert demo.main(TINY + ["--model", "gpt-oss", "--window", "4"]) == 0
    out = capsys.readouterr().out
    assert (
        "gpt-oss-like model, 1 layers, hidden 32, 2 query / 1 KV heads, head dim 16, MLP 64, vocab 64, "
        "4-token sliding window in layers [0] (the others full), attention sinks"
    ) in out
    assert "agreement: all 3 requests give identical tokens (rvv, torch_native)" in out


@pytest.mark.variant_independent
def test_demo_model_options():
    gpt_oss = demo.model_config(demo.parse_args(["--model", "gpt-oss"]))
    assert (gpt_oss.sliding_window, gpt_oss.attention_sinks, gpt_oss.hidden_size) == (16, True, 256)
    llama = demo.model_config(demo.parse_args(["--hidden", "64", "--window", "8"]))
    assert (llama.sliding_window, llama.attention_sinks, llama.hidden_size) == (8, False, 64)
    assert demo.model_config(demo.parse_args([])) == demo.MODELS["llama"]


def test_demo_int8_cache_on_one_backend(capsys, monkeypatch):
    monkeypatch.delenv("RVV_ATTN_QEMU_CPU", raising=False)
    assert demo.main(TINY + ["--kv-cache", "int8-static", "--backends", "rvv"]) == 0
    out = capsys.readouterr().out
    assert "KV cache int8-static (model float32)" in out and "; native;" in out and "agreement" not in out


@pytest.mark.parametrize(
    "bad, message",
    [
        (["--backends", "rvv,flash"], "unknown backend flash"),
        (["--prompt-lens", "3,x"], "not a comma-separated list"),
        (["--kv-cache", "int4"], "invalid choice"),
        (["--model", "gpt-5"], "invalid choice"),
        (["--window", "-1"], "--window -1: give the keys a sliding layer sees"),
        (["--heads", "0"], "--heads must be >= 1"),
    ],
)
@pytest.mark.variant_independent
def test_demo_rejects_bad_options(bad, message, capsys):
    with pytest.raises(SystemExit):
        demo.parse_args(bad)
    assert message in capsys.readouterr().err
