"""A stream's pane: `#i LABEL`, the numbers line, the text's tail, a failure note.

`PaneData` is what a pane shows independent of its size (also a tmux pane's
snapshot); `box_pane` draws it boxed (the grid, the zoomed stream), `bare_pane`
without a box (tmux draws the borders). `PaneCache` rebuilds a boxed pane only
when what it shows changed (the live grid's hot path).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..model.labels import LABEL_VERIFYING, label_key
from ..model.sanitize import sanitize
from ..model.state import RunModel, StreamState
from .lines import Line, Piece, clean_pieces, fit, styled_tail, wrap

__all__ = [
    "PaneCache",
    "PaneData",
    "bare_pane",
    "box_pane",
    "header_pieces",
    "number_text",
    "numbers_text",
    "pane_data",
    "percent_text",
    "proven_text",
]

_BOX = ("┌", "─", "┐", "│", "└", "┘")


_FOCUS_BOX = ("┏", "━", "┓", "┃", "┗", "┛")  # the focused pane: heavy lines, no color needed


def number_text(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def percent_text(stream: StreamState) -> str:
    acceptance = stream.acceptance
    if acceptance is None:
        return "-"
    return f"{acceptance * 100:.0f}%" + ("*" if stream.acceptance_frozen else "")


def numbers_text(stream: StreamState, *, narrow: bool = True) -> str:
    """tokens, steps, tokens/step, acceptance; `*` marks acceptance frozen at a downgrade."""
    steps = number_text(stream.steps, "d")
    per_step = number_text(stream.tokens_per_step, ".2f")
    if narrow:  # fits a 36-column pane: "1234 tok 456 st 2.71 t/st acc 45%"
        return f"{stream.tokens} tok {steps} st {per_step} t/st acc {percent_text(stream)}"
    return f"{stream.tokens} tok · {steps} steps · {per_step} tok/step · acc {percent_text(stream)}"


def proven_text(stream: StreamState) -> str | None:
    """How much of a VERIFYING stream's text is proven so far ("87% proven"): auto mode
    colors what the telemetry proved as it goes; the verdict waits for the stream's end."""
    if stream.label != LABEL_VERIFYING or not stream.sse_byte_count:
        return None
    return f"{stream.proven_bytes * 100 // stream.sse_byte_count}% proven"


def header_pieces(stream: StreamState) -> Line:
    """`#i LABEL · numbers` on one line (the stream view and the plain listing)."""
    proven = proven_text(stream)
    return [
        (f"#{stream.index} ", "bold"),
        (stream.label, label_key(stream.label)),
        *([(f" · {proven}", None)] if proven else []),
        (" · " + numbers_text(stream, narrow=False), None),
    ]


@dataclass(frozen=True)
class PaneData:
    """What a pane shows, independent of its size (also a tmux pane's snapshot)."""

    index: int
    label: str
    numbers: str
    body: tuple[Piece, ...]  # sanitized, styled tail of the text
    note: str | None
    requests: int | None = None  # --requests: the run's requests (the title's "#i/N")
    proven: str | None = None  # VERIFYING: how much is proven so far (proven_text)


def pane_data(stream: StreamState, model: RunModel, max_chars: int | None) -> PaneData:
    body = clean_pieces(styled_tail(stream, model, max_chars))
    note = sanitize(stream.note, keep_newlines=False) if stream.note else None
    requests = len(model.streams) if model.queueing else None
    return PaneData(
        stream.index, stream.label, numbers_text(stream), tuple(body), note, requests,
        proven_text(stream),
    )  # fmt: skip


def _pane_content(data: PaneData, width: int, height: int) -> list[Line]:
    """Exactly `height` lines of `width` cells: header, numbers, the tail, the note."""
    # With --requests a stream shows request after request: "#17/100" is the 18th of 100.
    of = f"/{data.requests}" if data.requests is not None else ""
    title = f"#{data.index}{of} "
    proven: Line = [(f" · {data.proven}", None)] if data.proven else []
    content: list[Line] = [
        fit([(title, "bold"), (data.label, label_key(data.label)), *proven], width),
        fit([(data.numbers, None)], width),
    ]
    body_height = max(0, height - 2 - (1 if data.note else 0))
    if body_height:
        body = wrap(data.body, width, body_height) if data.body else []
        content.extend(body)
        content.extend([(" " * width, None)] for _ in range(body_height - len(body)))
    if data.note:
        content.append(fit([(data.note, "note")], width))
    return content[:height]


def box_pane(data: PaneData, width: int, height: int, *, focused: bool = False) -> list[Line]:
    """A boxed pane: exactly `height` lines of exactly `width` cells."""
    tl, horizontal, tr, vertical, bl, br = _FOCUS_BOX if focused else _BOX
    edge_key = "bold" if focused else "border"
    inner = max(1, width - 2)
    lines: list[Line] = [[(tl + horizontal * inner + tr, edge_key)]]
    edge = (vertical, edge_key)
    for line in _pane_content(data, inner, max(0, height - 2)):
        lines.append([edge, *line, edge])
    lines.append([(bl + horizontal * inner + br, edge_key)])
    return lines


def bare_pane(data: PaneData, width: int, height: int) -> list[Line]:
    """A pane without a box (tmux draws the borders): exactly `height` lines."""
    content = _pane_content(data, width, height)
    content.extend([(" " * width, None)] for _ in range(height - len(content)))
    return content


class PaneCache:
    """Boxed panes rebuilt only when what they show changed (the live grid's hot path)."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self._panes: dict[int, tuple[tuple[object, ...], list[Line]]] = {}

    def key(self, stream: StreamState) -> tuple[object, ...]:
        """Everything a pane's picture depends on, besides its size."""
        stats = stream.stats
        model = self.model
        return (
            stream.label,
            stream.note,
            stream.tokens,
            len(stream.chunks),
            len(stream.spans),
            stream.proven_bytes,
            stats.get("steps"),
            stats.get("tokens"),
            stats.get("accepted"),
            stats.get("drafts_scheduled"),
            stats.get("drafts_padded"),
            model.colorize,
            model.color_by,
            len(model.streams) if model.queueing else None,
        )

    def get(self, stream: StreamState, width: int, height: int, focused: bool) -> list[Line]:
        key = (*self.key(stream), width, height, focused)
        cached = self._panes.get(stream.index)
        if cached is None or cached[0] != key:
            budget = max(1, width - 2) * max(1, height - 4) * 2
            data = pane_data(stream, self.model, budget)
            cached = (key, box_pane(data, width, height, focused=focused))
            self._panes[stream.index] = cached
        return cached[1]

    def keep_only(self, streams: Sequence[StreamState]) -> None:
        """Forget the panes of requests no longer on screen (--requests)."""
        if len(self._panes) > 2 * len(streams):
            shown = {stream.index for stream in streams}
            self._panes = {i: pane for i, pane in self._panes.items() if i in shown}
