"""Record a run's inputs and replay them into a fresh reconciler.

The recording is gzip'd JSON lines: a header object, then one array per
reconciler input in the exact order the session fed them (SSE deltas, SSE
ends, raw telemetry frames, HTTP errors, finalize), each with its time in
seconds since the run started, then a footer object with the verdicts and the
server-wide numbers. Because the reconcilers are deterministic, replaying the
same inputs in the same order gives the same spans and verdicts; replay checks
that and says so.
"""

from __future__ import annotations

import base64
import gzip
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .sanitize import one_line

__all__ = ["FORMAT_VERSION", "Recorder", "Recording", "RecordingError", "read_recording"]

FORMAT_VERSION = 1
_MAGIC_KEY = "parallelhue_recording"


class RecordingError(Exception):
    """An unreadable recording; one line naming the problem."""


class Recorder:
    """Appends a run's inputs to a gzip'd JSON-lines file as they happen."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        try:
            self._file = gzip.GzipFile(path, "wb", compresslevel=6)
        except OSError as error:
            raise RecordingError(f"--record: cannot write {path}: {error.strerror}") from None
        self._start = time.monotonic()
        self._write({_MAGIC_KEY: FORMAT_VERSION, **header})

    def _write(self, item: object) -> None:
        self._file.write(json.dumps(item, ensure_ascii=False, separators=(",", ":")).encode())
        self._file.write(b"\n")

    def clock(self) -> float:
        """Seconds since the run started, rounded as stored: the live run uses these
        exact values too, so a replay computes the same latencies to the last digit."""
        return round(time.monotonic() - self._start, 6)

    def start(self, at: float, stream: int) -> None:
        self._write([at, "start", stream])

    def sse(self, at: float, stream: int, text: str, token_ids: list[int]) -> None:
        self._write([at, "sse", stream, text, token_ids])

    def finish(self, at: float, stream: int, reason: str) -> None:
        self._write([at, "fin", stream, reason])

    def error(self, at: float, stream: int, message: str) -> None:
        self._write([at, "err", stream, message])

    def frames(self, at: float, frames: list[bytes]) -> None:
        for frame in frames:
            self._write([at, "frame", base64.b64encode(frame).decode("ascii")])

    def finalize(self, at: float) -> None:
        self._write([at, "finalize"])

    def close(self, footer: dict[str, Any]) -> None:
        self._write({"end": self.clock(), **footer})
        self._file.close()

    def abandon(self) -> None:
        """Close without a footer (interrupted run); the file stays readable."""
        self._file.close()


@dataclass
class Recording:
    header: dict[str, Any]
    events: list[list[Any]] = field(default_factory=list)
    footer: dict[str, Any] | None = None

    def iter_events(self) -> Iterator[list[Any]]:
        return iter(self.events)


def read_recording(path: str) -> Recording:
    """Load a recording; every problem is a RecordingError with one line."""
    shown = one_line(path)
    try:
        with gzip.open(path, "rb") as handle:
            raw_lines = handle.read().splitlines()
    except (OSError, EOFError) as error:
        reason = getattr(error, "strerror", None) or str(error)
        raise RecordingError(
            f"replay: {shown} is not a ParallelHue recording ({one_line(reason)})"
        ) from None
    if not raw_lines:
        raise RecordingError(f"replay: {shown} is empty")
    try:
        header = json.loads(raw_lines[0])
    except ValueError:
        header = None
    if not isinstance(header, dict) or _MAGIC_KEY not in header:
        raise RecordingError(f"replay: {shown} is not a ParallelHue recording")
    if header[_MAGIC_KEY] != FORMAT_VERSION:
        raise RecordingError(
            f"replay: {shown} has recording format {one_line(str(header[_MAGIC_KEY]))}, "
            f"this build reads {FORMAT_VERSION}"
        )
    recording = Recording(header=header)
    for number, raw in enumerate(raw_lines[1:], start=2):
        try:
            item = json.loads(raw)
        except ValueError:
            raise RecordingError(f"replay: {shown} line {number} is not JSON") from None
        if isinstance(item, dict):
            recording.footer = item
        elif isinstance(item, list) and len(item) >= 2 and isinstance(item[1], str):
            recording.events.append(item)
        else:
            raise RecordingError(f"replay: {shown} line {number} is not a recorded event")
    return recording


def decode_frame_field(value: str) -> bytes:
    return base64.b64decode(value.encode("ascii"), validate=True)
