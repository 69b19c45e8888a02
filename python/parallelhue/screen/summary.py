"""The end-of-run summary: a table with a row per stream and a total, then notes.

The figures come from `results.py` (this run's own frames; the client's clock
for times). Columns that would only hold dashes are left out (a run without
telemetry shows no step, acceptance or role columns), and a narrow terminal
drops the least important columns first (`--json` has every figure). The
server's /metrics deltas are a separate line named server-wide, because they
count everything the server did during the run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from ..model.advice import grouped_notes, run_message_notes
from ..model.labels import SHORT_LABELS, label_key
from ..model.results import figure_totals, run_result, stream_result, telemetry_measured
from ..model.sanitize import sanitize
from ..model.state import SIMULATED_LABEL, RunModel
from .cells import cells
from .lines import Line, fit, line_width, word_wrap
from .paint import plain_lines, rich_text, theme_for

__all__ = ["render_summary", "role_line", "summary_block", "summary_lines"]

_SPARK = "▁▂▃▄▅▆▇█"
_FROZEN = "*"
_FROM_USAGE = "†"


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


def _ms(value: float | None) -> str:
    """A duration: milliseconds below a second, else seconds."""
    if value is None:
        return "-"
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.2f} s"


def _fixed(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:.1f}%"


def _spark(hist: Mapping[str, int] | None) -> str:
    """Steps per tokens-per-step value 1..max as one bar each (▁ few, █ most, · none)."""
    if not hist:
        return "-"
    counts = {int(k): int(v) for k, v in hist.items()}
    top = max(counts.values())
    if top <= 0:
        return "-"
    bars = []
    for tokens in range(1, max(counts) + 1):
        count = counts.get(tokens, 0)
        bars.append("·" if count == 0 else _SPARK[min(7, (count * 8 - 1) // top)])
    return "".join(bars)


def _itl(spread: Mapping[str, float | None]) -> str:
    values = [spread.get("p50"), spread.get("p90"), spread.get("p99")]
    if any(v is None for v in values):
        return "-"
    return "/".join(f"{float(v or 0) * 1000:.1f}" for v in values)


def _positions(values: list[float | None] | None) -> str:
    if not values:
        return "-"
    return " ".join("-" if v is None else f"{v * 100:.0f}" for v in values)


@dataclass(frozen=True)
class _Column:
    header: str
    priority: int  # the higher, the earlier it is dropped on a narrow screen
    telemetry: bool  # only when the run has figures from the reconciler
    value: Callable[[dict[str, Any]], str]
    right: bool = True


def _tokens(row: dict[str, Any]) -> str:
    return str(row["tokens"]) + (_FROM_USAGE if row.get("tokens_source") == "usage" else "")


def _acceptance(row: dict[str, Any]) -> str:
    return _percent(row["acceptance"]) + (_FROZEN if row.get("acceptance_frozen") else "")


def _roles(row: dict[str, Any]) -> str:
    roles = row["roles"]
    if not roles:
        return "-"
    return f"{roles['accepted']}/{roles['target'] + roles['plain']}/{roles['bonus']}"


def _columns(positions: int) -> list[_Column]:
    columns = [
        _Column("tokens", 0, False, _tokens),
        _Column("steps", 1, True, lambda r: "-" if r["steps"] is None else str(r["steps"])),
        _Column("tok/step", 1, True, lambda r: _fixed(r["mean_tokens_per_step"])),
        _Column("hist", 4, True, lambda r: _spark(r["tokens_per_step_histogram"]), False),
        _Column("accept", 1, True, _acceptance),
    ]
    if positions:
        columns.append(
            _Column(
                f"acc@1..{positions} %", 3, True, lambda r: _positions(r["acceptance_by_position"])
            )
        )
    columns += [
        _Column("draft/target/bonus", 5, True, _roles),
        _Column("TTFT", 2, False, lambda r: _ms(r["ttft"])),
        _Column("ITL p50/p90/p99 ms", 3, False, lambda r: _itl(r["itl_s"])),
        _Column("E2E", 3, False, lambda r: _ms(r["e2e"])),
        _Column("tok/s", 2, False, lambda r: _fixed(r["tokens_per_second"], 1)),
        _Column("finish", 6, False, lambda r: r["finish"], False),
    ]
    return columns


def _table(model: RunModel, width: int | None) -> tuple[list[Line], set[str]]:
    """The table's lines and the headers of the columns it kept."""
    measured = telemetry_measured(model)
    streams = [stream_result(s) for s in model.streams]
    total = run_result(model)
    positions = max(
        [len(r["acceptance_by_position"] or []) for r in streams]
        + [len(total["acceptance_by_position"] or [])]
    )
    columns = [c for c in _columns(positions if measured else 0) if measured or not c.telemetry]
    rows: list[tuple[str, str, str | None, dict[str, Any]]] = []
    for state, result in zip(model.streams, streams, strict=True):
        row = {
            **result,
            "ttft": result["ttft_s"],
            "e2e": result["e2e_s"],
            "finish": "error" if result["error"] else (result["finish_reason"] or "-"),
        }
        short = SHORT_LABELS.get(state.label, state.label)
        rows.append((f"#{state.index}", short, label_key(state.label), row))
    total_row = {
        **total,
        # The total counts the streams' usage figures too: it carries their mark.
        "tokens_source": "usage"
        if any(s.tokens_source == "usage" for s in model.streams)
        else None,
        "acceptance_frozen": False,
        "ttft": total["ttft_s"]["mean"],
        "e2e": total["e2e_s"]["mean"],
        "finish": "",
    }
    rows.append(("total", "", None, total_row))
    texts = [[c.value(row) for c in columns] for _, _, _, row in rows]
    widths = [max(cells(c.header), *(cells(t[i]) for t in texts)) for i, c in enumerate(columns)]
    first = max(len("stream"), *(cells(name) for name, _, _, _ in rows))
    second = max(len("label"), *(cells(short) for _, short, _, _ in rows))
    keep = list(range(len(columns)))
    if width is not None:
        # Drop the least important columns until the table fits.
        def total_width() -> int:
            return first + 1 + second + sum(widths[i] + 2 for i in keep)

        for priority in sorted({c.priority for c in columns}, reverse=True):
            if total_width() <= width or priority == 0:
                break
            keep = [i for i in keep if columns[i].priority < priority]

    def cell(text: str, size: int, right: bool) -> str:
        pad = " " * (size - cells(text))
        return pad + text if right else text + pad

    header: Line = [(cell("stream", first, False) + " " + cell("label", second, False), "heading")]
    for i in keep:
        header.append(("  " + cell(columns[i].header, widths[i], columns[i].right), "heading"))
    lines = [header]
    for (name, short, key, _row), values in zip(rows, texts, strict=True):
        line: Line = [(cell(name, first, False) + " ", "bold" if name == "total" else None)]
        line.append((cell(short, second, False), key))
        for i in keep:
            line.append(("  " + cell(values[i], widths[i], columns[i].right), None))
        lines.append(line)
    if width is not None:
        lines = [fit(line, width) for line in lines]
    return lines, {columns[i].header for i in keep}


def _notes(model: RunModel, positions_shown: bool) -> list[str]:
    notes: list[str] = []
    totals = figure_totals(model)
    measured = telemetry_measured(model)
    labels = " · ".join(f"{label} {n}" for label, n in sorted(model.count_labels().items()))
    notes.append(f"labels: {labels}")
    if model.mode == "chunk":
        notes.append("steps and roles: not measured (chunk mode ignores telemetry)")
    elif not measured:
        notes.append(
            "steps and roles: not measured (no step of this run was proven by telemetry frames)"
        )
    else:
        notes.append(f"total: {role_line(totals)}")
        hist = totals.get("hist") or {}
        shown = " ".join(f"{int(k)}:{int(v)}" for k, v in sorted(hist.items())) or "-"
        notes.append(f"tokens per step histogram (tokens:steps): {shown}")
        notes.append(
            "acceptance = accepted / (drafts scheduled - drafts padded), from this run's frames"
            + ("; acc@i: the same per draft position i" if positions_shown else "")
        )
        checked = _metrics_note(model)
        if checked:
            notes.append(checked)
    reported = _reported_note(model)
    if reported:
        notes.append(reported)
    for state in model.streams:
        if state.acceptance_frozen:
            notes.append(
                f"stream {state.index}: {_FROZEN} acceptance frozen at the downgrade: it counts "
                "only the steps proven before it"
            )
            break
    if any(s.tokens_source == "usage" for s in model.streams):
        notes.append(
            f"{_FROM_USAGE} tokens from usage.completion_tokens: the server sent no token ids"
        )
    notes.extend(grouped_notes([(s.index, s.label, s.note) for s in model.streams if s.note]))
    result = run_result(model)
    ttft, itl, e2e = result["ttft_s"], result["itl_s"], result["e2e_s"]
    note = (
        model.arrival_note
        if model.arrival_note and (model.concurrency or len(model.streams)) >= 4
        else ""
    )
    notes.append(
        f"latency (client clock, SSE arrival{'; ' + note if note else ''}): "
        f"TTFT mean={_ms(ttft['mean'])} p50={_ms(ttft['p50'])} p99={_ms(ttft['p99'])}; "
        f"ITL (gaps between SSE deltas) mean={_ms(itl['mean'])} p50={_ms(itl['p50'])} "
        f"p90={_ms(itl['p90'])} p99={_ms(itl['p99'])}; "
        f"E2E mean={_ms(e2e['mean'])} p99={_ms(e2e['p99'])}"
    )
    if _requests_run(model):
        notes.append(_requests_note(model, result))
    wall = result["wall_seconds"]
    if wall is not None:
        rate = result["tokens_per_second"]
        notes.append(
            f"wall time {wall:.2f} s (first request to last SSE delta); "
            f"{_fixed(rate, 1)} tok/s over the run"
        )
    if model.server_deltas:
        parts = []
        for label, value in model.server_deltas:
            if label.startswith("acceptance"):
                parts.append(f"{label}={_percent(value)}")
            else:
                parts.append(f"{label}={value:,.0f}")
        notes.append(
            "server-wide /metrics deltas (all requests on the server during the run, "
            "not only this run): " + "; ".join(parts)
        )
    counters = model.counters
    if counters and any(
        counters.get(k, 0) for k in ("rejected_frames", "gaps", "dropped_reported")
    ):
        notes.append(
            "telemetry: " + ", ".join(f"{k}={v}" for k, v in sorted(counters.items()) if v)
        )
    notes.extend(run_message_notes(model.run_messages))
    if model.fix is not None:
        notes.append(model.fix)  # last: the one line to act on
    return notes


def _metrics_note(model: RunModel) -> str:
    """The fourth witness: vLLM's per-request spec-decode metrics, when both reconcilers
    matched them with the scheduler's records (a mismatch fails the stream instead)."""
    steps = int(model.totals.get("metrics_steps", 0) or 0)
    if steps <= 0:
        return ""
    streams = sum(1 for s in model.streams if int(s.stats.get("metrics_steps", 0) or 0) > 0)
    note = (
        f"cross-checked with vLLM's per-request metrics: {steps} verify "
        f"step{'s' if steps != 1 else ''} of {streams} of {len(model.streams)} "
        f"stream{'s' if len(model.streams) != 1 else ''} agree with the scheduler's records"
    )
    if streams < len(model.streams):
        # Why the others are not counted (docs/PROTOCOL.md "The fourth witness").
        note += (
            " (vLLM sends the lists only for a request the engine finished with a verify "
            "step: none after a stop string)"
        )
    return note


def _reported_note(model: RunModel) -> str:
    """What the server-reported figures are (only when a stream shows them)."""
    shown = [s for s in model.streams if s.shows_reported]
    if not shown:
        return ""
    engines = sorted({str(s.reported.engine) for s in shown if s.reported is not None})
    return (
        f"{len(shown)} of {len(model.streams)} stream{'s' if len(model.streams) != 1 else ''}: "
        f"steps and roles as {' and '.join(engines)} reported them (server-reported: the "
        "engine's own statement, checked for consistency, one witness; not EXACT)"
    )


def _requests_run(model: RunModel) -> bool:
    """--requests beyond --concurrency, or a --request-rate: requests, not just streams."""
    return model.queueing or not math.isinf(model.request_rate)


def _requests_note(model: RunModel, result: Mapping[str, Any]) -> str:
    waits = [
        s.started_at - s.scheduled_at
        for s in model.streams
        if s.started_at is not None and s.scheduled_at is not None
    ]
    rate = result["requests_per_second"]
    arrivals = (
        "all due at once"
        if math.isinf(model.request_rate)
        else f"Poisson arrivals at {model.request_rate:g}/s"
    )
    wait = f"; waited for a free stream: mean {_ms(sum(waits) / len(waits))}" if waits else ""
    return (
        f"requests: {result['completed_requests']} of {result['requests']} completed on "
        f"{result['concurrency']} streams ({arrivals}); "
        f"{_fixed(rate, 2)} requests/s over the run{wait}"
    )


def _title(model: RunModel, shorter: int = 0) -> Line:
    """The summary's title; `shorter` 1-4 leaves out the model's name (the banner has it),
    then says SIMULATED ENGINE and interrupted in fewer words, then drops the counts."""
    count = len(model.streams)
    title: Line = [("Summary", "heading")]
    if model.is_simulated:
        simulated = SIMULATED_LABEL if shorter >= 2 else f"{SIMULATED_LABEL}: simulated numbers"
        title.append((f" ({simulated})", "heading"))
    if model.replay_of is not None:
        title.append((f" (replay of {sanitize(model.replay_of, keep_newlines=False)})", "heading"))
    if model.interrupted:
        partial = "partial" if shorter >= 3 else "partial figures"
        title.append((f" (interrupted: {partial})", "heading"))
    if shorter < 4:
        if _requests_run(model):
            streams = model.concurrency or count
            rate = "" if math.isinf(model.request_rate) else f" at {model.request_rate:g}/s"
            shown = f" · {count} requests on {streams} stream{'s' if streams != 1 else ''}{rate}"
        else:
            shown = f" · {count} stream{'s' if count != 1 else ''}"
        title.append((f"{shown} · mode {model.mode}", None))
    if model.model_name and shorter < 1:
        title.append((f" · model {sanitize(model.model_name, keep_newlines=False)}", None))
    return title


def _title_line(model: RunModel, width: int | None) -> Line:
    """The title on one line (it never wraps): shorter as the terminal is narrower,
    cut only when even the shortest does not fit."""
    if width is None:
        return _title(model)
    for shorter in range(5):
        title = _title(model, shorter)
        if line_width(title) <= width:
            return fit(title, width)
    return fit(title, width)


def summary_block(model: RunModel, width: int | None) -> list[Line]:
    """Title, table and notes, fitted to `width` cells (None: natural width, unwrapped):
    the table drops columns, the notes wrap (and leave out what explains a dropped one)."""
    table, kept = _table(model, width)
    positions_shown = any(header.startswith("acc@") for header in kept)
    lines = [_title_line(model, width), *table]
    for note in _notes(model, positions_shown):
        lines.extend(word_wrap([(note, None)], width))
    return lines


def summary_lines(model: RunModel) -> list[str]:
    """The summary as plain lines (what --measurement keeps and tests read)."""
    return plain_lines(summary_block(model, None))


def render_summary(model: RunModel, width: int | None = None) -> Text:
    """The summary as Rich text, laid out for a console `width` cells wide."""
    return rich_text(summary_block(model, width), theme_for(model))
