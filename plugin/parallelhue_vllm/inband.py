"""In-band telemetry: a request's frames travel inside its own SSE response.

docs/PROTOCOL.md, "In-band telemetry (stream version 2)". A client asks per
request with the header `X-ParallelHue-Telemetry: 2`. The API-server process
that serves the request claims it in its hub (`Hub.claim`); the frontend hook
binds the claim to the request's vLLM-internal id (`bind_current`, through a
context variable set around the request, so nothing but the request's own
handler can bind it); the emitters of the scheduler and of the frontend send
that request's frames, keyed by the same id, to the hubs (`envelopes`); the
response carries them as SSE events

    event: parallelhue
    data: <base64 of items>

interleaved with the engine's own chunks, and, before `data: [DONE]`, an end
item saying whether every frame the request needs came (`Claim.finish` waits,
bounded, for the scheduler's frames of the final step).

Three parts live here, independent of any web framework: the items and the
event encoding (with the reference decoder the vectors check), the envelope
between emitters and hubs (server-internal: one plugin installation on one
host), and the context variable.
"""

from __future__ import annotations

import base64
import binascii
import contextvars
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hub import Claim

__all__ = [
    "ENVELOPE_MAGIC",
    "EVENT_NAME",
    "FLAG_CLOSED",
    "FLAG_FINISHED",
    "FLAG_REFUSED",
    "HEADER",
    "ITEM_END",
    "ITEM_FRAME",
    "MAX_EVENT_ITEMS_BYTES",
    "MAX_FRAME_ITEM",
    "STATUS_COMPLETE",
    "STATUS_DROPPED",
    "STATUS_HUB_CLOSED",
    "STATUS_MISSING_BOTH",
    "STATUS_MISSING_SCHEDULER",
    "STATUS_MISSING_TEXT",
    "STREAM_VERSION",
    "End",
    "Envelope",
    "InbandError",
    "bind_current",
    "decode_event",
    "encode_envelopes",
    "end_item",
    "event",
    "frame_item",
    "lost_reason",
    "parse_envelopes",
    "record_extent",
    "use_claim",
]

# The request header and the version of this format (version 1 was the removed
# per-run subscription stream).
HEADER = "X-ParallelHue-Telemetry"
STREAM_VERSION = 2
EVENT_NAME = "parallelhue"

ITEM_FRAME, ITEM_END = 1, 2
MAX_FRAME_ITEM = 65536  # MAX_FRAME_BYTES of the frame protocol
# The items of one event at most (before base64): the encoder cuts there.
MAX_EVENT_ITEMS_BYTES = 256 << 10

# End item status: what the response's telemetry is missing (0: nothing).
STATUS_COMPLETE = 0
STATUS_MISSING_SCHEDULER = 1
STATUS_MISSING_TEXT = 2
STATUS_MISSING_BOTH = 3
STATUS_DROPPED = 4
STATUS_HUB_CLOSED = 5

_ITEM = struct.Struct("<BI")
# status, reserved, frames, dropped, waited_us
_END = struct.Struct("<HHIII")
_END_ITEM_HEADER = _ITEM.pack(ITEM_END, _END.size)


class InbandError(ValueError):
    """An in-band event that breaks docs/PROTOCOL.md; the message is normative."""


# ------------------------------------------------------------------ items and events
def frame_item(frame: bytes) -> bytes:
    if not 1 <= len(frame) <= MAX_FRAME_ITEM:
        raise ValueError(f"frame of {len(frame)} bytes cannot be a frame item")
    return _ITEM.pack(ITEM_FRAME, len(frame)) + frame


def end_item(status: int, frames: int, dropped: int, waited_us: int) -> bytes:
    return _END_ITEM_HEADER + _END.pack(
        status, 0, min(frames, 0xFFFFFFFF), min(dropped, 0xFFFFFFFF), min(waited_us, 0xFFFFFFFF)
    )


def event(items: bytes) -> bytes:
    """One SSE event carrying `items` (whole items)."""
    return b"event: parallelhue\ndata: " + base64.b64encode(items) + b"\n\n"


@dataclass(frozen=True, slots=True)
class End:
    """The end item: `frames` frame items came before it in this response."""

    status: int
    frames: int
    dropped: int
    waited_us: int


def decode_event(data: str) -> list[bytes | End]:
    """The items of one `parallelhue` event's data (the reference decoder): frames as
    bytes, the end item as End. Raises InbandError with the normative message."""
    text = data
    if not text or len(text) % 4 or not text.isascii():
        raise InbandError("in-band telemetry: event data is not base64")
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise InbandError("in-band telemetry: event data is not base64") from None
    if base64.b64encode(raw).decode("ascii") != text:
        # Non-canonical padding bits: a second spelling of the same bytes.
        raise InbandError("in-band telemetry: event data is not base64")
    items: list[bytes | End] = []
    at = 0
    size = len(raw)
    while at < size:
        if size - at < _ITEM.size:
            raise InbandError(
                f"in-band telemetry: truncated item header at byte {at}: "
                f"{size - at} of {_ITEM.size} bytes"
            )
        kind, length = _ITEM.unpack_from(raw, at)
        if kind == ITEM_FRAME:
            if not 1 <= length <= MAX_FRAME_ITEM:
                raise InbandError(
                    f"in-band telemetry: frame item at byte {at} of {length} bytes "
                    f"(1..={MAX_FRAME_ITEM})"
                )
        elif kind == ITEM_END:
            if length != _END.size:
                raise InbandError(
                    f"in-band telemetry: end item at byte {at} of {length} bytes "
                    f"(exactly {_END.size})"
                )
        else:
            raise InbandError(f"in-band telemetry: unknown item type {kind} at byte {at}")
        start = at + _ITEM.size
        if size - start < length:
            raise InbandError(
                f"in-band telemetry: truncated item at byte {at}: {size - start} of {length} bytes"
            )
        payload = raw[start : start + length]
        if kind == ITEM_FRAME:
            items.append(payload)
        else:
            status, reserved, frames, dropped, waited = _END.unpack(payload)
            if reserved:
                raise InbandError(f"in-band telemetry: end item at byte {at}: reserved {reserved}")
            items.append(End(status, frames, dropped, waited))
        at = start + length
    return items


def lost_reason(end: End) -> str | None:
    """The reconciler's reason when an end item says telemetry is missing (None: none).

    The numbers are the server's statement (docs/PROTOCOL.md): they only word
    the reason; any non-complete status fails the stream."""
    status = end.status
    if status == STATUS_COMPLETE:
        return None
    waited = f"{end.waited_us // 1000} ms"
    if status == STATUS_MISSING_SCHEDULER:
        return (
            f"telemetry lost: the scheduler's frames of the final step did not come within {waited}"
        )
    if status == STATUS_MISSING_TEXT:
        who = "the detokenizer's frames of the final step"
        return f"telemetry lost: {who} did not come within {waited}"
    if status == STATUS_MISSING_BOTH:
        return f"telemetry lost: no frame of the final step came within {waited}"
    if status == STATUS_DROPPED:
        why = "(the response was read too slowly)"
        return f"telemetry lost: {end.dropped} frames dropped by the server {why}"
    if status == STATUS_HUB_CLOSED:
        return "telemetry lost: the server's telemetry hub shut down"
    return f"telemetry lost: the server ended this response's telemetry with status {status}"


# ------------------------------------------------------------------ envelopes
ENVELOPE_MAGIC = b"PHIB"
# A record in the frame says the request finished (provenance or text flag 1).
FLAG_FINISHED = 1
# The source sends nothing more for this request.
FLAG_CLOSED = 2
# The frontend refused the request (a notice says why): no provenance is needed.
FLAG_REFUSED = 4
# flags, role, key length, end_tokens, frame length
_ENTRY = struct.Struct("<BBHII")
# Datagrams to a hub at most this long (several envelopes per datagram).
MAX_ENVELOPE_DATAGRAM = 192 << 10


@dataclass(frozen=True, slots=True)
class Envelope:
    """One frame (or none: a closing mark) for the request `key`, with what the hub
    needs to know without reading the frame: the sender's role, its flags, and the
    request's tokens the sender has accounted for so far (`end_tokens`)."""

    key: bytes
    role: int
    flags: int
    end_tokens: int
    frame: bytes


def encode_envelopes(envelopes: list[Envelope]) -> list[bytes]:
    """Datagrams of at most MAX_ENVELOPE_DATAGRAM bytes (one envelope may stand alone)."""
    datagrams: list[bytes] = []
    parts: list[bytes] = [ENVELOPE_MAGIC]
    used = len(ENVELOPE_MAGIC)
    for envelope in envelopes:
        entry = (
            _ENTRY.pack(
                envelope.flags,
                envelope.role,
                len(envelope.key),
                envelope.end_tokens,
                len(envelope.frame),
            )
            + envelope.key
            + envelope.frame
        )
        if used + len(entry) > MAX_ENVELOPE_DATAGRAM and len(parts) > 1:
            datagrams.append(b"".join(parts))
            parts = [ENVELOPE_MAGIC]
            used = len(ENVELOPE_MAGIC)
        parts.append(entry)
        used += len(entry)
    if len(parts) > 1:
        datagrams.append(b"".join(parts))
    return datagrams


def parse_envelopes(data: bytes) -> list[Envelope] | None:
    """The envelopes of one datagram; None when it is not one (counted as rejected)."""
    if data[:4] != ENVELOPE_MAGIC:
        return None
    out: list[Envelope] = []
    at = 4
    size = len(data)
    while at < size:
        if size - at < _ENTRY.size:
            return None
        flags, role, key_len, end_tokens, frame_len = _ENTRY.unpack_from(data, at)
        at += _ENTRY.size
        if size - at < key_len + frame_len or frame_len > MAX_FRAME_ITEM or not key_len:
            return None
        key = data[at : at + key_len]
        at += key_len
        out.append(Envelope(key, role, flags, end_tokens, data[at : at + frame_len]))
        at += frame_len
    return out


def record_extent(record: bytes) -> tuple[int, int, bool]:
    """(stream, tokens up to the record's end, finished) of an encoded provenance or
    text record: both begin `u16 stream, u8 flags, u8 finish, u32 offset, u16 n_tokens`
    (docs/PROTOCOL.md), and flag 1 is `finished` in both."""
    stream, flags, _finish, offset, count = _RECORD_HEAD.unpack_from(record)
    return stream, offset + count, bool(flags & 1)


_RECORD_HEAD = struct.Struct("<HBBIH")


# ------------------------------------------------------------------ the request's claim
# Set around one HTTP request by the server (endpoint.py, the simulated engine): the
# frontend hook reads it when vLLM registers that request, in the request's own task.
_CURRENT: contextvars.ContextVar[Claim | None] = contextvars.ContextVar(
    "parallelhue_inband_claim", default=None
)


def use_claim(claim: Claim | None) -> contextvars.Token[Claim | None]:
    return _CURRENT.set(claim)


def reset_claim(token: contextvars.Token[Claim | None]) -> None:
    _CURRENT.reset(token)


def bind_current(request_id: str) -> bool:
    """Bind the claim of the request being served (if it asked for in-band telemetry)
    to vLLM's internal id of that request. True when it was bound now."""
    claim: Any = _CURRENT.get()
    if claim is None:
        return False
    bound: bool = claim.bind(request_id)
    return bound
