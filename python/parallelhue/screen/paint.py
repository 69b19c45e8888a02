"""Painters of the pane model: lines of (text, style key) pieces to ANSI or Rich text.

The ANSI painter is the live grid's fast path (and the tmux pane viewer's):
escape codes come from the theme, built once per style key. The Rich painter
feeds everything printed through a Rich console (final pictures, the
summary), so Rich decides what a non-terminal gets. `export.py` paints the same
lines into HTML and SVG.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from rich.text import Span, Text

from ..model.state import RunModel
from .lines import Line
from .style import Theme

__all__ = ["RESET", "ansi_line", "plain_lines", "rich_text", "theme_for"]

RESET = "\x1b[0m"


def theme_for(model: RunModel) -> Theme:
    """The run's palette under its color rule (NO_COLOR), one instance per pair."""
    return _theme(model.palette, not model.no_color)


@functools.lru_cache(maxsize=8)
def _theme(palette: str, use_color: bool) -> Theme:
    return Theme(palette, use_color=use_color)


def ansi_line(line: Line, theme: Theme) -> str:
    """One line as text with SGR escapes; every styled piece ends with a reset."""
    prefixes = theme.prefixes
    out: list[str] = []
    for text, key in line:
        prefix = prefixes.get(key, "") if key is not None else ""
        out.append(f"{prefix}{text}{RESET}" if prefix else text)
    return "".join(out)


def plain_lines(lines: Iterable[Line]) -> list[str]:
    return ["".join(text for text, _ in line) for line in lines]


def _trimmed(line: Line) -> Line:
    """Without the unstyled spaces that pad it to its width (printed output)."""
    out = list(line)
    while out and out[-1][1] is None and not out[-1][0].strip():
        out.pop()
    if out and out[-1][1] is None:
        out[-1] = (out[-1][0].rstrip(), None)
    return out


def rich_text(lines: Iterable[Line], theme: Theme, *, trim: bool = False) -> Text:
    """All lines as one Rich Text (joined by newlines), one span per styled piece;
    `trim` drops the padding at the end of each line."""
    parts: list[str] = []
    spans: list[Span] = []
    position = 0
    first = True
    for line in lines:
        if not first:
            parts.append("\n")
            position += 1
        first = False
        for text, key in _trimmed(line) if trim else line:
            if not text:
                continue
            parts.append(text)
            end = position + len(text)
            style = theme.rich(key)
            if style is not None and style:
                spans.append(Span(position, end, style))
            position = end
    return Text("".join(parts), spans=spans, no_wrap=True, overflow="crop")
