"""Rows as a real terminal draws them (issue 26, 5, 6 and 12): the demo's own text
(CJK, Devanagari, Arabic, emoji with skin tones and flags, combining marks) in tmux,
live (paused, so a capture holds one whole frame), zoomed and printed at the end, at
several widths. Columns are counted as tmux counts them, with the C library's
wcwidth (tests/terminal_width.py; tmux 3.3a draws the demo's characters so).

A row drawn wider than the layout measured loses its last characters at the right
border (autowrap is off in the live grid) or wraps onto the next row (the printed
picture); one drawn narrower moves its borders left. Both break the checks below:
every pane border at its pane's column, and every pane's text, read row by row, a
piece of the demo's text with nothing missing.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from parallelhue.model.sanitize import sanitize
from parallelhue.screen.cells import for_screen
from parallelhue.sim.vocab import CORPUS
from terminal_width import terminal_width, wcwidth
from test_tmux import (
    PROMPT,
    _shell,
    _shell_command,
    _type,
    _wait_until,
    private_tmux,  # noqa: F401 - the fixture every test uses
)

pytestmark = [
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed"),
    pytest.mark.usefixtures("private_tmux"),
]

# The demo's text as the screen shows it, without blanks (a row's padding is blanks);
# each stream walks it from its own start, round and round.
SHOWN = "".join(for_screen(sanitize(CORPUS, keep_newlines=False)).split()) * 4
VERTICAL = "│┃"
TOP = "┌┏"


def cells_of(row: str) -> list[tuple[int, str]]:
    """(column, character) for each character of a captured row, columns as drawn; a
    zero-width mark is in the column of the character it sits on."""
    out: list[tuple[int, str]] = []
    column = 0
    for char in row:
        size = max(0, wcwidth(char))
        out.append((column if size or not out else out[-1][0], char))
        column += size
    return out


def text_between(row: str, left: int, right: int) -> str:
    """The characters a row holds in columns left..right-1."""
    return "".join(char for column, char in cells_of(row) if left <= column < right)


def char_at(row: str, column: int) -> str:
    """The character drawn at `column` (not a mark on it)."""
    return next((c for at, c in cells_of(row) if at == column and wcwidth(c) > 0), "")


def check_panes(rows: list[str], width: int) -> int:
    """Every box: its borders in their columns on every row, its text a piece of the
    demo's. Returns how many pane bodies were checked."""
    bodies = 0
    index = 0
    while index < len(rows):
        row = rows[index]
        if not row or row[0] not in TOP:
            index += 1
            continue
        corners = [column for column, char in cells_of(row) if char in "┐┓"]
        lefts = [column for column, char in cells_of(row) if char in TOP]
        assert lefts and len(lefts) == len(corners), row
        assert corners[-1] <= width - 1, (width, row)
        body: dict[int, list[str]] = {left: [] for left in lefts}
        index += 1
        while index < len(rows) and rows[index][:1] not in ("└", "┗"):
            row = rows[index]
            assert terminal_width(row) <= width, (width, row)
            for left, right in zip(lefts, corners, strict=True):
                assert char_at(row, left) in VERTICAL, (width, left, row)
                assert char_at(row, right) in VERTICAL, (width, right, row)
                body[left].append(text_between(row, left + 1, right))
            index += 1
        for left, inner in body.items():
            assert re.match(r"#\d+ ", inner[0]), inner[0]
            assert re.match(r"\d+ tok ", inner[1]), inner[1]
            text = "".join("".join(inner[2:]).split())
            assert text in SHOWN, (width, left, inner[2:])
            bodies += 1 if text else 0
    return bodies


def check_overview(rows: list[str], width: int) -> int:
    """Overview lines: each entry at its column, its tail a piece of the demo's text."""
    entry = re.compile(r"[ ▶]#\d+ *(VERIFY|EXACT) +[\d.-]+ +[\d%*-]+ ")
    lines = [row for row in rows if entry.match(row)]
    if not lines:
        return 0
    columns = max(len(re.findall(r"[ ▶]#\d+ ", row)) for row in lines)
    slot = width // columns
    tails = 0
    for row in lines:
        assert terminal_width(row) <= width, (width, row)
        for start in range(0, columns * slot, slot):
            part = text_between(row, start, start + slot)
            if not part.strip():
                continue
            head = entry.match(part)
            assert head is not None, (width, start, row)
            tail = "".join(part[head.end() :].split())
            assert tail in SHOWN, (width, part)
            tails += 1
    return tails


def _live_demo(width: int, height: int) -> str:
    target = _shell(f"w{width}", width, height)
    command = _shell_command(
        "demo", "--concurrency", "16", "--max-tokens", "3000", "--step-ms", "30"
    )
    _type(target, command, "Enter")
    _wait_until(target, lambda text: "#1 " in text and " tok " in text, "the live grid")
    return target


def _paused_frame(target: str) -> str:
    """One whole frame: pause (the run goes on), wait until two captures agree."""
    _type(target, "p")
    previous = ""
    for _ in range(100):
        frame = _wait_until(target, lambda text: "PAUSED" in text, "the paused frame")
        if frame == previous:
            return frame
        previous = frame
    raise AssertionError("the paused screen kept changing")


@pytest.mark.parametrize(("width", "height"), [(80, 24), (101, 30), (134, 40), (200, 50)])
def test_live_grid_zoom_and_overview_keep_every_character_inside_its_borders(
    width: int, height: int
) -> None:
    target = _live_demo(width, height)
    bodies = overview = 0
    seen = ""
    # Several frames, a second apart: the tails move through every script of the text.
    for _ in range(6):
        frame = _paused_frame(target)
        rows = frame.splitlines()
        assert len(rows) <= height
        bodies += check_panes(rows, width)
        overview += check_overview(rows, width)
        seen += frame
        _type(target, "p")
        subprocess.run(["sleep", "1"], check=True)
    assert bodies >= 6
    assert overview >= (6 if height < 40 else 0)
    # Zoomed: one pane as wide as the terminal.
    _type(target, "z")
    for _ in range(3):
        frame = _paused_frame(target)
        assert "keys: Esc or z back to the grid" in frame
        assert check_panes(frame.splitlines(), width) == 1
        seen += frame
        _type(target, "p")
        subprocess.run(["sleep", "1"], check=True)
    _type(target, "q")
    _wait_until(target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt")
    # The scripts that broke the rows were on the screen.
    for sample in ("हिन्दी", "عربي", "👍🏽", "🇯🇵", "日本語", "é"):
        assert any(char in seen for char in sample[:2]), sample


def _run_to_the_end(name: str, width: int, command: str) -> tuple[list[str], list[str]]:
    """A run in a fresh pane of `width` columns until its summary and the prompt are
    back: the rows as drawn, and as tmux joins the ones it wrapped (-J)."""
    target = _shell(name, width, 200)
    _type(target, "clear; " + command, "Enter")
    screen = _wait_until(
        target, lambda text: "wall time" in text and text.rstrip().endswith(PROMPT.rstrip()),
        "the end of the run",
    )  # fmt: skip
    joined = subprocess.run(
        ["tmux", "capture-pane", "-p", "-J", "-t", target], check=True, capture_output=True,
        text=True,
    ).stdout  # fmt: skip
    return screen.splitlines(), joined.splitlines()


@pytest.mark.parametrize("width", [80, 120, 160])
def test_final_picture_keeps_its_boxes_on_every_row(width: int) -> None:
    """Issue 26, 5: the picture printed after the run broke its boxes on rows with
    emoji or Devanagari (autowrap on: a row too wide wraps onto the next)."""
    command = _shell_command(
        "demo", "--concurrency", "8", "--max-tokens", "400", "--step-ms", "1", "--view", "grid"
    )
    rows, joined = _run_to_the_end(f"f{width}", width, command)
    assert check_panes(rows, width) == 8
    # No row of the picture or the summary was wrapped by the terminal.
    assert joined == rows


def test_dumb_terminal_summary_fits_the_terminal() -> None:
    """Issue 26, 12: with TERM=dumb the summary ignored the width and the terminal
    wrapped it inside numbers."""
    command = _shell_command(
        "demo", "--concurrency", "4", "--max-tokens", "40", "--step-ms", "1"
    ).replace("env -u TMUX ", "env -u TMUX TERM=dumb ", 1)
    rows, joined = _run_to_the_end("dumb", 70, command)
    assert "\x1b" not in "\n".join(rows)
    start = next(row for row, line in enumerate(rows) if line.startswith("Summary"))
    end = next(row for row in range(start, len(rows)) if rows[row].startswith("wall time"))
    summary = rows[start : end + 1]
    assert all(terminal_width(line) <= 70 for line in summary), summary
    table = [line for line in summary if re.match(r"(#\d+|total) ", line)]
    assert len(table) == 5 and all(re.search(r"\d$", line) for line in table), table
    # The lines the terminal shows are the summary's own: none was wrapped by it.
    first = joined.index(rows[start])
    assert summary == joined[first : first + len(summary)]
