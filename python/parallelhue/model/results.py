"""The figures of a run, computed once: the summary table, `--json` and `--measurement`.

Steps, tokens per step, acceptance (overall and per draft position) and role
counts come only from the reconciler's statistics of this run's own frames.
Times come from the client's clock at SSE arrival: TTFT (request start to the
first delta), ITL (gaps between consecutive deltas of a stream, as `vllm bench
serve` measures them), end-to-end latency (request start to the last delta) and
tokens per second (tokens / end-to-end latency per stream; tokens / wall time
for the run). A stream without telemetry figures gets `None`, never zeros.
The JSON shape is documented in docs/CLIENT.md ("--json") and
docs/result.schema.json.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from .endpoint import api_kind
from .labels import LABEL_EXACT, LABEL_REPORTED
from .reported import reported_summary
from .state import RunModel, StreamState, acceptance_of

__all__ = [
    "ACCEPTED_BY_POSITION",
    "DRAFTS_BY_POSITION",
    "RESULT_SCHEMA",
    "by_position",
    "json_document",
    "percentile",
    "run_result",
    "stream_result",
    "telemetry_measured",
]

RESULT_SCHEMA = "parallelhue-result/1"
# Per-draft-position counts of the reconciler's stats (docs/PROTOCOL.md, contract C2):
# lists indexed by draft position 0..K-1, from this run's own settled records.
DRAFTS_BY_POSITION = "drafts_by_pos"
ACCEPTED_BY_POSITION = "accepted_by_pos"
_ROLES = ("accepted", "target", "bonus", "plain")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile with linear interpolation (numpy's default, as vllm bench)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _spread(values: Sequence[float]) -> dict[str, float | None]:
    return {
        "mean": statistics.fmean(values) if values else None,
        "p50": percentile(values, 50),
        "p90": percentile(values, 90),
        "p99": percentile(values, 99),
    }


def by_position(stats: Mapping[str, Any]) -> list[float | None] | None:
    """Acceptance per draft position 1..K, when the reconciler reports the counts."""
    drafts = stats.get(DRAFTS_BY_POSITION)
    accepted = stats.get(ACCEPTED_BY_POSITION)
    if not isinstance(drafts, list) or not isinstance(accepted, list) or not drafts:
        return None
    return [
        (int(a) / int(d)) if int(d) > 0 else None for a, d in zip(accepted, drafts, strict=False)
    ]


def _counts(stats: Mapping[str, Any], key: str) -> list[int] | None:
    value = stats.get(key)
    return [int(v) for v in value] if isinstance(value, list) else None


def _histogram(stats: Mapping[str, Any]) -> dict[str, int]:
    hist = stats.get("hist") or {}
    return {str(int(k)): int(v) for k, v in sorted(hist.items(), key=lambda kv: int(kv[0]))}


def _telemetry(stats: Mapping[str, Any]) -> dict[str, Any]:
    """The reconciler's figures, all None when it settled no step for this stream.
    Server-reported steps that fit more than one way have no step figures, but
    the engine's own draft totals: acceptance only."""
    steps = int(stats.get("steps", 0))
    if steps <= 0 and int(stats.get("drafts_scheduled", 0)) > 0:
        return {**_telemetry({}), "acceptance": acceptance_of(stats)}
    if steps <= 0:
        return {
            "confirmed_tokens": None,
            "steps": None,
            "mean_tokens_per_step": None,
            "tokens_per_step_histogram": None,
            "acceptance": None,
            "acceptance_by_position": None,
            "drafts_by_position": None,
            "accepted_by_position": None,
            "roles": None,
            "mixed_spans": None,
        }
    tokens = int(stats.get("tokens", 0))
    return {
        "confirmed_tokens": tokens,
        "steps": steps,
        "mean_tokens_per_step": tokens / steps,
        "tokens_per_step_histogram": _histogram(stats),
        "acceptance": acceptance_of(stats),
        "acceptance_by_position": by_position(stats),
        "drafts_by_position": _counts(stats, DRAFTS_BY_POSITION),
        "accepted_by_position": _counts(stats, ACCEPTED_BY_POSITION),
        "roles": {role: int(stats.get(role, 0)) for role in _ROLES},
        "mixed_spans": int(stats.get("mixed_spans", 0)),
    }


def _since(at: float | None, origin: float | None) -> float | None:
    return None if at is None or origin is None else at - origin


def stream_result(stream: StreamState, origin: float | None = None) -> dict[str, Any]:
    """One stream's (one request's) verdict, reason, finish reason and figures;
    `origin`: when the run began sending (RunModel.dispatch_at)."""
    gaps = stream.inter_step_gaps()
    e2e = stream.e2e
    tokens = stream.tokens
    return {
        "stream": stream.index,
        "label": stream.label,
        "verdict": stream.verdict,
        "reason": stream.reason,
        "error": stream.error,
        "finish_reason": stream.finish_reason,
        "tokens": tokens,
        "tokens_source": stream.tokens_source,
        # Whose figures these are: EXACT's proven frames, the server's own word
        # (server-reported steps), or none.
        "evidence": _evidence(stream),
        **_telemetry(stream.figures),
        "reported": reported_summary(stream.reported),
        "acceptance_frozen": stream.acceptance_frozen,
        "ttft_s": stream.ttft,
        "itl_s": _spread(gaps),
        "e2e_s": e2e,
        "tokens_per_second": tokens / e2e if e2e and tokens else None,
        # --requests / --request-rate: which stream it went out on, when it was due
        # (its arrival) and when it was sent (later when every stream was busy).
        "slot": stream.slot,
        "arrival_s": _since(stream.scheduled_at, origin),
        "start_s": _since(stream.started_at, origin),
        "wait_s": (
            max(0.0, stream.started_at - stream.scheduled_at)
            if stream.started_at is not None and stream.scheduled_at is not None
            else None
        ),
    }


def _evidence(stream: StreamState) -> str | None:
    if stream.label == LABEL_EXACT:
        return "exact"
    if stream.label == LABEL_REPORTED:
        return "server-reported"
    return None


def figure_totals(model: RunModel) -> dict[str, Any]:
    """The run's figures: the reconciler's totals, plus the server-reported
    streams' own (a run without telemetry has only those)."""
    if model.mode == "chunk":
        return {}
    totals = dict(model.totals)
    for stream in model.streams:
        if stream.shows_reported:
            _add(totals, stream.figures)
    return totals


def _add(totals: dict[str, Any], stats: Mapping[str, Any]) -> None:
    for key, value in stats.items():
        if isinstance(value, dict):
            merged = dict(totals.get(key) or {})
            for k, v in value.items():
                merged[k] = merged.get(k, 0) + v
            totals[key] = merged
        elif isinstance(value, list):
            mine = list(totals.get(key) or [])
            mine += [0] * (len(value) - len(mine))
            totals[key] = [a + b for a, b in zip(mine, value + [0] * len(mine), strict=False)]
        else:
            totals[key] = int(totals.get(key, 0)) + int(value)


def telemetry_measured(model: RunModel) -> bool:
    """Whether any stream has step figures (else the table drops their columns)."""
    return int(figure_totals(model).get("steps", 0)) > 0


def run_result(model: RunModel) -> dict[str, Any]:
    """The run's totals: the same figures over every stream."""
    streams = model.streams
    tokens = sum(s.tokens for s in streams)
    wall = model.wall_seconds
    ttfts = [s.ttft for s in streams if s.ttft is not None]
    e2es = [s.e2e for s in streams if s.e2e is not None]
    gaps = [gap for s in streams for gap in s.inter_step_gaps()]
    totals = figure_totals(model)
    completed = sum(1 for s in streams if s.sse_finished and s.error is None)
    return {
        "streams": len(streams),
        "requests": len(streams),
        "concurrency": model.concurrency if model.concurrency is not None else len(streams),
        "request_rate": None if math.isinf(model.request_rate) else model.request_rate,
        "completed_requests": completed,
        "requests_per_second": completed / wall if wall else None,
        "labels": model.count_labels(),
        "tokens": tokens,
        **_telemetry(totals),
        "ttft_s": _spread(ttfts),
        "itl_s": _spread(gaps),
        "e2e_s": _spread(e2es),
        "wall_seconds": wall,
        "tokens_per_second": tokens / wall if wall else None,
    }


def _without_credentials(url: str) -> str:
    parts = urlsplit(url)
    if not (parts.username or parts.password):
        return url
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def json_document(
    model: RunModel, *, endpoint: str | None, exit_code: int, message: str | None
) -> dict[str, Any]:
    """What `--json` prints: the run, its totals and every stream (docs/CLIENT.md)."""
    hello_keys = (
        "role", "engine", "engine_version", "plugin_version", "spec_method",
        "num_speculative_tokens",
    )  # fmt: skip
    return {
        "schema": RESULT_SCHEMA,
        "simulated": model.is_simulated,
        "replay_of": model.replay_of,
        "interrupted": model.interrupted,
        "mode": model.mode,
        "server": {
            "endpoint": _without_credentials(endpoint) if endpoint else None,
            "api": api_kind(endpoint) if endpoint else None,
            "model": model.model_name,
        },
        "backend": {
            "name": model.backend.name,
            "speculative": model.backend.speculative,
            "evidence": model.backend.evidence,
        },
        "engine": [{key: source.get(key) for key in hello_keys} for source in model.sources],
        "exit_code": exit_code,
        "message": message,
        "total": run_result(model),
        "streams": [stream_result(stream, model.dispatch_at) for stream in model.streams],
        "server_wide_metrics_deltas": {label: value for label, value in model.server_deltas},
        "telemetry": dict(model.counters),
        "run_messages": list(model.run_messages),
        "fix": model.fix,
    }
