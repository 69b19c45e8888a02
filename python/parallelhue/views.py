"""Rich views of a run: one stream inline, a live grid of up to 64 panes, or plain text.

All views read a `RunModel`; one task calls `refresh()` at a fixed rate, so
the screen is redrawn from one place and never per token. Every piece of
server text is sanitized before it becomes a Rich `Text` (never markup).
"""

from __future__ import annotations

import math
import sys
from typing import Protocol

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.style import Style
from rich.text import Span, Text

from .sanitize import sanitize
from .state import (
    LABEL_CHUNK,
    LABEL_ERROR,
    LABEL_EXACT,
    LABEL_NOT_EXACT,
    RunModel,
    Segment,
    StreamState,
)
from .summary import render_summary

__all__ = [
    "GRID_MAX_PANES",
    "AnsiGrid",
    "GridView",
    "PlainView",
    "StreamView",
    "View",
    "banner_text",
    "grid_renderable",
    "header_text",
    "make_console",
    "make_view",
    "pane_ansi",
    "styled_text",
    "tail_text",
    "wrap_cells",
]

GRID_MAX_PANES = 64
REFRESH_HZ = 10.0
# A 64-pane frame costs tens of milliseconds in Rich; big grids redraw less often.
LARGE_GRID_PANES = 16
LARGE_GRID_INTERVAL = 0.25
_MIN_PANE_WIDTH = 36
_MIN_PANE_HEIGHT = 6

_LABEL_STYLES = {
    LABEL_EXACT: "bold green",
    LABEL_CHUNK: "bold yellow",
    LABEL_NOT_EXACT: "bold red",
    LABEL_ERROR: "bold red",
}


class View(Protocol):
    # Seconds between two redraws; fixed for the run, chosen by the view's size.
    refresh_interval: float

    def start(self) -> None: ...
    def refresh(self) -> None: ...
    def stop(self) -> None:
        """Leave the live display and print the final picture and summary."""
        ...

    def abort(self) -> None:
        """Leave the live display and restore the terminal, printing nothing (Ctrl-C)."""
        ...


def make_console(no_color: bool, *, plain: bool = False, record: bool = False) -> Console:
    if plain:
        return Console(
            color_system=None,
            no_color=True,
            force_terminal=False,
            highlight=False,
            markup=False,
            emoji=False,
            record=record,
            soft_wrap=True,  # pipes get whole lines, not lines cut at 80 columns
        )
    # xterm-256 on a terminal (the palette is defined there); no ANSI into a pipe.
    return Console(
        color_system="256" if sys.stdout.isatty() else None,
        no_color=no_color,
        highlight=False,
        markup=False,
        emoji=False,
        record=record,
    )


_COLOR_STYLES = {color: Style(color=f"color({color})") for color in range(256)}


def styled_text(
    segments: list[Segment], colorize: bool = True, max_chars: int | None = None
) -> Text:
    """Sanitized text with one style span per colored segment.

    With `max_chars`, only the last pieces up to about that many characters are
    built: a pane shows the tail, and long streams must not cost more per frame.
    """
    if max_chars is not None:
        kept: list[Segment] = []
        total = 0
        for segment in reversed(segments):
            kept.append(segment)
            total += len(segment[0])
            if total >= max_chars:
                break
        kept.reverse()
        segments = kept
    plain_parts: list[str] = []
    spans: list[Span] = []
    position = 0
    for piece, color in segments:
        clean = sanitize(piece)
        if not clean:
            continue
        plain_parts.append(clean)
        end = position + len(clean)
        if color is not None and colorize:
            spans.append(Span(position, end, _COLOR_STYLES[color]))
        position = end
    return Text("".join(plain_parts), spans=spans)


def _number(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def header_text(stream: StreamState, *, narrow: bool = False) -> Text:
    """stream, label, tokens, steps, tokens/step, acceptance (two lines when narrow)."""
    header = Text(no_wrap=True, overflow="ellipsis")
    header.append(f"#{stream.index} ", "bold")
    header.append(stream.label, _LABEL_STYLES.get(stream.label, "bold"))
    acceptance = stream.acceptance
    percent = _number(None if acceptance is None else acceptance * 100, ".0f")
    percent += "%" if acceptance is not None else ""
    steps = _number(stream.steps, "d")
    per_step = _number(stream.tokens_per_step, ".2f")
    if narrow:  # fits a 36-column pane: "1234 tok 456 st 2.71 t/st acc 45%"
        header.append(f"\n{stream.sse_tokens} tok {steps} st {per_step} t/st acc {percent}")
    else:
        header.append(
            f" · {stream.sse_tokens} tok · {steps} steps · {per_step} tok/step · acc {percent}"
        )
    return header


def banner_text(model: RunModel) -> Text:
    banner = Text()
    if model.simulated or model.backend.simulated:
        banner.append("SIMULATED ENGINE", "bold reverse")
        banner.append(" · ")
    rest = model.banner.removeprefix("SIMULATED ENGINE · ")
    banner.append(sanitize(rest, keep_newlines=False))
    return banner


def _status(model: RunModel, shown: int) -> Text:
    counts = model.count_labels()
    labels = "streams " + " · ".join(f"{label}: {n}" for label, n in sorted(counts.items()))
    total = len(model.streams)
    hidden = total - shown
    parts = []
    if hidden > 0:
        # First on the line, so a narrow terminal cuts the counts rather than this.
        if shown < min(total, GRID_MAX_PANES):
            parts.append(f"{hidden} of {total} streams hidden: enlarge the terminal or use --tmux")
        else:
            parts.append(f"{hidden} of {total} streams hidden: the grid holds {GRID_MAX_PANES}")
    parts.append(labels)
    if model.run_messages:
        parts.append("run: " + sanitize(model.run_messages[-1], keep_newlines=False))
    return Text(" · ".join(parts), "dim", no_wrap=True, overflow="ellipsis")


def tail_text(text: Text, console: Console, width: int, height: int) -> Text:
    """The last `height` wrapped lines of `text` at `width` columns."""
    if height <= 0:
        return Text()
    budget = width * height * 2
    if len(text) > budget:
        text = text[-budget:]  # styled_text(max_chars=...) usually trimmed already
    lines = text.wrap(console, max(1, width))
    return Text("\n").join(list(lines)[-height:])


def _fit(line: Text, width: int) -> Text:
    """Exactly `width` cells: cropped or padded with spaces."""
    line = line.copy()
    line.truncate(width, overflow="crop", pad=True)
    return line


def pane_lines(
    stream: StreamState, model: RunModel, console: Console, width: int, height: int
) -> list[Text]:
    """A boxed pane as exactly `height` lines of exactly `width` cells.

    Drawn by hand rather than with rich.panel.Panel inside a Table: 64 panes
    per frame made Rich's layout the dominant cost of a redraw.
    """
    inner = max(1, width - 2)
    note = stream.note
    header = header_text(stream, narrow=True)
    header_lines = header.split("\n")
    body_height = max(0, height - 2 - len(header_lines) - (1 if note else 0))
    budget = inner * max(1, body_height) * 2
    body = styled_text(stream.tail_segments(model.colorize, budget))
    content: list[Text] = list(header_lines)
    if body_height:
        wrapped = list(body.wrap(console, inner))[-body_height:]
        content.extend(wrapped)
        content.extend(Text() for _ in range(body_height - len(wrapped)))
    if note:
        content.append(Text(sanitize(note, keep_newlines=False), "red"))
    content = content[: max(0, height - 2)]
    edge = Text("│")
    lines = [Text("┌" + "─" * inner + "┐")]
    for line in content:
        lines.append(Text.assemble(edge, _fit(line, inner), edge))
    lines.append(Text("└" + "─" * inner + "┘"))
    return lines


def grid_layout(count: int, width: int, height: int) -> tuple[int, int, int]:
    """(columns, pane width, pane height) for `count` panes on a width x height screen."""
    columns = max(1, min(count, width // _MIN_PANE_WIDTH))
    rows = math.ceil(count / columns)
    pane_width = max(_MIN_PANE_WIDTH // 2, width // columns)
    pane_height = max(_MIN_PANE_HEIGHT, (height - 2) // max(1, rows))
    return columns, pane_width, pane_height


def grid_renderable(model: RunModel, console: Console, width: int, height: int) -> Group:
    shown = model.streams[:GRID_MAX_PANES]
    columns, pane_width, pane_height = grid_layout(len(shown), width, height)
    # Only whole rows that fit below the banner and above the status line.
    rows_that_fit = max(1, (height - 2) // pane_height)
    shown = shown[: rows_that_fit * columns]
    rows: list[Text] = []
    for row_start in range(0, len(shown), columns):
        panes = [
            pane_lines(stream, model, console, pane_width, pane_height)
            for stream in shown[row_start : row_start + columns]
        ]
        for index in range(pane_height):
            row = Text(no_wrap=True, overflow="crop")
            for lines in panes:
                row.append_text(lines[index])
            rows.append(row)
    return Group(banner_text(model), *rows, _status(model, len(shown)))


class GridView:
    """A live grid of fixed-size panes; the layout follows the terminal size.

    While running, frames are written as ANSI text by `AnsiGrid` (only the rows
    that changed since the last frame); the final picture is drawn by Rich.
    """

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self._grid: AnsiGrid | None = None
        large = min(len(model.streams), GRID_MAX_PANES) > LARGE_GRID_PANES
        self.refresh_interval = LARGE_GRID_INTERVAL if large else 1.0 / REFRESH_HZ

    def _renderable(self) -> Group:
        size = self.console.size
        return grid_renderable(self.model, self.console, size.width, size.height)

    def start(self) -> None:
        # Nothing is drawn live into a pipe (as with Rich Live): only the final picture.
        if self.console.is_terminal:
            self._grid = AnsiGrid(self.model, self.console)
            self._grid.start()
            self.refresh()

    def refresh(self) -> None:
        if self._grid is not None:
            self._grid.draw()

    def final_picture(self, console: Console) -> Group:
        width = console.size.width
        count = min(len(self.model.streams), GRID_MAX_PANES)
        columns, _, _ = grid_layout(count, width, 10**6)
        rows = math.ceil(count / columns) if count else 1
        # The final picture keeps every pane, roomier when there are few rows.
        pane_height = 16 if rows <= 2 else 10
        return grid_renderable(self.model, console, width, rows * pane_height + 2)

    def abort(self) -> None:
        if self._grid is not None:
            self._grid.stop()
            self._grid = None

    def stop(self) -> None:
        self.abort()
        self.console.print(self.final_picture(self.console))
        self.console.print(render_summary(self.model))


# --- the live grid as ANSI text --------------------------------------------------------

_RESET = "\x1b[0m"
# Foreground SGR of each xterm-256 color, built once instead of per piece.
_FG_SGR = tuple(f"\x1b[38;5;{color}m" for color in range(256))
_AUTOWRAP_OFF = "\x1b[?7l"
_AUTOWRAP_ON = "\x1b[?7h"
# Rich's "bold green" etc. as SGR parameters (colors dropped under NO_COLOR).
_LABEL_SGR = {
    LABEL_EXACT: ("1", "32"),
    LABEL_CHUNK: ("1", "33"),
    LABEL_NOT_EXACT: ("1", "31"),
    LABEL_ERROR: ("1", "31"),
}


def _sgr(attrs: str, color: str | None, use_color: bool) -> str:
    params = [attrs] if attrs else []
    if color is not None and use_color:
        params.append(color)
    return f"\x1b[{';'.join(params)}m" if params else ""


def _crop(text: str, width: int, ellipsis: bool = True) -> str:
    """`text` cut or padded to exactly `width` cells."""
    if text.isascii():
        cells = len(text)
    else:
        cells = cell_len(text)
    if cells <= width:
        return text + " " * (width - cells)
    out: list[str] = []
    used = 0
    limit = width - 1 if ellipsis else width
    for char in text:
        size = cell_len(char)
        if used + size > limit:
            break
        out.append(char)
        used += size
    if ellipsis and width > 0:
        out.append("…")
        used += 1
    return "".join(out) + " " * (width - used)


def wrap_cells(pieces: list[tuple[str, str]], width: int, max_lines: int) -> list[str]:
    """The last `max_lines` lines of `pieces` (text, SGR prefix) hard-wrapped at `width`
    cells; each line is exactly `width` cells and ends with its attributes reset."""
    lines: list[str] = []
    current: list[str] = []
    used = 0
    width = max(1, width)

    def flush() -> None:
        nonlocal current, used
        lines.append("".join(current) + " " * (width - used))
        current = []
        used = 0

    for text, prefix in pieces:
        if not text:
            continue
        if "\n" not in text:
            # The common case: a piece that fits on the current line, measured once.
            size = len(text) if text.isascii() else cell_len(text)
            if used + size <= width:
                current.append(f"{prefix}{text}{_RESET}" if prefix else text)
                used += size
                if used >= width:
                    flush()
                continue
        parts = text.split("\n")
        for number, part in enumerate(parts):
            if number:
                flush()
            while part:
                room = width - used
                if part.isascii():
                    take = part[:room]
                    size = len(take)
                elif (whole := cell_len(part)) <= room:
                    take, size = part, whole  # most pieces fit: one width call, not one per char
                else:
                    size = 0
                    end = 0
                    for char in part:
                        char_size = cell_len(char)
                        if size + char_size > room:
                            break
                        size += char_size
                        end += 1
                    if end == 0 and used == 0:
                        end, size = 1, min(width, cell_len(part[0]))  # wider than the pane
                    take = part[:end]
                if take:
                    current.append(f"{prefix}{take}{_RESET}" if prefix else take)
                    used += size
                    part = part[len(take) :]
                if part or used >= width:
                    flush()
    if current:
        flush()
    return lines[-max_lines:] if max_lines > 0 else []


def pane_ansi(stream: StreamState, model: RunModel, width: int, height: int) -> list[str]:
    """A boxed pane as exactly `height` ANSI lines of exactly `width` cells (the live grid)."""
    inner = max(1, width - 2)
    use_color = not model.no_color
    colorize = model.colorize
    label = stream.label
    attrs, label_color = _LABEL_SGR.get(label, ("1", None))
    acceptance = stream.acceptance
    percent = _number(None if acceptance is None else acceptance * 100, ".0f")
    percent += "%" if acceptance is not None else ""
    numbers = (
        f"{stream.sse_tokens} tok {_number(stream.steps, 'd')} st "
        f"{_number(stream.tokens_per_step, '.2f')} t/st acc {percent}"
    )
    title = f"#{stream.index} "
    head = _crop(title + label, inner)
    first = (
        f"\x1b[1m{title}{_RESET}{_sgr(attrs, label_color, use_color)}{head[len(title) :]}{_RESET}"
        if len(head) > len(title) and head.startswith(title)
        else f"\x1b[1m{head}{_RESET}"
    )
    content = [first, _crop(numbers, inner)]
    note = stream.note
    body_height = max(0, height - 4 - (1 if note else 0))
    if body_height:
        pieces: list[tuple[str, str]] = []
        for text, color in stream.tail_segments(colorize, inner * body_height * 2):
            clean = sanitize(text)
            if clean:
                prefix = _FG_SGR[color] if color is not None and use_color else ""
                pieces.append((clean, prefix))
        body = wrap_cells(pieces, inner, body_height)
        content.extend(body)
        content.extend(" " * inner for _ in range(body_height - len(body)))
    if note:
        note_sgr = _sgr("", "31", use_color)
        cropped = _crop(sanitize(note, keep_newlines=False), inner)
        content.append(f"{note_sgr}{cropped}{_RESET}" if note_sgr else cropped)
    content = content[: max(0, height - 2)]
    lines = ["┌" + "─" * inner + "┐"]
    lines.extend(f"│{line}│" for line in content)
    lines.append("└" + "─" * inner + "┘")
    return lines


def _pane_key(stream: StreamState, model: RunModel) -> tuple[object, ...]:
    """Everything a pane's picture depends on, besides its size."""
    return (
        stream.label,
        stream.note,
        stream.sse_tokens,
        len(stream.chunks),
        len(stream.spans),
        stream.proven_bytes,
        stream.stats.get("steps"),
        stream.stats.get("tokens"),
        stream.stats.get("accepted"),
        stream.stats.get("drafts_scheduled"),
        stream.stats.get("drafts_padded"),
        model.colorize,
    )


class AnsiGrid:
    """Draws the live grid on a terminal without Rich's layout engine.

    A pane is rebuilt only when its content changed, and only the screen rows
    that differ from the previous frame are written. A 64-pane frame costs
    a few milliseconds instead of tens (docs/benchmarks/client.md).
    """

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self._panes: dict[int, tuple[tuple[object, ...], list[str]]] = {}
        self._previous: list[str] = []
        self._size: tuple[int, int] | None = None

    def start(self) -> None:
        self.console.set_alt_screen(True)
        self.console.show_cursor(False)
        # Autowrap off: a row the terminal draws wider than computed (emoji and
        # scripts whose cell width terminals disagree on) is clipped at the right
        # edge instead of wrapping onto, and corrupting, the row below it.
        self._write(_AUTOWRAP_OFF)

    def stop(self) -> None:
        self._write(_AUTOWRAP_ON)
        self.console.show_cursor(True)
        self.console.set_alt_screen(False)

    def _write(self, text: str) -> None:
        if self.console.is_terminal:
            self.console.file.write(text)
            self.console.file.flush()

    def frame(self, width: int, height: int) -> list[str]:
        """The screen as ANSI lines: banner, whole rows of panes, status line."""
        model = self.model
        use_color = not model.no_color
        shown = model.streams[:GRID_MAX_PANES]
        columns, pane_width, pane_height = grid_layout(len(shown), width, height)
        rows_that_fit = max(1, (height - 2) // pane_height)
        shown = shown[: rows_that_fit * columns]
        lines = [_banner_ansi(model, width, use_color)]
        for row_start in range(0, len(shown), columns):
            panes = []
            for stream in shown[row_start : row_start + columns]:
                key = (*_pane_key(stream, model), pane_width, pane_height)
                cached = self._panes.get(stream.index)
                if cached is None or cached[0] != key:
                    cached = (key, pane_ansi(stream, model, pane_width, pane_height))
                    self._panes[stream.index] = cached
                panes.append(cached[1])
            lines.extend("".join(parts) for parts in zip(*panes, strict=True))
        status = _status(model, len(shown)).plain
        dim = _sgr("2", None, use_color)
        lines.append(f"{dim}{_crop(status, width)}{_RESET}")
        return lines[:height]

    def draw(self) -> None:
        size = self.console.size
        width, height = size.width, size.height
        lines = self.frame(width, height)
        out: list[str] = []
        if (width, height) != self._size:
            self._size = (width, height)
            self._previous = []
            out.append("\x1b[H\x1b[2J")
        previous = self._previous
        for row, line in enumerate(lines):
            if row >= len(previous) or previous[row] != line:
                out.append(f"\x1b[{row + 1};1H{line}{_RESET}\x1b[K")
        if len(lines) < len(previous):
            out.append(f"\x1b[{len(lines) + 1};1H\x1b[J")
        self._previous = lines
        if out:
            self.console.file.write("".join(out))
            self.console.file.flush()


def _banner_ansi(model: RunModel, width: int, use_color: bool) -> str:
    rest = sanitize(model.banner.removeprefix("SIMULATED ENGINE · "), keep_newlines=False)
    if model.simulated or model.backend.simulated:
        flag = "SIMULATED ENGINE"
        if width <= len(flag):
            return f"\x1b[1;7m{_crop(flag, width)}{_RESET}"
        return f"\x1b[1;7m{flag}{_RESET}{_crop(' · ' + rest, width - len(flag))}"
    return _crop(rest, width)


class StreamView:
    """One stream inline: its tail while running, the whole text at the end."""

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self._live: Live | None = None
        self.refresh_interval = 1.0 / REFRESH_HZ

    def _renderable(self) -> Group:
        stream = self.model.streams[0]
        size = self.console.size
        height = max(1, size.height - 4)
        body = tail_text(
            styled_text(stream.tail_segments(self.model.colorize, size.width * height * 2)),
            self.console,
            size.width,
            height,
        )
        parts: list[RenderableType] = [banner_text(self.model), header_text(stream), body]
        if stream.note:
            parts.append(Text(sanitize(stream.note, keep_newlines=False), "red"))
        return Group(*parts)

    def start(self) -> None:
        self._live = Live(
            self._renderable(),
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()

    def refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._renderable(), refresh=True)

    def final_picture(self, console: Console) -> Group:
        stream = self.model.streams[0]
        parts: list[RenderableType] = [
            banner_text(self.model),
            header_text(stream),
            styled_text(stream.segments(self.model.colorize)),
        ]
        if stream.note:
            parts.append(Text(sanitize(stream.note, keep_newlines=False), "red"))
        return Group(*parts)

    def abort(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None

    def stop(self) -> None:
        self.abort()
        self.console.print(self.final_picture(self.console))
        self.console.print(render_summary(self.model))


class PlainView:
    """No live display and no ANSI: each stream's text and the summary at the end."""

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self.refresh_interval = 1.0 / REFRESH_HZ

    def start(self) -> None:
        pass

    def refresh(self) -> None:
        pass

    def final_picture(self, console: Console) -> Group:
        # The banner comes last-known: the plugin's hello may arrive mid-run.
        parts: list[RenderableType] = [banner_text(self.model)]
        for stream in self.model.streams:
            parts.append(header_text(stream))
            parts.append(styled_text(stream.segments(colorize=False), colorize=False))
            if stream.note:
                parts.append(Text(sanitize(stream.note, keep_newlines=False)))
            parts.append(Text(""))
        return Group(*parts)

    def abort(self) -> None:
        pass

    def stop(self) -> None:
        self.console.print(self.final_picture(self.console))
        self.console.print(render_summary(self.model))


def make_view(kind: str, model: RunModel, console: Console) -> GridView | StreamView | PlainView:
    if kind == "grid":
        return GridView(model, console)
    if kind == "stream":
        return StreamView(model, console)
    return PlainView(model, console)
