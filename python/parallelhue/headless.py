"""A live run without a screen: the real `Session`, for tests and benchmarks.

`run_headless` drives exactly what `parallelhue` runs — the same paths,
reconcilers, receivers and streams — with a view that draws nothing, and
returns the run's model with a few conveniences. The benchmarks (benches/)
and the fault tests load the simulated engine through it, so what they
measure and check is the shipped client, not a second one.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .cli.config import parse_run
from .model.shapes import Counters, SourceInfo, StreamStats
from .model.state import RunModel
from .session import Session

__all__ = ["HeadlessResult", "HeadlessView", "run_headless"]


class HeadlessView:
    """A view that draws nothing, refreshed at the grid view's rate for 64 panes."""

    def __init__(self, model: RunModel, refresh_interval: float = 0.25) -> None:
        self.model = model
        self.refresh_interval = refresh_interval

    def start(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def abort(self) -> None:
        pass


@dataclass
class HeadlessResult:
    run_id: str
    model: RunModel
    exit_code: int
    message: str | None
    receiver: Mapping[str, object] = field(default_factory=dict)
    elapsed: float = 0.0

    @property
    def verdicts(self) -> list[tuple[str, str | None]]:
        return [(s.verdict, s.reason) for s in self.model.streams]

    def reasons(self) -> list[str | None]:
        return [s.reason for s in self.model.streams]

    @property
    def counters(self) -> Counters:
        return self.model.counters  # type: ignore[return-value]

    @property
    def totals(self) -> StreamStats:
        return self.model.totals  # type: ignore[return-value]

    @property
    def sources(self) -> list[SourceInfo]:
        return self.model.sources

    @property
    def run_messages(self) -> list[str]:
        return self.model.run_messages

    @property
    def sse_tokens(self) -> int:
        return sum(s.sse_tokens for s in self.model.streams)

    @property
    def sse_chunks(self) -> int:
        """SSE deltas that carried text or token ids."""
        return sum(len(s.delta_times) for s in self.model.streams)

    @property
    def texts(self) -> list[str]:
        return [s.text for s in self.model.streams]

    @property
    def finish_reasons(self) -> list[str | None]:
        return [s.finish_reason for s in self.model.streams]

    @property
    def errors(self) -> list[str | None]:
        return [s.error for s in self.model.streams]


async def run_headless(
    base_url: str,
    *,
    num_streams: int,
    socket_dir: str,
    max_tokens: int = 64,
    reconciler_kind: str = "python",
    prompt: str = "Tell me about speculative decoding.",
    stop: list[str] | None = None,
    chat: bool = True,
    grace: float = 3.0,
    seed: int = 0,
    mode: str = "auto",
    timeout: float = 60.0,
    record: str | None = None,
    model: str | None = None,
    telemetry: str = "auto",
    api_key: str | None = None,
) -> HeadlessResult:
    """One run of `num_streams` streams against `base_url` (no /v1 suffix)."""
    endpoint = base_url + ("/v1/chat/completions" if chat else "/v1/completions")
    argv = [
        "--endpoint", endpoint, "--concurrency", str(num_streams),
        "--max-tokens", str(max_tokens), "--mode", mode, "--reconciler", reconciler_kind,
        "--socket-dir", socket_dir, "--timeout", str(timeout), "--seed", str(seed),
        "--view", "plain", "--telemetry", telemetry,
    ]  # fmt: skip
    if api_key is not None:
        argv += ["--api-key", api_key]
    if record is not None:
        argv += ["--record", record]
    if model is not None:
        argv += ["--model", model]
    config = parse_run([*argv, "--", prompt], env={}, stdout_tty=False)
    extra: dict[str, Any] = {"stop": stop} if stop else {}
    session = Session(config, HeadlessView, extra_body=extra, grace=grace)
    started = time.monotonic()
    result = await session.run()
    path = session.path
    receiver = path.receiver_stats() if path is not None else {}
    return HeadlessResult(
        run_id=session.run_id,
        model=result.model,
        exit_code=result.exit_code,
        message=result.message,
        receiver=receiver,
        elapsed=time.monotonic() - started,
    )
