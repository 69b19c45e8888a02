"""StreamState.tail_segments, the redraw's hot loop, against a plain reading of
the same spans: the same pieces and keys for ASCII and multi-byte text, across
its windows of spans, in both color rules, colored or not, for every length."""

from __future__ import annotations

import random

import pytest

from parallelhue.state import StreamState, _span_key

WORDS = ["the ", "quick ", "b", "r", "own ", "日本", "語 ", "é", "🚀", "x", "a\u0301 "]


def plain_tail(
    stream: StreamState, colorize: bool, max_chars: int | None, color_by: str, roles_known: bool
) -> list[tuple[str, str | None]]:
    """The spans read one by one through the public span view, then cut."""
    spans = stream.spans
    pieces = []
    for i in range(len(spans)):
        key = _span_key(spans.step(i), spans.role(i), color_by, roles_known) if colorize else None
        pieces.append((spans.text(i), key))
    if max_chars is None:
        return pieces
    kept: list[tuple[str, str | None]] = []
    total = 0
    for piece in reversed(pieces):
        if total >= max_chars:
            break
        kept.append(piece)
        total += len(piece[0])
    kept.reverse()
    return kept


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


@pytest.mark.parametrize("ascii_only", [True, False])
@pytest.mark.parametrize("n_spans", [0, 1, 127, 128, 129, 300, 700])
def test_tail_segments_match_the_spans_read_one_by_one(ascii_only: bool, n_spans: int) -> None:
    stream = make_stream(n_spans, ascii_only, seed=n_spans)
    for colorize in (True, False):
        for color_by in ("step", "role"):
            for roles_known in (True, False):
                for max_chars in (None, 1, 2, 37, 136, 400, 5000):
                    got = stream.tail_segments(
                        colorize, max_chars, color_by, roles_known=roles_known
                    )
                    want = plain_tail(stream, colorize, max_chars, color_by, roles_known)
                    assert got == want, (colorize, color_by, roles_known, max_chars)


def test_a_window_mixing_ascii_and_multibyte_spans_is_cut_per_span() -> None:
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
    assert [key for _, key in whole] == [_span_key(k, None, "step") for k in range(len(texts))]
    tail = stream.tail_segments(True, 250)
    assert [text for text, _ in tail] == texts[-175:]  # 100 x "c" + 75 x "日本" = 250
