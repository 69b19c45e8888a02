"""The end of a run: telemetry already sent is waited for, late telemetry only when due."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from parallelhue.cli.config import parse_run
from parallelhue.session import Session


class _Path:
    """An ingest path whose receiver thread is `lag` polls behind the kernel: the
    datagrams are sent, but counted only once the thread pushed them."""

    def __init__(self, model: Any, lag: int, frames: int) -> None:
        self.model, self.lag, self.frames = model, lag, frames
        self.pending_calls = 0

    def telemetry_pending(self) -> bool:
        self.pending_calls += 1
        return self.pending_calls <= self.lag

    def poll(self) -> None:
        if self.pending_calls > self.lag and self.frames:
            self.model.counters = {"frames": self.frames}

    def update_stats(self) -> None:
        pass


def _grace(lag: int, frames: int, settle_after: float) -> tuple[float, _Path]:
    config = parse_run(["hi", "--mode", "auto", "--model", "m"], env={}, stdout_tty=False)
    session = Session(config, lambda _model: None)  # type: ignore[arg-type, return-value]
    model = SimpleNamespace(counters={"frames": 0})
    loop_started = asyncio.new_event_loop()
    began = loop_started.time()
    feed = SimpleNamespace(
        model=model, all_settled=lambda: loop_started.time() - began >= settle_after
    )
    path = _Path(model, lag, frames)
    loop_started.run_until_complete(session._grace(path, feed))  # type: ignore[arg-type]
    took = loop_started.time() - began
    loop_started.close()
    return took, path


def test_datagrams_still_in_the_receiver_are_waited_for() -> None:
    # The streams ended before the receiver thread pushed the hello: not "no telemetry".
    took, path = _grace(lag=5, frames=3, settle_after=0.05)
    assert path.pending_calls == 6
    assert took >= 0.05  # it went on to wait for the verdicts (the grace period)


def test_no_datagram_at_all_ends_at_once() -> None:
    took, path = _grace(lag=0, frames=0, settle_after=10.0)
    assert path.pending_calls == 1
    assert took < 1.0  # not the 2 s grace period (defect 5 of issue 12)
