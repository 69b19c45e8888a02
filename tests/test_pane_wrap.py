"""panes.wrap / _take / fit, with their cached, per-character widths, against the
code they replaced (the oracle below, measuring every piece and cluster with rich's
cell_len): ASCII, CJK, emoji with ZWJ sequences and VS16, combining marks, zero-width
characters, sanitized tabs and controls, at every width budget; and the width table
the fast path relies on, against rich."""

from __future__ import annotations

import random

import pytest
from rich.cells import _SINGLE_CELLS, cell_len, get_character_cell_size

from parallelhue import panes
from parallelhue.panes import Line, Piece, _take, cells, fit, wrap
from parallelhue.sanitize import sanitize

# --- the oracle: panes.py's measuring before the fast path (main 9b3aa66) ------------


def old_clusters(text: str) -> list[str]:
    out: list[str] = []
    for char in text:
        if out and cell_len(char) == 0:
            out[-1] += char
        else:
            out.append(char)
    return out


def old_take(text: str, room: int) -> tuple[str, int]:
    if text.isascii():
        take = text[:room]
        return take, len(take)
    whole = cell_len(text)
    if whole <= room:
        return text, whole
    used = 0
    end = 0
    for cluster in old_clusters(text):
        size = cell_len(cluster)
        if used + size > room:
            break
        used += size
        end += len(cluster)
    return text[:end], used


def old_wrap(pieces: list[Piece], width: int | None, max_lines: int | None = None) -> list[Line]:
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
            for number, part in enumerate(text.split("\n")):
                if number:
                    flush()
                if part:
                    current.append((part, key))
            continue
        if "\n" not in text:
            size = len(text) if text.isascii() else cell_len(text)
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
                take, size = old_take(part, width - used)
                if not take and used == 0:
                    first = old_clusters(part)[0]
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


# --- inputs ---------------------------------------------------------------------------

ZWJ_FAMILY = "👨\u200d👩\u200d👧"
SAMPLES = {
    "ascii": "the quick brown fox jumps over the lazy dog, 0123456789 times",
    "cjk": "先にトークンを書き、大きなモデルがまとめて検証します。日本語の文",
    "cyrillic_greek": "Сначала черновик αβγ δ, затем проверка",
    "emoji": "🚀 ok 🎉🎉 x 😀",
    "zwj": f"a{ZWJ_FAMILY}b 🏳️\u200d🌈 c{ZWJ_FAMILY}{ZWJ_FAMILY}",
    "vs16": "\u2764\ufe0f love \u2764 \u263a\ufe0f smile \ufe0f lone",
    "combining": "e\u0301te\u0301 n\u0303o a\u0301\u0300\u0302 Z\u0351\u0352o",
    "zero_width": "a\u200bb\u200cc\u200d\u2060d\u00ade \u200b",
    "controls": sanitize(
        "tab\there\x07bell\x1b[31mred\x1b[0m\rcr\x00nul\x7fdel", keep_newlines=True
    ),
    "newlines": "one\ntwo 日本\n\n🚀\u200d x\nlast",
    "mixed": "ASCII 日本語 🚀 é\u0301 👩\u200d💻 \u2764\ufe0f \u0421\u0431 the end",
}
KEYS = ["step.0", "step.1", None, "bold"]


def cut(text: str, rng: random.Random) -> list[Piece]:
    """`text` as pieces of 1-5 characters (splitting clusters too), keys cycling."""
    pieces: list[Piece] = []
    at = 0
    while at < len(text):
        size = rng.randrange(1, 6)
        pieces.append((text[at : at + size], KEYS[len(pieces) % len(KEYS)]))
        at += size
    return pieces


def cases() -> list[tuple[str, list[Piece]]]:
    rng = random.Random(20261202)
    out = [(name, [(text, "k")]) for name, text in SAMPLES.items()]
    out += [(f"{name}-cut{k}", cut(text, rng)) for name, text in SAMPLES.items() for k in range(3)]
    alphabet = "".join(SAMPLES.values())
    for k in range(20):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80)))
        out.append((f"random{k}", cut(text, rng)))
    return out


CASES = cases()


@pytest.fixture(autouse=True)
def cold_caches() -> None:
    """Every test starts with the width cache empty, as a fresh client does."""
    panes._CELLS.clear()


@pytest.mark.parametrize(("name", "pieces"), CASES, ids=[name for name, _ in CASES])
def test_wrap_equals_the_old_wrap_at_every_width(name: str, pieces: list[Piece]) -> None:
    total = sum(cell_len(text) for text, _ in pieces)
    for width in [*range(1, total + 3), None]:
        for max_lines in (None, 0, 1, 2, 5):
            # Twice: the second call measures from the cache the first one filled.
            for _ in range(2):
                assert wrap(pieces, width, max_lines) == old_wrap(pieces, width, max_lines), (
                    name,
                    width,
                    max_lines,
                )


@pytest.mark.parametrize("text", list(SAMPLES.values()), ids=list(SAMPLES))
def test_take_and_cells_equal_the_old_measure_at_every_room(text: str) -> None:
    for start in range(len(text)):
        part = text[start:].split("\n")[0]  # wrap measures between newlines
        assert cells(part) == cell_len(part)
        assert cells(part) == cell_len(part)  # a cache hit
        for room in range(0, cell_len(part) + 2):
            assert _take(part, room) == old_take(part, room), (part, room)


@pytest.mark.parametrize(("name", "pieces"), CASES, ids=[name for name, _ in CASES])
def test_fit_equals_fit_with_the_old_measure(
    name: str, pieces: list[Piece], monkeypatch: pytest.MonkeyPatch
) -> None:
    """fit() measures with cells and _take too: the same lines as with the old ones."""
    new = [(w, e, fit(pieces, w, ellipsis=e)) for w in range(0, 60) for e in (True, False)]
    with monkeypatch.context() as patch:
        patch.setattr(panes, "_take", old_take)
        patch.setattr(panes, "cells", lambda t: len(t) if t.isascii() else cell_len(t))
        old = [(w, e, fit(pieces, w, ellipsis=e)) for w in range(0, 60) for e in (True, False)]
    assert new == old, name


def test_rich_widths_are_per_character_without_joiners() -> None:
    """The fast path's premise: without ZWJ / VS16, rich's width of a string is the
    sum of its characters' widths, and a character's cell_len is its table width."""
    assert all(get_character_cell_size(char) == 1 for char in _SINGLE_CELLS)
    rng = random.Random(7)
    for code in range(0x20, 0x30000):
        char = chr(code)
        if 0xD800 <= code < 0xE000 or char in "\u200d\ufe0f":
            continue
        assert cell_len(char) == get_character_cell_size(char), hex(code)
    pool = [chr(rng.randrange(0x20, 0x30000)) for _ in range(4000)]
    pool = [c for c in pool if not 0xD800 <= ord(c) < 0xE000 and c not in "\u200d\ufe0f"]
    for _ in range(500):
        text = "".join(rng.sample(pool, rng.randrange(1, 12)))
        assert cell_len(text) == sum(cell_len(c) for c in text), ascii(text)


def test_a_control_inside_a_wide_piece_is_zero_wide_as_rich_has_it() -> None:
    """The per-character path measures "\\n" as rich does (0), not as len (1): the
    bug the fit oracle caught in this change's first version."""
    assert _take("日本\n\n🚀", 5) == old_take("日本\n\n🚀", 5) == ("日本\n\n", 4)
    assert _take("日本\n\n🚀", 6) == ("日本\n\n🚀", 6)


def test_width_cache_is_bounded_and_stays_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(panes, "_CELLS_MAX", 8)
    texts = [f"日{chr(0x4E00 + k)}é" for k in range(50)]
    for text in texts:
        assert cells(text) == cell_len(text) == 5
        assert len(panes._CELLS) <= 8
    assert cells("abc") == 3 and "abc" not in panes._CELLS  # an ASCII piece: its len
