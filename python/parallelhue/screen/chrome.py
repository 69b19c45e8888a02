"""The lines around the panes (banner, legend, status), laid out from parts.

Each is a list of parts (a part: pieces that belong together), laid out by
`part_lines`: whole parts per line, wrapped onto more lines when the terminal
is narrow, never cut inside a part while there is a line left for it. Where
the live grid has few lines, the shorter wording of each part is tried before
anything is cut (`chrome_lines`).
"""

from __future__ import annotations

from collections.abc import Sequence

from .lines import Line, Piece, fit, line_width, word_wrap

__all__ = ["chrome_lines", "part_lines"]

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
