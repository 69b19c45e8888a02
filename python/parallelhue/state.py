"""What the screen shows about a run: one `StreamState` per stream, one `RunModel` per run.

The session and the replayer write into these; the views only read them. The
coloring rule lives here so every view (and the export) applies it the same
way: a character is colored by its engine step only inside a span the
reconciler proved; a mixed span stays uncolored; `SSE CHUNK MODE` colors by SSE
chunk; nothing is colored for a non-speculative server or under NO_COLOR.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from .backend import Backend
from .sanitize import one_line

__all__ = [
    "LABEL_CHUNK",
    "LABEL_ERROR",
    "LABEL_EXACT",
    "LABEL_NOT_EXACT",
    "LABEL_VERIFYING",
    "PALETTE",
    "RunModel",
    "Segment",
    "StreamState",
]

# xterm-256 green, red, blue, yellow: one color per new step, cycling.
PALETTE = (46, 196, 27, 226)

LABEL_EXACT = "EXACT TOKEN PROVENANCE"
LABEL_CHUNK = "SSE CHUNK MODE"
LABEL_VERIFYING = "VERIFYING"
LABEL_NOT_EXACT = "NOT EXACT"
LABEL_ERROR = "ERROR"

Segment = tuple[str, int | None]  # text (raw, sanitized by the renderer), xterm color


# Compact reprs: asyncio's end-of-run signal bookkeeping (Python 3.11) formats
# the main task's result with repr(), and a full dataclass repr of a run's
# texts and times cost ~0.2 s per call at 128k tokens.
@dataclass(repr=False)
class StreamState:
    index: int
    mode: str  # the run's mode: exact, auto or chunk
    prompt: str = ""
    chunks: list[str] = field(default_factory=list)
    sse_byte_count: int = 0  # UTF-8 bytes of the SSE text so far
    sse_tokens: int = 0
    spans: list[tuple[str, int | None]] = field(default_factory=list)
    # The last span's start and text: proven_bytes is computed from them when read
    # (once per redraw), not for every span.
    last_span: tuple[int, str] = (0, "")
    verdict: str = "pending"  # pending, exact, failed
    reason: str | None = None
    error: str | None = None  # the HTTP stream's own failure
    sse_finished: bool = False
    finish_reason: str | None = None
    started_at: float | None = None
    first_token_at: float | None = None
    delta_times: list[float] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    stats: dict[str, Any] = field(default_factory=dict)  # reconciler stream_stats

    def __repr__(self) -> str:
        return (
            f"StreamState(index={self.index}, mode={self.mode!r}, verdict={self.verdict!r}, "
            f"sse_tokens={self.sse_tokens}, chunks={len(self.chunks)}, spans={len(self.spans)})"
        )

    # --- inputs -----------------------------------------------------------------

    def add_delta(self, text: str, token_ids: list[int], now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        self.delta_times.append(now)
        self.sse_tokens += len(token_ids)
        if text:
            self.chunks.append(text)
            self.sse_byte_count += len(text.encode("utf-8"))

    def add_reads(self, texts: list[str], times: list[float], tokens: int, text_bytes: int) -> None:
        """Several deltas read by the Rust SSE thread: the same state as `add_delta`
        for each (one arrival time per delta), `texts` being the non-empty ones."""
        if not times:
            return
        if self.first_token_at is None:
            self.first_token_at = times[0]
        self.delta_times.extend(times)
        self.sse_tokens += tokens
        self.chunks.extend(texts)
        self.sse_byte_count += text_bytes

    def add_span(self, byte_start: int, text: str, step_index: int | None) -> None:
        # Spans arrive in order and cover the text contiguously (PROTOCOL.md).
        self.spans.append((text, step_index))
        self.last_span = (byte_start, text)

    @property
    def proven_bytes(self) -> int:
        """SSE bytes proven so far: where the last span ends."""
        start, text = self.last_span
        return start + len(text.encode("utf-8")) if text else start

    def fail_http(self, message: str) -> None:
        self.error = message

    # --- what to show -----------------------------------------------------------

    @property
    def shows_chunks(self) -> bool:
        """Chunk mode, or auto mode after this stream was downgraded."""
        return self.mode == "chunk" or (self.mode == "auto" and self.verdict == "failed")

    @property
    def label(self) -> str:
        if self.error is not None:
            return LABEL_ERROR
        if self.shows_chunks:
            return LABEL_CHUNK
        if self.verdict == "exact":
            return LABEL_EXACT
        if self.verdict == "failed":
            return LABEL_NOT_EXACT
        return LABEL_VERIFYING

    @property
    def note(self) -> str | None:
        """One line under the text: why the stream is not exact, or its HTTP failure."""
        if self.error is not None:
            return f"error: {self.error}"
        if self.verdict == "failed" and self.reason:
            prefix = "downgraded: " if self.mode == "auto" else "not exact: "
            return prefix + one_line(self.reason)
        return None

    @property
    def text(self) -> str:
        return "".join(self.chunks)

    def unproven_tail(self) -> str:
        """The SSE text after the proven bytes, read back from the last chunks only."""
        missing = self.sse_byte_count - self.proven_bytes
        if missing <= 0:
            return ""
        gathered: list[bytes] = []
        have = 0
        for chunk in reversed(self.chunks):
            data = chunk.encode("utf-8")
            gathered.append(data)
            have += len(data)
            if have >= missing:
                break
        gathered.reverse()
        return b"".join(gathered)[-missing:].decode("utf-8", "replace")

    def segments(self, colorize: bool) -> list[Segment]:
        """The stream's text cut into colored pieces by the coloring rule."""
        if self.shows_chunks:
            return [
                (chunk, PALETTE[i % len(PALETTE)] if colorize else None)
                for i, chunk in enumerate(self.chunks)
            ]
        pieces: list[Segment] = [
            (text, PALETTE[step % len(PALETTE)] if colorize and step is not None else None)
            for text, step in self.spans
        ]
        if self.mode == "auto" and self.verdict != "exact":
            # auto shows the text at once; the unproven tail stays uncolored.
            tail = self.unproven_tail()
            if tail:
                pieces.append((tail, None))
        return pieces

    def tail_segments(self, colorize: bool, max_chars: int) -> list[Segment]:
        """The last pieces of `segments(colorize)` holding at least `max_chars` characters.

        Equal to the tail `styled_text(..., max_chars=...)` keeps, but walks back
        from the end only: a redraw costs what is visible, not the stream's length.
        """
        pieces: list[Segment] = []
        total = 0
        if self.shows_chunks:
            chunks = self.chunks
            index = len(chunks) - 1
            while index >= 0 and total < max_chars:
                chunk = chunks[index]
                pieces.append((chunk, PALETTE[index % len(PALETTE)] if colorize else None))
                total += len(chunk)
                index -= 1
            pieces.reverse()
            return pieces
        if self.mode == "auto" and self.verdict != "exact":
            tail = self.unproven_tail()
            if tail:
                pieces.append((tail, None))
                total = len(tail)
        spans = self.spans
        index = len(spans) - 1
        while index >= 0 and total < max_chars:
            text, step = spans[index]
            color = PALETTE[step % len(PALETTE)] if colorize and step is not None else None
            pieces.append((text, color))
            total += len(text)
            index -= 1
        pieces.reverse()
        return pieces

    # --- numbers ----------------------------------------------------------------

    @property
    def steps(self) -> int | None:
        return None if self.mode == "chunk" else int(self.stats.get("steps", 0))

    @property
    def tokens_per_step(self) -> float | None:
        steps = self.steps
        if not steps:
            return None
        return int(self.stats.get("tokens", 0)) / steps

    @property
    def acceptance(self) -> float | None:
        return acceptance_of(self.stats)

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None or self.started_at is None:
            return None
        return self.first_token_at - self.started_at

    def inter_step_gaps(self) -> list[float]:
        times = self.delta_times
        return [b - a for a, b in itertools.pairwise(times)]


def acceptance_of(stats: dict[str, Any]) -> float | None:
    """accepted / (drafts_scheduled - drafts_padded), None without real drafts."""
    drafted = int(stats.get("drafts_scheduled", 0)) - int(stats.get("drafts_padded", 0))
    if drafted <= 0:
        return None
    return int(stats.get("accepted", 0)) / drafted


@dataclass(repr=False)
class RunModel:
    streams: list[StreamState]
    mode: str
    backend: Backend
    no_color: bool
    title: str = "ParallelHue"
    simulated: bool = False
    reconciler_kind: str = "rust"
    run_messages: list[str] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)  # hello frames seen
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    server_deltas: list[tuple[str, float]] = field(default_factory=list)
    # How precise the SSE arrival times are, when not to the read (the Rust reader).
    arrival_note: str = ""
    finished: bool = False
    interrupted: bool = False

    def __repr__(self) -> str:
        return (
            f"RunModel(streams={len(self.streams)}, mode={self.mode!r}, "
            f"backend={self.backend.name!r}, finished={self.finished})"
        )

    @property
    def colorize(self) -> bool:
        return self.backend.speculative and not self.no_color

    @property
    def banner(self) -> str:
        parts = []
        if self.simulated or self.backend.simulated:
            parts.append("SIMULATED ENGINE")
        parts.append(f"mode {self.mode}")
        parts.append(f"backend {self.backend.name} ({self.backend.evidence})")
        if not self.backend.speculative:
            parts.append("monochrome: no speculative decoding proven")
        return " · ".join(parts)

    def count_labels(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stream in self.streams:
            counts[stream.label] = counts.get(stream.label, 0) + 1
        return counts
