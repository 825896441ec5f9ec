"""Generate with a small model through each attention backend and compare: ``python -m rvv_attn.demo``.

``--model`` picks the model: ``llama`` (the default) or ``gpt-oss``, the
same decoder with gpt-oss's attention (sliding-window layers alternating
with full ones, a learned sink per head; ``--window`` sets the window). The
same requests (deterministic prompts from ``--seed``) run once per
backend: chunked prefill, batched greedy decode, requests finishing at
different times and later ones taking over their cache slots. Prints each
request's tokens, whether the backends agree, and per-phase throughput.
Under QEMU the times are emulated wall time (the nox demo sessions set
RVV_ATTN_QEMU_CPU): useful as a ratio between backends, not as a board figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from . import runtime_info
from .serving.backends import BACKENDS as SERVING_BACKENDS
from .serving.backends import AttentionBackend
from .serving.backends import make_backend as make_serving_backend
from .serving.batch import ForwardMode
from .serving.generation import Engine, Request
from .serving.model import MODELS, LlamaModel, ModelConfig
from .serving.pools import Int8Scales, ReqToTokenPool, make_kv_pool

# The demo's backends: the serving path's own, and SGLang's classes driving its rvv backend (needs SGLang).
BACKENDS = (*SERVING_BACKENDS, "sglang")


def make_backend(name: str, num_heads: int, v_head_dim: int) -> AttentionBackend:
    if name == "sglang":
        from .sglang_plugin.demo_backend import SGLangRadixBackend  # imports SGLang: only when asked for

        return SGLangRadixBackend(num_heads, v_head_dim)
    return make_serving_backend(name, num_heads, v_head_dim)


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
KV_CACHES = ("float", "int8-dynamic", "int8-static")


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give positive integers, e.g. 12,40,7")
    return values


# Model sizes the command line may change: flag, ModelConfig field, help.
_SIZE_FLAGS = (
    ("--layers", "num_layers", "layers"),
    ("--hidden", "hidden_size", "hidden size"),
    ("--heads", "num_heads", "query heads"),
    ("--kv-heads", "num_kv_heads", "KV heads"),
    ("--head-dim", "head_dim", "head dimension"),
    ("--intermediate", "intermediate_size", "MLP width"),
    ("--vocab", "vocab_size", "vocabulary"),
)


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def model_config(args: argparse.Namespace) -> ModelConfig:
    """``--model``'s configuration with the sizes (and ``--window``) given on the command line."""
    changes = {field: getattr(args, _dest(flag), None) for flag, field, _ in _SIZE_FLAGS}
    changes["sliding_window"] = getattr(args, "window", None)
    return dataclasses.replace(MODELS[args.model], **{k: v for k, v in changes.items() if v is not None})


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m rvv_attn.demo",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--backends",
        default="rvv,torch_native",
        help=f"comma-separated, run in this order; the first is the one the others are compared with "
        f"({', '.join(BACKENDS)})",
    )
    p.add_argument(
        "--sglang",
        action="store_true",
        help="add the backend 'sglang': SGLang's ForwardBatch, RadixAttention and KV pool driving its rvv "
        "attention backend (needs SGLang's Python package)",
    )
    m = p.add_argument_group("model (random weights from --seed; a size not given is the --model's)")
    m.add_argument(
        "--model",
        choices=MODELS,
        default="llama",
        help="llama: full attention in every layer; gpt-oss: sliding-window layers (0, 2, ...) "
        "alternating with full ones, and attention sinks",
    )
    # Unset model options stay out of the namespace (SUPPRESS), so the chosen --model's values apply.
    m.add_argument(
        "--window",
        type=int,
        metavar="TOKENS",
        default=argparse.SUPPRESS,
        help=f"keys a sliding-window layer sees, its own included; 0: none (default: the model's, "
        f"{', '.join(f'{name} {cfg.sliding_window}' for name, cfg in MODELS.items())})",
    )
    for flag, field, what in _SIZE_FLAGS:
        m.add_argument(
            flag,
            type=int,
            metavar="N",
            default=argparse.SUPPRESS,
            help=f"{what} (default: {getattr(MODELS['llama'], field)})",
        )
    m.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("requests")
    r.add_argument("--requests", type=int, default=5)
    r.add_argument(
        "--prompt-lens",
        type=_int_list,
        default=[12, 70, 5, 33, 20],
        help="prompt lengths, repeated cyclically over the requests",
    )
    r.add_argument(
        "--new-tokens",
        type=_int_list,
        default=[6, 4, 10, 8, 6],
        help="tokens to generate per request, repeated cyclically",
    )
    r.add_argument("--chunk-size", type=int, default=32, help="prefill token budget per extend batch")
    r.add_argument("--max-running", type=int, default=3, help="requests in flight; the rest wait for a free row")
    c = p.add_argument_group("KV cache and execution")
    c.add_argument("--dtype", choices=DTYPES, default="float32", help="model and float-cache dtype")
    c.add_argument("--kv-cache", choices=KV_CACHES, default="float")
    c.add_argument(
        "--kv-scales",
        type=float,
        nargs=2,
        metavar=("K", "V"),
        help="int8-static: K and V scales (default: codes cover 5 standard deviations of the model's K, V)",
    )
    c.add_argument("--pool-tokens", type=int, default=0, help="KV cache slots (0: enough for --max-running requests)")
    c.add_argument("--threads", type=int, default=1, help="torch threads (the kernels use torch's thread pool)")
    c.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if args.sglang and "sglang" not in args.backends:
        args.backends.append("sglang")
    unknown = [b for b in args.backends if b not in BACKENDS]
    if unknown or not args.backends:
        p.error(f"--backends: unknown backend {unknown[0] if unknown else '(none)'}; choose from {', '.join(BACKENDS)}")
    if args.requests < 1 or args.threads < 1 or args.chunk_size < 1 or args.max_running < 1:
        p.error("--requests, --threads, --chunk-size and --max-running must be >= 1")
    sizes = [flag for flag, _, _ in _SIZE_FLAGS if getattr(args, _dest(flag), 1) < 1]
    if sizes:
        p.error(f"{sizes[0]} must be >= 1")
    if getattr(args, "window", 0) < 0:
        p.error(f"--window {args.window}: give the keys a sliding layer sees (>= 1), or 0 for no window")
    return args


@dataclass
class BackendRun:
    name: str
    requests: dict[str, Request]
    prefill_tokens: int
    prefill_seconds: float
    decode_tokens: int
    decode_seconds: float
    wall_seconds: float
    attention_seconds: dict[ForwardMode, float]


class Progress:
    """One line per backend: a bar over the tokens to process (prompt + generated)."""

    def __init__(self, label: str, total: int, enabled: bool, width: int = 28) -> None:
        self.label, self.total, self.enabled, self.width = label, total, enabled, width
        self.tty = sys.stderr.isatty()
        self._last_quarter = -1

    def update(self, done: int, note: str) -> None:
        if not self.enabled:
            return
        filled = self.width * done // self.total
        line = f"  {self.label:<13} [{'#' * filled}{'.' * (self.width - filled)}] {done:>5}/{self.total} tokens  {note}"
        if self.tty:
            print("\r" + line, end="", file=sys.stderr, flush=True)
        elif 4 * done // self.total != self._last_quarter:  # a log file gets a line per quarter
            self._last_quarter = 4 * done // self.total
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr, flush=True)


def make_requests(args: argparse.Namespace, vocab: int) -> list[Request]:
    g = torch.Generator().manual_seed(args.seed + 1)
    reqs = []
    for i in range(args.requests):
        n = args.prompt_lens[i % len(args.prompt_lens)]
        prompt = torch.randint(0, vocab, (n,), generator=g).tolist()
        reqs.append(Request(f"req{i}", prompt, args.new_tokens[i % len(args.new_tokens)]))
    return reqs


def run_backend(name: str, args: argparse.Namespace, cfg: ModelConfig) -> BackendRun:
    dtype = DTYPES[args.dtype]
    reqs = make_requests(args, cfg.vocab_size)
    max_context = max(r.context_len for r in reqs)
    pool_tokens = args.pool_tokens or args.max_running * max_context
    model = LlamaModel(cfg, dtype, seed=args.seed)
    kv_pool = make_kv_pool(
        args.kv_cache,
        pool_tokens,
        cfg.num_layers,
        cfg.num_kv_heads,
        cfg.head_dim,
        cfg.head_dim,
        dtype,
        Int8Scales(*(args.kv_scales or cfg.static_kv_scales())),
        shuffle_seed=args.seed,
    )
    backend = make_backend(name, cfg.num_heads, cfg.head_dim)
    attention_seconds = {ForwardMode.EXTEND: 0.0, ForwardMode.DECODE: 0.0}
    untimed_forward = backend.forward

    def timed_forward(q, k, v, layer, batch, save_kv_cache=True):
        # The backend's own share of each phase, apart from the model's matmuls around it.
        start = time.perf_counter()
        out = untimed_forward(q, k, v, layer, batch, save_kv_cache)
        attention_seconds[batch.forward_mode] += time.perf_counter() - start
        return out

    backend.forward = timed_forward
    engine = Engine(
        model,
        backend,
        ReqToTokenPool(args.max_running, max_context),
        kv_pool,
        chunk_size=args.chunk_size,
        max_running=args.max_running,
    )
    for req in reqs:
        engine.add_request(req)
    total = sum(len(r.prompt) + r.max_new_tokens - 1 for r in reqs)
    progress = Progress(name, total, not args.no_progress)

    def on_step(eng: Engine, mode: ForwardMode) -> None:
        done = sum(s.tokens for s in eng.stats.values())
        progress.update(
            done,
            f"{mode.value:<6} running {len(eng.running)}, waiting {len(eng.waiting)}, finished {len(eng.finished)}",
        )

    start = time.perf_counter()
    try:
        engine.run(on_step)
    finally:
        progress.close()
    wall = time.perf_counter() - start
    pre, dec = engine.stats[ForwardMode.EXTEND], engine.stats[ForwardMode.DECODE]
    return BackendRun(
        name, {r.rid: r for r in reqs}, pre.tokens, pre.seconds, dec.tokens, dec.seconds, wall, attention_seconds
    )


def _where() -> str:
    cpu = os.environ.get("RVV_ATTN_QEMU_CPU")
    return f"emulated (qemu-riscv64 -cpu {cpu})" if cpu else "native"


def report(runs: list[BackendRun], args: argparse.Namespace) -> bool:
    """Print per-request tokens, agreement with the first backend, and the summary table; True if all agree."""
    first = runs[0]
    print("\nper-request tokens (greedy):")
    all_agree = True
    for rid, req in first.requests.items():
        print(f"  {rid} (prompt {len(req.prompt):>3}, {req.max_new_tokens:>2} new)  {first.name:<13} {req.output}")
        for other in runs[1:]:
            out = other.requests[rid].output
            if out == req.output:
                verdict = "same"
            else:
                all_agree = False
                diverge = next(i for i, (a, b) in enumerate(zip(out + [None], req.output + [None])) if a != b)
                verdict = f"DIFFERENT from token {diverge}: {out}"
            print(f"  {'':<26} {other.name:<13} {verdict}")
    if len(runs) > 1:
        n = len(first.requests)
        print(
            f"\nagreement: {'all ' + str(n) + ' requests give identical tokens' if all_agree else 'NO'} "
            f"({', '.join(r.name for r in runs)})"
        )
    label = "emulated " if os.environ.get("RVV_ATTN_QEMU_CPU") else ""
    print(
        f"\nsummary ({_where()}; times are {label}wall-clock seconds"
        + ("; compare backends by their ratio, not with hardware)" if label else ")")
    )
    header = (
        f"  {'backend':<13} {'prefill tok':>11} {'prefill s':>9} {'(attn s)':>8} {'prefill tok/s':>13} "
        f"{'decode tok':>10} {'decode s':>8} {'(attn s)':>8} {'decode tok/s':>12} {'total s':>8}"
    )
    print(header)
    print("  " + "-" * (len(header) - 2))
    for r in runs:
        attn = r.attention_seconds
        print(
            f"  {r.name:<13} {r.prefill_tokens:>11} {r.prefill_seconds:>9.2f} {attn[ForwardMode.EXTEND]:>8.2f} "
            f"{r.prefill_tokens / max(r.prefill_seconds, 1e-9):>13.1f} {r.decode_tokens:>10} "
            f"{r.decode_seconds:>8.2f} {attn[ForwardMode.DECODE]:>8.2f} "
            f"{r.decode_tokens / max(r.decode_seconds, 1e-9):>12.1f} {r.wall_seconds:>8.2f}"
        )
    if len(runs) > 1:
        base = runs[-1]
        for r in runs[:-1]:
            ra, ba = r.attention_seconds, base.attention_seconds
            print(
                f"  {r.name} vs {base.name}, speed ratio: "
                f"prefill {base.prefill_seconds / max(r.prefill_seconds, 1e-9):.2f}x "
                f"(attention alone {ba[ForwardMode.EXTEND] / max(ra[ForwardMode.EXTEND], 1e-9):.2f}x), "
                f"decode {base.decode_seconds / max(r.decode_seconds, 1e-9):.2f}x "
                f"(attention alone {ba[ForwardMode.DECODE] / max(ra[ForwardMode.DECODE], 1e-9):.2f}x)"
            )
        print("  (attn s: time inside the attention backend; the rest is the model's matmuls, norms and sampling)")
    return all_agree


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        cfg = model_config(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    info = runtime_info()
    reqs = make_requests(args, cfg.vocab_size)
    kv = args.dtype if args.kv_cache == "float" else f"{args.kv_cache} (model {args.dtype})"
    style = {"llama": "Llama-style", "gpt-oss": "gpt-oss-like"}[args.model]
    print(f"rvv-attn demo: {style} model, {cfg.describe()}, seed {args.seed}")
    print(
        f"  {len(reqs)} requests, prompts {[len(r.prompt) for r in reqs]}, new tokens "
        f"{[r.max_new_tokens for r in reqs]}; prefill chunk {args.chunk_size} tokens, at most {args.max_running} "
        f"running; KV cache {kv}"
    )
    print(
        f"  kernels: variant {info['active_variant']} (CPU VLEN {info['cpu_vlen'] or 'none'}); {_where()}; "
        f"torch {info['torch']}, {args.threads} thread(s)\n"
    )
    runs = []
    for name in args.backends:
        try:
            runs.append(run_backend(name, args, cfg))
        except (RuntimeError, ValueError) as err:
            print(f"error: backend {name}: {err}", file=sys.stderr)
            return 2
    agree = report(runs, args)
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
