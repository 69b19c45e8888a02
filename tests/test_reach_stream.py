"""The HTTP telemetry stream framing: the normative vectors against the Python decoder, the
encoder against the decoder, and split invariance (the Rust decoder runs the same vectors
in `cargo test`, rust/core/src/telemetry/stream.rs)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from parallelhue_vllm import telemetry_stream as ts

VECTOR_DIR = Path(__file__).resolve().parent / "vectors" / "stream"
VECTORS: list[dict[str, Any]] = json.loads(
    (VECTOR_DIR / "telemetry_stream.json").read_text(encoding="utf-8")
)["vectors"]
RUN = bytes(range(16))


def decode(
    data: bytes, pieces: list[int], finish: bool
) -> tuple[list[dict[str, object]], str | None]:
    """Feed `data` cut at `pieces` (sizes, the rest at the end); items and the error."""
    decoder = ts.StreamDecoder()
    items: list[dict[str, object]] = []
    chunks: list[bytes] = []
    offset = 0
    for size in pieces:
        chunks.append(data[offset : offset + size])
        offset += size
    chunks.append(data[offset:])
    for chunk in chunks:
        try:
            items += [item.meaning() for item in decoder.push(chunk)]
        except ts.StreamError as error:
            items += [item.meaning() for item in error.items]
            return items, str(error)
        assert decoder.buffered <= ts.PREAMBLE_SIZE + ts.ITEM_HEADER_SIZE + ts.MAX_FRAME_ITEM
    if finish:
        try:
            decoder.finish()
        except ts.StreamError as error:
            return items, str(error)
    return items, None


def test_committed_vectors_equal_generated_output() -> None:
    spec = importlib.util.spec_from_file_location("stream_vectors", VECTOR_DIR / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = (VECTOR_DIR / "telemetry_stream.json").read_text(encoding="utf-8")
    assert committed == module.render(module.all_vectors())


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
@pytest.mark.parametrize("step", [0, 1, 3, 5, 32, 33, 1 << 20])
def test_vector_decodes_the_same_in_every_split(vector: dict[str, Any], step: int) -> None:
    data = bytes.fromhex(vector["hex"])
    pieces = [step] * (len(data) // step) if step else []
    items, error = decode(data, pieces, vector["finish"])
    assert items == vector["items"]
    assert error == vector["error"]


def test_an_error_is_final() -> None:
    decoder = ts.StreamDecoder()
    with pytest.raises(ts.StreamError, match="bad magic") as first:
        decoder.push(b"GET ")
    for again in (lambda: decoder.push(b""), decoder.finish):
        with pytest.raises(ts.StreamError) as later:
            again()
        assert str(later.value) == str(first.value)


def test_the_largest_frame_item_decodes_and_the_next_size_is_refused() -> None:
    frame = bytes(i % 251 for i in range(ts.MAX_FRAME_ITEM))
    decoder = ts.StreamDecoder()
    items = decoder.push(ts.preamble(RUN, 1, 2) + ts.frame_item(frame))
    assert [i.kind for i in items] == ["preamble", "frame"] and items[1].frame == frame
    with pytest.raises(ValueError, match="frame of 65537 bytes cannot be a frame item"):
        ts.frame_item(frame + b"x")
    header = bytes([ts.ITEM_FRAME]) + (ts.MAX_FRAME_ITEM + 1).to_bytes(4, "little")
    with pytest.raises(ts.StreamError) as error:
        decoder.push(header)
    assert str(error.value) == (
        "telemetry stream: oversized frame item at byte 65573: 65537 bytes, limit 65536"
    )


def test_end_message_is_cut_to_1024_bytes_on_a_character_boundary() -> None:
    message = "é" * 600  # 1200 bytes
    decoder = ts.StreamDecoder()
    items = decoder.push(ts.preamble(RUN, 0, 0) + ts.end_item(ts.END_OTHER, message))
    assert items[-1].message == "é" * 512
    assert decoder.ended
    decoder.finish()


frames = st.lists(st.binary(min_size=1, max_size=300), max_size=8)


@given(frames, st.lists(st.integers(0, 40), max_size=30), st.integers(0, 7))
def test_encoder_output_decodes_to_the_same_items_in_any_split(
    payloads: list[bytes], cuts: list[int], drops: int
) -> None:
    parts = [ts.preamble(RUN, 4096, 2000)]
    for payload in payloads:
        parts.append(ts.frame_item(payload))
        if drops:
            parts.append(ts.dropped_item(drops))
        parts.append(ts.heartbeat_item())
    parts.append(ts.end_item(ts.END_HUB_CLOSED, "bye"))
    data = b"".join(parts)
    items, error = decode(data, cuts, finish=True)
    assert error is None
    assert [i for i in items if i["kind"] == "frame"] == [
        {"kind": "frame", "hex": p.hex()} for p in payloads
    ]
    assert items[0] == {
        "kind": "preamble",
        "run_id": RUN.hex(),
        "buffer_bytes": 4096,
        "heartbeat_ms": 2000,
    }
    assert items[-1] == {"kind": "end", "code": 1, "message": "bye"}
    assert sum(1 for i in items if i["kind"] == "dropped") == (len(payloads) if drops else 0)
