"""SGLang's own server on riscv64 serves requests through rvv-attn, token for token equal to transformers.

Each architecture starts ``python -m sglang.launch_server`` once (SGLang's
launcher, HTTP on 127.0.0.1, its scheduler and detokenizer in spawned
processes) on a model directory the test writes, with ``--device cpu`` and no
``--attention-backend``: the plugin's riscv64 default must pick ``rvv``. The
reference is transformers' own model class on the same files
(tests/sglang_server.py), which shares no code with SGLang or rvv-attn.

Slow under QEMU (each server start imports torch and SGLang in three
processes): these run in the test-sglang-server session, not in `nox -t test`.
"""

from __future__ import annotations

import platform
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

import sglang_server
from sglang_server import CONTEXT_LENGTH, MODELS, VOCAB_SIZE, Server, prompt_ids, reference_tokens

pytestmark = [pytest.mark.sglang, pytest.mark.sglang_server]

if platform.machine() != "riscv64":
    pytest.skip(
        "the server tests check rvv-attn's riscv64 defaults: run them in test-sglang-server", allow_module_level=True
    )

CONCURRENT_LENGTHS = (5, 17, 40, 29)  # the longest takes three 16-token prefill chunks
CONCURRENT_NEW_TOKENS = 8
LOAD_REQUESTS, LOAD_IN_FLIGHT, LOAD_NEW_TOKENS = 32, 8, 3


@pytest.fixture(scope="module", params=list(MODELS))
def served(request, tmp_path_factory):
    if platform.machine() != "riscv64":
        pytest.fail("the server tests check rvv-attn's riscv64 defaults: run them with ./ci/nox -s test-sglang-server")
    spec = MODELS[request.param]
    folder = tmp_path_factory.mktemp(spec.name)
    model_dir = sglang_server.write_model(spec, folder / "model")
    server = Server(model_dir, folder / "server.log", spec.extra_server_args)
    try:
        server.start()
        print(f"\n{spec.name}: server answered after {server.start_seconds:.0f} s ({spec.notes})")
        yield spec, server, sglang_server.build_model(spec), model_dir
    finally:
        server.stop()


def test_plugin_runs_in_the_scheduler_and_rvv_serves_by_default(served):
    _, server, _, _ = served
    log = server.log()
    # The launcher resolves the arguments: rvv chosen by the plugin's riscv64 default, no grammar backend.
    assert "--device cpu on riscv64 without --attention-backend: using 'rvv'" in log
    assert "xgrammar is not installed (no riscv64 build): --grammar-backend none" in log
    # The scheduler (another process) builds the backend and says what the plugin did there.
    found = re.search(
        r"rvv-attn: the rvv attention backend serves this model \(kernel variant vlen256: .*\); plugin loaded in "
        r"process (\d+): \d+ sgl_kernel names served, stand-ins for triton, xgrammar, RoPE on its torch path",
        log,
    )
    assert found, server.tail()
    assert int(found.group(1)) != server.process.pid, "the backend must be built in SGLang's scheduler process"


def test_concurrent_chunked_requests_match_the_reference(served):
    spec, server, model, _ = served
    prompts = prompt_ids(CONCURRENT_LENGTHS, seed=spec.seed)
    expected = reference_tokens(model, prompts, CONCURRENT_NEW_TOKENS)
    with ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda p: server.generate(p, CONCURRENT_NEW_TOKENS), prompts))
    assert got == expected
    for feature, change in spec.must_matter.items():
        # The data can tell: without the feature, transformers' own model continues these prompts differently.
        other = reference_tokens(sglang_server.build_model(spec, change), prompts, CONCURRENT_NEW_TOKENS)
        assert other != expected, f"{feature} must change some of these tokens, or equal tokens prove nothing"


def test_text_completion_matches_the_reference(served):
    spec, server, model, model_dir = served
    tokenizer = sglang_server.load_tokenizer(model_dir)
    ids = prompt_ids([12], seed=spec.seed + 100)[0]
    prompt = tokenizer.decode(ids)
    assert tokenizer(prompt, add_special_tokens=False)["input_ids"] == ids, "the text must stand for these ids"
    expected = tokenizer.decode(reference_tokens(model, [ids], 6)[0])
    status, body = server.post(
        "/v1/completions",
        {"model": str(model_dir), "prompt": prompt, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
    )
    assert status == 200, body
    assert body["choices"][0]["text"].split() == expected.split()


def test_bounded_load_gives_every_request_its_own_tokens(served):
    spec, server, model, _ = served
    lengths = [3 + (7 * i) % 28 for i in range(LOAD_REQUESTS)]
    prompts = prompt_ids(lengths, seed=spec.seed + 200)
    expected = reference_tokens(model, prompts, LOAD_NEW_TOKENS)
    with ThreadPoolExecutor(LOAD_IN_FLIGHT) as pool:
        got = list(pool.map(lambda p: server.generate(p, LOAD_NEW_TOKENS), prompts))
    mismatched = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
    assert not mismatched, f"requests {mismatched} differ from the reference"


def test_bad_input_gets_sglangs_error_and_the_server_keeps_serving(served):
    spec, server, model, _ = served
    sampling = {"max_new_tokens": 2, "temperature": 0.0}
    status, body = server.post("/generate", {"input_ids": [5, VOCAB_SIZE + 7, 6], "sampling_params": sampling})
    assert status == 400 and str(VOCAB_SIZE + 7) in str(body), body
    too_long = prompt_ids([CONTEXT_LENGTH + 20], seed=spec.seed + 300)[0]
    status, body = server.post("/generate", {"input_ids": too_long, "sampling_params": sampling})
    assert status == 400 and "context length" in str(body).lower(), body
    prompt = prompt_ids([9], seed=spec.seed + 400)[0]
    assert server.generate(prompt, 4) == reference_tokens(model, [prompt], 4)[0]
    assert server.process.poll() is None
