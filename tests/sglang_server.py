"""SGLang's own server for the server tests: a small model directory, an independent reference, the process.

- :func:`write_model` writes what ``--model-path`` reads: a transformers
  config, random weights in safetensors (a fixed seed), and a tokenizer built
  offline with ``tokenizers``. The weights are scaled so that attention
  decides the tokens: query/key projections large enough for sharp scores,
  value/output projections that carry as much as the residual stream, and a
  small MLP. A backend that attends to the wrong keys then emits other tokens.
- :func:`reference_tokens` is greedy decoding with transformers' own model
  class on the same files, in float32, one request at a time: nothing of
  SGLang or rvv-attn is involved.
- :class:`Server` starts ``python -m sglang.launch_server`` (SGLang's real
  launcher, HTTP on 127.0.0.1, its own spawned processes) and talks to it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
VOCAB_SIZE = 256
CONTEXT_LENGTH = 128


def word(index: int) -> str:
    """The text of the ``index``-th ordinary token (ids start after the special tokens)."""
    return f"w{index}"


@dataclass(frozen=True)
class TinyModel:
    """One architecture of the server tests: its transformers config and how its weights are drawn."""

    name: str
    model_type: str  # transformers' config class, by its model_type
    config: dict[str, Any]
    # Config changes that must change the reference's tokens (what a backend that dropped the feature would give):
    # they show that the prompts exercise the feature, so that equal tokens mean the backend implements it.
    must_matter: dict[str, dict[str, Any]] = field(default_factory=dict)
    seed: int = 0
    # Standard deviation of the embeddings (the other weights: _weight_scale).
    embedding_scale: float = 1.0
    # Norm weights set to a constant, by a fragment of the parameter's name (the rest keep their initial value).
    norm_weights: dict[str, float] = field(default_factory=dict)
    notes: str = ""
    extra_server_args: tuple[str, ...] = field(default_factory=tuple)


_COMMON = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": CONTEXT_LENGTH,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "dtype": "float32",
}

LLAMA = TinyModel(
    name="llama",
    model_type="llama",
    config={**_COMMON, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "rope_theta": 10000.0},
    seed=1,
    notes="Llama with GQA (4 query heads, 2 KV heads)",
)

# Gemma 2's attention: a sliding window on every other layer, and scores soft-capped (s = cap * tanh(s / cap)). Its
# embeddings are tied to the output and scaled by sqrt(hidden) on the way in, hence the smaller embedding scale. No
# final logit soft cap: SGLang's CPU path would run it through a Triton kernel. (SGLang accepts only its GPU
# backends for EXAONE 4's and gpt-oss's windows, so those cannot be served on a CPU.)
_WINDOW = 8
GEMMA2 = TinyModel(
    name="gemma2-window",
    model_type="gemma2",
    config={
        **_COMMON,
        "architectures": ["Gemma2ForCausalLM"],
        "num_hidden_layers": 4,
        "rope_theta": 10000.0,
        "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh",
        "hidden_act": "gelu_pytorch_tanh",  # the name SGLang's Gemma 2 reads
        "query_pre_attn_scalar": 16,
        "sliding_window": _WINDOW,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "attn_logit_softcapping": 5.0,
        "final_logit_softcapping": None,
    },
    must_matter={
        "the sliding window": {"layer_types": ["full_attention"] * 4},
        "the soft cap": {"attn_logit_softcapping": None},
    },
    seed=2,
    embedding_scale=0.5,
    # Gemma's norms scale by (1 + weight) and it normalizes each block's output before the residual add: attention
    # out x8 to stand up to the scaled, tied embeddings, the MLP x0.1 so that attention decides. (Greedy tokens of a
    # random tied model still repeat often; the window and the cap each change them, which is what counts here.)
    norm_weights={"post_attention_layernorm": 7.0, "post_feedforward_layernorm": -0.9},
    notes=f"Gemma 2 style: sliding window of {_WINDOW} tokens on two of four layers, attention soft cap 5, GQA",
)

MODELS = {m.name: m for m in (LLAMA, GEMMA2)}


# ---- the model directory ----


def _weight_scale(spec: TinyModel, name: str) -> float | None:
    """Standard deviation for a parameter by its name; None keeps the initial value (norms stay at one)."""
    if "norm" in name:
        return None
    if "embed_tokens" in name:
        return spec.embedding_scale
    if any(p in name for p in ("q_proj", "k_proj")):
        return 0.25  # scores q.k/sqrt(16) of a few units: attention picks keys, it does not average them
    if any(p in name for p in ("v_proj", "o_proj")):
        return 0.125  # the attention output is as large as the residual stream
    if "lm_head" in name:
        return 0.4  # logits a few units apart: greedy choices are not near-ties
    return 0.02  # the MLP: small, so attention decides


def build_model(spec: TinyModel, overrides: dict[str, Any] | None = None):
    """transformers' model for ``spec`` with its seeded weights (float32, eval mode)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(spec.model_type, **{**spec.config, **(overrides or {})})
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="eager")
    generator = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            scale = _weight_scale(spec, name)
            if scale is not None:
                param.copy_(torch.randn(param.shape, generator=generator) * scale)
            for fragment, value in spec.norm_weights.items():
                if fragment in name:
                    param.fill_(value)
    return model.eval()


def write_tokenizer(path: Path) -> None:
    """A word-level tokenizer over ``w0 w1 ...`` (SentencePiece-style spaces), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({"\u2581" + word(i): len(SPECIAL_TOKENS) + i for i in range(VOCAB_SIZE - len(SPECIAL_TOKENS))})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(path)


def write_model(spec: TinyModel, path: Path) -> Path:
    """The directory ``--model-path`` reads: config.json, model.safetensors, the tokenizer's files."""
    path.mkdir(parents=True, exist_ok=True)
    build_model(spec).save_pretrained(path, safe_serialization=True)
    write_tokenizer(path)
    return path


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def prompt_ids(lengths: Sequence[int], seed: int) -> list[list[int]]:
    """Prompts of ordinary tokens (no special ones), deterministic per seed."""
    generator = torch.Generator().manual_seed(seed)
    first = len(SPECIAL_TOKENS)
    return [torch.randint(first, VOCAB_SIZE, (n,), generator=generator).tolist() for n in lengths]


# ---- the reference ----


# Two float32 implementations of the same model (different summation orders, SGLang's fused projections, the
# kernels' online softmax) agree on logits to about 1e-5 here; a greedy choice whose top two logits are closer than
# 20 times that could go either way, and the comparison would test rounding, not attention.
MIN_MARGIN = 2e-4


@torch.no_grad()
def reference_tokens(model, prompts: Sequence[Sequence[int]], new_tokens: int) -> list[list[int]]:
    """Greedy continuation of each prompt, alone, by recomputing the whole sequence each step (no cache).

    Raises if a choice is a near-tie (MIN_MARGIN): then the prompts or the seed must change, not the tolerance.
    """
    results = []
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            top = torch.topk(logits, 2).values
            if float(top[0] - top[1]) < MIN_MARGIN:
                raise AssertionError(f"near-tie in the reference after {ids}: top logits {top.tolist()}")
            ids.append(int(logits.argmax()))
        results.append(ids[len(prompt) :])
    return results


# ---- the server ----


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(AssertionError):
    pass


class Server:
    """``python -m sglang.launch_server`` in a process group of its own, its log in a file."""

    # Under QEMU the launcher, the scheduler and the detokenizer each import torch and SGLang (about two minutes
    # each, partly in parallel on two cores) before the server answers.
    START_TIMEOUT = 1800

    def __init__(self, model_dir: Path, log_path: Path, extra_args: Sequence[str] = (), env: dict | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.args = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            str(model_dir),
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--context-length",
            str(CONTEXT_LENGTH),
            "--max-total-tokens",
            "2048",
            "--max-running-requests",
            "8",
            "--chunked-prefill-size",
            "16",
            # The model's own dtype, as the reference runs it (SGLang's "auto" would serve a float32 model in float16).
            "--dtype",
            "float32",
            "--log-level",
            "info",
            *extra_args,
        ]
        self.env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", **(env or {})}
        self.process: subprocess.Popen | None = None
        self.start_seconds = 0.0

    def start(self) -> Server:
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env,
                start_new_session=True,
            )  # fmt: skip
        deadline = started + self.START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise ServerError(f"the server exited with {self.process.returncode} before it served:\n{self.tail()}")
            if self.healthy():
                break
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(f"the server did not answer within {self.START_TIMEOUT} s:\n{self.tail()}")
            time.sleep(3)
        self.start_seconds = time.monotonic() - started
        return self

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=10) as response:
                return response.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, 60), (signal.SIGKILL, 30)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # The launcher's children run in its process group: make sure none outlives the test.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])

    def post(self, path: str, payload: dict, timeout: float = 900) -> tuple[int, dict]:
        """(HTTP status, JSON body); an error status is returned, not raised."""
        request = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            body = error.read()
            try:
                return error.code, json.loads(body)
            except ValueError:
                return error.code, {"raw": body.decode(errors="replace")}

    def generate(self, input_ids: Sequence[int], new_tokens: int) -> list[int]:
        """Greedy tokens for ``input_ids`` through /generate (EOS ignored, so every request runs its length)."""
        status, body = self.post(
            "/generate",
            {
                "input_ids": list(input_ids),
                "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True},
            },
        )
        if status != 200:
            raise ServerError(f"/generate answered {status}: {body}\n{self.tail(20)}")
        return list(body["output_ids"])
