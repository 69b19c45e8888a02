"""The end-of-run summary: per stream and in total, from the run's own frames.

Steps, tokens per step, acceptance and role counts come from the reconciler's
statistics (confirmed tokens of settled provenance records: this run's
requests only). Times come from the client's own clock (SSE arrival). The
server's /metrics deltas are shown in a separate block named server-wide,
because they count everything the server did during the run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from rich.console import Group, RenderableType
from rich.text import Text

from .state import RunModel, StreamState, acceptance_of

__all__ = ["render_summary", "role_line", "summary_lines", "totals_of"]


def role_line(stats: Mapping[str, Any]) -> str:
    """Roles of the confirmed tokens; the three token counts add up to `tokens`.

    A plain token (from a step that scheduled no drafts) is produced by the target
    model, so it is counted in `target=`; how many of those were plain follows the
    bracket.
    """
    plain = int(stats.get("plain", 0))
    target = int(stats.get("target", 0)) + plain
    return (
        f"[accepted draft={int(stats.get('accepted', 0))} tokens; "
        f"target={target} tokens; "
        f"bonus={int(stats.get('bonus', 0))} tokens; "
        f"mixed spans={int(stats.get('mixed_spans', 0))}] "
        f"(target includes {plain} plain tokens from steps without drafts)"
    )


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f} ms"


def _mean_tokens_per_step(stats: Mapping[str, Any]) -> float | None:
    steps = int(stats.get("steps", 0))
    return int(stats.get("tokens", 0)) / steps if steps else None


def _histogram(stats: Mapping[str, Any]) -> str:
    hist = stats.get("hist") or {}
    if not hist:
        return "-"
    return " ".join(f"{int(k)}:{int(v)}" for k, v in sorted(hist.items(), key=lambda kv: kv[0]))


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return ordered[index]


def totals_of(model: RunModel) -> dict[str, Any]:
    """Run totals; the reconciler's when there is one, else zeros (chunk mode)."""
    return dict(model.totals)


def _latency(streams: list[StreamState]) -> dict[str, float | None]:
    ttfts = [s.ttft for s in streams if s.ttft is not None]
    gaps = [gap for s in streams for gap in s.inter_step_gaps()]
    return {
        "ttft_mean": statistics.fmean(ttfts) if ttfts else None,
        "ttft_p50": _percentile([t for t in ttfts if t is not None], 0.5),
        "gap_mean": statistics.fmean(gaps) if gaps else None,
        "gap_p50": _percentile(gaps, 0.5),
        "gap_p95": _percentile(gaps, 0.95),
    }


def summary_lines(model: RunModel) -> list[str]:
    """The summary as plain lines (also what --measurement and tests read)."""
    lines: list[str] = []
    chunk_only = model.mode == "chunk"
    for stream in model.streams:
        stats = stream.stats
        line = f"stream {stream.index}: {stream.label}; SSE tokens={stream.sse_tokens}"
        if not chunk_only:
            line += (
                f"; steps={int(stats.get('steps', 0))}"
                f"; tokens/step={_fmt(_mean_tokens_per_step(stats))}"
                f"; acceptance={_percent(acceptance_of(stats))} " + role_line(stats)
            )
        line += f"; TTFT={_seconds(stream.ttft)}"
        gaps = stream.inter_step_gaps()
        line += f"; inter-step={_seconds(statistics.fmean(gaps) if gaps else None)}"
        if stream.note:
            line += f"; {stream.note}"
        lines.append(line)
    totals = model.totals
    latency = _latency(model.streams)
    sse_tokens = sum(s.sse_tokens for s in model.streams)
    lines.append(f"total: {len(model.streams)} streams; SSE tokens={sse_tokens}")
    if chunk_only:
        lines.append("steps and roles: not measured (chunk mode ignores telemetry)")
    else:
        lines.append(
            f"total: confirmed tokens={int(totals.get('tokens', 0))}; "
            f"steps={int(totals.get('steps', 0))}; "
            f"mean tokens/step={_fmt(_mean_tokens_per_step(totals))}; "
            f"acceptance={_percent(acceptance_of(totals))} "
            f"(accepted / (drafts scheduled - drafts padded))"
        )
        lines.append(f"total: {role_line(totals)}")
        lines.append(f"tokens per step histogram (tokens:steps): {_histogram(totals)}")
    lines.append(
        f"latency (client clock, SSE arrival): TTFT mean={_seconds(latency['ttft_mean'])}, "
        f"p50={_seconds(latency['ttft_p50'])}; inter-step mean={_seconds(latency['gap_mean'])}, "
        f"p50={_seconds(latency['gap_p50'])}, p95={_seconds(latency['gap_p95'])}"
        + (f" ({model.arrival_note})" if model.arrival_note else "")
    )
    if model.ended_at is not None:
        wall = model.ended_at - model.started_at
        rate = sse_tokens / wall if wall > 0 else None
        lines.append(
            f"wall time {wall:.2f} s; this run's SSE tokens / wall time = {_fmt(rate)} tok/s"
        )
    if model.server_deltas:
        parts = []
        for label, value in model.server_deltas:
            if label.startswith("acceptance"):
                parts.append(f"{label}={_percent(value)}")
            else:
                parts.append(f"{label}={value:,.0f}")
        lines.append(
            "server-wide /metrics deltas (all requests on the server during the run, "
            "not only this run): " + "; ".join(parts)
        )
    counters = model.counters
    if counters and any(
        counters.get(k, 0) for k in ("rejected_frames", "gaps", "dropped_reported")
    ):
        lines.append(
            "telemetry: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.items()) if v)
        )
    return lines


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def render_summary(model: RunModel) -> RenderableType:
    """The summary as Rich text, one line per stream and the run's totals."""
    lines = summary_lines(model)
    title = Text("Summary", "bold")
    if model.simulated or model.backend.simulated:
        title.append(" (SIMULATED ENGINE: simulated numbers)", "bold")
    return Group(title, *(Text(line) for line in lines))
