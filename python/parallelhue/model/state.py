"""What the screen shows about a run: one `StreamState` per stream, one `RunModel` per run.

The session and the replayer write into these; the views only read them. The
coloring rule lives here so every view (and the export) applies it the same
way: a character is colored by its engine step only inside a span the
reconciler proved; a mixed span stays uncolored; `SSE CHUNK MODE` colors by SSE
chunk; nothing is colored for a non-speculative server or under NO_COLOR.
Pieces carry style keys (labels.py), never colors: the painters decide.

A stream's SSE text is stored once, as UTF-8; its chunks and the proven spans
are runs of that text (end offsets with their steps), which is how the Rust
path delivers them (`Reconciler.take`): a redraw decodes only what it shows.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .advice import TelemetrySetup
from .backend import Backend
from .labels import (
    CHUNK_KEYS,
    LABEL_CANCELLED,
    LABEL_CHUNK,
    LABEL_ERROR,
    LABEL_EXACT,
    LABEL_NOT_EXACT,
    LABEL_QUEUED,
    LABEL_REPORTED,
    LABEL_VERIFYING,
)
from .reported import Reported, ReportedInputs, judge
from .sanitize import one_line
from .shapes import SourceInfo, Usage
from .spans import (
    NO_ROLE,
    NO_STEP,
    SpanStore,
    append_le,
    new_span_records,
    tail_keys,
    tail_pieces,
)

__all__ = [
    "SIMULATED_LABEL",
    "RunModel",
    "Segment",
    "StreamState",
    "acceptance_of",
    "telemetry_expected",
]

# Everything from the embedded simulator says so, on screen, in summaries and exports.
SIMULATED_LABEL = "SIMULATED ENGINE"

Segment = tuple[str, str | None]  # text (raw, sanitized by the layout), style key


def telemetry_expected(counters: Mapping[str, Any]) -> bool:
    """Whether telemetry can still arrive after the SSE streams ended.

    A server with the plugin sends its hello and the first step records while
    the first tokens are generated; when not one datagram came in by the end of
    every stream, none is coming (the grace period would only delay the verdict).
    """
    return int(counters.get("frames", 0)) > 0


class _Runs:
    """Runs of one stream's UTF-8 text: run `i` is `data[ends[i-1]:ends[i]]`."""

    __slots__ = ("_data", "_ends")

    def __init__(self, data: bytearray, ends: array[int]) -> None:
        self._data = data
        self._ends = ends

    def __len__(self) -> int:
        return len(self._ends)

    def text(self, i: int) -> str:
        if i < 0:
            i += len(self._ends)
        start = self._ends[i - 1] if i > 0 else 0
        return self._data[start : self._ends[i]].decode("utf-8", "replace")

    def __getitem__(self, i: int) -> str:
        return self.text(i)

    def __iter__(self) -> Iterator[str]:
        return (self.text(i) for i in range(len(self._ends)))

    def __eq__(self, other: object) -> bool:
        """Equal to another run view or list with the same items (tests compare runs)."""
        if isinstance(other, _Runs | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self)!r})"


class _Spans:
    """The proven spans as (text, step index or None for a mixed span).

    `records` holds two u64 words per span, as the Rust path packs them
    (rust/core/src/spans.rs): its end offset in the stream's UTF-8 text, then
    `step | role << 32` (step NO_STEP: mixed; role NO_ROLE: none).
    """

    __slots__ = ("_data", "_records")

    def __init__(self, data: bytearray, records: SpanStore) -> None:
        self._data = data
        self._records = records

    def __len__(self) -> int:
        return len(self._records) // 2

    def end(self, i: int) -> int:
        return self._records[2 * i]

    def text(self, i: int) -> str:
        if i < 0:
            i += len(self)
        start = self._records[2 * i - 2] if i > 0 else 0
        return self._data[start : self._records[2 * i]].decode("utf-8", "replace")

    def step(self, i: int) -> int | None:
        value = self._records[2 * i + 1] & NO_STEP
        return None if value == NO_STEP else value

    def role(self, i: int) -> int | None:
        value = (self._records[2 * i + 1] >> 32) & NO_ROLE
        return None if value == NO_ROLE else value

    def __getitem__(self, i: int) -> tuple[str, int | None]:
        return self.text(i), self.step(i)

    def __iter__(self) -> Iterator[tuple[str, int | None]]:
        return (self[i] for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        """Equal to another span view or list with the same items (tests compare runs)."""
        if isinstance(other, _Spans | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"_Spans({list(self)!r})"


# Compact reprs: asyncio's end-of-run signal bookkeeping (Python 3.11) formats
# the main task's result with repr(), and a full dataclass repr of a run's
# texts and times cost ~0.2 s per call at 128k tokens.
@dataclass(repr=False)
class StreamState:
    index: int
    mode: str  # the run's mode: exact, auto or chunk
    prompt: str = ""
    sse_utf8: bytearray = field(default_factory=bytearray)  # the SSE text, once
    chunk_ends: array[int] = field(default_factory=lambda: array("Q"))  # non-empty deltas
    # When each non-empty delta arrived (the timeline; see add_text for its precision).
    chunk_times: array[float] = field(default_factory=lambda: array("d"))
    sse_tokens: int = 0  # token ids received over SSE
    # The proven spans, two words each (see _Spans): end offset, step | role << 32;
    # the Rust path's Reconciler.take appends to them itself.
    span_records: SpanStore = field(default_factory=lambda: new_span_records())
    verdict: str = "pending"  # pending, exact, failed
    reason: str | None = None
    error: str | None = None  # the HTTP stream's own failure
    cancelled: bool = False  # stopped by the client (exact mode, after another failed)
    sse_finished: bool = False
    finish_reason: str | None = None
    started_at: float | None = None
    # --requests: not sent yet; when its arrival time is (monotonic, None: at once).
    queued: bool = False
    scheduled_at: float | None = None
    slot: int | None = None  # which of the run's streams it went out on (RunModel.slots)
    first_token_at: float | None = None
    delta_times: array[float] = field(default_factory=lambda: array("d"))
    usage: Usage | None = None
    # reconciler.stream_stats (a StreamStats once the first update arrived)
    stats: Mapping[str, Any] = field(default_factory=dict)
    # The server's own statements about its steps (reported.py), collected on either
    # path; judged once the stream's SSE finished normally.
    reported_inputs: ReportedInputs = field(default_factory=ReportedInputs)
    reported: Reported | None = None
    # The run received no telemetry frame (no plugin): server-reported steps may
    # stand in for EXACT. Kept up to date by the feed.
    plugin_silent: bool = True
    # The server-reported pieces as span records (see _Spans), built once judged.
    reported_records: SpanStore | None = None

    def __repr__(self) -> str:
        return (
            f"StreamState(index={self.index}, mode={self.mode!r}, verdict={self.verdict!r}, "
            f"sse_tokens={self.sse_tokens}, chunks={len(self.chunk_ends)}, "
            f"spans={len(self.span_records) // 2})"
        )

    # --- inputs -----------------------------------------------------------------

    def add_delta(self, text: str, token_ids: list[int], now: float) -> None:
        """One SSE delta (the reference path and replay)."""
        data = text.encode("utf-8")  # before any change: a lone surrogate raises here
        if self.first_token_at is None:
            self.first_token_at = now
        self.delta_times.append(now)
        self.sse_tokens += len(token_ids)
        self.reported_inputs.add_delta(len(data), len(token_ids))
        if data:
            self.sse_utf8 += data
            self.chunk_ends.append(len(self.sse_utf8))
            self.chunk_times.append(now)

    def add_text(
        self,
        utf8: bytes,
        chunk_ends: bytes,
        times: bytes,
        tokens: int,
        reported: tuple[bytes, bytes, bytes, list[Any]] | None = None,
    ) -> None:
        """Deltas as the Rust path packs them (`Reconciler.take`): the new text
        once, where each non-empty delta ends, one arrival time per delta, and
        the server-reported tier's inputs."""
        if reported is not None:
            self.reported_inputs.add_packed(*reported)
        before = len(self.delta_times)
        chunks_before = len(self.chunk_ends)
        append_le(self.delta_times, times)
        if self.first_token_at is None and len(self.delta_times) > before:
            self.first_token_at = self.delta_times[before]
        self.sse_tokens += tokens
        self.sse_utf8 += utf8
        append_le(self.chunk_ends, chunk_ends)
        # Which delta each chunk came with is known when none was empty; else the
        # batch's last arrival stands for all of it (the timeline's precision).
        new_times = self.delta_times[before:]
        new_chunks = len(self.chunk_ends) - chunks_before
        if len(new_times) == new_chunks:
            self.chunk_times.extend(new_times)
        elif new_chunks and new_times:
            self.chunk_times.extend([new_times[-1]] * new_chunks)

    def add_span(
        self, byte_start: int, text: str, step_index: int | None, role: int | None = None
    ) -> None:
        """One span event (the reference path and replay); `role` is C2's 8th element."""
        # Spans arrive in order and cover the text contiguously (PROTOCOL.md);
        # should one start further on, the bytes between stay uncolored.
        records = self.span_records
        if byte_start > self.proven_bytes:
            records.extend((byte_start, NO_STEP | NO_ROLE << 32))
        step = NO_STEP if step_index is None else step_index
        role_code = NO_ROLE if role is None else role
        records.extend((byte_start + len(text.encode("utf-8")), step | role_code << 32))

    def add_span_runs(self, records: bytes) -> None:
        """Spans as the Rust path packs them (16 bytes each, see _Spans); the
        live path's `Reconciler.take` appends them to `span_records` itself."""
        self.span_records.frombytes(records)

    @property
    def has_roles(self) -> bool:
        """A span of it carried a token role (contract C2)."""
        return self.span_records.has_roles

    @property
    def chunks(self) -> _Runs:
        """The non-empty SSE deltas' texts, in order."""
        return _Runs(self.sse_utf8, self.chunk_ends)

    @property
    def spans(self) -> _Spans:
        """The proven spans, in order: (text, step index or None)."""
        return _Spans(self.sse_utf8, self.span_records)

    @property
    def sse_byte_count(self) -> int:
        """UTF-8 bytes of the SSE text so far."""
        return len(self.sse_utf8)

    @property
    def proven_bytes(self) -> int:
        """SSE bytes proven so far: where the last span ends."""
        return self.span_records[-2] if self.span_records else 0

    def fail_http(self, message: str) -> None:
        self.error = message

    @property
    def over(self) -> bool:
        """Its exchange ended (or was stopped): its stream is free for the next request."""
        return self.sse_finished or self.error is not None or self.cancelled

    # --- what to show -----------------------------------------------------------

    @property
    def shows_reported(self) -> bool:
        """Auto mode, no telemetry in the run, and the server's own statements
        about this stream's steps fit each other and the bytes received."""
        return (
            self.mode == "auto"
            and self.plugin_silent
            and self.verdict != "exact"
            and self.reported is not None
            and self.reported.fits
        )

    @property
    def reported_pending(self) -> bool:
        """Auto mode, no telemetry, and the server states its steps (llama-server's
        counters arrive per chunk): its verdict comes when the stream ends."""
        return (
            self.mode == "auto"
            and self.plugin_silent
            and self.reported is None
            and self.reported_inputs.says_anything
            and not self.over
        )

    @property
    def shows_chunks(self) -> bool:
        """Chunk mode, or auto mode after this stream was downgraded (and no
        server-reported steps stand in, or may still)."""
        if self.mode == "chunk":
            return True
        return (
            self.mode == "auto"
            and self.verdict == "failed"
            and not self.shows_reported
            and not self.reported_pending
        )

    def judge_reported(self, stop_strings: bool) -> None:
        """The SSE finished normally: judge the server's statements (reported.py)."""
        usage = self.usage.get("completion_tokens") if self.usage else None
        completion = usage if isinstance(usage, int) else self.reported_inputs.completion_tokens
        self.reported = judge(
            self.reported_inputs,
            completion_tokens=completion,
            stop_strings=stop_strings,
            text=bytes(self.sse_utf8),
        )
        records = new_span_records()
        words: list[int] = []
        for end, step, role in self.reported.pieces:
            step_word = NO_STEP if step is None else step
            words += (end, step_word | (NO_ROLE if role is None else role) << 32)
        records.extend(words)
        self.reported_records = records

    @property
    def label(self) -> str:
        if self.error is not None:
            return LABEL_ERROR
        if self.cancelled and self.verdict != "exact":
            return LABEL_CANCELLED
        if self.queued:
            return LABEL_QUEUED
        if self.shows_reported:
            return LABEL_REPORTED
        if self.shows_chunks:
            return LABEL_CHUNK
        if self.reported_pending:
            return LABEL_VERIFYING
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
        if self.cancelled and self.queued:
            return "not sent: exact mode stopped the run after another stream failed"
        if self.cancelled and self.verdict != "exact":
            return "cancelled: exact mode stopped the run after another stream failed"
        reported = self.reported
        if self.shows_reported and reported is not None:
            what = f"steps as {reported.engine} reports them (one witness, not exact)"
            if reported.ambiguity is not None:
                what += f"; uncolored where they fit more than one way, {reported.ambiguity}"
            return what
        if self.reported_pending:
            return "server-reported steps: colored when the stream ends"
        if self.verdict == "failed" and self.reason:
            if self.mode == "auto" and reported is not None and reported.reason is not None:
                return f"downgraded: server-reported steps refused: {one_line(reported.reason)}"
            prefix = "downgraded: " if self.mode == "auto" else "not exact: "
            return prefix + one_line(self.reason)
        return None

    @property
    def text(self) -> str:
        return self.sse_utf8.decode("utf-8", "replace")

    def unproven_tail(self) -> str:
        """The SSE text after the proven bytes."""
        return self.sse_utf8[self.proven_bytes :].decode("utf-8", "replace")

    def segments(
        self, colorize: bool, color_by: str = "step", *, roles_known: bool = True
    ) -> list[Segment]:
        """The stream's text cut into styled pieces by the coloring rule."""
        return self.tail_segments(colorize, None, color_by, roles_known=roles_known)

    def tail_segments(
        self,
        colorize: bool,
        max_chars: int | None,
        color_by: str = "step",
        *,
        roles_known: bool = True,
    ) -> list[Segment]:
        """The last pieces of the styled text holding at least `max_chars` characters
        (all of them for None), walking back from the end only: a redraw costs what
        is visible, not the stream's length. `roles_known`: the run's reconciler
        reports token roles (RunModel.roles_known); else a role-less span is unproven."""
        limit = max_chars if max_chars is not None else -1
        pieces: list[Segment] = []
        total = 0
        if self.shows_chunks:
            chunks = self.chunks
            index = len(chunks) - 1
            while index >= 0 and (limit < 0 or total < limit):
                chunk = chunks.text(index)
                pieces.append((chunk, CHUNK_KEYS[index % len(CHUNK_KEYS)] if colorize else None))
                total += len(chunk)
                index -= 1
            pieces.reverse()
            return pieces
        if self.shows_reported and self.reported_records is not None:
            keys, by_role = tail_keys(colorize, color_by, True)
            return tail_pieces(
                self.sse_utf8, self.reported_records, limit, 0, keys, by_role, "mixed"
            )
        if self.mode == "auto" and self.verdict != "exact":
            # auto shows the text at once; the unproven tail stays uncolored (dim).
            tail = self.unproven_tail()
            if tail:
                pieces.append((tail, "unproven" if colorize else None))
                total = len(tail)
        # The hot path of every redraw, in Rust when built: the spans read back
        # from the end and decoded as _Spans.text does, each with its key
        # (spans.span_key's rule).
        keys, by_role = tail_keys(colorize, color_by, roles_known)
        spans = tail_pieces(self.sse_utf8, self.span_records, limit, total, keys, by_role, "mixed")
        spans.extend(pieces)  # the unproven tail comes last
        return spans

    def step_marks(self) -> list[tuple[float, int | None, int | None, int]]:
        """(arrival time, step, role, characters) per proven span, for the timeline:
        the time is the SSE arrival of the chunk holding the span's first byte."""
        ends = self.chunk_ends
        times = self.chunk_times
        if not ends or len(times) != len(ends):
            return []
        spans = self.spans
        marks = []
        start = 0
        for index in range(len(spans)):
            chunk = min(bisect.bisect_right(ends, start), len(ends) - 1)
            marks.append(
                (times[chunk], spans.step(index), spans.role(index), len(spans.text(index)))
            )
            start = spans.end(index)
        return marks

    def chunk_arrivals(self) -> list[float]:
        """When each non-empty delta arrived (the timeline of an unproven stream)."""
        return list(self.chunk_times)

    # --- numbers ----------------------------------------------------------------

    @property
    def tokens(self) -> int:
        """Tokens received: the SSE token ids, else the usage chunk's completion_tokens
        (servers that send no token ids)."""
        if self.sse_tokens:
            return self.sse_tokens
        completion = self.usage.get("completion_tokens") if self.usage else None
        return completion if isinstance(completion, int) and completion > 0 else 0

    @property
    def tokens_source(self) -> str:
        if self.sse_tokens:
            return "token_ids"
        return "usage" if self.tokens else "none"

    @property
    def figures(self) -> Mapping[str, Any]:
        """The statistics its label stands for: the server-reported tier's, else
        the reconciler's (empty in chunk mode)."""
        if self.shows_reported and self.reported is not None:
            return self.reported.stats()
        return self.stats if self.mode != "chunk" else {}

    @property
    def steps(self) -> int | None:
        """Proven engine steps; None when none was (chunk mode, no telemetry, not yet):
        not measured is never shown as 0."""
        return int(self.figures.get("steps", 0)) or None

    @property
    def tokens_per_step(self) -> float | None:
        steps = self.steps
        if not steps:
            return None
        return int(self.figures.get("tokens", 0)) / steps

    @property
    def acceptance(self) -> float | None:
        return acceptance_of(self.figures)

    @property
    def acceptance_frozen(self) -> bool:
        """The reconciler stops counting a stream when it fails: its figures cover
        only what was proven before the downgrade."""
        return self.verdict == "failed" and not self.shows_reported and self.acceptance is not None

    @property
    def ttft(self) -> float | None:
        if self.first_token_at is None or self.started_at is None:
            return None
        return self.first_token_at - self.started_at

    @property
    def last_at(self) -> float | None:
        return self.delta_times[-1] if self.delta_times else None

    @property
    def e2e(self) -> float | None:
        """Request start to the last SSE delta (vllm bench's end-to-end latency)."""
        last = self.last_at
        if last is None or self.started_at is None or self.error is not None:
            return None
        return last - self.started_at

    def inter_step_gaps(self) -> list[float]:
        times = self.delta_times
        return [b - a for a, b in itertools.pairwise(times)]


def acceptance_of(stats: Mapping[str, Any]) -> float | None:
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
    sources: list[SourceInfo] = field(default_factory=list)  # hello frames seen
    started_at: float = field(default_factory=time.monotonic)
    ended_at: float | None = None
    totals: Mapping[str, Any] = field(default_factory=dict)  # a StreamStats
    counters: Mapping[str, Any] = field(default_factory=dict)  # a Counters
    server_deltas: list[tuple[str, float]] = field(default_factory=list)
    # How precise the SSE arrival times are, when not to the read (the Rust reader).
    arrival_note: str = ""
    # Where the telemetry comes from and what vouches for it (telemetry.security_line).
    telemetry: str = ""
    finished: bool = False
    interrupted: bool = False
    # The stream whose failure stopped an exact-mode run (the first to fail).
    first_failure: int | None = None
    color_by: str = "step"  # step | role (--color)
    palette: str = "standard"  # style.PALETTES (--palette)
    model_name: str | None = None
    server: str | None = None  # host:port shown in the banner
    replay_of: str | None = None  # the recording being replayed
    # --requests N > --concurrency C: the screen shows C streams, each the latest request
    # started on it (`slots`: request index per stream; None: one stream per request).
    concurrency: int | None = None
    request_rate: float = math.inf
    slots: list[int] = field(default_factory=list)
    dispatch_at: float | None = None  # when the first request could go (arrival time 0)
    # The reconciler reports token roles (C2: 8-element span events, per-position stats).
    roles_reported: bool = False
    # How the telemetry was to arrive (None: chunk mode, or a recording without it), and
    # the one line naming the likely cause of missing evidence and its fix (advice.py):
    # every view, the summary and --json print it.
    telemetry_setup: TelemetrySetup | None = None
    fix: str | None = None
    # The requests carry stop strings (server-reported steps of vLLM then refuse:
    # its chunks hold text back).
    stop_strings: bool = False

    def __post_init__(self) -> None:
        if self.queueing and not self.slots:
            assert self.concurrency is not None
            self.slots = list(range(self.concurrency))

    def __repr__(self) -> str:
        return (
            f"RunModel(streams={len(self.streams)}, mode={self.mode!r}, "
            f"backend={self.backend.name!r}, finished={self.finished})"
        )

    @property
    def colorize(self) -> bool:
        return self.backend.speculative and not self.no_color

    @property
    def is_simulated(self) -> bool:
        return self.simulated or self.backend.simulated

    @property
    def nothing_received(self) -> bool:
        """Every stream failed the same way before a single byte of text: one line
        says all there is (no panes, no summary)."""
        streams = self.streams
        if not streams or any(s.error is None or len(s.delta_times) for s in streams):
            return False
        return len({s.error for s in streams}) == 1

    @property
    def wall_seconds(self) -> float | None:
        """First request to the last SSE delta: the generation, not the grace period
        for late telemetry nor the closing /metrics scrape."""
        starts = [s.started_at for s in self.streams if s.started_at is not None]
        ends = [s.last_at for s in self.streams if s.last_at is not None]
        if not starts or not ends:
            return None
        return max(0.0, max(ends) - min(starts))

    @property
    def roles_known(self) -> bool:
        """Whether a span without a role means "tokens of two roles" (mixed) rather
        than "no role proven": the reconciler reports roles (contract C2)."""
        if not self.roles_reported and any(s.has_roles for s in self.streams):
            self.roles_reported = True
        return self.roles_reported

    @property
    def queueing(self) -> bool:
        """More requests than streams: the screen shows streams, the summary requests."""
        return self.concurrency is not None and self.concurrency < len(self.streams)

    def start_stream(self, index: int, at: float) -> None:
        """Request `index` was sent at `at`: it takes the place of a finished request."""
        state = self.streams[index]
        state.started_at = at
        state.queued = False
        if not self.queueing:
            state.slot = index
            return
        slots = self.slots
        if index in slots:  # the first requests have their streams from the start
            state.slot = slots.index(index)
            return
        free = next((k for k, i in enumerate(slots) if self.streams[i].over), None)
        if free is None:  # cannot happen live; a hand-edited recording: the oldest
            free = min(range(len(slots)), key=lambda k: self.streams[slots[k]].started_at or 0.0)
        slots[free] = index
        state.slot = free

    def shown_streams(self) -> list[StreamState]:
        """What the live screen lays out: every stream, or with --requests the
        latest request of each stream."""
        if not self.queueing:
            return self.streams
        return [self.streams[i] for i in self.slots]

    def reported_engines(self) -> tuple[list[str], bool]:
        """The engines whose own statements color streams of this run (auto mode),
        and whether a stream still open states (or, like the ended ones, will
        state) its steps: the banner's and the legend's word on the tier."""
        if self.mode != "auto":
            return [], False
        streams = self.streams
        shown = sorted({str(s.reported.engine) for s in streams if s.shows_reported and s.reported})
        waiting = any(
            s.reported_pending
            or (bool(shown) and s.plugin_silent and s.reported is None and not s.over)
            for s in streams
        )
        return shown, waiting

    def reported_possible(self) -> bool:
        """Auto mode, a server that drafts (its /metrics), no telemetry in the run so
        far, no server statement yet, and an open stream with text waits for its
        verdict: a server without our plugin may still state that stream's steps in
        its final chunk (vLLM's per-request metrics come only there), so the banner
        says the colors could come then."""
        if self.mode != "auto" or self.sources or not self.backend.speculative:
            # A hello came (the plugin speaks), or nothing says the server drafts.
            return False
        return any(
            s.plugin_silent
            and s.label == LABEL_VERIFYING
            and not s.reported_pending
            and bool(s.sse_utf8)
            and s.proven_bytes == 0  # a proven byte: its frames came
            and not s.over
            for s in self.shown_streams()
        )

    def request_counts(self) -> tuple[int, int, int]:
        """(finished, open, queued) requests."""
        finished = open_ = queued = 0
        for stream in self.streams:
            if stream.queued and not stream.cancelled:
                queued += 1
            elif stream.over:
                finished += 1
            elif stream.started_at is not None:
                open_ += 1
        return finished, open_, queued

    def count_labels(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for stream in self.streams:
            counts[stream.label] = counts.get(stream.label, 0) + 1
        return counts
