"""What the keys changed in the grid (focus, zoom, pause) and the arrow keys' move."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GridUi", "move_focus"]


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
