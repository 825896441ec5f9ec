"""Wall-clock timing: repeated calls, their spread, the figures derived per unit, and the copy-bandwidth probe."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Spread:
    """Seconds per call over the timed calls: median, quartiles, extremes."""

    calls: int
    median: float
    p25: float
    p75: float
    min: float
    max: float

    @property
    def iqr(self) -> float:
        return self.p75 - self.p25

    def as_json(self) -> dict:
        return {**asdict(self), "iqr": self.iqr}


def spread(times: list[float]) -> Spread:
    if not times:
        raise ValueError("no timed calls")
    if len(times) == 1:
        p25 = p75 = times[0]
    else:
        # "inclusive": the quartiles of the sample itself, within [min, max] even for 2 or 3 calls.
        p25, _, p75 = statistics.quantiles(times, n=4, method="inclusive")
    return Spread(len(times), statistics.median(times), p25, p75, min(times), max(times))


def time_calls(
    fn: Callable[[], object],
    min_calls: int,
    min_seconds: float,
    max_calls: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Seconds of each of at least ``min_calls`` calls, continued until ``min_seconds`` have passed (at most
    ``max_calls``), after one untimed call: the first call pays for allocation, page faults and starting the
    thread pool, which no later call does."""
    fn()
    times: list[float] = []
    started = clock()
    while len(times) < max(1, min_calls) or (clock() - started < min_seconds and len(times) < max_calls):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return times


def per_unit_ns(seconds: float, units: int) -> float:
    """Nanoseconds per unit of work."""
    return seconds / units * 1e9


def bytes_per_second(nbytes: float, seconds: float) -> float:
    return nbytes / seconds if seconds > 0 else float("inf")


def cycles_per_unit(seconds: float, units: int, clock_hz: float) -> float:
    """Measured cycles per unit: time per unit x the clock (assumed steady over the call)."""
    return seconds / units * clock_hz


@dataclass(frozen=True)
class Bandwidth:
    """The copy probe at one thread count: ``buffer_bytes`` copied, counted as read + written bytes per second."""

    threads: int
    buffer_bytes: int
    time: Spread

    @property
    def bytes_per_second(self) -> float:
        # A copy reads the buffer and writes another of the same size: STREAM's "copy" counts both.
        return bytes_per_second(2 * self.buffer_bytes, self.time.median)

    def as_json(self) -> dict:
        return {
            "threads": self.threads,
            "buffer_bytes": self.buffer_bytes,
            "bytes_per_second": self.bytes_per_second,
            "time": self.time.as_json(),
        }


def copy_bandwidth(buffer_bytes: int, threads: int, min_calls: int, min_seconds: float, max_calls: int) -> Bandwidth:
    """torch ``copy_`` of a ``buffer_bytes`` tensor into another, at the current torch thread count.

    The buffer should be far larger than the last-level cache (a SpacemiT K1 has 512 KiB of L2 per cluster of
    four cores): then every call streams from DRAM and back.
    """
    import torch

    src = torch.ones(buffer_bytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    times = time_calls(lambda: dst.copy_(src), min_calls, min_seconds, max_calls)
    return Bandwidth(threads, buffer_bytes, spread(times))
