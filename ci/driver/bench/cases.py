"""What the benchmarks measure: the shapes, the emulated configurations, the units of work, the options."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ..errors import ConfigError
from ..toolchain.vlens import by_vlen, variants

HEADS, HEADS_KV, HEAD_DIM = 32, 8, 128
DECODE_SPLITS = 8
NEW_TOKENS = 256
LONG_CONTEXT = 32768
DTYPES = ("bf16", "int8-static", "int8-dynamic", "fp8")
NATIVE = "torch-sdpa"
# The VLEN of the headline figures: the int8 extend rows, the guard's subset and the docs' detail table.
HEADLINE_VLEN = 256
# Where torch's SDPA runs: the sysroot's torch has no vector code, so one VLEN is enough.
NATIVE_VLEN = HEADLINE_VLEN
PORTABLE = "portable"


@dataclass(frozen=True)
class Case:
    op: str  # "decode", "extend" or "varlen"
    dtype: str  # "bf16", "int8-static", "int8-dynamic", "fp8" (e4m3, static scales, as SGLang calls it)
    batch: int = 1  # varlen: images
    seq: int = 0  # decode: tokens in the sequence, the new one included
    prefix: int = 0  # extend: cached tokens before the new ones
    new: int = 0  # extend: new tokens per sequence; varlen: patches per image
    window: int = 0  # decode/extend: sliding_window_size (0: none)
    sinks: bool = False  # decode/extend: attention sinks given
    impl: str = "rvv-attn"  # or NATIVE
    heads: int = HEADS
    heads_kv: int = HEADS_KV
    head_dim: int = HEAD_DIM
    head_dim_v: int = HEAD_DIM
    splits: int = DECODE_SPLITS
    v_in_k: bool = False  # MLA: the V rows are the first Dv columns of the K rows (one latent cache)

    @property
    def id(self) -> str:
        shape = {
            "decode": f"B={self.batch} seq={self.seq}",
            "extend": f"B={self.batch} prefix={self.prefix}+{self.new}",
            "varlen": f"images={self.batch} patches={self.new} H={self.heads} D={self.head_dim}",
        }[self.op]
        impl = f" {self.impl}" if self.impl != "rvv-attn" else ""
        options = (f" window={self.window}" if self.window else "") + (" sinks" if self.sinks else "")
        heads = (self.heads, self.heads_kv, self.head_dim, self.head_dim_v)
        if self.op != "varlen" and heads != (HEADS, HEADS_KV, HEAD_DIM, HEAD_DIM):
            # Other models' heads; the Llama-like default keeps the short names the baseline was keyed by.
            options += " MLA" if self.v_in_k else ""
            options += f" H={self.heads}/{self.heads_kv} D={self.head_dim}/{self.head_dim_v}"
        return f"{self.op}{impl} {self.dtype} {shape}{options}"

    @property
    def group(self) -> int:
        return self.heads // self.heads_kv

    def pairs_per_sequence(self) -> int:
        """Query-key pairs of one sequence: causal for extend (new token i sees prefix + i + 1 keys), all
        patches x patches for varlen."""
        if self.op == "varlen":
            return self.new * self.new
        return self.new * self.prefix + self.new * (self.new + 1) // 2

    def attended(self) -> int:
        """Decode: the tokens one step attends (the last ``window`` of them with a sliding window)."""
        return min(self.seq, self.window) if self.window else self.seq

    def units(self) -> int:
        if self.op == "decode":
            return self.batch * self.attended() * self.heads_kv
        return self.batch * self.pairs_per_sequence() * self.heads

    def fma_registers_per_unit(self, vlen: int) -> float:
        """Float32 FMAs per unit, in LMUL-1 register operations: what a cycle floor is counted from.

        Decode, per KV token per KV head: G * (D + Dv) (q.k for each query head of the group, p*v into each
        accumulator); extend and varlen, per pair per query head: D + Dv. VLEN/32 lanes per register.
        """
        per_unit = self.head_dim + self.head_dim_v
        if self.op == "decode":
            per_unit *= self.group
        return per_unit / (vlen / 32)

    def kv_bytes_per_unit(self) -> float:
        """Bytes of K and V the call must read per unit, each cached row once (a floor for memory traffic).

        Decode: one K and one V row per KV token per KV head; extend: every key's rows once per KV head,
        spread over the pairs of the G query heads that share them. int8 rows are a byte per element plus,
        with dynamic scales, a float32 scale per row. MLA's V rows lie inside its K rows: only K is read.
        """
        element = 2 if self.dtype == "bf16" else 1
        columns = self.head_dim if self.v_in_k else self.head_dim + self.head_dim_v
        row_bytes = columns * element + (8 if self.dtype == "int8-dynamic" else 0)
        if self.op == "decode":
            return float(row_bytes)
        keys = self.prefix + self.new if self.op == "extend" else self.new
        return keys * row_bytes / (self.group * self.pairs_per_sequence())

    @property
    def unit(self) -> str:
        return "KV token x KV head" if self.op == "decode" else "query-key pair x query head"


@dataclass(frozen=True)
class Config:
    """One emulated process: a kernel variant at a QEMU VLEN, and the cases it measures."""

    variant: str  # "portable" or "vlen<N>"
    vlen: int  # the QEMU CPU's VLEN
    cases: tuple[Case, ...]

    @property
    def name(self) -> str:
        if all(c.impl == NATIVE for c in self.cases):
            return NATIVE
        return self.variant


def kernel_cases(int8_extend: bool = True) -> list[Case]:
    """Decode in every dtype and shape; extend in bf16 with and without a prefix, int8 (``int8_extend``) without.

    An extend with a 1024-token prefix is the costliest row to emulate (about 5.5 min at VLEN 128, 3 min for
    the portable build: QEMU works element by element), so only bf16 measures it; the int8 caches' extend
    path is measured at prefix 0 (20-40 s a row, so at HEADLINE_VLEN only: the kernel is bf16's, only its
    K/V loads differ), and their long-context cost by the decode rows. Then the 32k and MLA decode rows.
    """
    cases = [Case("decode", dt, batch=b, seq=s) for dt in DTYPES for b in (1, 8) for s in (1024, 4096)]
    quantized = [dt for dt in DTYPES if dt.startswith("int8")]
    cases += [
        Case("extend", dt, prefix=0, new=NEW_TOKENS) for dt in ["bf16", *quantized] if int8_extend or dt == "bf16"
    ]
    cases.append(Case("extend", "bf16", prefix=1024, new=NEW_TOKENS))
    if int8_extend:
        # fp8 extend reads the cache only for its prefix (SGLang's pool writes the new tokens): beside bf16's.
        cases.append(Case("extend", "fp8", prefix=1024, new=NEW_TOKENS))
    return cases + long_and_mla_cases()


def long_and_mla_cases() -> list[Case]:
    """Decode at a 32k context (the same work as B=8 at 4096, through one sequence's long token map), and
    DeepSeek-V2-Lite's MLA decode: 16 query heads over one latent head, D = 576 (512 latent + 64 rope), V the
    first 512 columns of the K rows (tests/test_mla.py calls it the same way)."""
    return [Case("decode", "bf16", seq=LONG_CONTEXT), mla_case()]


def mla_case() -> Case:
    return Case("decode", "bf16", seq=4096, heads=16, heads_kv=1, head_dim=576, head_dim_v=512, v_in_k=True)


def headline_cases() -> list[Case]:
    """The shapes of the headline figures (B=1, seq 4096 decode; prefix 1024 + 256 extend), bf16."""
    return [Case("decode", "bf16", seq=4096), Case("extend", "bf16", prefix=1024, new=NEW_TOKENS)]


def contract_cases() -> list[Case]:
    """SGLang main's options, at HEADLINE_VLEN: a 128-token window over 4096 tokens (beside a plain 128-token
    decode: the window should cost what its tokens cost), an extend with sinks (beside the plain one of
    kernel_cases), and a vision encoder's dense varlen attention. 4 images x 256 patches (ViT at 16x16
    patches) rather than 1024: emulating the 4x larger score tiles would cost ~10 min of the run.
    """
    return [
        Case("decode", "bf16", seq=4096, window=128),
        Case("decode", "bf16", seq=128),
        Case("extend", "bf16", prefix=0, new=NEW_TOKENS, sinks=True),
        vision_case(),
    ]


def vision_case(impl: str = "rvv-attn") -> Case:
    return Case("varlen", "bf16", batch=4, new=256, heads=16, heads_kv=16, head_dim=64, head_dim_v=64, impl=impl)


def full_configs() -> list[Config]:
    """Everything `nox -s bench` measures, one emulated process per configuration, in the order they start.

    Emulator CPU per process (docs/benchmarks.md): VLEN 128 ~480 s, VLEN 256 ~400 s, portable ~310 s, SDPA
    ~150 s, VLEN 512 and 1024 ~110 s each; with 2 jobs this order ends in about 14 min.
    """
    native = tuple(Case(**{**asdict(c), "impl": NATIVE}) for c in headline_cases()) + (vision_case(NATIVE),)
    configs = [
        Config(PORTABLE, NATIVE_VLEN, tuple(kernel_cases(int8_extend=False))),
        Config(f"vlen{NATIVE_VLEN}", NATIVE_VLEN, native),
    ]
    configs += [
        Config(
            v.name,
            v.vlen,
            tuple(
                kernel_cases(int8_extend=v.vlen == HEADLINE_VLEN)
                + (contract_cases() if v.vlen == HEADLINE_VLEN else [])
            ),
        )
        for v in variants()
    ]
    return configs


def check_configs() -> list[Config]:
    """The guard's subset in `nox -t test`: one decode and one extend shape at VLEN 256."""
    cases = (Case("decode", "bf16", seq=1024), Case("extend", "bf16", prefix=0, new=NEW_TOKENS))
    return [Config(by_vlen(HEADLINE_VLEN).name, HEADLINE_VLEN, cases)]


def row_key(config_name: str, case: Case) -> str:
    return f"{config_name} | {case.id}"


@dataclass(frozen=True)
class Options:
    update_baseline: bool = False
    jobs: int = 0  # 0: as many as there are cores
    only: tuple[str, ...] = ()  # substrings of row keys; empty: everything


def parse_posargs(args: Sequence[str]) -> Options:
    update, jobs, only = False, 0, ()
    for arg in args:
        if arg == "--update-baseline":
            update = True
        elif arg.startswith("--only="):
            only = tuple(s.strip() for s in arg.split("=", 1)[1].split(",") if s.strip())
            if not only:
                raise ConfigError("--only needs one or more comma-separated parts of row names, e.g. --only=decode")
        elif arg.startswith("--jobs="):
            value = arg.split("=", 1)[1]
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"--jobs must be a positive integer, got {value!r}")
            jobs = int(value)
        else:
            raise ConfigError(f"unknown bench option {arg!r}", "options: --update-baseline, --jobs=N, --only=a,b")
    return Options(update, jobs, only)


def select(configs: Sequence[Config], only: Sequence[str]) -> list[Config]:
    """The configurations and cases whose row key (``"<config> | <case id>"``) contains one of ``only``."""
    if not only:
        return list(configs)
    picked = []
    for config in configs:
        cases = tuple(c for c in config.cases if any(part in row_key(config.name, c) for part in only))
        if cases:
            picked.append(Config(config.variant, config.vlen, cases))
    if not picked:
        raise ConfigError(
            f"--only={','.join(only)} matches no benchmark row",
            "row names look like 'vlen256 | decode bf16 B=1 seq=4096'",
        )
    return picked
