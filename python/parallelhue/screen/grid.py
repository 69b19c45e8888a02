"""The grid: full panes where they fit, overview lines for the rest, the banner,
legend and status around them (`grid_screen`, live; `final_grid`, printed after
the run). The zoomed stream is the focused pane drawn over the whole body."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from ..model.state import RunModel, StreamState
from .banner import banner_lines
from .focus import GridUi
from .legend import legend_lines
from .lines import Line
from .overview import overview_line
from .pane import PaneCache, box_pane, pane_data
from .status import status_lines

__all__ = [
    "GRID_MAX_PANES",
    "LEGEND_MIN_HEIGHT",
    "MIN_PANE_HEIGHT",
    "MIN_PANE_WIDTH",
    "OVERVIEW_MIN_WIDTH",
    "GridPlan",
    "final_grid",
    "grid_layout",
    "grid_plan",
    "grid_screen",
]

GRID_MAX_PANES = 64


MIN_PANE_WIDTH = 36


MIN_PANE_HEIGHT = 6


OVERVIEW_MIN_WIDTH = 40


# Terminals shorter than this keep the legend off the screen (it is in --help too).
LEGEND_MIN_HEIGHT = 12


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
