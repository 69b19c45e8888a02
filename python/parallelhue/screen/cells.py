"""Terminal cells: how many columns a terminal gives a text, the one measure of every layout.

A terminal places text one code point at a time, each as wide as wcwidth(3)
says: two cells for East Asian wide and fullwidth characters (CJK, most
emoji), none for combining marks and format characters, one for everything
else, Devanagari's spacing vowel signs and Arabic letters included. That is
what xterm, VTE (GNOME Terminal), Konsole, Alacritty and tmux draw, and what
every pane, overview line, banner and export here is laid out with: a row
measured here is exactly as wide as the terminal draws it, so no row spills
over a border or loses characters at the screen's edge.

Two kinds of characters are measured differently by terminals that join
emoji sequences (kitty, WezTerm, iTerm2): a variation selector 16 turns a
one-cell symbol into a two-cell emoji there (U+2764 U+FE0F), and a skin-tone
modifier joins its emoji into one two-cell picture. `for_screen` drops
variation selectors 15 and 16 from laid-out text, so a symbol is one cell on
every terminal; a skin-tone modifier keeps its two cells here, and a joining
terminal draws that row two cells short (its border moves left; nothing is cut).
Zero-width joiners never get here: `sanitize` removes format characters.
"""

from __future__ import annotations

import unicodedata

__all__ = ["cells", "char_cells", "for_screen", "head_cells", "tail_cells"]

# Code points wcwidth(3) counts otherwise than their Unicode properties say: Hangul
# vowels and final consonants that join the syllable before them (no cell of their
# own), and two blocks of symbols drawn two cells wide.
_JOINING_JAMO = ((0x1160, 0x11FF), (0xD7B0, 0xD7FF))
_WIDE_SYMBOLS = ((0x3248, 0x324F), (0x4DC0, 0x4DFF))
_ZERO_CATEGORIES = frozenset(("Mn", "Me", "Cf", "Cc", "Cs"))
_SOFT_HYPHEN = 0x00AD  # a format character that terminals draw as a hyphen
# Variation selectors 15 (text style) and 16 (emoji style): see the module's doc.
_PRESENTATION = str.maketrans("", "", "\ufe0e\ufe0f")

# Widths of single characters and of whole non-ASCII texts (every redraw measures
# the same tails again). Bounded: emptied when full.
_CHAR: dict[str, int] = {}
_TEXT: dict[str, int] = {}
_TEXT_MAX = 1 << 16


def char_cells(char: str) -> int:
    """The cells a terminal gives one code point (0, 1 or 2)."""
    size = _CHAR.get(char)
    if size is None:
        size = _CHAR[char] = _char_cells(char)
    return size


def _char_cells(char: str) -> int:
    code = ord(char)
    if code < 0x7F:
        return 1 if code >= 0x20 else 0
    if code == _SOFT_HYPHEN:
        return 1
    if unicodedata.category(char) in _ZERO_CATEGORIES:
        return 0
    if any(low <= code <= high for low, high in _JOINING_JAMO):
        return 0
    if unicodedata.east_asian_width(char) in "WF":
        return 2
    return 2 if any(low <= code <= high for low, high in _WIDE_SYMBOLS) else 1


def cells(text: str) -> int:
    """The cells a terminal gives `text` (one line, no controls)."""
    if text.isascii():
        return len(text)
    size = _TEXT.get(text)
    if size is None:
        if len(_TEXT) >= _TEXT_MAX:
            _TEXT.clear()
        size = _TEXT[text] = sum(map(char_cells, text))
    return size


def head_cells(text: str, room: int) -> tuple[str, int]:
    """The longest prefix of `text` that fits `room` cells, and its width.

    A character keeps the zero-width marks after it (a prefix never ends between
    a letter and its accent), and a prefix may hold only such marks when no
    letter fits: they belong to the text before `text`.
    """
    if text.isascii():
        take = text[: max(0, room)]
        return take, len(take)
    whole = cells(text)
    if whole <= room:
        return text, whole
    used = 0
    known = _CHAR
    for end, char in enumerate(text):
        size = known.get(char)  # char_cells(char), without the call on a hit
        if size is None:
            size = char_cells(char)
        if size and used + size > room:
            return text[:end], used
        used += size
    return text, used


def tail_cells(text: str, room: int) -> tuple[str, int]:
    """The longest suffix of `text` that fits `room` cells, and its width; it never
    starts with a zero-width mark (one whose letter was cut off is dropped too)."""
    if text.isascii():
        take = text[len(text) - max(0, room) :] if room < len(text) else text
        return take, len(take)
    used = 0
    start = len(text)  # where the suffix starts: always at a letter, never at a mark
    for index in range(len(text) - 1, -1, -1):
        size = char_cells(text[index])
        if size == 0:
            continue  # kept only if its letter before it is
        if used + size > room:
            break
        used += size
        start = index
    return text[start:], used


def for_screen(text: str) -> str:
    """`text` as the layouts place it: without variation selectors 15 and 16."""
    if text.isascii() or ("\ufe0f" not in text and "\ufe0e" not in text):
        return text
    return text.translate(_PRESENTATION)
