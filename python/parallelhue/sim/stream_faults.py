"""Faults of the HTTP telemetry stream, applied by the simulated engine's route.

The datagram faults (`faults.FaultProxy`) lose frames between the emitters
and a socket; these lose them where the HTTP path loses them: after the hub,
in the stream a subscriber reads. They rewrite the route's chunks (whole
items, docs/PROTOCOL.md "HTTP telemetry stream") once a subscriber's stream
has carried `skip_frames` frame items:

- `stream-drop:N`: the next N frame items are discarded and a `dropped` item
  saying N takes their place, exactly what a hub whose buffer was full sends;
- `stream-end`: the stream ends there with an end item (code 3, "other");
- `stream-close`: the connection closes there without an end item.

The frames themselves are never changed, so what the client sees is
byte for byte what a real hub or a lost connection would give it.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass, field

from parallelhue_vllm import telemetry_stream as ts

from .config import FaultConfig

__all__ = ["END_MESSAGE", "StreamFaults", "StreamOutput"]

log = logging.getLogger("parallelhue.sim")

END_MESSAGE = "SIMULATED fault stream-end: the server ended the telemetry stream mid-run"
_ITEM = struct.Struct("<BI")


@dataclass(slots=True)
class StreamOutput:
    """What the route writes for one chunk, and whether the stream stops after it."""

    data: bytes
    # "end": the end item is in `data`, finish the body; "close": drop the connection.
    stop: str | None = None


@dataclass(slots=True)
class StreamFaults:
    """One subscriber's stream faults (a new instance per stream)."""

    config: FaultConfig
    frames_seen: int = 0
    dropped: int = 0
    fired: dict[str, int] = field(default_factory=dict)

    def apply(self, chunk: bytes) -> StreamOutput:
        """Rewrite one chunk of whole items (the preamble passes untouched)."""
        if chunk[:4] == ts.STREAM_MAGIC and len(chunk) == ts.PREAMBLE_SIZE:
            return StreamOutput(chunk)
        config = self.config
        out = bytearray()
        at = 0
        while at + ts.ITEM_HEADER_SIZE <= len(chunk):
            kind, length = _ITEM.unpack_from(chunk, at)
            end = at + ts.ITEM_HEADER_SIZE + length
            item = chunk[at:end]
            at = end
            if kind != ts.ITEM_FRAME or self.frames_seen < config.skip_frames:
                self.frames_seen += kind == ts.ITEM_FRAME
                out += item
                continue
            if config.stream_close:
                self._fire("stream_close")
                return StreamOutput(bytes(out), "close")
            if config.stream_end:
                self._fire("stream_end")
                return StreamOutput(bytes(out) + ts.end_item(ts.END_OTHER, END_MESSAGE), "end")
            if self.dropped < config.stream_drop:
                self.dropped += 1
                if self.dropped == config.stream_drop:
                    self._fire("stream_drop")
                    out += ts.dropped_item(self.dropped)
                continue
            out += item
        return StreamOutput(bytes(out) + chunk[at:])

    def _fire(self, name: str) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1
        log.info("SIMULATED fault injected: %s", name.replace("_", "-"))
