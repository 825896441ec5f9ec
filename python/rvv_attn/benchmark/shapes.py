"""What the board benchmark measures: model head shapes, the plans (smoke, quick, full), work and bytes per shape.

Units of work are those of the instruction-count benchmark (docs/benchmarks.md),
so a time per unit here and a cycle estimate per unit there describe the same
amount of work:

- decode: one KV token x one KV head (B x attended tokens x H_kv per call);
- extend: one query-key pair x one query head (causal: new token i sees
  prefix + i + 1 keys).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

DTYPES = ("bf16", "int8-static", "int8-dynamic", "fp8")


@dataclass(frozen=True)
class Heads:
    """One attention layer's heads: H query heads over H_kv KV heads of D (keys) and Dv (values) elements."""

    heads: int
    heads_kv: int
    head_dim: int
    head_dim_v: int
    v_in_k: bool = False  # MLA: V is the first Dv columns of the K rows (one latent cache)


# Public models' attention shapes (their configs' num_attention_heads, num_key_value_heads, head_dim;
# DeepSeek-V2-Lite's absorbed MLA decode: 16 heads over one latent head of kv_lora_rank 512 + rope 64).
MODELS = {
    "llama3-8b": Heads(32, 8, 128, 128),
    "qwen2.5-7b": Heads(28, 4, 128, 128),
    "deepseek-v2-lite": Heads(16, 1, 576, 512, v_in_k=True),
}
# The instruction-count benchmark's default heads: its row names leave them out.
BENCH_DEFAULT_HEADS = MODELS["llama3-8b"]


@dataclass(frozen=True)
class Shape:
    model: str  # a key of MODELS
    op: str  # "decode" or "extend"
    dtype: str  # "bf16", "int8-static", "int8-dynamic", "fp8" (e4m3 codes, static scales)
    seq: int = 0  # decode: tokens in the sequence, the new one included
    prefix: int = 0  # extend: cached tokens before the new ones
    new: int = 0  # extend: new tokens
    window: int = 0  # sliding_window_size (0: none)
    batch: int = 1

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; known: {', '.join(MODELS)}")
        if self.op not in ("decode", "extend") or self.dtype not in DTYPES:
            raise ValueError(f"unknown op/dtype {self.op}/{self.dtype}")
        if (self.op == "decode" and self.seq < 1) or (self.op == "extend" and self.new < 1):
            raise ValueError(f"{self.op} needs seq >= 1 (decode) or new >= 1 (extend), got {self}")

    @property
    def heads(self) -> Heads:
        return MODELS[self.model]

    @property
    def context(self) -> int:
        """Tokens the (last) query sees: decode's sequence, extend's prefix + new."""
        return self.seq if self.op == "decode" else self.prefix + self.new

    @property
    def label(self) -> str:
        what = f"ctx={self.seq}" if self.op == "decode" else f"prefix={self.prefix}+{self.new}"
        batch = f" B={self.batch}" if self.batch != 1 else ""
        window = f" window={self.window}" if self.window else ""
        return f"{self.model} {self.op} {self.dtype} {what}{batch}{window}"

    def attended(self) -> int:
        """Decode: the tokens one step attends (the last ``window`` of them with a sliding window)."""
        return min(self.seq, self.window) if self.window else self.seq

    def pairs_per_sequence(self) -> int:
        """Extend: causal query-key pairs of one sequence (without a window)."""
        return self.new * self.prefix + self.new * (self.new + 1) // 2

    def units(self) -> int:
        if self.op == "decode":
            return self.batch * self.attended() * self.heads.heads_kv
        return self.batch * self.pairs_per_sequence() * self.heads.heads

    @property
    def unit(self) -> str:
        return "KV token x KV head" if self.op == "decode" else "query-key pair x query head"

    def kv_row_bytes(self) -> int:
        """Bytes of one token's K and V rows of one KV head in the cache (MLA: the K row holds V)."""
        h = self.heads
        element = 2 if self.dtype == "bf16" else 1
        columns = h.head_dim if h.v_in_k else h.head_dim + h.head_dim_v
        return columns * element + (8 if self.dtype == "int8-dynamic" else 0)  # two float32 scales per row

    def kv_bytes_per_call(self) -> int:
        """K/V bytes one call must read, each row once: the floor of its memory traffic.

        Decode: the attended tokens' rows of every KV head; extend: the prefix's and the new tokens' rows.
        """
        tokens = self.attended() if self.op == "decode" else self.prefix + self.new
        return self.batch * tokens * self.heads.heads_kv * self.kv_row_bytes()

    def bench_id(self) -> str:
        """This shape's row name in the instruction-count benchmark (ci/driver/bench/cases.py ``Case.id``), so
        its cycle estimate can be looked up in bench/baseline.json; tests check the two agree."""
        h = self.heads
        if self.op == "decode":
            name = f"decode {self.dtype} B={self.batch} seq={self.seq}"
        else:
            name = f"extend {self.dtype} B={self.batch} prefix={self.prefix}+{self.new}"
        name += f" window={self.window}" if self.window else ""
        if h != BENCH_DEFAULT_HEADS:
            name += " MLA" if h.v_in_k else ""
            name += f" H={h.heads}/{h.heads_kv} D={h.head_dim}/{h.head_dim_v}"
        return name


def thread_counts(cpus: int) -> list[int]:
    """1, 2, 4, ... up to ``cpus``, and ``cpus`` itself when it is not a power of two."""
    counts, n = [], 1
    while n < cpus:
        counts.append(n)
        n *= 2
    return counts + [max(1, cpus)]


@dataclass(frozen=True)
class Plan:
    """A benchmark run: its shapes, thread counts and how long each row is timed."""

    name: str
    shapes: tuple[Shape, ...]
    threads: tuple[int, ...]
    bandwidth_mib: int  # the copy probe's buffer: far larger than the caches
    min_calls: int  # at least this many timed calls per row (a median needs a few)
    min_seconds: float  # and keep calling until this much time has passed ...
    max_calls: int  # ... but no more calls than this


def _decode(model: str, seq: int, dtype: str = "bf16", window: int = 0) -> Shape:
    return Shape(model, "decode", dtype, seq=seq, window=window)


def _extend(model: str, prefix: int, new: int, dtype: str = "bf16") -> Shape:
    return Shape(model, "extend", dtype, prefix=prefix, new=new)


def quick_shapes() -> list[Shape]:
    """About a minute on a SpacemiT K1: the shapes with a cycle estimate at VLEN 256 (bench/baseline.json),
    Qwen's heads, and one 32k decode."""
    return [
        _decode("llama3-8b", 1024),
        _decode("llama3-8b", 4096),
        _decode("llama3-8b", 32768),
        _decode("llama3-8b", 4096, "int8-static"),
        _decode("llama3-8b", 4096, "int8-dynamic"),
        _decode("llama3-8b", 4096, "fp8"),
        _decode("qwen2.5-7b", 4096),
        _decode("deepseek-v2-lite", 4096),
        _decode("llama3-8b", 4096, window=128),
        _extend("llama3-8b", 0, 256),
        _extend("llama3-8b", 1024, 256),
    ]


def full_shapes() -> list[Shape]:
    """Contexts 512 to 32k for every model, int8 beside bf16, extend chunks with and without a prefix,
    sliding windows of gpt-oss's 128 and Mistral's 4096 tokens."""
    contexts = (512, 1024, 2048, 4096, 8192, 16384, 32768)
    shapes = [_decode("llama3-8b", s) for s in contexts]
    shapes += [_decode(m, s) for m in ("qwen2.5-7b", "deepseek-v2-lite") for s in (512, 4096, 32768)]
    shapes += [_decode("llama3-8b", s, dt) for dt in DTYPES[1:] for s in (1024, 4096, 32768)]
    shapes += [_decode("llama3-8b", 4096, window=128), _decode("llama3-8b", 32768, window=4096)]
    shapes += [_extend("llama3-8b", p, 256) for p in (0, 1024, 8192)]
    shapes += [_extend("llama3-8b", 0, 256, dt) for dt in ("int8-static", "int8-dynamic")]
    # fp8 extend reads its cache only for the prefix (SGLang's pool writes the new tokens).
    shapes += [_extend("llama3-8b", 1024, 256, "fp8")]
    shapes += [_extend("qwen2.5-7b", 1024, 256)]
    return shapes


def smoke_shapes() -> list[Shape]:
    """Every kind of row at a few tokens: for tests, in seconds even under emulation."""
    return [
        _decode("llama3-8b", 40),
        _decode("llama3-8b", 40, "int8-static"),
        _decode("llama3-8b", 40, "int8-dynamic"),
        _decode("llama3-8b", 40, "fp8"),
        _decode("qwen2.5-7b", 24),
        _decode("deepseek-v2-lite", 24),
        _decode("llama3-8b", 40, window=8),
        _extend("llama3-8b", 0, 8),
        _extend("llama3-8b", 16, 8),
        _extend("llama3-8b", 16, 8, "fp8"),
    ]


def plan(name: str, cpus: int) -> Plan:
    """The plan ``--quick``, ``--smoke`` or (default) ``full`` stands for, on a machine with ``cpus`` CPUs."""
    every = tuple(thread_counts(cpus))
    if name == "smoke":
        return Plan(name, tuple(smoke_shapes()), every[:2], 8, 2, 0.0, 2)
    if name == "quick":
        # One thread and all of them: the two ends of the scaling curve.
        ends = tuple(sorted({1, every[-1]}))
        return Plan(name, tuple(quick_shapes()), ends, 256, 3, 0.1, 20)
    if name == "full":
        return Plan(name, tuple(full_shapes()), every, 512, 7, 0.5, 200)
    raise ValueError(f"unknown plan {name!r}: smoke, quick or full")


def with_threads(p: Plan, threads: list[int]) -> Plan:
    return replace(p, threads=tuple(threads))
