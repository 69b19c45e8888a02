"""The pane model: every screen of a run laid out once, as lines of styled pieces.

A `Line` is a list of `(text, style key)` pieces; text is sanitized and laid
out in terminal cells (wide characters count two), and every line of a
sized layout is exactly its width. Nothing here knows about colors or escape
codes: `paint.py` turns lines into ANSI text (the live grid, tmux panes) or
Rich text (the final pictures), `export.py` into HTML and SVG, all from the
same lines. What is on screen:

- the banner (engine, model and server, mode, backend and its evidence),
- the legend (what the colors mean in this run),
- boxed panes (`#i LABEL`, the numbers line, the text's tail, a failure note),
- overview lines for the streams without a pane (label, tokens per step,
  acceptance, the live tail), so 64 streams are all visible at 200x50,
- the status line (label counts, what is hidden, the keys).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .backend import untested_engine
from .cells import _TEXT as _MEASURED
from .cells import cells, char_cells, for_screen, head_cells, tail_cells
from .sanitize import sanitize
from .state import (
    LABEL_CANCELLED,
    LABEL_CHUNK,
    LABEL_ERROR,
    LABEL_EXACT,
    LABEL_NOT_EXACT,
    LABEL_QUEUED,
    LABEL_REPORTED,
    LABEL_VERIFYING,
    SIMULATED_LABEL,
    RunModel,
    StreamState,
    label_key,
)
from .style import ROLE_KEYS, ROLE_NAMES, STEP_KEYS

__all__ = [
    "GRID_MAX_PANES",
    "SHORT_LABELS",
    "GridUi",
    "Line",
    "PaneCache",
    "PaneData",
    "Piece",
    "banner_line",
    "bare_pane",
    "box_pane",
    "cells",
    "final_grid",
    "fit",
    "grid_layout",
    "grid_screen",
    "header_pieces",
    "legend_line",
    "line_text",
    "line_width",
    "numbers_text",
    "overview_line",
    "pane_data",
    "plain_listing",
    "requests_text",
    "status_line",
    "stream_screen",
    "word_wrap",
    "wrap",
]

Piece = tuple[str, str | None]
Line = list[Piece]

GRID_MAX_PANES = 64
MIN_PANE_WIDTH = 36
MIN_PANE_HEIGHT = 6
OVERVIEW_MIN_WIDTH = 40
# Terminals shorter than this keep the legend off the screen (it is in --help too).
LEGEND_MIN_HEIGHT = 12

SHORT_LABELS = {
    LABEL_EXACT: "EXACT",
    LABEL_CHUNK: "CHUNK",
    LABEL_VERIFYING: "VERIFY",
    LABEL_NOT_EXACT: "FAILED",
    LABEL_ERROR: "ERROR",
    LABEL_CANCELLED: "CANCEL",
    LABEL_QUEUED: "QUEUED",
    LABEL_REPORTED: "REPORTED",
}
_BOX = ("┌", "─", "┐", "│", "└", "┘")
_FOCUS_BOX = ("┏", "━", "┓", "┃", "┗", "┛")  # the focused pane: heavy lines, no color needed


# --- cells ----------------------------------------------------------------------------


def line_width(line: Line) -> int:
    return sum(cells(text) for text, _ in line)


def line_text(line: Line) -> str:
    return "".join(text for text, _ in line)


def fit(pieces: Iterable[Piece], width: int, *, ellipsis: bool = True) -> Line:
    """Exactly `width` cells: cut (ending in … when `ellipsis`) or padded with spaces."""
    out: Line = []
    used = 0
    pieces = list(pieces)
    total = sum(cells(text) for text, _ in pieces)
    limit = width - 1 if ellipsis and total > width else width
    for text, key in pieces:
        if used >= limit:
            break
        take, size = head_cells(text, limit - used)
        if take:
            out.append((take, key))
            used += size
        if size < cells(text):
            break
    if total > width and ellipsis and width > 0:
        out.append(("…", "dim"))
        used += 1
    if used < width:
        out.append((" " * (width - used), None))
    return out


def tail_fit(pieces: Sequence[Piece], width: int) -> Line:
    """The last `width` cells of `pieces` on one line (newlines shown as spaces)."""
    kept: Line = []
    used = 0
    for text, key in reversed(pieces):
        flat = text.replace("\n", " ")
        size = cells(flat)
        if used + size <= width:
            kept.append((flat, key))
            used += size
            continue
        piece, size = tail_cells(flat, width - used)
        if piece:
            kept.append((piece, key))
            used += size
        break
    kept.reverse()
    if kept and cells(kept[0][0][:1]) == 0:
        # A mark whose letter is cut off (in the piece before): nothing to sit on.
        kept[0] = (tail_cells(kept[0][0], width)[0], kept[0][1])
    if used < width:
        kept.insert(0, (" " * (width - used), None))
    return kept


def wrap(pieces: Iterable[Piece], width: int | None, max_lines: int | None = None) -> list[Line]:
    """`pieces` hard-wrapped at `width` cells (None: only at newlines, unpadded);
    sized lines are padded to exactly `width`. With `max_lines`, the last ones.
    A full line takes the zero-width marks that follow it (an accent stays with
    its letter, even when the two come in different pieces)."""
    lines: list[Line] = []
    current: Line = []
    used = 0

    def flush() -> None:
        nonlocal current, used
        if width is not None and used < width:
            current.append((" " * (width - used), None))
        lines.append(current)
        current = []
        used = 0

    for text, key in pieces:
        if not text:
            continue
        if width is None:
            parts = text.split("\n")
            for number, part in enumerate(parts):
                if number:
                    flush()
                if part:
                    current.append((part, key))
            continue
        if "\n" not in text:
            if used >= width and (text[0] < "\x80" or char_cells(text[0])):
                flush()  # a full line: only a mark may still join it
            # The common case: a piece that fits on the current line, measured once
            # (cells(text), without the call for ASCII or a cached width).
            size = len(text) if text.isascii() else (_MEASURED.get(text) or cells(text))
            if used + size <= width:
                current.append((text, key))
                used += size
                continue
        for number, part in enumerate(text.split("\n")):
            if number:
                flush()
            while part:
                if used >= width and (part[0] < "\x80" or char_cells(part[0])):
                    flush()  # a full line: only a mark may still join it
                take, size = head_cells(part, width - used)
                if not take:
                    if used:
                        flush()  # the line is full: the rest goes on the next one
                        continue
                    # A character wider than the pane: alone on its line.
                    take = part[:1]
                    size = min(width, cells(take))
                current.append((take, key))
                used += size
                part = part[len(take) :]
                if part and (part[0] < "\x80" or char_cells(part[0])):
                    flush()  # the next letter did not fit (a mark would have)
    if current or not lines:
        flush()
    if max_lines is not None:
        return lines[-max_lines:] if max_lines > 0 else []
    return lines


def word_wrap(pieces: Iterable[Piece], width: int | None) -> list[Line]:
    """`pieces` wrapped at spaces to `width` cells (words longer than a line are cut);
    lines are padded to exactly `width`. None: one unwrapped line."""
    pieces = [(text.replace("\n", " "), key) for text, key in pieces]
    if width is None:
        return [pieces]
    words: list[Line] = [[]]
    for text, key in pieces:
        for number, part in enumerate(text.split(" ")):
            if number:
                words.append([])
            if part:
                words[-1].append((part, key))
    lines: list[Line] = []
    current: Line = []
    used = 0
    for word in words:
        size = line_width(word)
        if current and used + 1 + size > width:
            lines.append(fit(current, width))
            current, used = [], 0
        if current:
            current.append((" ", None))
            used += 1
        if size > width:  # a word longer than a line: cut it, go on after its last piece
            cut = wrap(word, width)
            lines.extend(cut[:-1])
            word = [(line_text(cut[-1]).rstrip(), cut[-1][0][1] if cut[-1] else None)]
            size = line_width(word)
        current.extend(word)
        used += size
    lines.append(fit(current, width))
    return lines


_TEXT = operator.itemgetter(0)  # a piece's text


def _styled(stream: StreamState, model: RunModel, max_chars: int | None) -> list[Piece]:
    """The tail of a stream's text in this run's coloring (None: all of it)."""
    return stream.tail_segments(
        model.colorize, max_chars, model.color_by, roles_known=model.roles_known
    )


def _clean(pieces: Sequence[Piece], *, laid_out: bool = True) -> Line:
    """The pieces sanitized, empty ones dropped (every pane at every redraw). Text
    `laid_out` in cells also loses its variation selectors 15/16 (cells.for_screen)
    and any zero-width mark it starts with (its letter is not shown)."""
    # The common case, one test for the whole tail: every piece printable (as a
    # joined string is exactly when each of its pieces is), only empty ones go.
    # The texts are taken and tested by C loops (map, join, all), not a Python
    # loop per piece (callgrind: 29k instructions a grid pane against 41k).
    texts = list(map(_TEXT, pieces))
    joined = "".join(texts)
    if joined.isprintable() and (not laid_out or for_screen(joined) is joined):
        out = list(pieces) if all(texts) else [piece for piece in pieces if piece[0]]
    else:
        out = []
        for text, key in pieces:
            clean = text if text.isprintable() else sanitize(text)
            if laid_out:
                clean = for_screen(clean)
            if clean:
                out.append((clean, key))
    if laid_out and out and out[0][0][0] > "\x7f" and char_cells(out[0][0][0]) == 0:
        first = tail_cells(out[0][0], cells(out[0][0]))[0]
        out = [(first, out[0][1]), *out[1:]] if first else out[1:]
    return out


# --- numbers and headers ----------------------------------------------------------------


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _percent(stream: StreamState) -> str:
    acceptance = stream.acceptance
    if acceptance is None:
        return "-"
    return f"{acceptance * 100:.0f}%" + ("*" if stream.acceptance_frozen else "")


def numbers_text(stream: StreamState, *, narrow: bool = True) -> str:
    """tokens, steps, tokens/step, acceptance; `*` marks acceptance frozen at a downgrade."""
    steps = _number(stream.steps, "d")
    per_step = _number(stream.tokens_per_step, ".2f")
    if narrow:  # fits a 36-column pane: "1234 tok 456 st 2.71 t/st acc 45%"
        return f"{stream.tokens} tok {steps} st {per_step} t/st acc {_percent(stream)}"
    return f"{stream.tokens} tok · {steps} steps · {per_step} tok/step · acc {_percent(stream)}"


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
    body = _clean(_styled(stream, model, max_chars))
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


def overview_line(stream: StreamState, model: RunModel, width: int, *, focused: bool) -> Line:
    """One stream on one line: `#i LABEL tok/step acc` and the live tail of its text."""
    short = SHORT_LABELS.get(stream.label, stream.label[:6])
    per_step = _number(stream.tokens_per_step, ".2f")
    head: Line = [
        ("▶" if focused else " ", "bold"),
        (f"#{stream.index:<3}", "focus" if focused else "bold"),
        (f"{short:<6}", label_key(stream.label)),
        (f" {per_step:>4} {_percent(stream):>4} ", None),
    ]
    used = line_width(head)
    if used >= width:
        return fit(head, width, ellipsis=False)
    room = width - used - 1
    body = _clean(_styled(stream, model, room * 2 + 8))
    return [*head, *tail_fit(body, room), (" ", None)]


# --- banner, legend, status --------------------------------------------------------------
#
# Each is a list of parts (a part: pieces that belong together), laid out by `part_lines`:
# whole parts per line, wrapped onto more lines when the terminal is narrow, never cut
# inside a part while there is a line left for it. Where the live grid has few lines,
# the shorter wording of each part is tried before anything is cut.

_SEPARATOR: Piece = (" · ", None)


def part_lines(parts: Sequence[Line], width: int, max_lines: int | None = None) -> list[Line]:
    """`parts` joined by " · " on lines of exactly `width` cells, as many whole parts per
    line as fit; a part wider than a line is wrapped at spaces. With `max_lines`, what
    does not fit on the last line is cut there, ending in "…"."""
    rows: list[Line] = []
    current: Line = []
    used = 0
    for part in parts:
        size = line_width(part)
        if current and used + 3 + size <= width:
            current += [_SEPARATOR, *part]
            used += 3 + size
            continue
        if current:
            rows.append(current)
        if size <= width:
            current, used = list(part), size
            continue
        wrapped = [_unpadded(line) for line in word_wrap(part, width)]
        rows.extend(wrapped[:-1])
        current = wrapped[-1]
        used = line_width(current)
    if current or not rows:
        rows.append(current)
    if max_lines is not None and len(rows) > max(1, max_lines):
        keep = max(1, max_lines)
        last: Line = list(rows[keep - 1])
        for row in rows[keep:]:
            last += [_SEPARATOR, *row]
        rows = [*rows[: keep - 1], last]
    return [fit(row, width) for row in rows]


def _unpadded(line: Line) -> Line:
    """`line` without the blank piece that pads it to its width."""
    if line and line[-1][1] is None and not line[-1][0].strip():
        return line[:-1]
    return line


def chrome_lines(
    wordings: Sequence[Sequence[Line]], width: int | None, max_lines: int | None = None
) -> list[Line]:
    """The first wording (a list of parts; the longest first) whose parts fit on
    `max_lines` lines, else the last one cut to them; `width` None: the first
    wording on one unpadded line."""
    if width is None:
        return [[piece for index, part in enumerate(wordings[0])
                 for piece in ([_SEPARATOR] if index else []) + list(part)]]  # fmt: skip
    for parts in wordings[:-1]:
        lines = part_lines(parts, width)
        if max_lines is None or len(lines) <= max_lines:
            return lines
    return part_lines(wordings[-1], width, max_lines)


def _banner_parts(model: RunModel, short: bool) -> list[Line]:
    parts: list[Line] = []
    if model.is_simulated:
        parts.append([(SIMULATED_LABEL, "simulated")])
    if model.replay_of is not None:
        parts.append([(f"REPLAY of {sanitize(model.replay_of, keep_newlines=False)}", "replay")])
    texts = []
    if model.model_name:
        where = f" @ {model.server}" if model.server else ""
        texts.append(f"model {model.model_name}{where}")
    elif model.server:
        texts.append(f"server {model.server}")
    texts.append(f"mode {model.mode}")
    evidence = model.backend.evidence
    if short:
        # Where the verdict came from, without its details ("plugin hello: vLLM 0.32.0, K=3…").
        evidence = evidence.split(":", 1)[0]
    texts.append(f"backend {model.backend.name} ({evidence})")
    if any(source.get("verification") == "fly" for source in model.sources):
        # Contract C1: lossy verification; "accepted" then does not mean "what the target
        # would have sampled", and the banner must not let the colors suggest it.
        texts.append("LOSSY verification (fly): an accepted draft need not be the target's choice")
    if (untested := untested_engine(model.sources)) is not None:
        texts.append(f"UNTESTED engine: vLLM {untested} was never tested with the plugin")
    if not model.backend.speculative:
        texts.append("monochrome: no speculative decoding proven")
    reported = reported_text(model, short)
    if reported:
        texts.append(reported)
    if model.telemetry:
        # Where telemetry comes from and what vouches for it; short: the path and its
        # one warning ("over plain HTTP: NOT encrypted"), before the first comma.
        texts.append(model.telemetry.split(", ", 1)[0] if short else model.telemetry)
    parts += [[(sanitize(text, keep_newlines=False), None)] for text in texts]
    return parts


def _reported_engines(model: RunModel) -> tuple[list[str], bool]:
    """The engines whose own statements color streams of this run (auto mode), and
    whether a stream still open states (or, like the ended ones, will state) its steps."""
    if model.mode != "auto":
        return [], False
    streams = model.streams
    shown = sorted({str(s.reported.engine) for s in streams if s.shows_reported and s.reported})
    waiting = any(
        s.reported_pending
        or (bool(shown) and s.plugin_silent and s.reported is None and not s.over)
        for s in streams
    )
    return shown, waiting


def reported_text(model: RunModel, short: bool) -> str:
    """The banner's word on server-reported steps: which engine's statements color
    which streams and why (no plugin telemetry), or that they will at a stream's end."""
    shown, waiting = _reported_engines(model)
    if not shown and not waiting:
        return ""
    if short:
        return "REPORTED steps" if shown else "REPORTED steps at stream ends"
    engines = " and ".join(shown) if shown else "the server"
    text = f"server-reported steps from {engines} (no plugin telemetry: the engine's own word)"
    return text + ("; colors when each stream ends" if waiting else "")


def banner_lines(model: RunModel, width: int | None, max_lines: int | None = None) -> list[Line]:
    """The banner: engine, model and server, mode, backend and its evidence, telemetry."""
    wordings = [_banner_parts(model, False), _banner_parts(model, True)]
    return chrome_lines(wordings, width, max_lines)


def banner_line(model: RunModel, width: int | None) -> Line:
    """The banner on one line (cut with "…" when it does not fit)."""
    return banner_lines(model, width, 1)[0]


def _shows_chunks(model: RunModel) -> bool:
    return any(stream.shows_chunks for stream in model.shown_streams())


def _legend_parts(model: RunModel, short: bool) -> list[Line]:
    if not model.colorize:
        reason = "NO_COLOR" if model.no_color else "no speculative decoding proven"
        return [[("colors: none (" + reason + ")", "dim")]]
    if model.mode == "chunk":
        squares: Line = [("■", key) for key in STEP_KEYS]
        what = " (network chunks)" if short else " (network chunks, not engine steps)"
        return [[("colors: SSE chunks ", None), *squares, (what, None)]]
    parts: list[Line] = []
    verifying = model.mode == "auto" and any(
        stream.label == LABEL_VERIFYING for stream in model.shown_streams()
    )
    if model.color_by == "role":
        colors: Line = [("colors: token role", None)]
        for code in (1, 2, 3):
            colors += [(" ", None), ("■", ROLE_KEYS[code]), (f" {ROLE_NAMES[code]}", None)]
        parts.append(colors)
        parts.append([("plain: a step without drafts", None)])
        # A reconciler without contract C2's roles: no span is shown with a role.
        mixed = "underlined: tokens of two roles" if model.roles_known else None
        unproven = "dim: not yet proven" if model.roles_known else "dim: no role proven"
    else:
        cycle = " (cycling)" if short else " (cycling, one per verified step)"
        parts.append(
            [("colors: engine step ", None), *[("■", k) for k in STEP_KEYS], (cycle, None)]
        )
        mixed = (
            "underlined: 2 steps in 1 character"
            if short
            else ("underlined: a character from two steps")
        )
        unproven = "dim: not yet proven"
    if mixed is not None:
        parts.append([(mixed, "mixed")])
    unproven_part: Line = [(unproven, "unproven")]
    if verifying:
        # auto mode proves a stream as it goes; its verdict waits for the stream's end.
        unproven_part.append(
            ("; verdict when a stream ends" if short else "; the verdict comes when a stream ends",
             None)
        )  # fmt: skip
    parts.append(unproven_part)
    shown, waiting = _reported_engines(model)
    if shown or waiting:
        # What the tier proves, and that its colors come only with a stream's end
        # (vLLM's lists arrive in the final chunk; llama's steps are judged there too).
        what = (
            "REPORTED streams: the server's own steps (one witness), colored at its end"
            if short
            else f"{LABEL_REPORTED} streams: steps and roles as the engine states them, "
            "cross-checked for consistency (one witness, not EXACT); "
            "colored when the stream ends"
        )
        parts.append([(what, None)])
    if _shows_chunks(model):
        parts.append(
            [(f"{'CHUNK' if short else LABEL_CHUNK} streams: colors are SSE chunks", None)]
        )
    return parts


def legend_lines(model: RunModel, width: int | None, max_lines: int | None = None) -> list[Line]:
    """What the colors of this run mean, in the colors themselves."""
    return chrome_lines([_legend_parts(model, False), _legend_parts(model, True)], width, max_lines)


def legend_line(model: RunModel, width: int | None) -> Line:
    """The legend on one line (cut with "…" when it does not fit)."""
    return legend_lines(model, width, 1)[0]


@dataclass
class GridUi:
    """What the keys changed: the focused stream, zoom, pause (views.py); and where
    the last frame put each stream, for the arrow keys (`move_focus`)."""

    focus: int = 0
    zoomed: bool = False
    paused: bool = False
    keys: bool = False  # keys are read: show their hints
    # stream position -> (top row, left column, rows, columns) of its pane or overview entry
    places: dict[int, tuple[int, int, int, int]] = field(default_factory=dict)


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


# --- screens -----------------------------------------------------------------------------


def grid_layout(count: int, width: int, height: int) -> tuple[int, int, int]:
    """(columns, pane width, pane height) for `count` panes on a width x height body."""
    columns = max(1, min(count, width // MIN_PANE_WIDTH))
    rows = math.ceil(count / columns)
    pane_width = max(MIN_PANE_WIDTH // 2, width // columns)
    pane_height = max(MIN_PANE_HEIGHT, height // max(1, rows))
    return columns, pane_width, pane_height


@dataclass(frozen=True)
class GridPlan:
    """Which streams get a pane, which an overview line, and their sizes."""

    columns: int
    pane_width: int
    pane_height: int
    panes: tuple[int, ...]  # stream positions with a pane
    overview_columns: int
    overview_width: int
    overview_rows: int
    overview: tuple[int, ...]  # stream positions on overview lines, column-major


def grid_plan(count: int, width: int, body_height: int, focus: int) -> GridPlan:
    """Full panes where they fit, overview lines for the rest, all within the body."""
    pane_count = min(count, GRID_MAX_PANES)
    columns, pane_width, pane_height = grid_layout(pane_count, width, body_height)
    overview_columns = max(1, width // OVERVIEW_MIN_WIDTH)
    overview_width = width // overview_columns
    rows = math.ceil(pane_count / columns) if pane_count else 0
    if count <= GRID_MAX_PANES and rows * MIN_PANE_HEIGHT <= body_height:
        return GridPlan(
            columns, pane_width, pane_height, tuple(range(count)), overview_columns,
            overview_width, 0, (),
        )  # fmt: skip
    # Too many for panes: as many whole rows of panes as leave room for an overview
    # line per remaining stream; none if even the overview alone does not fit.
    pane_rows = 0
    for candidate in range(min(pane_count // columns, body_height // MIN_PANE_HEIGHT), 0, -1):
        remaining = count - candidate * columns
        if candidate * MIN_PANE_HEIGHT + math.ceil(remaining / overview_columns) <= body_height:
            pane_rows = candidate
            break
    panes = tuple(range(pane_rows * columns))
    rest = list(range(len(panes), count))
    available = body_height - pane_rows * MIN_PANE_HEIGHT
    # As few (so as wide) overview columns as the rows left over allow.
    overview_columns = max(1, min(overview_columns, math.ceil(len(rest) / max(1, available))))
    overview_width = width // overview_columns
    overview_rows = min(math.ceil(len(rest) / overview_columns), available)
    if pane_rows:
        pane_height = (body_height - overview_rows) // pane_rows
    room = overview_rows * overview_columns
    if len(rest) > room:
        # A window of the overview that holds the focused stream.
        start = 0
        if focus in rest:
            start = min(max(0, rest.index(focus) - room // 2), len(rest) - room)
        rest = rest[start : start + room]
    return GridPlan(
        columns, pane_width, pane_height, panes, overview_columns, overview_width,
        overview_rows, tuple(rest),
    )  # fmt: skip


def _pane_rows(
    model: RunModel,
    streams: Sequence[StreamState],
    positions: Sequence[int],
    columns: int,
    pane_width: int,
    pane_height: int,
    width: int,
    pane_of: PaneCache | None,
    focus: int | None,
) -> list[Line]:
    """Rows of boxed panes: `streams[p]` for each position p."""
    rows: list[Line] = []
    for row_start in range(0, len(positions), columns):
        panes = []
        for position in positions[row_start : row_start + columns]:
            stream = streams[position]
            focused = focus == position
            if pane_of is not None:
                panes.append(pane_of.get(stream, pane_width, pane_height, focused))
            else:
                data = pane_data(stream, model, None)
                panes.append(box_pane(data, pane_width, pane_height, focused=focused))
        spare = width - pane_width * len(panes)
        for index in range(pane_height):
            line: Line = []
            for lines in panes:
                line.extend(lines[index])
            if spare > 0:
                line.append((" " * spare, None))
            rows.append(line)
    return rows


def _overview_rows(
    model: RunModel,
    streams: Sequence[StreamState],
    plan: GridPlan,
    width: int,
    focus: int | None,
) -> list[Line]:
    rows: list[Line] = []
    positions = plan.overview
    for row in range(plan.overview_rows):
        line: Line = []
        for column in range(plan.overview_columns):
            slot = column * plan.overview_rows + row
            if slot < len(positions):
                stream = streams[positions[slot]]
                line.extend(
                    overview_line(
                        stream, model, plan.overview_width, focused=positions[slot] == focus
                    )
                )
            else:
                line.append((" " * plan.overview_width, None))
        spare = width - plan.overview_width * plan.overview_columns
        if spare > 0:
            line.append((" " * spare, None))
        rows.append(line)
    return rows


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


def _pane_places(
    positions: Sequence[int], columns: int, pane_width: int, pane_height: int, top: int
) -> dict[int, tuple[int, int, int, int]]:
    return {
        position: (
            top + (index // columns) * pane_height,
            (index % columns) * pane_width,
            pane_height,
            pane_width,
        )
        for index, position in enumerate(positions)
    }


def _grid_body(
    model: RunModel,
    shown: Sequence[StreamState],
    width: int,
    body_height: int,
    ui: GridUi,
    cache: PaneCache | None,
    focus: int | None,
    top: int,
) -> tuple[list[Line], int, dict[int, tuple[int, int, int, int]]]:
    """The grid's body (panes, overview lines, or the zoomed pane), how many streams it
    leaves out, and where it put each stream (rows counted from `top`)."""
    count = len(shown)
    if ui.zoomed and focus is not None:
        data = pane_data(shown[focus], model, width * body_height * 2)
        return box_pane(data, width, body_height, focused=True), 0, {}
    plan = grid_plan(count, width, body_height, focus if focus is not None else 0)
    panes = plan.panes
    if plan.overview_rows == 0 and not plan.overview:
        # Whole rows of panes only, as many as fit.
        rows_that_fit = max(1, body_height // plan.pane_height)
        panes = panes[: rows_that_fit * plan.columns]
    lines = _pane_rows(
        model, shown, panes, plan.columns, plan.pane_width, plan.pane_height, width, cache, focus
    )
    places = _pane_places(panes, plan.columns, plan.pane_width, plan.pane_height, top)
    overview_top = top + len(lines)
    for slot, position in enumerate(plan.overview):
        column, row = divmod(slot, max(1, plan.overview_rows))
        places[position] = (
            overview_top + row,
            column * plan.overview_width,
            1,
            plan.overview_width,
        )
    lines.extend(_overview_rows(model, shown, plan, width, focus))
    return lines, count - len(panes) - len(plan.overview), places


def grid_screen(
    model: RunModel,
    width: int,
    height: int,
    ui: GridUi | None = None,
    cache: PaneCache | None = None,
) -> list[Line]:
    """The live grid: exactly `height` lines of exactly `width` cells."""
    ui = ui or GridUi()
    shown = model.shown_streams()
    count = len(shown)
    if cache is not None and model.queueing:
        cache.keep_only(shown)
    # The banner, legend and status line wrap where the terminal is narrow: on a short
    # one into fewer lines (shorter wording first), below LEGEND_MIN_HEIGHT one line each
    # and no legend.
    roomy = height >= LEGEND_MIN_HEIGHT
    top: list[Line] = banner_lines(model, width, (3 if height >= 40 else 2) if roomy else 1)
    if roomy:
        top += legend_lines(model, width, 2)
    status_budget = 2 if roomy else 1
    # The focus is shown (heavy borders, ▶) only where keys can move it.
    focus = min(ui.focus, count - 1) if count and ui.keys else None
    status = status_lines(model, width, 0, ui, status_budget)
    body_height = max(1, height - len(top) - len(status))
    body, hidden, places = _grid_body(model, shown, width, body_height, ui, cache, focus, len(top))
    if hidden and not ui.zoomed:
        # Saying what is hidden may take another status line: lay the body out again.
        wider = status_lines(model, width, hidden, ui, status_budget)
        if len(wider) > len(status):
            body_height = max(1, height - len(top) - len(wider))
            body, hidden, places = _grid_body(
                model, shown, width, body_height, ui, cache, focus, len(top)
            )
        status = status_lines(model, width, hidden, ui, len(wider))
    ui.places = places
    lines = [*top, *body][: max(0, height - len(status))]
    lines.extend([(" " * width, None)] for _ in range(height - len(status) - len(lines)))
    lines.extend(status[: height - len(lines)])
    return lines


_DIRECTIONS = {
    "up": (-1, 0), "k": (-1, 0), "down": (1, 0), "j": (1, 0),
    "left": (0, -1), "h": (0, -1), "right": (0, 1), "l": (0, 1),
}  # fmt: skip


def move_focus(ui: GridUi, key: str, count: int) -> bool:
    """Move the focus by an arrow key (or hjkl) to the nearest stream on the screen in
    that direction, as the last frame laid them out (`ui.places`). Past the visible
    overview lines it moves on in stream order (the window follows the focus). False:
    not a direction key."""
    direction = _DIRECTIONS.get(key)
    if direction is None:
        return False
    down, right = direction
    here = ui.places.get(ui.focus)
    if ui.zoomed or here is None:
        # One stream on the screen (or the focus scrolled off): the next one in order.
        step = 1 if down + right > 0 else -1
        ui.focus = (ui.focus + step) % max(1, count)
        return True
    row, column = here[0] + here[2] / 2, here[1] + here[3] / 2
    best: tuple[float, int] | None = None
    for position, (top, left, rows, columns) in ui.places.items():
        if position == ui.focus:
            continue
        # How far along the direction, and how far off its line (ranges that overlap
        # are on the same line: a pane row and the overview line under it).
        along = (top + rows / 2 - row) * down + (left + columns / 2 - column) * right
        if down:
            if not (top >= here[0] + here[2] if down > 0 else top + rows <= here[0]):
                continue
            off = max(0.0, left - column, column - (left + columns))
        else:
            if not (left >= here[1] + here[3] if right > 0 else left + columns <= here[1]):
                continue
            off = max(0.0, top - row, row - (top + rows))
        score = along + 4 * off
        if best is None or score < best[0]:
            best = (score, position)
    if best is not None:
        ui.focus = best[1]
    elif down and 0 <= ui.focus + down < count and ui.focus + down not in ui.places:
        ui.focus += down  # the overview window scrolls to it
    return True


def final_grid(model: RunModel, width: int) -> list[Line]:
    """The grid printed after the run: every pane (up to 64), the rest as overview lines.
    With --requests, the streams' last requests (the summary has every request)."""
    shown = model.shown_streams()
    count = len(shown)
    pane_count = min(count, GRID_MAX_PANES)
    columns, _, _ = grid_layout(pane_count, width, 10**6)
    rows = math.ceil(pane_count / columns) if pane_count else 1
    # The final picture keeps every pane, roomier when there are few rows.
    pane_height = 16 if rows <= 2 else 10
    pane_width = max(MIN_PANE_WIDTH // 2, width // columns)
    lines: list[Line] = [*banner_lines(model, width), *legend_lines(model, width)]
    positions = list(range(pane_count))
    lines.extend(
        _pane_rows(model, shown, positions, columns, pane_width, pane_height, width, None, None)
    )
    if count > pane_count:
        overview_columns = max(1, width // OVERVIEW_MIN_WIDTH)
        rest = tuple(range(pane_count, count))
        plan = GridPlan(
            columns, pane_width, pane_height, (), overview_columns, width // overview_columns,
            math.ceil(len(rest) / overview_columns), rest,
        )  # fmt: skip
        lines.extend(_overview_rows(model, shown, plan, width, None))
    lines.extend(status_lines(model, width, 0, None, None))
    return lines


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
        lines.extend(wrap(_clean(_styled(stream, model, None)), width))
    else:
        reserved = (1 if note else 0) + (1 if status else 0)
        body_height = max(1, height - len(lines) - reserved)
        budget = width * body_height * 2
        body = _clean(_styled(stream, model, budget))
        lines.extend(wrap(body, width, body_height))
    if note:
        lines.append(fit([(sanitize(note, keep_newlines=False), "note")], width))
    if status is not None and height is not None:
        lines.append(status)
    return lines


def plain_listing(model: RunModel) -> list[Line]:
    """Every stream's header, whole text and note, unwrapped (pipes get whole lines)."""
    lines: list[Line] = [banner_line(model, None)]
    for stream in model.streams:
        lines.append(header_pieces(stream))
        lines.extend(wrap(_clean(stream.segments(False), laid_out=False), None))
        if stream.note:
            lines.append([(sanitize(stream.note, keep_newlines=False), None)])
        lines.append([])
    return lines
