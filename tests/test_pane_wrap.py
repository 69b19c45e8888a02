"""lines.wrap / fit / tail_fit lay text out in the cells a terminal draws (cells.py):
ASCII, CJK, Devanagari, Arabic, emoji with skin tones and VS16, combining marks,
zero-width characters, sanitized tabs and controls, cut into pieces at every place
and laid out at every width. The properties are checked against the C library's
wcwidth(3), which is what xterm, VTE and tmux draw with (test_tmux.py checks the
terminal itself): every sized line is exactly its width, no character is lost or
moved, an accent never starts a line away from its letter, and a line is only
broken where the next character does not fit."""

from __future__ import annotations

import itertools
import random

import pytest

from parallelhue.model.sanitize import sanitize
from parallelhue.screen import cells as cells_module
from parallelhue.screen.cells import cells, char_cells
from parallelhue.screen.lines import Line, Piece, fit, line_text, tail_fit, wrap
from terminal_width import terminal_width

ZWJ_FAMILY = "👨\u200d👩\u200d👧"
SAMPLES = {
    "ascii": "the quick brown fox jumps over the lazy dog, 0123456789 times",
    "cjk": "先にトークンを書き、大きなモデルがまとめて検証します。日本語の文",
    "cyrillic_greek": "Сначала черновик αβγ δ, затем проверка",
    "devanagari": "हिन्दी: मसौदा टोकन। क्षत्रिय",
    "arabic": "عربي: رموز مقبولة ومرفوضة",
    "emoji": "🚀 ok 🎉🎉 x 😀 👍🏽 flags 🇯🇵🇫🇷",
    "zwj": f"a{ZWJ_FAMILY}b c{ZWJ_FAMILY}{ZWJ_FAMILY}",
    "vs16": "\u2764\ufe0f love \u2764 \u263a\ufe0f smile \ufe0f lone",
    "combining": "e\u0301te\u0301 n\u0303o a\u0301\u0300\u0302 Z\u0351\u0352o",
    "zero_width": "a\u200bb\u200cc\u2060d\u00ade \u200b",
    "controls": sanitize("tab\there\x07bell\x1b[31mred\x1b[0m\rcr\x00nul\x7fdel"),
    "newlines": "one\ntwo 日本\n\n🚀 x\nlast",
    "mixed": "ASCII 日本語 🚀 é\u0301 \u2764\ufe0f \u0421\u0431 हिन्दी عربي the end",
}
KEYS = ["step.0", "step.1", None, "bold"]


def cut(text: str, rng: random.Random) -> list[Piece]:
    """`text` as pieces of 1-5 characters (splitting letters from their marks too)."""
    pieces: list[Piece] = []
    at = 0
    while at < len(text):
        size = rng.randrange(1, 6)
        pieces.append((text[at : at + size], KEYS[len(pieces) % len(KEYS)]))
        at += size
    return pieces


def cases() -> list[tuple[str, list[Piece]]]:
    rng = random.Random(20261206)
    out = [(name, [(text, "k")]) for name, text in SAMPLES.items()]
    out += [(f"{name}-cut{k}", cut(text, rng)) for name, text in SAMPLES.items() for k in range(3)]
    alphabet = "".join(SAMPLES.values())
    for k in range(20):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80)))
        out.append((f"random{k}", cut(text, rng)))
    return out


CASES = cases()


def drawn(line: Line) -> int:
    """How wide a terminal draws the line (the C library's wcwidth)."""
    return terminal_width(line_text(line))


def is_mark(char: str) -> bool:
    return char >= "\x80" and char_cells(char) == 0


@pytest.fixture(autouse=True)
def cold_caches() -> None:
    """Every test starts with the width caches empty, as a fresh client does."""
    cells_module._TEXT.clear()
    cells_module._CHAR.clear()


def contents(lines: list[Line], text: str) -> list[str]:
    """The text each line holds: the longest part of the rest of `text` (up to a
    newline, which ends the line) the line starts with, before spaces only (its
    padding). Fails when a character is lost or moved."""
    out: list[str] = []
    position = 0
    for line in lines:
        shown = line_text(line)
        size = 0
        while (
            position + size < len(text)
            and text[position + size] != "\n"
            and shown.startswith(text[position : position + size + 1])
        ):
            size += 1
        assert not shown[size:].strip(" "), (shown, text[position:])
        out.append(text[position : position + size])
        position += size
        if text[position : position + 1] == "\n":
            position += 1
    assert position == len(text), (text[position:], lines)
    return out


@pytest.mark.parametrize(("name", "pieces"), CASES, ids=[name for name, _ in CASES])
def test_wrap_fills_each_line_exactly_and_loses_nothing(name: str, pieces: list[Piece]) -> None:
    text = "".join(t for t, _ in pieces)
    total = cells(text.replace("\n", ""))
    for width in range(2, total + 3):
        # Twice: the second call measures from the caches the first one filled.
        for _ in range(2):
            lines = wrap(pieces, width)
            assert all(drawn(line) == width for line in lines), (name, width, lines)
            held = contents(lines, text)
            for line, following in itertools.pairwise(held):
                # A line breaks where the next letter does not fit (or at a newline),
                # never before a mark: an accent stays on its letter's line.
                if following and "\n" not in text:
                    assert not is_mark(following[0]), (name, width, held)
                    next_width = terminal_width(line) + terminal_width(following[0])
                    assert next_width > width, (name, width, held)
            for max_lines in (0, 1, 2, 5):
                assert wrap(pieces, width, max_lines) == (lines[-max_lines:] if max_lines else [])


@pytest.mark.parametrize(("name", "pieces"), CASES, ids=[name for name, _ in CASES])
def test_fit_and_tail_fit_are_their_width_and_keep_marks_with_letters(
    name: str, pieces: list[Piece]
) -> None:
    flat = [(t.replace("\n", " "), k) for t, k in pieces]
    text = "".join(t for t, _ in flat)
    for width in range(0, 60):
        for ellipsis in (True, False):
            line = fit(flat, width, ellipsis=ellipsis)
            assert drawn(line) == width, (name, width, line)
            shown = line_text(line).rstrip(" …")
            assert text.startswith(shown.rstrip(" ")) or not shown.strip(), (name, width)
        tail = tail_fit(flat, width)
        assert drawn(tail) == width, (name, width, tail)
        kept = line_text(tail).lstrip(" ")
        assert text.endswith(kept), (name, width, kept)
        # A mark's letter is kept with it (a space too: then lstrip took it off here).
        assert not kept or not is_mark(kept[0]) or text[-len(kept) - 1] == " ", (name, kept)


def test_a_mark_after_a_full_line_stays_on_it() -> None:
    """`ñ` as `n` and U+0303 in two pieces (two engine steps), the `n` filling the line:
    the tilde stays on the `n`'s line instead of starting the next one."""
    lines = wrap([("abcn", "step.0"), ("\u0303xy", "step.1")], 4)
    assert [line_text(line) for line in lines] == ["abcn\u0303", "xy  "]


def test_cells_caches_are_bounded_and_stay_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cells_module, "_TEXT_MAX", 8)
    texts = [f"日{chr(0x4E00 + k)}é" for k in range(50)]
    for text in texts:
        assert cells(text) == terminal_width(text) == 5
        assert len(cells_module._TEXT) <= 8
    assert cells("abc") == 3 and "abc" not in cells_module._TEXT  # an ASCII piece: its len
