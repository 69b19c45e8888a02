"""The views of a run: one stream inline, a live grid of panes and overview lines, plain text.

Every view lays its screen out as lines (`lines.py`; the grid, stream and plain
screens in `grid.py`, `stream.py`, `plain.py`) and paints it:
the live grid with the ANSI painter (only the rows that changed are written),
everything printed through Rich with the Rich painter. One task calls
`refresh()` at a fixed rate, so the screen is redrawn from one place and never
per token. Live views on a terminal read keys (`keys.py`): focus, zoom,
pause, step/role colors and quit.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Protocol

from rich.console import Console
from rich.live import Live

from ..cli.settings import dumb_terminal
from ..model.state import RunModel
from .focus import GridUi, move_focus
from .grid import GRID_MAX_PANES, final_grid, grid_layout, grid_screen
from .keys import KeyReader
from .lines import Line
from .paint import RESET, ansi_line, rich_text, theme_for
from .pane import PaneCache
from .plain import plain_listing
from .stream import stream_screen
from .summary import summary_block

__all__ = [
    "GRID_MAX_PANES",
    "AnsiGrid",
    "GridView",
    "PlainView",
    "StreamView",
    "View",
    "grid_layout",
    "make_console",
    "make_view",
]

REFRESH_HZ = 10.0
# Big grids redraw less often: a 64-pane frame is the most expensive one.
LARGE_GRID_PANES = 16
LARGE_GRID_INTERVAL = 0.25
_AUTOWRAP_OFF = "\x1b[?7l"
_AUTOWRAP_ON = "\x1b[?7h"


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


class RunConsole(Console):
    """A Rich console that reports a closed stdout (`| head`) as BrokenPipeError, for the
    CLI's one line and exit code, instead of Rich's silent exit 1."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError("stdout was closed")


def make_console(
    no_color: bool, *, plain: bool = False, record: bool = False, stderr: bool = False
) -> Console:
    """The console of a run; `stderr` when stdout carries JSON (--json, --measurement -)."""
    stream = sys.stderr if stderr else sys.stdout
    if plain:
        return RunConsole(
            file=stream,
            color_system=None,
            no_color=True,
            force_terminal=False,
            highlight=False,
            markup=False,
            emoji=False,
            record=record,
            soft_wrap=True,  # pipes get whole lines, not lines cut at 80 columns
        )
    # xterm-256 on a terminal (the palettes are defined there); no ANSI into a pipe.
    color = stream.isatty() and not dumb_terminal()
    return RunConsole(
        file=stream,
        color_system="256" if color else None,
        no_color=no_color,
        highlight=False,
        markup=False,
        emoji=False,
        record=record,
    )


def print_lines(console: Console, model: RunModel, lines: list[Line]) -> None:
    text = rich_text(lines, theme_for(model), trim=True)
    console.print(text, soft_wrap=True)


def terminal_width(console: Console) -> int | None:
    """The columns of the terminal the console writes to, TERM=dumb included (it wraps
    long lines too); None for a pipe or a file, which get whole lines."""
    try:
        if not console.file.isatty():
            return None
    except (AttributeError, ValueError, OSError):
        return None
    if console.is_terminal and not console.soft_wrap:
        return console.size.width
    try:
        return os.get_terminal_size(console.file.fileno()).columns or None
    except (AttributeError, ValueError, OSError):
        return console.size.width


def print_summary(console: Console, model: RunModel) -> None:
    print_lines(console, model, summary_block(model, terminal_width(console)))


class _Keys:
    """The keys every live view shares: q quits (like Ctrl-C), p pauses, c colors."""

    def __init__(self, model: RunModel) -> None:
        self.model = model
        self.ui = GridUi()
        self._reader: KeyReader | None = None
        self._redraw: Callable[[bool], None] | None = None

    def start(self, console: Console, redraw: Callable[[bool], None]) -> None:
        if not console.is_terminal or not KeyReader.available():
            return
        self.ui.keys = True
        self._redraw = redraw
        self._reader = KeyReader(self.on_key)
        self._reader.start()

    def on_key(self, key: str) -> None:
        ui = self.ui
        count = len(self.model.shown_streams())
        if key in ("q", "Q"):
            # The same path as Ctrl-C: the session cancels every stream and cleans up,
            # the CLI prints the partial summary.
            self.model.interrupted = True
            signal.raise_signal(signal.SIGINT)
            return
        if key in ("p", "space"):
            ui.paused = not ui.paused
        elif key == "c":
            self.model.color_by = "role" if self.model.color_by == "step" else "step"
        elif key in ("z", "enter"):
            ui.zoomed = not ui.zoomed
        elif key == "escape":
            ui.zoomed = False
        elif move_focus(ui, key, count):
            pass  # arrows and hjkl: on the grid, as the last frame laid the streams out
        elif key == "tab":
            ui.focus = (ui.focus + 1) % max(1, count)
        elif key == "backtab":
            ui.focus = (ui.focus - 1) % max(1, count)
        elif key == "pagedown":
            ui.focus = min(count - 1, ui.focus + 10)
        elif key == "pageup":
            ui.focus = max(0, ui.focus - 10)
        elif key == "home":
            ui.focus = 0
        elif key == "end":
            ui.focus = max(0, count - 1)
        else:
            return
        if self._redraw is not None:
            self._redraw(True)  # at once, paused or not

    def stop(self) -> None:
        if self._reader is not None:
            self._reader.stop()
            self._reader = None


class GridView:
    """A live grid of fixed-size panes plus overview lines; the layout follows the
    terminal size. Frames are written as ANSI text by `AnsiGrid`."""

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self._grid: AnsiGrid | None = None
        self._keys = _Keys(model)
        large = min(len(model.shown_streams()), GRID_MAX_PANES) > LARGE_GRID_PANES
        self.refresh_interval = LARGE_GRID_INTERVAL if large else 1.0 / REFRESH_HZ

    def start(self) -> None:
        # Nothing is drawn live into a pipe: only the final picture.
        if self.console.is_terminal and not dumb_terminal():
            self._grid = AnsiGrid(self.model, self.console, self._keys.ui)
            self._grid.start()
            self._keys.start(self.console, self._draw)
            self.refresh()

    def _draw(self, force: bool = False) -> None:
        if self._grid is not None:
            self._grid.draw(force=force)

    def refresh(self) -> None:
        self._draw()

    def final_lines(self, width: int) -> list[Line]:
        return final_grid(self.model, width)

    def abort(self) -> None:
        self._keys.stop()
        if self._grid is not None:
            self._grid.stop()
            self._grid = None

    def stop(self) -> None:
        self.abort()
        if self.model.nothing_received:
            return  # the CLI's one line says it all
        print_lines(self.console, self.model, self.final_lines(self.console.size.width))
        print_summary(self.console, self.model)


class AnsiGrid:
    """Draws the live grid on a terminal without Rich's layout engine.

    Panes are rebuilt only when their content changed (`PaneCache`), and only the
    screen rows that differ from the previous frame are written. Every row is
    exactly the terminal's width, so nothing is erased after it (an erase after
    a full-width row would take its last cell).
    """

    def __init__(self, model: RunModel, console: Console, ui: GridUi | None = None) -> None:
        self.model = model
        self.console = console
        self.ui = ui or GridUi()
        self._cache = PaneCache(model)
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
        """The screen as ANSI lines: banner, legend, panes, overview lines, status."""
        theme = theme_for(self.model)
        lines = grid_screen(self.model, width, height, self.ui, self._cache)
        return [ansi_line(line, theme) for line in lines]

    def draw(self, force: bool = False) -> None:
        size = self.console.size
        width, height = size.width, size.height
        if self.ui.paused and not force and (width, height) == self._size:
            return
        lines = self.frame(width, height)
        out: list[str] = []
        if (width, height) != self._size:
            self._size = (width, height)
            self._previous = []
            out.append("\x1b[H\x1b[2J")
        previous = self._previous
        for row, line in enumerate(lines):
            if row >= len(previous) or previous[row] != line:
                out.append(f"\x1b[{row + 1};1H{line}{RESET}")
        self._previous = lines
        if out:
            self.console.file.write("".join(out))
            self.console.file.flush()


class StreamView:
    """One stream inline: its tail while running, the whole text at the end."""

    def __init__(self, model: RunModel, console: Console) -> None:
        self.model = model
        self.console = console
        self._live: Live | None = None
        self._keys = _Keys(model)
        self.refresh_interval = 1.0 / REFRESH_HZ

    def _renderable(self) -> object:
        size = self.console.size
        lines = stream_screen(self.model, size.width, max(3, size.height - 1), self._keys.ui)
        return rich_text(lines, theme_for(self.model), trim=True)

    def start(self) -> None:
        if not self.console.is_terminal or dumb_terminal():
            return  # nothing live into a pipe or a dumb terminal
        self._live = Live(
            self._renderable(),  # type: ignore[arg-type]
            console=self.console,
            auto_refresh=False,
            transient=True,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        self._live.start()
        self._keys.start(self.console, self._draw)

    def _draw(self, force: bool = False) -> None:
        if self._live is not None and (force or not self._keys.ui.paused):
            self._live.update(self._renderable(), refresh=True)  # type: ignore[arg-type]

    def refresh(self) -> None:
        self._draw()

    def final_lines(self, width: int) -> list[Line]:
        return stream_screen(self.model, width, None)

    def abort(self) -> None:
        self._keys.stop()
        if self._live is not None:
            self._live.stop()
            self._live = None

    def stop(self) -> None:
        self.abort()
        if self.model.nothing_received:
            return
        print_lines(self.console, self.model, self.final_lines(self.console.size.width))
        print_summary(self.console, self.model)


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

    def final_lines(self, width: int) -> list[Line]:
        """The picture an export shows: what a terminal would have shown (in colors)."""
        if len(self.model.shown_streams()) == 1:
            return stream_screen(self.model, width, None)
        return final_grid(self.model, width)

    def abort(self) -> None:
        pass

    def stop(self) -> None:
        if self.model.nothing_received:
            return
        # The banner comes last-known: the plugin's hello may arrive mid-run.
        print_lines(self.console, self.model, plain_listing(self.model))
        print_summary(self.console, self.model)


def make_view(kind: str, model: RunModel, console: Console) -> GridView | StreamView | PlainView:
    if kind == "grid":
        return GridView(model, console)
    if kind == "stream":
        return StreamView(model, console)
    return PlainView(model, console)
