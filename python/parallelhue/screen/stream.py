"""The stream view: one stream's banner, legend, header, text and note."""

from __future__ import annotations

from ..model.sanitize import sanitize
from ..model.state import RunModel
from .banner import banner_lines
from .focus import GridUi
from .legend import legend_lines
from .lines import Line, clean_pieces, fit, styled_tail, wrap
from .pane import header_pieces
from .status import requests_text

__all__ = ["stream_screen"]

_STREAM_KEY_HINT = "keys: p pause · c colors · q quit"


def stream_screen(
    model: RunModel, width: int, height: int | None, ui: GridUi | None = None
) -> list[Line]:
    """One stream: banner, legend, header, its text (the tail when `height` is given,
    else all of it), the note, and the keys while they are read."""
    stream = model.shown_streams()[0]
    budget = None if height is None else 3 if height >= 40 else 2
    lines: list[Line] = [*banner_lines(model, width, budget), *legend_lines(model, width, budget)]
    header = header_pieces(stream)
    if model.queueing:
        header.append((" · " + requests_text(model), "dim"))
    lines.append(fit(header, width))
    note = stream.note
    status: Line | None = None
    if ui is not None and ui.keys:
        paused = "PAUSED (p resumes; the run goes on) · " if ui.paused else ""
        status = fit([(paused + _STREAM_KEY_HINT, "dim")], width)
    if height is None:
        lines.extend(wrap(clean_pieces(styled_tail(stream, model, None)), width))
    else:
        reserved = (1 if note else 0) + (1 if status else 0)
        body_height = max(1, height - len(lines) - reserved)
        budget = width * body_height * 2
        body = clean_pieces(styled_tail(stream, model, budget))
        lines.extend(wrap(body, width, body_height))
    if note:
        lines.append(fit([(sanitize(note, keep_newlines=False), "note")], width))
    if status is not None and height is not None:
        lines.append(status)
    return lines
