"""An overview line: one stream without a pane (label, tokens per step, acceptance,
the live tail), so 64 streams are all visible at 200x50."""

from __future__ import annotations

from ..model.labels import SHORT_LABELS, label_key
from ..model.state import RunModel, StreamState
from .lines import Line, clean_pieces, fit, line_width, styled_tail, tail_fit
from .pane import number_text, percent_text

__all__ = ["overview_line"]


def overview_line(stream: StreamState, model: RunModel, width: int, *, focused: bool) -> Line:
    """One stream on one line: `#i LABEL tok/step acc` and the live tail of its text."""
    short = SHORT_LABELS.get(stream.label, stream.label[:6])
    per_step = number_text(stream.tokens_per_step, ".2f")
    head: Line = [
        ("▶" if focused else " ", "bold"),
        (f"#{stream.index:<3}", "focus" if focused else "bold"),
        (f"{short:<6}", label_key(stream.label)),
        (f" {per_step:>4} {percent_text(stream):>4} ", None),
    ]
    used = line_width(head)
    if used >= width:
        return fit(head, width, ellipsis=False)
    room = width - used - 1
    body = clean_pieces(styled_tail(stream, model, room * 2 + 8))
    return [*head, *tail_fit(body, room), (" ", None)]
