"""How wide a terminal draws a text: the C library's wcwidth(3), per code point.

xterm, VTE and tmux place text with it (tmux 3.3a measured in test_tmux.py
agrees), so it is the oracle the layout tests hold `parallelhue.screen.cells` to.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import locale

__all__ = ["terminal_width", "wcwidth"]


def _load() -> ctypes.CDLL:
    name = ctypes.util.find_library("c")
    if name is None:
        raise RuntimeError("the tests need the C library's wcwidth")
    libc = ctypes.CDLL(name)
    libc.wcwidth.argtypes = [ctypes.c_wchar]
    libc.wcwidth.restype = ctypes.c_int
    return libc


_LIBC = _load()
# wcwidth answers for the locale's character set: a UTF-8 one (glibc has C.UTF-8;
# Python itself runs in it when no other is set, PEP 538).
locale.setlocale(locale.LC_CTYPE, "C.UTF-8")
_WIDTHS: dict[str, int] = {}


def wcwidth(char: str) -> int:
    """wcwidth(3) of one code point (-1 for a control)."""
    size = _WIDTHS.get(char)
    if size is None:
        size = _WIDTHS[char] = int(_LIBC.wcwidth(char))
    return size


def terminal_width(text: str) -> int:
    """The columns a wcwidth terminal advances for `text` (controls count none)."""
    return sum(max(0, wcwidth(char)) for char in text)
