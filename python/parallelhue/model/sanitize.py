"""Make server-provided text safe to put on a terminal.

Everything a server sends (generated text, error bodies, model names, version
strings) passes through here before it reaches a screen, a tmux pane or an
exported picture. Escape sequences, C0/C1 controls, bare carriage returns,
bidirectional overrides and zero-width format characters could rewrite the
screen, hide text or reorder it; they are removed or replaced by a visible
placeholder.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["one_line", "sanitize"]

# ESC-introduced sequences: CSI (ESC [ ... final), OSC/DCS/SOS/PM/APC strings
# (terminated by BEL or ESC \), and two-byte escapes. The 8-bit C1 forms
# (0x9b CSI, 0x9d OSC, 0x90 DCS ...) are covered by the same patterns.
_ESCAPE_SEQUENCE = re.compile(
    r"""
    (?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?          # CSI, possibly unterminated
  | (?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])     # OSC / DCS / SOS / PM / APC ...
      .*?(?:\x07|\x1b\\|\x9c|$)                 # ... up to its terminator
  | \x1b[ -/]*[0-~]?                             # any other escape
    """,
    re.VERBOSE | re.DOTALL,
)

# Bidirectional embeddings, overrides and isolates (Trojan Source).
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
_PLACEHOLDER = "\ufffd"


def _clean_char(char: str, keep_newlines: bool) -> str:
    code = ord(char)
    if char == "\n":
        return "\n" if keep_newlines else " "
    if char == "\t":
        return "    " if keep_newlines else " "
    if code < 0x20 or code == 0x7F or 0x80 <= code < 0xA0:
        # \r would move the cursor back over earlier text; other controls
        # ring bells, erase or switch charsets.
        return "" if char == "\r" else _PLACEHOLDER
    if char in _BIDI:
        return ""
    category = unicodedata.category(char)
    if category == "Cf":  # zero-width joiners/spaces, BOM, invisible separators
        return ""
    if category in ("Zl", "Zp"):  # U+2028 / U+2029 act as line breaks
        return "\n" if keep_newlines else " "
    if category == "Cs":  # lone surrogate from a broken decode
        return _PLACEHOLDER
    return char


def sanitize(text: str, *, keep_newlines: bool = True) -> str:
    """Remove anything that could control the terminal; keep newlines if asked."""
    if text.isprintable():  # fast path: the common case has nothing to remove
        return text
    text = _ESCAPE_SEQUENCE.sub("", text)
    return "".join(_clean_char(char, keep_newlines) for char in text)


def one_line(text: str, limit: int = 200) -> str:
    """Sanitize into a single line of at most `limit` characters (error messages)."""
    flat = " ".join(sanitize(text, keep_newlines=False).split())
    if len(flat) > limit:
        flat = flat[: limit - 1] + "…"
    return flat
