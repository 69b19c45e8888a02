"""The HTTP telemetry stream (docs/PROTOCOL.md, "HTTP telemetry stream"): encoder and decoder.

Telemetry frames travel over HTTP as a byte stream: a 32-byte preamble
naming the run, then items `u8 type, u32 length, payload`. A frame item
carries one telemetry frame byte for byte as the emitter sent it as a
datagram; this layer never looks inside a frame, so it does not depend on the
frame protocol version. The hub (`hub.py`) encodes; `StreamDecoder` is the
pure-Python reference decoder the test vectors check (the client's decoder is
`rust/core/src/telemetry_stream.rs`; both return the same items and the same
error messages).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

__all__ = [
    "CONTENT_TYPE",
    "END_HUB_CLOSED",
    "END_OTHER",
    "END_TOO_SLOW",
    "ITEM_DROPPED",
    "ITEM_END",
    "ITEM_FRAME",
    "ITEM_HEADER_SIZE",
    "ITEM_HEARTBEAT",
    "MAX_END_MESSAGE",
    "MAX_FRAME_ITEM",
    "PREAMBLE_SIZE",
    "STREAM_MAGIC",
    "STREAM_VERSION",
    "Item",
    "StreamDecoder",
    "StreamError",
    "dropped_item",
    "end_item",
    "frame_item",
    "heartbeat_item",
    "preamble",
]

STREAM_MAGIC = b"PHTS"
STREAM_VERSION = 1
PREAMBLE_SIZE = 32
ITEM_HEADER_SIZE = 5
CONTENT_TYPE = "application/x-parallelhue-telemetry"

ITEM_FRAME, ITEM_DROPPED, ITEM_HEARTBEAT, ITEM_END = 1, 2, 3, 4
END_HUB_CLOSED, END_TOO_SLOW, END_OTHER = 1, 2, 3

MAX_FRAME_ITEM = 65536  # = MAX_FRAME_BYTES of the frame protocol: a whole datagram
MAX_END_MESSAGE = 1024

# magic, version, flags, reserved, run_id, buffer_bytes, heartbeat_ms
_PREAMBLE = struct.Struct("<4sBBH16sII")
_ITEM = struct.Struct("<BI")
_U32 = struct.Struct("<I")
_U16 = struct.Struct("<H")

assert _PREAMBLE.size == PREAMBLE_SIZE and _ITEM.size == ITEM_HEADER_SIZE

_KIND_NAMES = {
    ITEM_FRAME: "frame",
    ITEM_DROPPED: "dropped",
    ITEM_HEARTBEAT: "heartbeat",
    ITEM_END: "end",
}
# Allowed payload length per item type, checked as soon as the item header is in.
_LENGTHS = {
    ITEM_FRAME: (1, MAX_FRAME_ITEM),
    ITEM_DROPPED: (4, 4),
    ITEM_HEARTBEAT: (0, 0),
    ITEM_END: (2, 2 + MAX_END_MESSAGE),
}

_HEARTBEAT = _ITEM.pack(ITEM_HEARTBEAT, 0)


# ------------------------------------------------------------------ encoder
def preamble(run_id: bytes, buffer_bytes: int, heartbeat_ms: int) -> bytes:
    """The stream's first 32 bytes: the run it carries and the hub's limits for it."""
    if len(run_id) != 16:
        raise ValueError(f"run id must be 16 bytes, got {len(run_id)}")
    return _PREAMBLE.pack(STREAM_MAGIC, STREAM_VERSION, 0, 0, run_id, buffer_bytes, heartbeat_ms)


def frame_item(frame: bytes) -> bytes:
    """One telemetry frame, unchanged."""
    if not 1 <= len(frame) <= MAX_FRAME_ITEM:
        raise ValueError(f"frame of {len(frame)} bytes cannot be a frame item")
    return _ITEM.pack(ITEM_FRAME, len(frame)) + frame


def dropped_item(frames: int) -> bytes:
    """Frames of this run the hub discarded for this subscriber since the previous dropped item."""
    return _ITEM.pack(ITEM_DROPPED, 4) + _U32.pack(min(frames, 0xFFFFFFFF))


def heartbeat_item() -> bytes:
    """Sent when the stream was idle for the announced heartbeat interval."""
    return _HEARTBEAT


def end_item(code: int, message: str) -> bytes:
    """The server ends the stream; nothing follows."""
    data = message.encode("utf-8")[:MAX_END_MESSAGE]
    # A cut may split a character: drop the partial tail so the message stays UTF-8.
    data = data.decode("utf-8", "ignore").encode("utf-8")
    return _ITEM.pack(ITEM_END, 2 + len(data)) + _U16.pack(code) + data


# ------------------------------------------------------------------ decoder
class StreamError(Exception):
    """A telemetry stream that breaks docs/PROTOCOL.md; the message is normative.

    `items` holds what the failing `push` call decoded before the violation.
    """

    def __init__(self, message: str, items: list[Item] | None = None) -> None:
        super().__init__(message)
        self.items: list[Item] = items or []


@dataclass(frozen=True, slots=True)
class Item:
    """One decoded element: `kind` is preamble, frame, dropped, heartbeat or end."""

    kind: str
    run_id: bytes = b""
    buffer_bytes: int = 0
    heartbeat_ms: int = 0
    frame: bytes = b""
    frames: int = 0
    code: int = 0
    message: str = ""

    def meaning(self) -> dict[str, object]:
        """The JSON form used by the test vectors (tests/vectors/stream/)."""
        if self.kind == "preamble":
            return {
                "kind": "preamble",
                "run_id": self.run_id.hex(),
                "buffer_bytes": self.buffer_bytes,
                "heartbeat_ms": self.heartbeat_ms,
            }
        if self.kind == "frame":
            return {"kind": "frame", "hex": self.frame.hex()}
        if self.kind == "dropped":
            return {"kind": "dropped", "frames": self.frames}
        if self.kind == "end":
            return {"kind": "end", "code": self.code, "message": self.message}
        return {"kind": self.kind}


class StreamDecoder:
    """Bytes in (any split), items out. No I/O.

    It holds at most one incomplete item (≤ 65 541 bytes): a length beyond an
    item type's limit is refused from its 5-byte header, before the payload
    arrives. The first error is final: later calls raise it again.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._position = 0  # stream offset of the first byte in _buffer
        self._preamble_done = False
        self._ended = False
        self._error: StreamError | None = None

    @property
    def position(self) -> int:
        """Bytes of the stream consumed so far (whole items and the preamble)."""
        return self._position

    @property
    def buffered(self) -> int:
        """Bytes held for an incomplete item."""
        return len(self._buffer)

    @property
    def ended(self) -> bool:
        """Whether the end item was decoded."""
        return self._ended

    def _fail(self, message: str, items: list[Item] | None = None) -> StreamError:
        self._error = StreamError(f"telemetry stream: {message}")
        return StreamError(str(self._error), items)

    def push(self, data: bytes) -> list[Item]:
        """Decode what `data` completes; raises StreamError at the first violation."""
        if self._error is not None:
            raise StreamError(str(self._error))
        if self._ended:
            if data:
                raise self._fail(f"data after the end item at byte {self._position}", [])
            return []
        items: list[Item] = []
        buffer = self._buffer
        buffer += data
        offset = 0
        if not self._preamble_done:
            if len(buffer) < PREAMBLE_SIZE:
                if len(buffer) >= 4 and buffer[:4] != STREAM_MAGIC:
                    raise self._fail(
                        f"bad magic: expected 50485453, got {bytes(buffer[:4]).hex()}", items
                    )
                return items
            magic, version, flags, reserved, run_id, buffer_bytes, heartbeat_ms = (
                _PREAMBLE.unpack_from(buffer, 0)
            )
            if magic != STREAM_MAGIC:
                raise self._fail(f"bad magic: expected 50485453, got {magic.hex()}", items)
            if version != STREAM_VERSION:
                raise self._fail(
                    f"unsupported stream version {version} (this build speaks {STREAM_VERSION})",
                    items,
                )
            if flags or reserved:
                raise self._fail(
                    f"reserved preamble field set: flags {flags}, reserved {reserved}", items
                )
            items.append(Item("preamble", run_id, buffer_bytes, heartbeat_ms))
            self._preamble_done = True
            offset = PREAMBLE_SIZE
        end = len(buffer)
        while end - offset >= ITEM_HEADER_SIZE:
            kind, length = _ITEM.unpack_from(buffer, offset)
            at = self._position + offset
            limits = _LENGTHS.get(kind)
            if limits is None:
                raise self._fail(f"unknown item type {kind} at byte {at}", items)
            name = _KIND_NAMES[kind]
            low, high = limits
            if length > high:
                raise self._fail(
                    f"oversized {name} item at byte {at}: {length} bytes, limit {high}", items
                )
            if length < low:
                raise self._fail(
                    f"short {name} item at byte {at}: {length} bytes, needs {low}", items
                )
            start = offset + ITEM_HEADER_SIZE
            if end - start < length:
                break
            payload = bytes(buffer[start : start + length])
            offset = start + length
            if kind == ITEM_FRAME:
                items.append(Item("frame", frame=payload))
            elif kind == ITEM_DROPPED:
                items.append(Item("dropped", frames=_U32.unpack(payload)[0]))
            elif kind == ITEM_HEARTBEAT:
                items.append(Item("heartbeat"))
            else:
                try:
                    message = payload[2:].decode("utf-8")
                except UnicodeDecodeError:
                    raise self._fail(
                        f"end item at byte {at}: invalid UTF-8 message", items
                    ) from None
                items.append(Item("end", code=_U16.unpack_from(payload)[0], message=message))
                self._ended = True
                if offset < end:
                    raise self._fail(
                        f"data after the end item at byte {self._position + offset}", items
                    )
                break
        del buffer[:offset]
        self._position += offset
        return items

    def finish(self) -> None:
        """The connection closed: raises unless the stream ended cleanly with its end item."""
        if self._error is not None:
            raise StreamError(str(self._error))
        if self._ended:
            return
        have = len(self._buffer)
        if not self._preamble_done:
            raise self._fail(f"truncated preamble: {have} of {PREAMBLE_SIZE} bytes")
        if have == 0:
            raise self._fail("connection closed without an end item")
        at = self._position
        if have < ITEM_HEADER_SIZE:
            raise self._fail(
                f"truncated item header at byte {at}: {have} of {ITEM_HEADER_SIZE} bytes"
            )
        kind, length = _ITEM.unpack_from(self._buffer, 0)
        raise self._fail(
            f"truncated {_KIND_NAMES[kind]} item at byte {at}: "
            f"{have - ITEM_HEADER_SIZE} of {length} bytes"
        )
