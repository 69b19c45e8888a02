"""The frame encoder (parallelhue_vllm.wire) against the reference decoder and the spec."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallelhue.reference.decode import decode_frame
from parallelhue_vllm import wire

RUN = bytes.fromhex("00112233445566778899aabbccddeeff")
HEADER = wire.Header(RUN, 0xABCDEF, 5, 9, 123456789, 2)


def test_header_layout_matches_protocol_offsets() -> None:
    frame = wire.encode_records(wire.KIND_NOTICE, HEADER, [wire.NoticeRecord(1, 5, "hi")])
    assert frame[0:4] == b"PHUE"
    assert frame[4] == 3
    assert frame[5] == wire.KIND_NOTICE
    assert frame[6:8] == b"\x00\x00"
    assert frame[8:24] == RUN
    assert struct.unpack_from("<QQQQII", frame, 24) == (
        0xABCDEF,
        5,
        9,
        123456789,
        2,
        len(frame) - 64,
    )


def test_provenance_round_trip() -> None:
    records = [
        wire.ProvenanceRecord(0, 10, [1, 2, 3], [1, 1, 3], 2),
        wire.ProvenanceRecord(
            7, 0, [2**32 - 1], [0], 0, finished=True, finish_reason=wire.FINISH_LENGTH
        ),
        wire.ProvenanceRecord(
            9, 4, [5, 6], [1, 1], 3, drafts_padded=1, finished=True, finish_reason=1, trimmed=True
        ),
    ]
    frame = decode_frame(wire.encode_records(wire.KIND_PROVENANCE, HEADER, records))
    assert frame.header == HEADER
    assert frame.records == records
    assert frame.record_flags == [0, 1, 3]


def test_text_round_trip() -> None:
    ni = "日".encode()
    records = [
        wire.TextRecord(
            3, 0, [wire.TextToken(1, b""), wire.TextToken(2, ni, 1, 2)], ni, finished=False
        ),
        wire.TextRecord(
            4,
            8,
            [wire.TextToken(5, b"ab")],
            b"",
            finished=True,
            finish_reason=wire.FINISH_STOP,
            text_truncated=True,
            tokens_trimmed=True,
            trimmed_tokens=3,
        ),
    ]
    frame = decode_frame(wire.encode_records(wire.KIND_TEXT, HEADER, records))
    assert frame.records == records
    assert frame.record_flags == [0, 7]


def test_hello_round_trip() -> None:
    hello = wire.Hello(
        wire.SOURCE_SCHEDULER, wire.ENGINE_SIMULATED, wire.DERIVATION_COUNTS, True, 4,
        "0.2.0", "sim-1", "draft_model", wire.VERIFICATION_FLY,
    )  # fmt: skip
    frame = decode_frame(wire.encode_hello(HEADER, hello))
    assert frame.hello == hello


def test_hello_and_text_token_layout_matches_protocol_offsets() -> None:
    hello = wire.Hello(1, 1, 1, False, 0x0203, "p", "e", "m", wire.VERIFICATION_SYNTHETIC)
    body = wire.encode_hello(HEADER, hello)[64:]
    assert body[:8] == bytes([1, 1, 1, 0, 3, 2, 2, 0])  # ..., K, verification (u16 LE)
    record = wire.TextRecord(5, 0, [wire.TextToken(0x01020304, b"xy", 1, 0x0102)], b"xy")
    entry = wire.encode_records(wire.KIND_TEXT, HEADER, [record])[64 + 2 + 16 :][:9]
    assert entry == bytes([4, 3, 2, 1, 2, 0, 1, 2, 1])  # id, frag_len, span_back, lead_len


def test_notice_message_is_cut_at_a_character_boundary() -> None:
    # 341 three-byte characters = 1023 bytes; one more would straddle the 1024 limit.
    message = "あ" * 400
    record = wire.NoticeRecord(wire.ALL_STREAMS, wire.NOTICE_OTHER, message)
    assert wire.record_size(wire.KIND_NOTICE, record) == 6 + 1023
    frame = decode_frame(wire.encode_records(wire.KIND_NOTICE, HEADER, [record]))
    decoded = frame.records[0]
    assert isinstance(decoded, wire.NoticeRecord)
    assert decoded.message == "あ" * 341


@pytest.mark.parametrize(
    ("kind", "record"),
    [
        (wire.KIND_PROVENANCE, wire.ProvenanceRecord(1, 2, [3, 4, 5], [1, 1, 2], 3)),
        (
            wire.KIND_TEXT,
            wire.TextRecord(1, 2, [wire.TextToken(3, "é".encode()), wire.TextToken(4, b"")], b"x"),
        ),
        (wire.KIND_NOTICE, wire.NoticeRecord(1, 2, "stream_interval 2")),
    ],
)
def test_record_size_matches_encoded_size(kind: int, record: wire.Record) -> None:
    one = wire.encode_records(kind, HEADER, [record])
    two = wire.encode_records(kind, HEADER, [record, record])
    assert len(one) == 64 + 2 + wire.record_size(kind, record)
    assert len(two) - len(one) == wire.record_size(kind, record)


def test_record_of_the_wrong_kind_is_refused() -> None:
    notice = wire.NoticeRecord(1, 2, "x")
    with pytest.raises(ValueError, match=r"^a NoticeRecord cannot go in a provenance frame$"):
        wire.encode_records(wire.KIND_PROVENANCE, HEADER, [notice])
    with pytest.raises(ValueError, match=r"^a NoticeRecord cannot go in a text frame$"):
        wire.record_size(wire.KIND_TEXT, notice)
    with pytest.raises(ValueError, match=r"^kind 1 does not carry records$"):
        wire.encode_records(wire.KIND_HELLO, HEADER, [notice])


def test_unrepresentable_frames_are_refused() -> None:
    with pytest.raises(ValueError, match=r"^0 records, a frame holds 1\.\.=1024$"):
        wire.encode_records(wire.KIND_NOTICE, HEADER, [])
    with pytest.raises(ValueError, match=r"^record for stream 2: 257 tokens, limit 256$"):
        wire.encode_records(
            wire.KIND_PROVENANCE,
            HEADER,
            [wire.ProvenanceRecord(2, 0, [1] * 257, [1] * 257, 256)],
        )
    with pytest.raises(ValueError, match=r"^record for stream 2: 1 roles for 2 tokens$"):
        wire.encode_records(
            wire.KIND_PROVENANCE, HEADER, [wire.ProvenanceRecord(2, 0, [1, 2], [1], 1)]
        )
    with pytest.raises(ValueError, match=r"^provenance record field out of range"):
        wire.encode_records(
            wire.KIND_PROVENANCE, HEADER, [wire.ProvenanceRecord(2, 0, [2**32], [0], 0)]
        )
    with pytest.raises(ValueError, match=r"^frame of 70082 bytes exceeds 65536$"):
        wire.encode_records(
            wire.KIND_TEXT, HEADER, [wire.TextRecord(0, 0, [], b"x" * 70000, True, 1)]
        )
    with pytest.raises(ValueError, match=r"^hello spec_method is 256 bytes, limit 255$"):
        wire.encode_hello(HEADER, wire.Hello(1, 1, 1, False, 1, "p", "e", "m" * 256, 1))
    with pytest.raises(ValueError, match=r"^run id must be 16 raw bytes, got 32$"):
        wire.encode_records(
            wire.KIND_NOTICE,
            wire.Header(b"0" * 32, 1, 0, 0, 0),
            [wire.NoticeRecord(0, 1, "")],
        )


def _text_record(stream: int, size: int) -> wire.TextRecord:
    return wire.TextRecord(stream, 0, [wire.TextToken(1, b"a" * size)], b"a" * size)


def test_split_respects_byte_limit_and_order() -> None:
    records: list[wire.Record] = [_text_record(i, 10000) for i in range(7)]
    chunks = wire.split_for_frames(wire.KIND_TEXT, records)
    assert [len(c) for c in chunks] == [3, 3, 1]
    assert [r for chunk in chunks for r in chunk] == records
    for chunk in chunks:
        assert len(wire.encode_records(wire.KIND_TEXT, HEADER, chunk)) <= wire.MAX_FRAME_BYTES


def test_split_respects_record_limit() -> None:
    records: list[wire.Record] = [
        wire.ProvenanceRecord(i, 0, [1], [0], 0) for i in range(2 * 1024 + 5)
    ]
    chunks = wire.split_for_frames(wire.KIND_PROVENANCE, records)
    assert [len(c) for c in chunks] == [1024, 1024, 5]


def test_split_fills_a_frame_exactly() -> None:
    # Two records whose frame is exactly MAX_FRAME_BYTES stay together.
    budget = wire.MAX_FRAME_BYTES - 64 - 2
    first = _text_record(0, 30000)
    second_size = budget - wire.record_size(wire.KIND_TEXT, first) - 16 - 9
    second = wire.TextRecord(1, 0, [wire.TextToken(1, b"")], b"b" * second_size)
    chunks = wire.split_for_frames(wire.KIND_TEXT, [first, second])
    assert chunks == [[first, second]]
    assert len(wire.encode_records(wire.KIND_TEXT, HEADER, chunks[0])) == wire.MAX_FRAME_BYTES
    third = wire.TextRecord(2, 0, [wire.TextToken(1, b"")], b"")
    assert wire.split_for_frames(wire.KIND_TEXT, [first, second, third]) == [
        [first, second],
        [third],
    ]


def test_split_refuses_a_record_that_fits_no_frame() -> None:
    with pytest.raises(ValueError, match=r"^record for stream 4 is 70025 bytes"):
        wire.split_for_frames(wire.KIND_TEXT, [_text_record(4, 35000)])


RUN_HEX = "0123456789abcdef0123456789abcdef"


@pytest.mark.parametrize(
    ("vllm_id", "expected"),
    [
        (f"chatcmpl-ph1_{RUN_HEX}_12-1a2b3c4d", (RUN_HEX, 12)),
        (f"cmpl-ph1_{RUN_HEX}_0-deadbeef", (RUN_HEX, 0)),
        (f"1_chatcmpl-ph1_{RUN_HEX}_65534-deadbeef", (RUN_HEX, 65534)),
        (f"ph1_{RUN_HEX}_7", (RUN_HEX, 7)),
        (f"ph1_{RUN_HEX}_123456-x", None),  # six digits: not a stream index
        (f"ph1_{RUN_HEX}_65535", None),  # reserved for "whole run"
        (f"ph1_{RUN_HEX.upper()}_1", None),
        (f"ph1_{RUN_HEX[:-1]}_1", None),
        ("chatcmpl-abc-12345678", None),
    ],
)
def test_parse_request_id(vllm_id: str, expected: tuple[str, int] | None) -> None:
    assert wire.parse_request_id(vllm_id) == expected


def test_request_id_round_trips_through_a_vllm_id() -> None:
    rid = wire.request_id(RUN_HEX, 42)
    assert rid == f"ph1_{RUN_HEX}_42"
    assert wire.parse_request_id(f"chatcmpl-{rid}-0badf00d") == (RUN_HEX, 42)


_roles_step = st.integers(0, 6).flatmap(
    lambda k: st.tuples(st.just(k), st.integers(0, k)).map(
        lambda t: (t[0], [1] * t[1] + ([3] if t[1] == t[0] else [2]) if t[0] else [0])
    )
)


@settings(max_examples=200, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.integers(0, 65534),
            st.integers(0, 2**31),
            _roles_step,
            st.lists(st.integers(0, 2**32 - 1), min_size=7, max_size=7),
        ),
        min_size=1,
        max_size=20,
        unique_by=lambda t: t[0],
    )
)
def test_random_provenance_frames_round_trip(
    steps: list[tuple[int, int, tuple[int, list[int]], list[int]]],
) -> None:
    records = [
        wire.ProvenanceRecord(stream, offset, ids[: len(roles)], roles, k)
        for stream, offset, (k, roles), ids in steps
    ]
    frame = wire.encode_records(wire.KIND_PROVENANCE, HEADER, records)
    assert decode_frame(frame).records == records
