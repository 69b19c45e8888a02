"""The pane tail reader, the redraw's hot loop: the extension's
`_native.tail_pieces` against the Python one (`spans.python_tail_pieces`, the
client's reader without the extension) on the same arguments, for ASCII and
multi-byte text, spans splitting characters and invalid bytes, in both color
rules, colored or not, for every length; and StreamState.tail_segments on
each of them."""

from __future__ import annotations

import random
from array import array
from collections.abc import Callable
from typing import Any

import pytest

from parallelhue import _native
from parallelhue.model import state
from parallelhue.model.spans import python_tail_pieces, span_key, tail_keys
from parallelhue.model.state import StreamState

WORDS = ["the ", "quick ", "b", "r", "own ", "日本", "語 ", "é", "🚀", "x", "a\u0301 "]

native_tail_pieces = getattr(_native, "tail_pieces", None)
needs_native = pytest.mark.skipif(native_tail_pieces is None, reason="make native")
READERS: dict[str, Callable[..., list[tuple[str, str | None]]] | None] = {
    "native": native_tail_pieces,
    "python": python_tail_pieces,
}


@pytest.fixture(params=["native", "python"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Each reader in turn as the one StreamState.tail_segments calls."""
    function = READERS[request.param]
    if function is None:
        pytest.skip("make native")
    monkeypatch.setattr(state, "tail_pieces", function)
    return function


def both_readers_agree(
    stream: StreamState, colorize: bool, max_chars: int | None, color_by: str, roles_known: bool
) -> list[tuple[str, str | None]]:
    """The native and the Python reader on the same arguments; both return the
    same, and so does tail_segments (an exact-mode stream: the spans only)."""
    assert native_tail_pieces is not None
    keys, by_role = tail_keys(colorize, color_by, roles_known)
    limit = -1 if max_chars is None else max_chars
    args = (stream.sse_utf8, stream.span_records, limit, 0, keys, by_role, "mixed")
    got = native_tail_pieces(*args)
    want = python_tail_pieces(*args)
    assert got == want
    assert stream.tail_segments(colorize, max_chars, color_by, roles_known=roles_known) == got
    return got


def make_stream(n_spans: int, ascii_only: bool, seed: int) -> StreamState:
    rng = random.Random(seed)
    words = [w for w in WORDS if w.isascii()] if ascii_only else WORDS
    stream = StreamState(index=0, mode="exact")
    position = 0
    for k in range(n_spans):
        text = rng.choice(words)
        stream.add_delta(text, [1], 0.0)
        step = None if k % 11 == 5 else k // 2
        role = None if k % 7 == 3 else rng.randrange(4)
        stream.add_span(position, text, step, role)
        position += len(text.encode())
    return stream


@needs_native
@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("n_spans", [0, 1, 127, 128, 129, 300, 700])
def test_the_native_reader_gives_what_the_python_one_gives(ascii_only: bool, n_spans: int) -> None:
    stream = make_stream(n_spans, ascii_only, seed=n_spans)
    for colorize in (True, False):
        for color_by in ("step", "role"):
            for roles_known in (True, False):
                for max_chars in (None, 1, 2, 37, 136, 400, 5000):
                    got = both_readers_agree(stream, colorize, max_chars, color_by, roles_known)
                    if max_chars is None:
                        assert len(got) == n_spans
                    else:
                        # The fewest last spans holding max_chars characters.
                        held = sum(len(text) for text, _ in got)
                        assert held >= max_chars or len(got) == n_spans
                        assert held - len(got[0][0]) < max_chars if got else n_spans == 0


def test_a_window_mixing_ascii_and_multibyte_spans_is_cut_per_span(reader: Any) -> None:
    # Window boundaries fall inside an ASCII run and inside a multi-byte run:
    # 200 ASCII spans, then 100 of "日本", then 100 ASCII again.
    stream = StreamState(index=0, mode="exact")
    position = 0
    texts = ["ab"] * 200 + ["日本"] * 100 + ["c"] * 100
    for k, text in enumerate(texts):
        stream.add_delta(text, [1], 0.0)
        stream.add_span(position, text, k)
        position += len(text.encode())
    whole = stream.tail_segments(True, None)
    assert [text for text, _ in whole] == texts
    assert [key for _, key in whole] == [span_key(k, None, "step") for k in range(len(texts))]
    tail = stream.tail_segments(True, 250)
    assert [text for text, _ in tail] == texts[-175:]  # 100 x "c" + 75 x "日本" = 250


# Bytes cut at arbitrary places: spans that split a character (each part then
# decodes to U+FFFD on its own), invalid bytes, surrogates, long spans.
TEXT = "ascii text, 日本語のテキスト, émoji 🚀👩\u200d💻🇯🇵, e\u0301 a\u0300, Ελληνικά. ".encode()
BROKEN = [
    b"\xe6\x97", b"\x80", b"\xff", b"\xed\xa0\x80", b"\xf0\x9f\x9a", b"\xc3", b"\xf4\x90\x80\x80"
]  # fmt: skip


def byte_stream(n_spans: int, seed: int, broken: bool) -> StreamState:
    rng = random.Random(seed)
    stream = StreamState(index=0, mode="exact")
    for k in range(n_spans):
        if broken and rng.random() < 0.2:
            data = rng.choice(BROKEN)
        else:
            start = rng.randrange(len(TEXT))
            data = TEXT[start : start + rng.choice([0, 1, 2, 3, 5, 9, 40])]
        stream.sse_utf8 += data
        step = 0xFFFFFFFF if k % 13 == 4 else rng.randrange(1 << 31)
        role = 0xFF if k % 5 == 2 else rng.randrange(256)  # roles outside ROLE_KEYS too
        stream.span_records.extend((len(stream.sse_utf8), step | role << 32))
    return stream


@needs_native
@pytest.mark.parametrize("broken", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_spans_cut_anywhere_decode_as_python_decodes_each(broken: bool, seed: int) -> None:
    stream = byte_stream(400, seed, broken)
    spans = stream.spans
    if broken:
        assert any("\ufffd" in spans.text(i) for i in range(len(spans)))
    for colorize in (True, False):
        for color_by in ("step", "role"):
            for roles_known in (True, False):
                for max_chars in (None, 1, 3, 50, 333, 100_000):
                    both_readers_agree(stream, colorize, max_chars, color_by, roles_known)


def test_the_python_reader_decodes_and_keys_each_span_as_the_span_view_does() -> None:
    # Its key tables follow span_key for every role byte and step.
    stream = byte_stream(400, 3, broken=True)
    spans = stream.spans
    for color_by in ("step", "role"):
        for roles_known in (True, False):
            keys, by_role = tail_keys(True, color_by, roles_known)
            args = (stream.sse_utf8, stream.span_records, -1, 0, keys, by_role, "mixed")
            assert python_tail_pieces(*args) == [
                (spans.text(i), span_key(spans.step(i), spans.role(i), color_by, roles_known))
                for i in range(len(spans))
            ]


def test_a_split_character_decodes_as_python_decodes_its_parts(reader: Any) -> None:
    # "日" is e6 97 a5. Cut after its lead byte: that byte is one U+FFFD, each
    # lone continuation byte another; cut after two bytes: one for the pair.
    stream = StreamState(index=0, mode="exact")
    stream.sse_utf8 += "a日b".encode()
    stream.span_records.extend((2, 7, 5, 8))
    assert stream.tail_segments(True, None) == [("a\ufffd", "step.3"), ("\ufffd\ufffdb", "step.0")]
    stream.span_records[0] = 3
    assert stream.tail_segments(True, None) == [("a\ufffd", "step.3"), ("\ufffdb", "step.0")]


def test_the_unproven_tail_of_auto_mode_comes_last_and_counts(reader: Any) -> None:
    stream = StreamState(index=0, mode="auto")
    for k, text in enumerate(["ab", "cd", "ef"]):
        stream.add_delta(text, [1], 0.0)
        stream.add_span(2 * k, text, k)
    stream.add_delta("XYZ", [1], 0.0)
    assert stream.tail_segments(True, None) == [
        ("ab", "step.0"),
        ("cd", "step.1"),
        ("ef", "step.2"),
        ("XYZ", "unproven"),
    ]
    # The tail's 3 characters count toward the limit: one span more reaches 5.
    assert stream.tail_segments(True, 5) == [("ef", "step.2"), ("XYZ", "unproven")]
    assert stream.tail_segments(False, 3) == [("XYZ", None)]


def test_tail_pieces_refuses_spans_outside_the_text_and_short_key_tables(reader: Any) -> None:
    records = array("Q", [3, 0, 9, 1])
    with pytest.raises(ValueError, match=r"^span outside the text$"):
        reader(bytearray(b"abcd"), records, -1, 0, None, False, "mixed")
    with pytest.raises(ValueError, match=r"^span outside the text$"):
        reader(bytearray(b"abcdefghi"), array("Q", [5, 0, 4, 0]), -1, 0, None, False, "m")
    # Only the spans walked are read: the last one ends inside the text here.
    assert reader(bytearray(b"abc"), array("Q", [3, 0]), 1, 0, None, False, "m") == [("abc", None)]
    message = r"^tail_pieces: by role needs 256 keys, by step at least one$"
    with pytest.raises(ValueError, match=message):
        reader(bytearray(b"abcdefghi"), records, -1, 0, ("a",) * 4, True, "mixed")
    with pytest.raises(ValueError, match=message):
        reader(bytearray(b"abcdefghi"), records, -1, 0, (), False, "mixed")


@pytest.mark.parametrize("seed", range(8))
def test_a_panes_pieces_are_cleaned_as_each_piece_alone_would_be(seed: int) -> None:
    # clean_pieces tests the whole tail at once when it can; the result is each
    # piece sanitized on its own, empty pieces dropped, keys and order kept.
    from parallelhue.model.sanitize import sanitize
    from parallelhue.screen.lines import clean_pieces

    rng = random.Random(seed)
    odd = ["\u200d", "\x1b[31m", "\x1b]0;t\x07", "\r", "\t", "\n", "\x7f", "\u202e", "\u2028"]
    texts = [*WORDS, "日本語", "🚀👩\u200d💻"]
    # (what is mixed in, how often): nothing, empty pieces only (a printable
    # tail), controls and invisibles, both.
    for extra, rate in (([], 0.0), ([""], 0.3), (odd, 0.05), (odd, 0.5), (["", *odd], 0.3)):
        pieces = [
            (rng.choice(extra if rng.random() < rate else texts), rng.choice([None, "step.1"]))
            for _ in range(rng.randrange(1, 80))
        ]
        want = [(sanitize(text), key) for text, key in pieces if sanitize(text)]
        got = clean_pieces(pieces)
        assert got == want, (extra, rate, pieces)
        assert clean_pieces(tuple(pieces)) == want
        assert got is not pieces  # a new list: callers extend their lines
