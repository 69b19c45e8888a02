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
from dataclasses import dataclass

from rich.cells import cell_len

from .backend import untested_engine
from .sanitize import sanitize
from .state import (
    LABEL_CANCELLED,
    LABEL_CHUNK,
    LABEL_ERROR,
    LABEL_EXACT,
    LABEL_NOT_EXACT,
    LABEL_QUEUED,
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
}
_BOX = ("┌", "─", "┐", "│", "└", "┘")
_FOCUS_BOX = ("┏", "━", "┓", "┃", "┗", "┛")  # the focused pane: heavy lines, no color needed


# --- cells ----------------------------------------------------------------------------


# Widths of non-ASCII pieces, and of single characters, as rich's cell_len gives them
# (every redraw measures the same tails again). Bounded: emptied when full. An ASCII
# piece is never looked up here (cells: its len).
_CELLS: dict[str, int] = {}
_CELLS_MAX = 1 << 16
# The characters that change a width beyond the sum of its characters' (rich's cell_len:
# a zero-width joiner, variation selector 16). Pieces without them are measured per character.
_JOINER = "\u200d"
_VS16 = "\ufe0f"


def cells(text: str) -> int:
    if text.isascii():
        return len(text)
    size = _CELLS.get(text)
    return _measured(text) if size is None else size


def _measured(text: str) -> int:
    """rich's cell_len of `text`, kept in _CELLS (for an ASCII control too: 0, not len);
    callers look in _CELLS first, without a call on a hit."""
    if len(_CELLS) >= _CELLS_MAX:
        _CELLS.clear()
    size = _CELLS[text] = cell_len(text)
    return size


def line_width(line: Line) -> int:
    return sum(cells(text) for text, _ in line)


def line_text(line: Line) -> str:
    return "".join(text for text, _ in line)


def _clusters(text: str) -> list[str]:
    """`text` as characters with the zero-width ones after them (combining marks,
    variation selectors): measured whole, as `cells` measures a piece (U+2764 U+FE0F,
    an emoji, is two cells; its parts alone are one and zero)."""
    out: list[str] = []
    for char in text:
        if out and cell_len(char) == 0:
            out[-1] += char
        else:
            out.append(char)
    return out


def _take(text: str, room: int) -> tuple[str, int]:
    """The longest prefix of `text` fitting `room` cells, and its width."""
    if text.isascii():
        take = text[:room]
        return take, len(take)
    whole = cells(text)
    if whole <= room:
        return text, whole
    used = 0
    if _JOINER not in text and _VS16 not in text:
        # Here a width is the sum of the characters' widths, and a zero-width character
        # (size 0) never ends the prefix: the clusters below, measured per character.
        for end, char in enumerate(text):
            size = _CELLS.get(char)
            if size is None:  # rich's width, also for an ASCII control (0, not len)
                size = _measured(char)
            if used + size > room:
                return text[:end], used
            used += size
        return text, used
    end = 0
    for cluster in _clusters(text):
        size = cell_len(cluster)
        if used + size > room:
            break
        used += size
        end += len(cluster)
    return text[:end], used


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
        take, size = _take(text, limit - used)
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
        room = width - used
        chars: list[str] = []
        for cluster in reversed(_clusters(flat)):
            cluster_size = cell_len(cluster)
            if cluster_size > room:
                break
            chars.append(cluster)
            room -= cluster_size
        if chars:
            piece = "".join(reversed(chars))
            kept.append((piece, key))
            used += cells(piece)
        break
    kept.reverse()
    if used < width:
        kept.insert(0, (" " * (width - used), None))
    return kept


def wrap(pieces: Iterable[Piece], width: int | None, max_lines: int | None = None) -> list[Line]:
    """`pieces` hard-wrapped at `width` cells (None: only at newlines, unpadded);
    sized lines are padded to exactly `width`. With `max_lines`, the last ones."""
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
            # The common case: a piece that fits on the current line, measured once.
            if text.isascii():
                size = len(text)
            else:
                cached = _CELLS.get(text)  # cells(text), without the call on a hit
                size = _measured(text) if cached is None else cached
            if used + size <= width:
                current.append((text, key))
                used += size
                if used >= width:
                    flush()
                continue
        for number, part in enumerate(text.split("\n")):
            if number:
                flush()
            while part:
                take, size = _take(part, width - used)
                if not take and used == 0:
                    first = _clusters(part)[0]  # wider than the pane
                    take, size = first, min(width, cell_len(first))
                if take:
                    current.append((take, key))
                    used += size
                    part = part[len(take) :]
                if part or used >= width:
                    flush()
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


def _clean(pieces: Sequence[Piece]) -> Line:
    """The pieces sanitized, empty ones dropped (every pane at every redraw)."""
    # The common case, one test for the whole tail: every piece printable (as a
    # joined string is exactly when each of its pieces is), only empty ones go.
    # The texts are taken and tested by C loops (map, join, all), not a Python
    # loop per piece (callgrind: 29k instructions a grid pane against 41k).
    texts = list(map(_TEXT, pieces))
    if "".join(texts).isprintable():
        return list(pieces) if all(texts) else [piece for piece in pieces if piece[0]]
    out: Line = []
    for text, key in pieces:
        clean = text if text.isprintable() else sanitize(text)
        if clean:
            out.append((clean, key))
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


def header_pieces(stream: StreamState) -> Line:
    """`#i LABEL · numbers` on one line (the stream view and the plain listing)."""
    return [
        (f"#{stream.index} ", "bold"),
        (stream.label, label_key(stream.label)),
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


def pane_data(stream: StreamState, model: RunModel, max_chars: int | None) -> PaneData:
    body = _clean(_styled(stream, model, max_chars))
    note = sanitize(stream.note, keep_newlines=False) if stream.note else None
    requests = len(model.streams) if model.queueing else None
    return PaneData(stream.index, stream.label, numbers_text(stream), tuple(body), note, requests)


def _pane_content(data: PaneData, width: int, height: int) -> list[Line]:
    """Exactly `height` lines of `width` cells: header, numbers, the tail, the note."""
    # With --requests a stream shows request after request: "#17/100" is the 18th of 100.
    of = f"/{data.requests}" if data.requests is not None else ""
    title = f"#{data.index}{of} "
    content: list[Line] = [
        fit([(title, "bold"), (data.label, label_key(data.label))], width),
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


def banner_line(model: RunModel, width: int | None) -> Line:
    pieces: Line = []
    if model.is_simulated:
        pieces += [(SIMULATED_LABEL, "simulated"), (" · ", None)]
    if model.replay_of is not None:
        pieces += [(f"REPLAY of {sanitize(model.replay_of, keep_newlines=False)}", "replay")]
        pieces += [(" · ", None)]
    parts = []
    if model.model_name:
        where = f" @ {model.server}" if model.server else ""
        parts.append(f"model {model.model_name}{where}")
    elif model.server:
        parts.append(f"server {model.server}")
    parts.append(f"mode {model.mode}")
    parts.append(f"backend {model.backend.name} ({model.backend.evidence})")
    if any(source.get("verification") == "fly" for source in model.sources):
        # Contract C1: lossy verification; "accepted" then does not mean "what the target
        # would have sampled", and the banner must not let the colors suggest it.
        parts.append("LOSSY verification (fly): an accepted draft need not be the target's choice")
    if (untested := untested_engine(model.sources)) is not None:
        parts.append(f"UNTESTED engine: vLLM {untested} was never tested with the plugin")
    if not model.backend.speculative:
        parts.append("monochrome: no speculative decoding proven")
    if model.telemetry:
        parts.append(model.telemetry)  # where telemetry comes from and what vouches for it
    pieces.append((sanitize(" · ".join(parts), keep_newlines=False), None))
    return pieces if width is None else fit(pieces, width)


def legend_pieces(model: RunModel) -> Line:
    """What the colors of this run mean, in the colors themselves."""
    if not model.colorize:
        reason = "NO_COLOR" if model.no_color else "no speculative decoding proven"
        return [("colors: none (" + reason + ")", "dim")]
    pieces: Line = []
    if model.mode == "chunk":
        pieces += [("colors: SSE chunks ", None)]
        pieces += [("■", key) for key in STEP_KEYS]
        pieces += [(" (network chunks, not engine steps)", None)]
        return pieces
    if model.color_by == "role":
        pieces.append(("colors: token role ", None))
        for code in (1, 2, 3):
            pieces += [("■", ROLE_KEYS[code]), (f" {ROLE_NAMES[code]}  ", None)]
        pieces.append(("plain: a step without drafts", None))
        # A reconciler without contract C2's roles: no span is shown with a role.
        mixed = "underlined: tokens of two roles" if model.roles_known else None
        unproven = "dim: not yet proven" if model.roles_known else "dim: no role proven"
    else:
        pieces.append(("colors: engine step ", None))
        pieces += [("■", key) for key in STEP_KEYS]
        pieces.append((" (cycling, one per verified step)", None))
        mixed = "underlined: a character from two steps"
        unproven = "dim: not yet proven"
    if mixed is not None:
        pieces += [(" · ", None), (mixed, "mixed")]
    pieces += [(" · ", None), (unproven, "unproven")]
    pieces.append((" · SSE CHUNK MODE streams: colors are SSE chunks", None))
    return pieces


def legend_line(model: RunModel, width: int | None) -> Line:
    pieces = legend_pieces(model)
    return pieces if width is None else fit(pieces, width)


@dataclass
class GridUi:
    """What the keys changed: the focused stream, zoom, pause (views.py)."""

    focus: int = 0
    zoomed: bool = False
    paused: bool = False
    keys: bool = False  # keys are read: show their hints


_KEY_HINT = "keys: ↑↓←→ focus · z zoom · p pause · c colors · q quit"


def requests_text(model: RunModel) -> str:
    """--requests: how far the run is ("requests 37 done · 8 open · 55 queued of 100")."""
    done, open_, queued = model.request_counts()
    rate = "" if math.isinf(model.request_rate) else f" at {model.request_rate:g}/s"
    return (
        f"requests {done} done · {open_} open · {queued} queued of {len(model.streams)}"
        f"{rate} on {model.concurrency} streams"
    )


def status_line(model: RunModel, width: int, hidden: int, ui: GridUi | None) -> Line:
    counts = model.count_labels()
    noun = "requests" if model.queueing else "streams"
    labels = f"{noun} " + " · ".join(f"{label}: {n}" for label, n in sorted(counts.items()))
    parts = []
    if ui is not None and ui.paused:
        parts.append("PAUSED (p resumes; the run goes on)")
    if hidden > 0:
        # First on the line, so a narrow terminal cuts the counts rather than this.
        parts.append(
            f"{hidden} of {len(model.shown_streams())} streams hidden: enlarge the terminal, "
            "move the focus or use --tmux"
        )
    if model.queueing:
        parts.append(requests_text(model))
    parts.append(labels)
    if model.run_messages:
        parts.append("run: " + sanitize(model.run_messages[-1], keep_newlines=False))
    if ui is not None and ui.keys:
        parts.append(_KEY_HINT)
    return fit([(" · ".join(parts), "dim")], width)


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


def grid_screen(
    model: RunModel,
    width: int,
    height: int,
    ui: GridUi | None = None,
    cache: PaneCache | None = None,
) -> list[Line]:
    """The live grid: exactly `height` lines of exactly `width` cells."""
    ui = ui or GridUi()
    legend = height >= LEGEND_MIN_HEIGHT
    chrome = 2 + (1 if legend else 0)
    body_height = max(1, height - chrome)
    shown = model.shown_streams()
    count = len(shown)
    if cache is not None and model.queueing:
        cache.keep_only(shown)
    lines: list[Line] = [banner_line(model, width)]
    if legend:
        lines.append(legend_line(model, width))
    # The focus is shown (heavy borders, ▶) only where keys can move it.
    focus = min(ui.focus, count - 1) if count and ui.keys else None
    hidden = 0
    if ui.zoomed and focus is not None:
        stream = shown[focus]
        budget = width * body_height * 2
        data = pane_data(stream, model, budget)
        lines.extend(box_pane(data, width, body_height, focused=True))
    else:
        plan = grid_plan(count, width, body_height, focus if focus is not None else 0)
        if plan.overview_rows == 0 and not plan.overview:
            # Whole rows of panes only, as many as fit.
            rows_that_fit = max(1, body_height // plan.pane_height)
            on_screen = plan.panes[: rows_that_fit * plan.columns]
            hidden = count - len(on_screen)
            lines.extend(
                _pane_rows(
                    model, shown, on_screen, plan.columns, plan.pane_width, plan.pane_height,
                    width, cache, focus,
                )
            )  # fmt: skip
        else:
            hidden = count - len(plan.panes) - len(plan.overview)
            lines.extend(
                _pane_rows(
                    model, shown, plan.panes, plan.columns, plan.pane_width, plan.pane_height,
                    width, cache, focus,
                )
            )  # fmt: skip
            lines.extend(_overview_rows(model, shown, plan, width, focus))
    lines = lines[: height - 1]
    lines.extend([(" " * width, None)] for _ in range(height - 1 - len(lines)))
    lines.append(status_line(model, width, hidden, ui))
    return lines


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
    lines: list[Line] = [banner_line(model, width), legend_line(model, width)]
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
    lines.append(status_line(model, width, 0, None))
    return lines


_STREAM_KEY_HINT = "keys: p pause · c colors · q quit"


def stream_screen(
    model: RunModel, width: int, height: int | None, ui: GridUi | None = None
) -> list[Line]:
    """One stream: banner, legend, header, its text (the tail when `height` is given,
    else all of it), the note, and the keys while they are read."""
    stream = model.shown_streams()[0]
    lines: list[Line] = [banner_line(model, width), legend_line(model, width)]
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
        lines.extend(wrap(_clean(stream.segments(False)), None))
        if stream.note:
            lines.append([(sanitize(stream.note, keep_newlines=False), None)])
        lines.append([])
    return lines
