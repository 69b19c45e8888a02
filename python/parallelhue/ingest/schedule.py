"""When each request of a run starts: `--requests N` through `--concurrency C` streams
at `--request-rate R`.

The arrival times are fixed before the run, from the seed, so a run's schedule is
reproducible and testable without a clock: request 0 arrives at 0, and the gaps
between arrivals are exponential with mean 1/R (a Poisson process, as `vllm bench
serve --request-rate R` with burstiness 1 draws them); `inf` puts every arrival
at 0. A request starts at its arrival time or, when all C streams are busy then,
as soon as one ends — never before its arrival. Requests start in order.
"""

from __future__ import annotations

import math
import random

__all__ = ["Dispatcher", "arrival_offsets"]


def arrival_offsets(count: int, rate: float, seed: int) -> list[float]:
    """Seconds from the run's start at which each of `count` requests arrives."""
    if math.isinf(rate):
        return [0.0] * count
    # Its own generator: the schedule does not depend on anything else drawing numbers.
    rng = random.Random(f"parallelhue-arrivals-{seed}")
    offsets = [0.0]
    at = 0.0
    for _ in range(count - 1):
        at += rng.expovariate(rate)
        offsets.append(at)
    return offsets[:count]


class Dispatcher:
    """Which requests to start now, given the streams still open.

    `begin(now)` fixes the run's start (time 0 of the offsets); then `due(now,
    open_streams)` returns the requests to start, in order, and `wait(now,
    open_streams)` how long until the next one could be due (None: when a stream
    ends, or never)."""

    def __init__(self, offsets: list[float], concurrency: int) -> None:
        self.offsets = offsets
        self.concurrency = concurrency
        self.started = 0  # requests 0..started-1 have started
        self.t0: float | None = None

    @property
    def all_started(self) -> bool:
        return self.started >= len(self.offsets)

    def begin(self, now: float) -> None:
        self.t0 = now

    def scheduled_at(self, index: int) -> float:
        """The monotonic time request `index` arrives (after `begin`)."""
        assert self.t0 is not None, "begin() first"
        return self.t0 + self.offsets[index]

    def due(self, now: float, open_streams: int) -> list[int]:
        out: list[int] = []
        while (
            not self.all_started
            and open_streams + len(out) < self.concurrency
            and self.scheduled_at(self.started) <= now
        ):
            out.append(self.started)
            self.started += 1
        return out

    def wait(self, now: float, open_streams: int) -> float | None:
        if self.all_started or open_streams >= self.concurrency:
            return None
        return max(0.0, self.scheduled_at(self.started) - now)
