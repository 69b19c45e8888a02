"""A line of the screen: styled pieces laid out in terminal cells.

A `Line` is a list of `(text, style key)` pieces; text is sanitized and laid
out in terminal cells (wide characters count two; cells.py), and every line
of a sized layout is exactly its width. Nothing in the screen knows about
colors or escape codes: `paint.py` turns lines into ANSI text (the live grid,
tmux panes) or Rich text (the final pictures), `export.py` into HTML and SVG,
all from the same lines. Here: cutting, padding and wrapping pieces, and a
stream's tail in the run's coloring, cleaned for the screen.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Sequence

from ..model.sanitize import sanitize
from ..model.state import RunModel, StreamState
from .cells import _TEXT as _MEASURED
from .cells import cells, char_cells, for_screen, head_cells, tail_cells

__all__ = [
    "Line",
    "Piece",
    "clean_pieces",
    "fit",
    "line_text",
    "line_width",
    "styled_tail",
    "tail_fit",
    "word_wrap",
    "wrap",
]

Piece = tuple[str, str | None]


Line = list[Piece]


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


def styled_tail(stream: StreamState, model: RunModel, max_chars: int | None) -> list[Piece]:
    """The tail of a stream's text in this run's coloring (None: all of it)."""
    return stream.tail_segments(
        model.colorize, max_chars, model.color_by, roles_known=model.roles_known
    )


def clean_pieces(pieces: Sequence[Piece], *, laid_out: bool = True) -> Line:
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
