"""Nothing a server sends may control the terminal."""

from __future__ import annotations

import unicodedata

from hypothesis import given
from hypothesis import strategies as st

from parallelhue.model.sanitize import one_line, sanitize


def test_plain_text_is_untouched() -> None:
    text = "Hello, 世界! café — 👍🏽 ❤️ tab-free\nsecond line"
    assert sanitize(text) == text


def test_csi_osc_and_two_byte_escapes_are_removed() -> None:
    assert sanitize("a\x1b[31mred\x1b[0m b") == "ared b"
    assert sanitize("x\x1b]0;title\x07y") == "xy"
    assert sanitize("x\x1b]8;;http://e\x1b\\link\x1b]8;;\x1b\\y") == "xlinky"
    assert sanitize("x\x1bPdcs-string\x1b\\y") == "xy"
    assert sanitize("x\x1bcy") == "xy"  # RIS: full terminal reset
    assert sanitize("x\x1b[") == "x"  # cut-off sequence at the end


def test_c1_forms_are_removed() -> None:
    assert sanitize("x\x9b31my") == "xy"  # 8-bit CSI
    assert sanitize("x\x9d0;t\x9cy") == "xy"  # 8-bit OSC ... ST
    assert sanitize("a\x85b") == "a\ufffdb"  # NEL is a control, shown as a placeholder


def test_c0_controls_and_carriage_return() -> None:
    assert sanitize("over\rwrite") == "overwrite"
    assert sanitize("bell\x07!") == "bell\ufffd!"
    assert sanitize("back\x08space") == "back\ufffdspace"
    assert sanitize("del\x7f") == "del\ufffd"
    assert sanitize("a\tb") == "a    b"


def test_bidi_and_zero_width_format_characters() -> None:
    trojan = "if access \u202e} \u2066admin\u2069 {\u202c"
    assert sanitize(trojan) == "if access } admin {"
    assert sanitize("zero\u200bwidth\u200d\u2060\ufeff") == "zerowidth"
    assert sanitize("rtl\u200f\u200e\u061cmark") == "rtlmark"


def test_line_separators() -> None:
    assert sanitize("a\u2028b\u2029c") == "a\nb\nc"
    assert sanitize("a\nb", keep_newlines=False) == "a b"


def test_one_line_flattens_and_limits() -> None:
    assert one_line("boom\x1b[31m red\nsecond   line") == "boom red second line"
    assert one_line("x" * 300, 10) == "xxxxxxxxx…"


_DANGEROUS = {"Cc", "Cf", "Cs", "Zl", "Zp"}


@given(st.text(alphabet=st.characters(codec=None, exclude_categories=())))
def test_no_dangerous_character_survives(text: str) -> None:
    cleaned = sanitize(text)
    for char in cleaned:
        if char == "\n":
            continue
        assert unicodedata.category(char) not in _DANGEROUS, repr(char)
    flat = one_line(text)
    assert "\n" not in flat
