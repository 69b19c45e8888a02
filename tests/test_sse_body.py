"""One reading of bytes: the Rust SSE reader (`StreamBody`, seen through
`parallelhue._native.read_sse_body`) and the reference reader
(`parallelhue.reference.sse_body`) accept and refuse the same bodies, with the
same inputs, end, finish reason and message, however the bytes are split into
reads (docs/PROTOCOL.md "Reading the SSE body"). The `sse_differential` fuzz
target runs the same comparison under libFuzzer (docs/FUZZING.md).
"""

from __future__ import annotations

import itertools
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workloads
from parallelhue.reference.sse_body import ENDED_EARLY, differ, read_body
from parallelhue_vllm import inband

read_sse_body = workloads.native_test_kit("read_sse_body")
needs_native = pytest.mark.skipif(read_sse_body is None, reason="needs the test kit: make native")

PROPERTY = workloads.property_settings()


def chunk(text: str = "a", ids: list[int] | None = None, finish: str | None = None) -> bytes:
    data = {
        "id": "chatcmpl-x",
        "choices": [{"index": 0, "delta": {"content": text},
                     "token_ids": [1] if ids is None else ids, "finish_reason": finish}],
    }  # fmt: skip
    return json.dumps(data, ensure_ascii=False).encode()


def both(body: bytes, cuts: list[int] | None = None) -> Any:
    """The result both readers give for `body` read in parts cut at `cuts`."""
    bounds = [0, *sorted(set(cuts or [])), len(body)]
    parts = [body[a:b] for a, b in itertools.pairwise(bounds)]
    reference = read_body(parts)
    if read_sse_body is not None:
        native = read_sse_body(parts)
        assert differ(native, reference) is None, (body, parts)
        assert native[1] == reference[1] or native[1][1].startswith("invalid JSON")
    return reference


CHUNK = b"data: " + chunk("h\u00e9", [5, 6]) + b"\n\n"
DELTA = ("sse", "h\u00e9", [5, 6])

# In-band telemetry events (docs/PROTOCOL.md, "In-band telemetry").
FRAME_A, FRAME_B = b"PHUE" + bytes(60), b"PHUE" + bytes(range(1, 61))
EVENT_A = inband.event(inband.frame_item(FRAME_A))
EVENT_AB = inband.event(inband.frame_item(FRAME_A) + inband.frame_item(FRAME_B))
END_2 = inband.event(inband.end_item(0, 2, 0, 1500))
END_1 = inband.event(inband.end_item(0, 1, 0, 1500))
DONE = b"data: [DONE]\n\n"


@needs_native
@pytest.mark.parametrize(
    ("body", "inputs", "end"),
    [
        # Raw invalid UTF-8 in a data line: refused, never read as U+FFFD.
        (CHUNK + b'data: {"id":"chatcmpl-x","choices":[{"index":0,"text":"\xff"}]}\n\n',
         [("sse_id", "chatcmpl-x"), DELTA], ("bad_event", "invalid UTF-8 in SSE line 3")),
        # ... in a comment line, an event type, a field name: the same.
        (CHUNK + b": keep\xe9alive\n" + CHUNK, [("sse_id", "chatcmpl-x"), DELTA],
         ("bad_event", "invalid UTF-8 in SSE line 3")),
        (b"event: \xc0\xaf\n" + CHUNK, [], ("bad_event", "invalid UTF-8 in SSE line 1")),
        # An overlong encoding and an encoded surrogate (CESU-8) are not UTF-8.
        (b'data: {"choices":[],"x":"\xc0\xaf"}\n\n', [],
         ("bad_event", "invalid UTF-8 in SSE line 1")),
        (b'data: {"choices":[],"x":"\xed\xa0\x80"}\n\n', [],
         ("bad_event", "invalid UTF-8 in SSE line 1")),
        # A character cut by the end of the body.
        (CHUNK + b"data: \xe6\x97", [("sse_id", "chatcmpl-x"), DELTA],
         ("bad_event", "invalid UTF-8 in SSE line 3")),
        # A BOM starts the first line only; later it is part of the data (not JSON).
        (b"\xef\xbb\xbf" + CHUNK + b"data: [DONE]\n\n", [("sse_id", "chatcmpl-x"), DELTA],
         ("done",)),
        (CHUNK + b"\xef\xbb\xbf" + CHUNK, [("sse_id", "chatcmpl-x"), DELTA],
         ("body_ended",)),
        # CR, CRLF and LF line ends, mixed.
        (CHUNK.replace(b"\n", b"\r") + CHUNK.replace(b"\n", b"\r\n") + b"data: [DONE]\r\n\r\n",
         [("sse_id", "chatcmpl-x"), DELTA, DELTA], ("done",)),
        # A whitespace-only line is not a blank line: no dispatch.
        (b"data: " + chunk() + b"\n \n" + CHUNK, [],
         ("bad_event", "invalid JSON in SSE data: ")),
        # `data` without a colon is an empty data line (a leading newline: still JSON).
        (b"data\n" + CHUNK, [("sse_id", "chatcmpl-x"), DELTA], ("body_ended",)),
        (b"data\n\n", [], ("bad_event", "invalid JSON in SSE data: ")),
        # [DONE] trimmed of Unicode White_Space (not of Python's \x1c..\x1f).
        (b"data: \xc2\xa0[DONE]\t\n\n", [], ("done",)),
        (b"data: \x1c[DONE]\n\n", [], ("bad_event", "invalid JSON in SSE data: ")),
        # NUL is not JSON; a lone surrogate escape is not a string (both: JSON errors).
        (b"data: \x00\n\n", [], ("bad_event", "invalid JSON in SSE data: ")),
        (b'data: {"choices":[{"index":0,"text":"\\ud800"}]}\n\n', [],
         ("bad_event", "invalid JSON in SSE data: ")),
        # A last event without its blank line still counts.
        (CHUNK + b"data: " + chunk("z", [7], "stop"),
         [("sse_id", "chatcmpl-x"), DELTA, ("sse", "z", [7])], ("body_ended",)),
        # An event with its own type is not a completion chunk.
        (b"event: ping\n" + CHUNK + CHUNK, [("sse_id", "chatcmpl-x"), DELTA],
         ("body_ended",)),
        # In-band telemetry: frames in order with the chunks, the end item checked.
        (CHUNK + EVENT_AB + END_2 + DONE,
         [("sse_id", "chatcmpl-x"), DELTA, ("frame", FRAME_A), ("frame", FRAME_B)], ("done",)),
        (EVENT_A + CHUNK + END_1 + DONE,
         [("frame", FRAME_A), ("sse_id", "chatcmpl-x"), DELTA], ("done",)),
        # An end item that says something is missing: the stream's telemetry is lost.
        (EVENT_A + inband.event(inband.end_item(1, 1, 0, 2_500_000)) + DONE,
         [("frame", FRAME_A), ("lost", "telemetry lost: the scheduler's frames of the final "
                                       "step did not come within 2500 ms")], ("done",)),
        (EVENT_A + inband.event(inband.end_item(4, 1, 7, 0)) + DONE,
         [("frame", FRAME_A), ("lost", "telemetry lost: 7 frames dropped by the server (the "
                                       "response was read too slowly)")], ("done",)),
        (inband.event(inband.end_item(9, 0, 0, 0)) + DONE,
         [("lost", "telemetry lost: the server ended this response's telemetry with status 9")],
         ("done",)),
        # Begun and never ended: lost at [DONE] and at the body's end, not when cut.
        (EVENT_A + CHUNK + DONE, [("frame", FRAME_A), ("sse_id", "chatcmpl-x"), DELTA,
                                  ("lost", ENDED_EARLY)], ("done",)),
        (EVENT_A + CHUNK, [("frame", FRAME_A), ("sse_id", "chatcmpl-x"), DELTA,
                           ("lost", ENDED_EARLY)], ("body_ended",)),
        # Refusals: a count that differs, an event after the end, a wrong drop count,
        # bytes that are not (canonical) base64, an unknown item, a cut item.
        (EVENT_A + END_2, [("frame", FRAME_A)],
         ("bad_event", "in-band telemetry: the end item counts 2 frames, 1 came")),
        (inband.event(inband.end_item(0, 0, 0, 0)) + EVENT_A, [],
         ("bad_event", "in-band telemetry: an event after its end item")),
        (inband.event(inband.end_item(4, 0, 0, 0)), [],
         ("bad_event", "in-band telemetry: end item status 4 with 0 frames dropped")),
        (b"event: parallelhue\ndata: QR==\n\n", [],
         ("bad_event", "in-band telemetry: event data is not base64")),
        (b"event: parallelhue\ndata: AwAAAAA=\n\n", [],
         ("bad_event", "in-band telemetry: unknown item type 3 at byte 0")),
        (b"event: parallelhue\ndata: AQUAAABQSA==\n\n", [],
         ("bad_event", "in-band telemetry: truncated item at byte 0: 2 of 5 bytes")),
        # A finish_reason restated differently.
        (b"data: " + chunk("", [], "length") + b"\n\ndata: " + chunk("", [], "stop") + b"\n\n",
         [("sse_id", "chatcmpl-x")],
         ("bad_event", "invalid SSE chunk: choice 0's finish_reason 'stop' after 'length'")),
    ],
)  # fmt: skip
def test_both_readers_accept_and_refuse_the_same_bytes(
    body: bytes, inputs: list[Any], end: tuple[str, ...]
) -> None:
    for cuts in ([], list(range(1, len(body))), [len(body) // 2]):
        got_inputs, got_end, _finish = both(body, cuts)
        assert [tuple(i) for i in got_inputs] == inputs
        if end[0] == "bad_event" and end[1] == "invalid JSON in SSE data: ":
            assert got_end[0] == "bad_event" and got_end[1].startswith(end[1])
        else:
            assert got_end == end


# Pieces of bodies: valid lines and every kind of trouble for a byte reader.
PIECES = [
    b"data: ", b"data:", b"data", b"event: ping", b"event: message", b"event:", b": c",
    b"id: 1", b"id: \x00", b"retry: 5", b"\n", b"\r", b"\r\n", b"\n\n", b" ", b"\t",
    b"\xef\xbb\xbf", b"\x00", b"\xff", b"\xc0\xaf", b"\xe0\x80\xaf", b"\xed\xa0\x80",
    b"\xf4\x90\x80\x80", b"\xe6\x97", b"\xa5", b"\xe6\x97\xa5", b"\xf0\x9f\x99\x82",
    b"[DONE]", b" [DONE] ", b"\xc2\xa0", b"\x1c", b"\xe2\x80\xa8",
    b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\u0000"',
    chunk(), chunk("\u65e5", [9, 10]), chunk("", [], "stop"), chunk("", [], "length"),
    chunk("x", [1], None).replace(b'"index": 0', b'"index": 1'),
    b'{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}',
    b'{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":2}}',
    b'{"choices":[],"metrics":{"speculative_decoding":{"per_step_accepted":[1],'
    b'"per_step_drafted":[3]}}}',
    b'{"error":{"message":"boom"}}', b'{"choices":[{"index":0,"text":"\\u00e9","token_ids":[1]}]}',
    b"event: parallelhue", EVENT_A, EVENT_AB, END_1, END_2, EVENT_A[:40], b"QR==", b"AQ==",
]  # fmt: skip


@needs_native
@PROPERTY
@given(
    st.lists(st.sampled_from(PIECES), max_size=24),
    st.lists(st.integers(min_value=0, max_value=4000), max_size=8),
)
def test_any_body_split_anywhere_reads_the_same_in_both_readers(
    pieces: list[bytes], cuts: list[int]
) -> None:
    body = b"".join(pieces)
    both(body, [c for c in cuts if c <= len(body)])


@needs_native
@PROPERTY
@given(st.binary(max_size=200), st.lists(st.integers(min_value=0, max_value=200), max_size=6))
def test_arbitrary_bytes_read_the_same_in_both_readers(body: bytes, cuts: list[int]) -> None:
    both(b"data: " + body, [c for c in cuts if c <= len(body)])
