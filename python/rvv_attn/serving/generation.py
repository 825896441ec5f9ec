"""Greedy generation over the pools: chunked prefill, batched decode, requests joining and leaving.

Each ``step`` runs one batch. Prefill comes first: the requests still
prefilling share a budget of ``chunk_size`` new tokens per extend batch, so a
long prompt is split into chunks and every chunk after the first extends a
cached prefix. When no request is prefilling, all running requests decode one
token together. A request finishes after ``max_new_tokens`` tokens; its row
and cache slots are freed at once and handed to the next waiting request
(freed slots are reused first, so its token map is scattered over them).

A request is admitted only when a row is free and the pool's free slots
cover what every running request may still need, so a run never runs out of
cache halfway. Calls that cannot proceed raise before they change anything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from .backends import AttentionBackend
from .batch import ForwardMode, prepare_decode, prepare_extend
from .model import LlamaModel
from .pools import KVPool, ReqToTokenPool

__all__ = ["Request", "Engine", "PhaseStats"]


@dataclass
class Request:
    rid: str
    prompt: list[int]
    max_new_tokens: int
    output: list[int] = field(default_factory=list)
    logits: list[torch.Tensor] = field(default_factory=list)  # per generated token, when the engine keeps them
    req_pool_idx: int | None = None
    cached_len: int = 0  # tokens of prompt + output in the KV cache
    finished: bool = False

    @property
    def context_len(self) -> int:
        """Cache positions the request fills at most: the last generated token is never fed back."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def prefilling(self) -> bool:
        return self.cached_len < len(self.prompt)

    @property
    def remaining_need(self) -> int:
        return self.context_len - self.cached_len


@dataclass
class PhaseStats:
    tokens: int = 0
    seconds: float = 0.0
    batches: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


class Engine:
    def __init__(
        self,
        model: LlamaModel,
        backend: AttentionBackend,
        req_pool: ReqToTokenPool,
        kv_pool: KVPool,
        chunk_size: int = 64,
        max_running: int | None = None,
        keep_logits: bool = False,
    ) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size = {chunk_size} must be >= 1")
        self.model, self.backend = model, backend
        self.req_pool, self.kv_pool = req_pool, kv_pool
        self.chunk_size = chunk_size
        self.max_running = min(max_running or req_pool.max_reqs, req_pool.max_reqs)
        self.keep_logits = keep_logits
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: list[Request] = []
        self.stats = {ForwardMode.EXTEND: PhaseStats(), ForwardMode.DECODE: PhaseStats()}
        self._rids: set[str] = set()

    # ---- requests -------------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        """Queue a request; refuses one that could never run here (and queues nothing)."""
        if req.rid in self._rids:
            raise ValueError(f"request id {req.rid!r} is already in use")
        if not req.prompt:
            raise ValueError(f"request {req.rid!r} has an empty prompt")
        if req.max_new_tokens < 1:
            raise ValueError(f"request {req.rid!r}: max_new_tokens = {req.max_new_tokens} must be >= 1")
        vocab = self.model.cfg.vocab_size
        bad = [t for t in req.prompt if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"request {req.rid!r}: token id {bad[0]} is outside the vocabulary [0, {vocab})")
        limit = self.req_pool.max_context_len
        if req.context_len > limit:
            raise ValueError(
                f"request {req.rid!r} is longer than max_context_len = {limit}: prompt {len(req.prompt)} + "
                f"max_new_tokens {req.max_new_tokens} - 1 = {req.context_len} cache positions"
            )
        if req.context_len > self.kv_pool.size:
            raise ValueError(
                f"request {req.rid!r} needs {req.context_len} KV cache slots, the pool has {self.kv_pool.size} in all"
            )
        self._rids.add(req.rid)
        self.waiting.append(req)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.max_running and self.req_pool.available:
            reserved = sum(r.remaining_need for r in self.running)
            req = self.waiting[0]
            if self.kv_pool.available - reserved < req.remaining_need:
                break
            self.waiting.pop(0)
            req.req_pool_idx = self.req_pool.alloc(1)[0]
            self.running.append(req)

    def _release(self, req: Request) -> None:
        row = req.req_pool_idx
        self.kv_pool.free(self.req_pool.req_to_token[row, : req.cached_len].long())
        self.req_pool.free(row)
        req.req_pool_idx = None
        req.finished = True
        self.running.remove(req)
        self.finished.append(req)

    def abort(self, req: Request) -> None:
        """Drop a running request and free its row and slots."""
        if req not in self.running:
            raise ValueError(f"request {req.rid!r} is not running")
        self._release(req)

    # ---- batches --------------------------------------------------------------------------------
    def _forward(self, mode: ForwardMode, reqs: Sequence[Request], input_ids: torch.Tensor, batch) -> torch.Tensor:
        start = time.perf_counter()
        try:
            logits = self.model.forward(input_ids, batch, self.backend)
        except BaseException:
            # Give back this batch's slots and leave the requests where they were.
            for b, req in enumerate(reqs):
                self.req_pool.req_to_token[req.req_pool_idx, req.cached_len : int(batch.seq_lens[b])] = 0
            self.kv_pool.free(batch.out_cache_loc)
            raise
        stats = self.stats[mode]
        stats.seconds += time.perf_counter() - start
        stats.tokens += batch.num_tokens
        stats.batches += 1
        return logits

    def _sample(self, req: Request, logits: torch.Tensor) -> None:
        req.output.append(int(torch.argmax(logits)))
        if self.keep_logits:
            req.logits.append(logits.clone())
        if len(req.output) >= req.max_new_tokens:
            self._release(req)

    def _check_running(self, reqs: Sequence[Request]) -> None:
        for req in reqs:
            if req.req_pool_idx is None or req not in self.running:
                raise ValueError(f"request {req.rid!r} is not running (not admitted yet, or finished)")

    def run_extend(self, reqs: Sequence[Request], lens: Sequence[int]) -> None:
        """Prefill the next ``lens[i]`` prompt tokens of ``reqs[i]``; sample where a prompt completes."""
        self._check_running(reqs)
        for req, n in zip(reqs, lens):
            if not 1 <= n <= len(req.prompt) - req.cached_len:
                raise ValueError(
                    f"request {req.rid!r}: cannot prefill {n} tokens, "
                    f"{len(req.prompt) - req.cached_len} of its prompt are not cached yet"
                )
        batch = prepare_extend(
            self.req_pool, self.kv_pool, [r.req_pool_idx for r in reqs], [r.cached_len for r in reqs], list(lens)
        )
        ids = torch.tensor([t for r, n in zip(reqs, lens) for t in r.prompt[r.cached_len : r.cached_len + n]])
        logits = self._forward(ForwardMode.EXTEND, reqs, ids, batch)
        for b, (req, n) in enumerate(zip(reqs, lens)):
            req.cached_len += n
            if not req.prefilling:
                self._sample(req, logits[b])

    def run_decode(self, reqs: Sequence[Request]) -> None:
        """One new token for each of ``reqs`` (all fully prefilled)."""
        self._check_running(reqs)
        for req in reqs:
            if req.prefilling:
                raise ValueError(
                    f"request {req.rid!r} has {req.cached_len} of its {len(req.prompt)} prompt tokens "
                    "in the cache: decode needs the whole prompt prefilled first"
                )
        batch = prepare_decode(
            self.req_pool, self.kv_pool, [r.req_pool_idx for r in reqs], [r.cached_len for r in reqs]
        )
        ids = torch.tensor([r.output[-1] for r in reqs])
        logits = self._forward(ForwardMode.DECODE, reqs, ids, batch)
        for b, req in enumerate(reqs):
            req.cached_len += 1
            self._sample(req, logits[b])

    def step(self) -> ForwardMode | None:
        """Admit what fits, then run one batch: prefill chunks first, else a decode step. None when idle."""
        self._admit()
        prefilling = [r for r in self.running if r.prefilling]
        if prefilling:
            reqs, lens, budget = [], [], self.chunk_size
            for req in prefilling:
                if budget == 0:
                    break
                n = min(len(req.prompt) - req.cached_len, budget)
                reqs.append(req)
                lens.append(n)
                budget -= n
            self.run_extend(reqs, lens)
            return ForwardMode.EXTEND
        if self.running:
            self.run_decode(list(self.running))
            return ForwardMode.DECODE
        if self.waiting:
            raise RuntimeError(f"request {self.waiting[0].rid!r} cannot be admitted although nothing is running")
        return None

    def run(self, on_step: Callable[[Engine, ForwardMode], None] | None = None) -> list[Request]:
        """Step until every request has finished; returns them in the order they finished."""
        while (mode := self.step()) is not None:
            if on_step:
                on_step(self, mode)
        return self.finished
