"""Drive concurrent streaming requests at a vLLM server through the shipped client.

Used by the real-vLLM tests and the overhead benchmark, from the project venv.
Each run is one real `parallelhue.session.Session`, headless (the view of
`parallelhue.headless`): its fresh run id, its telemetry socket and receiver,
its HTTP streams, its reconciler — the Rust path, or the reference path with
PARALLELHUE_E2E_RECONCILER=python — exactly as `parallelhue` runs them. The
shapes only give each request its own endpoint, prompt and sampling. What the
tests read back per stream (text, token ids, finish reason, usage) is taken
from the run's recording (`--record`): the inputs the reconciler applied.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from parallelhue.cli.config import parse_run
from parallelhue.headless import HeadlessView
from parallelhue.ingest.record import read_recording
from parallelhue.session import RequestShape, Session

SPEC_METRICS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "generation": "vllm:generation_tokens_total",
}


@dataclass(frozen=True)
class Shape:
    """One request: endpoint, prompt and sampling."""

    endpoint: str  # "chat" or "completions"
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    extra: tuple[tuple[str, Any], ...] = ()  # more body fields, e.g. (("n", 2),)


@dataclass
class StreamResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    chunks: int = 0
    error: str | None = None
    # The usage the client extracted (C2 `push_sse_usage`): completion tokens and
    # vLLM's per-step accepted / drafted lists; None without a usage chunk.
    usage: tuple[int | None, list[int] | None, list[int] | None] | None = None


@dataclass
class RunResult:
    run_id: str
    streams: list[StreamResult]
    verdicts: list[tuple[str, str | None]]
    totals: dict[str, Any]
    counters: dict[str, int]
    sources: list[dict[str, Any]]
    seconds: float
    reconciler_kind: str
    # The recording's reconciler inputs, in the order applied, as `push_inputs`
    # items ("frame", b), ("sse", s, text, ids), ("sse_id", ...), ... ("finish", s, r).
    inputs: list[tuple[Any, ...]] = field(default_factory=list)


def scrape_metrics(url: str) -> dict[str, float]:
    """Server-wide counters, summed over label sets."""
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = set(SPEC_METRICS.values())
    values = dict.fromkeys(SPEC_METRICS, 0.0)
    reverse = {name: key for key, name in SPEC_METRICS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                values[reverse[sample.name]] += float(sample.value)
    return values


def _request_shape(shape: Shape, index: int, telemetry: bool) -> RequestShape:
    chat = shape.endpoint == "chat"
    fields: dict[str, Any] = {
        "max_tokens": shape.max_tokens,
        "temperature": shape.temperature,
    }
    if chat:
        fields["messages"] = [{"role": "user", "content": shape.prompt}]
    else:
        fields["prompt"] = shape.prompt
    if shape.stop:
        fields["stop"] = list(shape.stop)
    if shape.seed is not None:
        fields["seed"] = shape.seed
    if shape.ignore_eos:
        fields["ignore_eos"] = True
    fields.update(dict(shape.extra))
    return RequestShape(
        path="/v1/chat/completions" if chat else "/v1/completions",
        fields=fields,
        # Without telemetry the id carries no `ph1_` marker: the plugin ignores the request.
        request_id=None if telemetry else f"plain-{index}-{os.urandom(8).hex()}",
    )


def run(
    url: str,
    shapes: list[Shape],
    socket_dir: str,
    *,
    model: str = "tiny",
    settle_seconds: float = 10.0,
    telemetry: bool = True,
) -> RunResult:
    """Run one batch of concurrent streams (one per shape) through the real Session."""
    kind = "python" if os.environ.get("PARALLELHUE_E2E_RECONCILER") == "python" else "rust"
    with tempfile.TemporaryDirectory(prefix="ph-driver-") as scratch:
        record = os.path.join(scratch, "run.phr")
        argv = [
            "--endpoint", url + "/v1/completions", "--concurrency", str(len(shapes)),
            "--mode", "auto" if telemetry else "chunk", "--reconciler", kind,
            "--socket-dir", socket_dir, "--timeout", "600", "--model", model,
            "--view", "plain", "--telemetry", "socket", "--record", record,
        ]  # fmt: skip
        config = parse_run([*argv, "--", "(per request)"], env={}, stdout_tty=False)
        session = Session(
            config,
            HeadlessView,
            shapes=[_request_shape(s, i, telemetry) for i, s in enumerate(shapes)],
            grace=settle_seconds,
        )
        outcome = asyncio.run(session.run())
        recording = read_recording(record)
    run_model = outcome.model
    # The streams' own span, as the earlier driver timed it (first request sent to
    # the last delta): without the session's /metrics reads and its grace.
    starts = [s.started_at for s in run_model.streams if s.started_at is not None]
    ends = [s.delta_times[-1] for s in run_model.streams if len(s.delta_times)]
    seconds = max(ends) - min(starts) if starts and ends else 0.0
    results = [StreamResult() for _ in shapes]
    for event in recording.events:
        what = event[1]
        if what == "sse":
            _, _, stream, text, ids = event
            result = results[stream]
            result.chunks += 1
            result.text += text
            result.token_ids.extend(ids)
        elif what == "sse_usage":
            _, _, stream, tokens, accepted, drafted = event
            results[stream].usage = (tokens, accepted, drafted)
        elif what == "finish":
            results[event[2]].finish_reason = event[3]
    for state, result in zip(run_model.streams, results, strict=True):
        result.error = state.error
    return RunResult(
        run_id=session.run_id,
        streams=results,
        verdicts=[(s.verdict, s.reason) for s in run_model.streams],
        totals=dict(run_model.totals),
        counters=dict(run_model.counters),
        sources=[dict(s) for s in run_model.sources],
        seconds=seconds,
        reconciler_kind="python" if kind == "python" else "native",
        inputs=recording.reconciler_inputs(),
    )
