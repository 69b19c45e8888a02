"""cells.py measures text as a terminal draws it: the C library's wcwidth(3), the table
xterm, VTE and tmux place text with (test_tmux.py checks tmux itself)."""

from __future__ import annotations

import unicodedata

import pytest

from parallelhue.model.sanitize import sanitize
from parallelhue.screen.cells import cells, char_cells, for_screen, head_cells, tail_cells
from terminal_width import terminal_width, wcwidth

# The scripts and symbols generated text is made of: Latin and its accents, Greek,
# Cyrillic, Hebrew, Arabic, Devanagari and the other Indic scripts, Thai, Hangul (jamo
# and syllables), kana, CJK, fullwidth forms, symbols and emoji (assigned by Unicode 13,
# so the C library and this Python agree on which exist).
BLOCKS = [
    (0x00A0, 0x024F), (0x0300, 0x036F), (0x0370, 0x052F), (0x0590, 0x06FF),
    (0x0900, 0x0DFF), (0x0E00, 0x0E7F), (0x1100, 0x11FF), (0x2000, 0x2BFF),
    (0x3000, 0x30FF), (0x3200, 0x33FF), (0x4DC0, 0x4DFF), (0x4E00, 0x4FFF),
    (0xAC00, 0xD7FF), (0xFE00, 0xFE0F), (0xFF00, 0xFFEF), (0x1F000, 0x1F6FF),
    (0x1F900, 0x1F9FF),
]  # fmt: skip


def shown_characters() -> list[str]:
    """Every code point of BLOCKS that reaches a screen (sanitize keeps it)."""
    out = []
    for low, high in BLOCKS:
        for code in range(low, high + 1):
            char = chr(code)
            if unicodedata.category(char) == "Cn" or wcwidth(char) < 0:
                continue
            if sanitize(char) == char:
                out.append(char)
    return out


def test_every_shown_character_is_as_wide_as_wcwidth_says() -> None:
    chars = shown_characters()
    assert len(chars) > 20_000
    wrong = [(hex(ord(c)), char_cells(c), wcwidth(c)) for c in chars if char_cells(c) != wcwidth(c)]
    assert wrong == []


@pytest.mark.parametrize(
    ("text", "width"),
    [
        ("हिन्दी", 5),  # spacing vowel signs take a cell, the virama none
        ("عربي: رموز مقبولة", 17),
        ("👍🏽", 4),  # an emoji and its skin-tone modifier, two cells each
        ("🇯🇵", 2),  # two regional indicators, one cell each
        ("\u2764\ufe0f", 1),  # U+2764 is one cell; VS16 none
        ("e\u0301", 1),
        ("投機的", 6),
        ("한국어", 6),
    ],
)
def test_scripts_measure_as_the_terminal_draws_them(text: str, width: int) -> None:
    assert cells(text) == terminal_width(text) == width


def test_head_and_tail_keep_each_mark_with_its_letter() -> None:
    text = "नमस्ते e\u0301 🚀"
    for room in range(0, cells(text) + 2):
        head, used = head_cells(text, room)
        assert text.startswith(head) and used == cells(head) <= room
        rest = text[len(head) :]
        assert not rest or char_cells(rest[0]) > 0  # no mark left behind
        assert not rest or used + char_cells(rest[0]) > room  # the longest prefix
        tail, used = tail_cells(text, room)
        assert text.endswith(tail) and used == cells(tail) <= room
        assert not tail or char_cells(tail[0]) > 0  # no mark without its letter
        before = text[: len(text) - len(tail)]
        while before and char_cells(before[-1]) == 0:
            before = before[:-1]  # its marks: they go with the letter before them
        letter = before[-1:]  # the letter it would take next
        assert not letter or used + char_cells(letter) > room
    assert tail_cells("\u0301\u0301ab", 10) == ("ab", 2)  # marks with no letter: dropped


def test_for_screen_drops_only_the_presentation_selectors() -> None:
    assert for_screen("hearts \u2764\ufe0f \u263a\ufe0e ok") == "hearts \u2764 \u263a ok"
    text = "no selectors: 日本 e\u0301 👍🏽"
    assert for_screen(text) is text
