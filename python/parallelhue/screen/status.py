"""The status line: label counts, what is hidden, the fix or last run message, the keys."""

from __future__ import annotations

import math

from ..model.labels import SHORT_LABELS
from ..model.sanitize import sanitize
from ..model.state import RunModel
from .chrome import chrome_lines
from .focus import GridUi
from .lines import Line

__all__ = ["requests_text", "status_line", "status_lines"]

_KEY_HINT = "keys: ↑↓←→ focus · z zoom · p pause · c colors · q quit"


_ZOOM_KEY_HINT = "keys: Esc or z back to the grid · ↑↓←→ next stream · p pause · c colors · q quit"


def requests_text(model: RunModel) -> str:
    """--requests: how far the run is ("requests 37 done · 8 open · 55 queued of 100")."""
    done, open_, queued = model.request_counts()
    rate = "" if math.isinf(model.request_rate) else f" at {model.request_rate:g}/s"
    return (
        f"requests {done} done · {open_} open · {queued} queued of {len(model.streams)}"
        f"{rate} on {model.concurrency} streams"
    )


def _status_parts(model: RunModel, hidden: int, ui: GridUi | None, short: bool) -> list[Line]:
    counts = model.count_labels()
    noun = "requests" if model.queueing else "streams"
    names = SHORT_LABELS if short else {}
    labels = f"{noun} " + " · ".join(
        f"{names.get(label, label)}: {n}" for label, n in sorted(counts.items())
    )
    texts = []
    if ui is not None and ui.paused:
        texts.append("PAUSED (p resumes; the run goes on)")
    if hidden > 0:
        # First on the line, so a narrow terminal cuts the counts rather than this.
        texts.append(
            f"{hidden} of {len(model.shown_streams())} streams hidden: enlarge the terminal, "
            "move the focus or use --tmux"
        )
    if model.queueing:
        texts.append(requests_text(model))
    texts.append(labels)
    if model.fix is not None:
        texts.append(model.fix)  # the cause and its fix (advice.py), before any message
    elif model.run_messages:
        texts.append("run: " + sanitize(model.run_messages[-1], keep_newlines=False))
    if ui is not None and ui.keys:
        texts.append(_ZOOM_KEY_HINT if ui.zoomed else _KEY_HINT)
    return [[(text, "dim")] for text in texts]


def status_lines(
    model: RunModel, width: int, hidden: int, ui: GridUi | None, max_lines: int | None = 1
) -> list[Line]:
    """Label counts, what is hidden, the last run message, the keys."""
    wordings = [_status_parts(model, hidden, ui, False), _status_parts(model, hidden, ui, True)]
    return chrome_lines(wordings, width, max_lines)


def status_line(model: RunModel, width: int, hidden: int, ui: GridUi | None) -> Line:
    return status_lines(model, width, hidden, ui, 1)[0]
