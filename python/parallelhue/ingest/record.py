"""`--record` files: the ordered inputs a run's reconciler applied, and reading them back.

One format for both paths (version 3, rust/core/src/record.rs): a gzip'd
stream of binary items — header, each stream's start, every SSE delta, SSE
finish, telemetry frame, rejected datagram and telemetry loss in the order the reconciler
applied them, each stream's abnormal end, finalize — with times in seconds
since the run started, then a footer. On the Rust path the tap inside the
reconciler's lock writes it (`Reconciler.record`); on the reference path
`RecordWriter`, the same encoder and writer, is fed by `driver.RunDriver`. Because
the reconcilers are deterministic, replaying the inputs in the same order
gives the same spans and verdicts; replay checks that and says so.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..model.sanitize import one_line

__all__ = [
    "FORMAT_VERSION",
    "RecordWriterLike",
    "Recording",
    "RecordingError",
    "open_writer",
    "read_recording",
    "write_recording",
]

FORMAT_VERSION = 3
# The key of a version-1 recording's JSON header line.
_V1_MAGIC_KEY = "parallelhue_recording"


class RecordingError(Exception):
    """An unreadable or unwritable recording; one line naming the problem."""


class RecordWriterLike(Protocol):
    """The reference path's recorder: one item per call, timed at the call."""

    def start(self, stream: int) -> None: ...
    def sse(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def sse_input(self, item: tuple[Any, ...]) -> None: ...
    def finish(self, stream: int, reason: str | None) -> None: ...
    def end(self, stream: int, kind: str, status: int, detail: str) -> None: ...
    def frames(self, frames: list[bytes]) -> None: ...
    def lost(self, frames: int | None) -> None: ...
    def stream_lost(self, stream: int, reason: str) -> None: ...
    def finalize(self) -> None: ...
    def close(self, footer: dict[str, Any] | None) -> None: ...


class _Recorder:
    """`parallelhue._native.RecordWriter` (the tap's encoder and writer) for a
    session that feeds its reconciler from Python."""

    def __init__(self, writer: Any) -> None:
        self._writer = writer

    def start(self, stream: int) -> None:
        self._writer.start(stream)

    def sse(self, stream: int, text: str, token_ids: list[int]) -> None:
        self._writer.sse(stream, text, token_ids)

    def sse_input(self, item: tuple[Any, ...]) -> None:
        """An SSE input other than a delta: the C2 tuple (kind, stream, ...)."""
        kind, *fields = item
        getattr(self._writer, kind)(*fields)

    def finish(self, stream: int, reason: str | None) -> None:
        self._writer.finish(stream, reason)

    def end(self, stream: int, kind: str, status: int, detail: str) -> None:
        self._writer.end(stream, kind, status, detail)

    def frames(self, frames: list[bytes]) -> None:
        self._writer.frames(frames)

    def lost(self, frames: int | None) -> None:
        self._writer.lost(frames)

    def stream_lost(self, stream: int, reason: str) -> None:
        self._writer.stream_lost(stream, reason)

    def finalize(self) -> None:
        self._writer.finalize()

    def close(self, footer: dict[str, Any] | None) -> None:
        try:
            self._writer.close(None if footer is None else json.dumps(footer, ensure_ascii=False))
        except OSError as error:
            raise RecordingError(f"--record: writing failed: {error.strerror or error}") from None


def open_writer(path: str, header: dict[str, Any]) -> RecordWriterLike:
    """The reference path's recorder (it needs the native extension: one writer)."""
    try:
        from .._native import RecordWriter
    except ImportError as error:
        raise RecordingError(
            f"--record needs the parallelhue._native extension: run `make native` ({error})"
        ) from None
    try:
        writer = RecordWriter(path, json.dumps(header, ensure_ascii=False))
    except OSError as error:
        raise RecordingError(f"--record: cannot write {path}: {error.strerror or error}") from None
    return _Recorder(writer)


# SSE inputs other than a delta: the C2 tuple (kind, stream, ...) as recorded
# ("sse_counts": a stock server's step counters, for the server-reported tier only).
SSE_FIELD_KINDS = frozenset(("sse_id", "sse_choice", "sse_usage", "sse_counts"))
# Recorded events the reconciler applied; the rest (start, end, reject, lost,
# finalize, sse_counts) are the run's own events.
RECONCILER_INPUT_KINDS = frozenset(("frame", "sse", "finish", "sse_id", "sse_choice", "sse_usage"))


@dataclass
class Recording:
    header: dict[str, Any]
    # (time, kind, ...): ("start", s) ("sse", s, text, ids) ("sse_id", s, id)
    # ("sse_choice", s, index) ("sse_usage", s, n, accepted, drafted)
    # ("sse_counts", s, "timings" | "spec", a, b, c) ("finish", s, reason)
    # ("end", s, kind, status, detail) ("frame", bytes) ("reject", reason)
    # ("lost", frames | None) ("stream_lost", stream, reason) ("finalize",)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    footer: dict[str, Any] | None = None

    def reconciler_inputs(self) -> list[tuple[Any, ...]]:
        """The inputs in the order the reconciler applied them, without times."""
        return [tuple(e[1:]) for e in self.events if e[1] in RECONCILER_INPUT_KINDS]


def _json_object(text: str, what: str, shown: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise RecordingError(f"replay: {shown}: the recording's {what} is not a JSON object")
    return value


def read_recording(path: str) -> Recording:
    """Load a recording; every problem is a RecordingError with one line."""
    shown = one_line(path)
    try:
        with gzip.open(path, "rb") as handle:
            data = handle.read()
    except (zlib.error, EOFError) as error:
        # A flipped byte inside the compressed data, or a file cut short.
        why = "ends early" if isinstance(error, EOFError) else "does not decompress"
        raise RecordingError(f"replay: {shown} is damaged (its gzip data {why})") from None
    except gzip.BadGzipFile as error:
        if not str(error).startswith("Not a gzipped file"):  # a CRC or length mismatch
            raise RecordingError(
                f"replay: {shown} is damaged (its gzip checksum does not match)"
            ) from None
        raise RecordingError(
            f"replay: {shown} is not a ParallelHue recording ({one_line(str(error))})"
        ) from None
    except OSError as error:
        reason = error.strerror or str(error)
        raise RecordingError(
            f"replay: {shown} is not a ParallelHue recording ({one_line(reason)})"
        ) from None
    if not data:
        raise RecordingError(f"replay: {shown} is empty")
    if data.startswith(b"{"):
        first = data.split(b"\n", 1)[0]
        try:
            header = json.loads(first)
        except ValueError:
            header = None
        if isinstance(header, dict) and _V1_MAGIC_KEY in header:
            raise RecordingError(
                f"replay: {shown} has recording format {one_line(str(header[_V1_MAGIC_KEY]))} "
                f"(JSON lines), this build reads {FORMAT_VERSION}: record the run again"
            )
    try:
        from .._native import decode_recording
    except ImportError as error:
        raise RecordingError(
            f"replay needs the parallelhue._native extension: run `make native` ({error})"
        ) from None
    try:
        header_text, events, footer_text = decode_recording(data)
    except ValueError as error:
        raise RecordingError(f"replay: {shown}: {one_line(str(error))}") from None
    header = _json_object(header_text, "header", shown)
    footer = None if footer_text is None else _json_object(footer_text, "footer", shown)
    return Recording(header=header, events=list(events), footer=footer)


def write_recording(path: str, recording: Recording) -> None:
    """Write `recording` (e.g. an edited one) to `path`, items with their times.

    For tools and tests; live runs write through the tap or `open_writer`."""
    from .._native import encode_recording

    footer = None if recording.footer is None else json.dumps(recording.footer)
    data = encode_recording(json.dumps(recording.header), recording.events, footer)
    with gzip.open(path, "wb") as handle:
        handle.write(data)
