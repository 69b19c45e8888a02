"""Realistic multi-stream telemetry + SSE workloads for reconcilers (tests and benches).

`generate(seed, ...)` simulates a batched speculative-decoding engine serving
several streams of one client run, as the vLLM plugin would report it:

- a byte-level vocabulary built from multilingual text (ASCII, CJK, emoji with
  ZWJ sequences, combining marks, Devanagari, Arabic): tokens are 1..5-byte
  pieces cut anywhere, so multi-byte characters are split across tokens and
  across steps;
- per stream, steps of 1..K+1 tokens (accepted drafts then a target correction
  or a bonus, per-stream acceptance rate), steps without drafts (plain), padded
  draft slots (never accepted) in some steps, async scheduling for some runs;
- endings: max_tokens (the step is cut, `trimmed`), a stop token (EOS, never
  detokenized, later tokens of its step cut), a stop string in vLLM 0.26 style
  (text truncated, ids kept) or 0.33 style (surplus tokens trimmed) with extra
  scheduler steps the frontend never reports (surplus provenance);
- the detokenizer as vLLM's DecodeStream: a token whose bytes leave the text
  inside a character yields an empty fragment; the next complete one carries
  all pending bytes (`span_back` = number of pending tokens). HTTP deltas hold
  back max(len(stop)) - 1 characters while unfinished when stop strings are set;
- SSE chunks one per step, or several steps merged (the output collector
  coalescing under load);
- one provenance frame and one text frame per engine step per run carrying
  every stream's record (split only above MAX_FRAME_BYTES), encoded with
  parallelhue_vllm.wire; the channels (scheduler frames, frontend frames, each
  stream's SSE) interleave with jitter, each in its own order.

`mutate(workload, seed, kind)` applies one fault and says which streams it
affects and whether it is benign (the reconciler must still end all-exact).

Inputs are tuples ready to feed a reconciler (C2):
("frame", bytes) | ("sse", stream, text, token_ids) | ("sse_id", stream, id) |
("sse_choice", stream, index) | ("sse_usage", stream, n, accepted, drafted) |
("finish", stream, finish_reason).
"""

from __future__ import annotations

import os
import random
import struct
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]
for _extra in (_ROOT / "plugin", _ROOT / "python"):
    if str(_extra) not in sys.path:
        sys.path.append(str(_extra))

from parallelhue.reference.decode import Frame, FrameError, decode_frame  # noqa: E402
from parallelhue_vllm import wire  # noqa: E402

Input = tuple[Any, ...]

CORPUS = [
    "The quick brown fox jumps over the lazy dog. ",
    "Speculative decoding drafts tokens and the target verifies them. ",
    "日本語のテキストを生成しています。",
    "中文字符也会被拆成多个字节\uff0c",
    "한국어 문장도 섞어 봅시다. ",
    "😀🚀✨ ",
    "👩‍💻 codes, 🇯🇵 flags, 👍🏽 tones. ",
    "e\u0301te\u0301 cafe\u0301 n\u0303o a\u0308 ",
    "नमस्ते दुनिया ",
    "مرحبا بالعالم ",
    "Ünïcödé ßtraße Ωμέγα ",
    "\n",
    "def f(x):\n    return x * 2\n",
]
# Never produced from the corpus, so they only match where a stream places them.
STOP_STRINGS = ("<END>", "§§", "⏹")
EOS_ID = 2
FIRST_PIECE_ID = 1000
ENDINGS = ("length", "eos", "stop026", "stop033")


@dataclass
class StreamTruth:
    """What a correct reconciler must conclude for one stream."""

    token_ids: list[int] = field(default_factory=list)  # tokens the client received
    roles: list[int] = field(default_factory=list)  # scheduler role of each of them
    text: str = ""  # the text the client received
    steps: int = 0  # provenance records with at least one confirmed token
    # Per character of `text`: the step ordinal and the token role it must be shown
    # with (None where the tokens its bytes may come from, at the granularity
    # lead_len gives, have two steps or two roles).
    char_steps: list[int | None] = field(default_factory=list)
    char_roles: list[int | None] = field(default_factory=list)
    ending: str = "length"
    coalesced_chunks: int = 0

    @property
    def tokens(self) -> int:
        return len(self.token_ids)

    def role_counts(self) -> dict[str, int]:
        names = ("plain", "accepted", "target", "bonus")
        return {name: self.roles.count(role) for role, name in enumerate(names)}


@dataclass
class Workload:
    seed: int
    run_id: str
    num_streams: int
    inputs: list[Input]
    truth: list[StreamTruth]
    mutation: str | None = None
    affected: frozenset[int] = frozenset()
    benign: bool = True

    @property
    def total_tokens(self) -> int:
        return sum(t.tokens for t in self.truth)

    def expected_totals(self) -> dict[str, int]:
        """Run totals that do not depend on input timing (surplus steps may arrive late)."""
        totals = dict.fromkeys(("tokens", "steps", "plain", "accepted", "target", "bonus"), 0)
        totals["bytes"] = 0
        for truth in self.truth:
            totals["tokens"] += truth.tokens
            totals["steps"] += truth.steps
            for name, count in truth.role_counts().items():
                totals[name] += count
            totals["bytes"] += len(truth.text.encode("utf-8"))
        return totals


def span_characters(events: list[tuple[Any, ...]], stream: int) -> list[tuple[Any, Any]]:
    """(step, role) of every character the span events of `stream` show, in order."""
    shown: list[tuple[Any, Any]] = []
    for event in events:
        if event[0] == "span" and event[1] == stream:
            shown.extend([(event[4], event[7])] * len(event[3]))
    return shown


def attribution_errors(workload: Workload, events: list[tuple[Any, ...]]) -> list[str]:
    """Streams whose spans do not show each character with its true step and role."""
    errors = []
    for index, truth in enumerate(workload.truth):
        expected = list(zip(truth.char_steps, truth.char_roles, strict=True))
        shown = span_characters(events, index)
        if shown != expected:
            errors.append(f"stream {index}: shown {shown}, expected {expected}")
    return errors


def feed(reconciler: Any, inputs: list[Input], batch_frames: bool = False) -> None:
    """Push every input into a reconciler (reference or native: same API)."""
    pending: list[bytes] = []
    for item in inputs:
        kind = item[0]
        if kind == "frame":
            if batch_frames:
                pending.append(item[1])
                continue
            reconciler.push_frame(item[1])
            continue
        if pending:
            reconciler.push_frames(pending)
            pending = []
        if kind == "sse":
            reconciler.push_sse(item[1], item[2], item[3])
        elif kind == "sse_id":
            reconciler.push_sse_id(item[1], item[2])
        elif kind == "sse_choice":
            reconciler.push_sse_choice(item[1], item[2])
        elif kind == "sse_usage":
            reconciler.push_sse_usage(item[1], item[2], item[3], item[4])
        else:
            reconciler.finish_sse(item[1], item[2])
    if pending:
        reconciler.push_frames(pending)


# ------------------------------------------------------------------ engine


class _Vocabulary:
    def __init__(self) -> None:
        self.ids: dict[bytes, int] = {}

    def tokenize(self, data: bytes, rng: random.Random) -> list[tuple[int, bytes]]:
        tokens = []
        position = 0
        sizes = iter(rng.choices((1, 2, 3, 4, 5), (2, 2, 2, 1, 1), k=len(data)))
        ids = self.ids
        while position < len(data):
            piece = data[position : position + next(sizes)]
            position += len(piece)
            token_id = ids.get(piece)
            if token_id is None:
                token_id = ids[piece] = FIRST_PIECE_ID + len(ids)
            tokens.append((token_id, piece))
        return tokens


def _random_text(rng: random.Random, size: int) -> str:
    parts: list[str] = []
    length = 0
    while length < size:
        part = rng.choice(CORPUS)
        parts.append(part)
        length += len(part.encode("utf-8"))
    return "".join(parts)


@dataclass
class _StepOutput:
    provenance: wire.ProvenanceRecord | None = None
    text: wire.TextRecord | None = None
    sse: tuple[str, list[int]] | None = None
    sse_final: bool = False


class _StreamSim:
    """One request: the scheduler's view, the detokenizer's view and the SSE chunks."""

    def __init__(
        self,
        index: int,
        rng: random.Random,
        vocab: _Vocabulary,
        *,
        tokens: int,
        k: int,
        async_scheduling: bool,
        ending: str,
        fixed_length: bool = False,
    ) -> None:
        self.index = index
        self.rng = rng
        self.k = k
        self.async_scheduling = async_scheduling
        self.ending = ending
        self.acceptance = rng.choice((0.2, 0.5, 0.7, 0.9, 1.0))
        self.stops: tuple[str, ...] = ()
        if ending.startswith("stop") or rng.random() < 0.3:
            self.stops = tuple(rng.sample(STOP_STRINGS, rng.randint(1, 2)))
        self.holdback = max((len(s) for s in self.stops), default=1) - 1
        # The token stream the model produces (longer than what is kept: trims and surplus).
        body_bytes = max(1, tokens) * (6 if fixed_length else 2)
        text = _random_text(rng, body_bytes)
        if ending.startswith("stop"):
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(self.stops) + text[cut:] + _random_text(rng, 40)
        pieces = vocab.tokenize(text.encode("utf-8"), rng)
        tail = vocab.tokenize(_random_text(rng, 120).encode("utf-8"), rng)
        self.max_tokens = 1 << 30
        self.eos_at = -1
        if ending == "length":
            self.max_tokens = tokens if fixed_length else rng.randint(1, max(1, len(pieces)))
        elif ending == "eos":
            self.eos_at = rng.randint(0, len(pieces))
            pieces = [*pieces[: self.eos_at], (EOS_ID, b""), *pieces[self.eos_at :]]
        self.tokens = pieces + tail
        # Scheduler side.
        self.position = 0  # next token of self.tokens
        self.scheduler_done = False
        self.surplus_steps_left = rng.choice((0, 1, 2)) if ending.startswith("stop") else 0
        self.first_step = True
        # Frontend side.
        self.frontend_done = False
        self.late_finish = ending in ("length", "eos") and rng.random() < 0.1
        self.late_finish_pending: wire.TextRecord | None = None
        self.pending_bytes = b""
        self.pending_tokens = 0
        self.unreleased = ""  # decoded text not yet handed to HTTP
        self.released = 0  # characters handed to HTTP
        self.total_chars = 0  # characters decoded
        self.text_offset = 0
        self.final_chars: int | None = None  # text length once finished (stop string cut)
        self.finish_reason: str | None = None  # the SSE finish_reason, once finished
        self.spec_metrics: list[tuple[int, int]] = []  # (accepted, drafted) per drafted step

    @property
    def done(self) -> bool:
        return self.scheduler_done and self.frontend_done

    def _roles(self) -> tuple[list[int], int, int]:
        if self.k == 0 or self.first_step or self.rng.random() < 0.1:
            drafts = 0
        elif self.rng.random() < 0.2:
            drafts = self.rng.randint(1, self.k)  # budget-truncated draft
        else:
            drafts = self.k
        self.first_step = False
        if drafts == 0:
            return [wire.ROLE_PLAIN], 0, 0
        # Padded slots (-1 placeholders that held no draft) cannot be accepted.
        padded = self.rng.randint(1, drafts) if self.rng.random() < 0.1 else 0
        accepted = 0
        while accepted < drafts - padded and self.rng.random() < self.acceptance:
            accepted += 1
        last = wire.ROLE_BONUS if accepted == drafts else wire.ROLE_TARGET
        return [wire.ROLE_ACCEPTED] * accepted + [last], drafts, padded

    def _decode(self, token_id: int, piece: bytes) -> wire.TextToken:
        if token_id == EOS_ID:
            # Never passed to decode_next: it gives nothing (give count 0).
            return wire.TextToken(token_id, b"", 0, 0)
        lead = len(self.pending_bytes)
        self.pending_bytes += piece
        try:
            text = self.pending_bytes.decode("utf-8")
        except UnicodeDecodeError:
            self.pending_tokens += 1
            # Its give count: all of its bytes go to the fragment that completes them.
            return wire.TextToken(token_id, b"", 0, len(piece))
        # lead_len: the fragment's first bytes are the pending tokens' own.
        token = wire.TextToken(token_id, self.pending_bytes, self.pending_tokens, lead)
        self.unreleased += text
        self.total_chars += len(text)
        self.pending_bytes = b""
        self.pending_tokens = 0
        return token

    def step(self) -> _StepOutput:
        out = _StepOutput()
        if self.late_finish_pending is not None:
            record = self.late_finish_pending
            self.late_finish_pending = None
            record.offset = self.text_offset
            delta = self._release(self.total_chars)
            record.http_delta = delta.encode("utf-8")
            out.text = record
            out.sse = (delta, [])
            out.sse_final = True
            self.frontend_done = True
            return out
        if self.scheduler_done:
            return out
        roles, drafts, padded = self._roles()
        if drafts:  # what vLLM's per-request metrics list: accepted before any cut
            self.spec_metrics.append((roles.count(wire.ROLE_ACCEPTED), drafts - padded))
        start = self.position
        count = len(roles)
        finished = trimmed = False
        reason = wire.FINISH_NONE
        if start + count >= self.max_tokens:
            count, finished, reason = self.max_tokens - start, True, wire.FINISH_LENGTH
        if start <= self.eos_at < start + count:
            count, finished, reason = self.eos_at - start + 1, True, wire.FINISH_STOP
        if count < len(roles):
            trimmed = True
            roles = roles[:count]
        step_tokens = self.tokens[start : start + count]
        self.position += count
        out.provenance = wire.ProvenanceRecord(
            self.index,
            start,
            [token_id for token_id, _ in step_tokens],
            roles,
            drafts,
            padded,
            finished,
            reason,
            trimmed,
        )
        if finished:
            self.scheduler_done = True
        if self.frontend_done:
            # Surplus: the frontend stopped on a stop string, the abort has not arrived yet.
            self.surplus_steps_left -= 1
            if self.surplus_steps_left <= 0:
                self.scheduler_done = True
            return out
        out.text, out.sse, out.sse_final = self._frontend_step(step_tokens, finished, reason)
        if self.frontend_done and self.surplus_steps_left <= 0:
            self.scheduler_done = True
        return out

    def _frontend_step(
        self, step_tokens: list[tuple[int, bytes]], finished: bool, reason: int
    ) -> tuple[wire.TextRecord, tuple[str, list[int]], bool]:
        before = self.total_chars
        text_tokens = []
        ends = []  # characters decoded after each token
        for token_id, piece in step_tokens:
            text_tokens.append(self._decode(token_id, piece))
            ends.append(self.total_chars)
        record = wire.TextRecord(self.index, self.text_offset, text_tokens, b"")
        stop_at = self._find_stop(before)
        if stop_at is not None:
            position, stop = stop_at
            self.final_chars = position
            finished, reason = True, wire.FINISH_STOP
            record.text_truncated = True
            if self.ending == "stop033":
                complete = position + len(stop)
                keep = next(i for i, end in enumerate(ends) if end >= complete) + 1
                record.trimmed_tokens = len(text_tokens) - keep
                record.tokens_trimmed = True
                record.tokens = text_tokens[:keep]
        elif finished:
            self.final_chars = self.total_chars
        if finished and self.late_finish and stop_at is None:
            # The finish reaches the frontend one step later, with no new tokens.
            delta = self._release(max(self.released, self.total_chars - self.holdback))
            record.http_delta = delta.encode("utf-8")
            self.text_offset += len(record.tokens)
            self.finish_reason = wire.FINISH_NAMES[reason]
            self.late_finish_pending = wire.TextRecord(
                self.index, 0, [], b"", finished=True, finish_reason=reason
            )
            return record, (delta, [t.token_id for t in record.tokens]), False
        if finished:
            assert self.final_chars is not None
            delta = self._release(self.final_chars)
            self.unreleased = ""
            record.finished = True
            self.finish_reason = wire.FINISH_NAMES[reason]
            record.finish_reason = reason
            self.frontend_done = True
        else:
            delta = self._release(max(self.released, self.total_chars - self.holdback))
        record.http_delta = delta.encode("utf-8")
        self.text_offset += len(record.tokens)
        return record, (delta, [t.token_id for t in record.tokens]), finished

    def _find_stop(self, before: int) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self.stops:
            # The holdback (>= len(stop) - 1) keeps the search window unreleased.
            start = max(0, before - len(stop) + 1 - self.released)
            found = self.unreleased.find(stop, start)
            if found >= 0 and (best is None or self.released + found < best[0]):
                best = (self.released + found, stop)
        return best

    def _release(self, upto: int) -> str:
        """Hand the text up to character `upto` to HTTP; returns the delta."""
        count = upto - self.released
        delta, self.unreleased = self.unreleased[:count], self.unreleased[count:]
        self.released = upto
        return delta


def _hello(run_bytes: bytes, source: int, role: int, spec: tuple[bool, int, str]) -> bytes:
    """A source's hello; `spec` is the scheduler's (async, k, method)."""
    async_scheduling, spec_k, method = spec
    derivation = (
        wire.DERIVATION_NONE
        if spec_k == 0
        else (wire.DERIVATION_COUNTS if async_scheduling else wire.DERIVATION_DRAFT_IDS)
    )
    if role == wire.SOURCE_FRONTEND:  # the frontend announces no speculative fields
        fields = (wire.DERIVATION_NONE, False, 0, "", wire.VERIFICATION_NONE)
    else:
        verification = wire.VERIFICATION_STANDARD if spec_k else wire.VERIFICATION_NONE
        fields = (derivation, async_scheduling, spec_k, method, verification)
    derived, is_async, k_announced, spec_method, verification = fields
    return wire.encode_hello(
        wire.Header(run_bytes, source, 0, 0, 1),
        wire.Hello(
            role, wire.ENGINE_SIMULATED, derived, is_async, k_announced,
            "0.2.0", "sim-1", spec_method, verification,
        ),
    )  # fmt: skip


def generate(
    seed: int,
    *,
    num_streams: int | tuple[int, int] = (1, 4),
    tokens: int | tuple[int, int] = (1, 40),
    k: int | tuple[int, int] = (0, 5),
    coalesce: float | None = None,
    endings: tuple[str, ...] = ENDINGS,
    jitter: float = 2.0,
    async_probability: float = 0.2,
    fixed_length: bool = False,
) -> Workload:
    """A random workload; every int-or-range argument is drawn from its range per seed.

    `fixed_length`: every stream ends by max_tokens after exactly `tokens` tokens
    (benchmarks: a known amount of work).
    """
    if fixed_length:
        endings = ("length",)
    rng = random.Random(seed)

    def draw(value: int | tuple[int, int]) -> int:
        return value if isinstance(value, int) else rng.randint(*value)

    streams = draw(num_streams)
    spec_k = draw(k)
    async_scheduling = spec_k > 0 and rng.random() < async_probability
    coalesce_p = rng.choice((0.0, 0.0, 0.3, 0.7)) if coalesce is None else coalesce
    run_bytes = rng.getrandbits(128).to_bytes(16, "big")
    run_id = run_bytes.hex()
    scheduler_id = rng.getrandbits(64) | 1
    frontend_id = rng.getrandbits(64) | 2
    vocab = _Vocabulary()
    sims = [
        _StreamSim(
            i,
            rng,
            vocab,
            tokens=draw(tokens),
            k=spec_k,
            async_scheduling=async_scheduling,
            ending=rng.choice(endings),
            fixed_length=fixed_length,
        )
        for i in range(streams)
    ]
    starts = [rng.randint(0, 3) for _ in sims]

    method = "" if spec_k == 0 else rng.choice(("ngram", "draft_model", "eagle3"))

    def hello(source: int, role: int) -> bytes:
        return _hello(run_bytes, source, role, (async_scheduling, spec_k, method))

    # Each channel is a list of (time, input); a channel keeps its own order.
    scheduler: list[tuple[float, Input]] = [(-1.0, ("frame", hello(scheduler_id, 1)))]
    frontend: list[tuple[float, Input]] = [(-1.0, ("frame", hello(frontend_id, 2)))]
    sse: list[list[tuple[float, Input]]] = [[] for _ in sims]
    seqs = {scheduler_id: 1, frontend_id: 1}
    truth = [StreamTruth(ending=sim.ending) for sim in sims]
    provenance_log: list[list[wire.ProvenanceRecord]] = [[] for _ in sims]
    text_log: list[list[wire.TextRecord]] = [[] for _ in sims]
    chunk: list[tuple[str, list[int]] | None] = [None for _ in sims]
    sse_tokens = [0 for _ in sims]

    def emit(kind: int, source: int, step: int, records: list[Any], channel: list[Any]) -> None:
        for part in wire.split_for_frames(kind, records):
            header = wire.Header(run_bytes, source, seqs[source], step, 1_000_000 * (step + 1))
            seqs[source] += 1
            time = step + rng.uniform(0, jitter)
            channel.append((time, ("frame", wire.encode_records(kind, header, part))))

    step = 0
    while not all(sim.done for sim in sims):
        provenance: list[wire.Record] = []
        texts: list[wire.Record] = []
        for sim, start in zip(sims, starts, strict=True):
            if step < start or sim.done:
                continue
            out = sim.step()
            if out.provenance is not None:
                provenance.append(out.provenance)
                provenance_log[sim.index].append(out.provenance)
            if out.text is not None:
                texts.append(out.text)
                text_log[sim.index].append(out.text)
            if out.sse is not None:
                previous = chunk[sim.index]
                if previous is not None:
                    merged = (previous[0] + out.sse[0], previous[1] + out.sse[1])
                    truth[sim.index].coalesced_chunks += 1
                else:
                    merged = out.sse
                if out.sse_final or rng.random() >= coalesce_p:
                    time = step + rng.uniform(0, jitter)
                    if not sse[sim.index]:  # the first chunk: its id carries the request id
                        chunk_id = f"chatcmpl-{wire.request_id(run_id, sim.index)}"
                        sse[sim.index].append((time, ("sse_id", sim.index, chunk_id)))
                    sse[sim.index].append((time, ("sse", sim.index, merged[0], merged[1])))
                    sse_tokens[sim.index] += len(merged[1])
                    chunk[sim.index] = None
                else:
                    chunk[sim.index] = merged
                if out.sse_final:
                    usage = _usage_input(sim, sse_tokens[sim.index], rng)
                    if usage is not None:
                        sse[sim.index].append((time + 0.005, usage))
                    reason = sim.finish_reason
                    sse[sim.index].append((time + 0.01, ("finish", sim.index, reason)))
        if provenance:
            emit(wire.KIND_PROVENANCE, scheduler_id, step, provenance, scheduler)
        if texts:
            emit(wire.KIND_TEXT, frontend_id, step, texts, frontend)
        step += 1

    for index in range(streams):
        _fill_truth(truth[index], provenance_log[index], text_log[index])
    inputs = _interleave([scheduler, frontend, *sse])
    return Workload(seed, run_id, streams, inputs, truth)


def _usage_input(sim: _StreamSim, tokens: int, rng: random.Random) -> Input | None:
    """The final usage chunk, sometimes: completion_tokens and, when the engine itself
    finished the request (no stop string), vLLM's per-request metrics."""
    choice = rng.random()
    if choice < 0.3:
        return None
    lists: tuple[list[int] | None, list[int] | None] = (None, None)
    if choice < 0.8 and sim.ending in ("length", "eos") and sim.k:
        lists = ([a for a, _ in sim.spec_metrics], [d for _, d in sim.spec_metrics])
    return ("sse_usage", sim.index, tokens, *lists)


def _fill_truth(
    truth: StreamTruth,
    provenance: list[wire.ProvenanceRecord],
    texts: list[wire.TextRecord],
) -> None:
    token_ids: list[int] = []
    fragments: list[tuple[int, wire.TextToken, int]] = []  # (offset, token, byte start)
    all_tokens: list[wire.TextToken] = []
    http = b""
    fragment_end = 0
    for record in texts:
        for token in record.tokens:
            all_tokens.append(token)
            if token.fragment:
                fragments.append((len(token_ids), token, fragment_end))
                fragment_end += len(token.fragment)
            token_ids.append(token.token_id)
        http += record.http_delta
    truth.token_ids = token_ids
    truth.text = http.decode("utf-8")
    ordinals: list[int] = []
    for ordinal, record in enumerate(provenance):
        for position, role in enumerate(record.roles):
            if record.offset + position < len(token_ids):
                truth.roles.append(role)
                ordinals.append(ordinal)
        if record.offset < len(token_ids):
            truth.steps += 1
    for offset, token, start in fragments:
        # Each character, by which tokens gave its bytes: each span_back predecessor
        # its give count of the fragment's first bytes, the token itself the rest.
        first = offset - token.span_back
        owned, at = [], 0  # (token, byte start, byte end)
        for predecessor in range(first, offset):
            give = all_tokens[predecessor].lead_len
            owned.append((predecessor, at, at + give))
            at += give
        owned.append((offset, at, len(token.fragment)))
        position = 0
        for character in token.fragment.decode("utf-8"):
            end = position + len(character.encode("utf-8"))
            if start + position >= len(http):
                break  # cut off by the stop string
            hit = [o for o, low, high in owned if low < end and high > position]
            tokens = list(range(hit[0], hit[-1] + 1))
            steps = {ordinals[t] for t in tokens}
            roles = {truth.roles[t] for t in tokens}
            truth.char_steps.append(steps.pop() if len(steps) == 1 else None)
            truth.char_roles.append(roles.pop() if len(roles) == 1 else None)
            position = end


def _interleave(channels: list[list[tuple[float, Input]]]) -> list[Input]:
    timed: list[tuple[float, int, int, Input]] = []
    for number, channel in enumerate(channels):
        latest = float("-inf")
        for position, (time, item) in enumerate(channel):
            latest = max(latest, time)  # a channel never overtakes itself
            timed.append((latest, number, position, item))
    timed.sort(key=lambda entry: entry[:3])
    return [entry[3] for entry in timed]


# ---------------------------------------------------------------- mutations

BENIGN_MUTATIONS = ("duplicate", "reorder_within", "foreign_run")
HARMFUL_MUTATIONS = (
    "drop",
    "truncate",
    "queue_drop",
    "reorder_beyond",
    "flip_http_byte",
    "flip_sse_byte",
    "change_frame_id",
    "change_sse_id",
    "notice",
    # The rules of a lying witness (issue 9): each one contradiction.
    "step_repeat",
    "step_back",
    "sse_finish_reason",
    "scheduler_finish_reason",
    "sse_choice",
    "chunk_id",
    "usage_count",
    "duplicate_differs",
    "late_notice",
    "truncated_flag",
    "drafts_beyond_k",
    "metrics_mismatch",
    "sse_split",
    "hello_differs",
    "loss_after_verdict",
    # Protocol 3's give counts.
    "give_sum",
    "give_uncarried",
    # Issue 24: evidence is monotone (a later statement never erases an earlier one).
    "metrics_then_none",
    "metrics_restated",
    "usage_corrected",
)
# Values honest vLLM may send that leave an attribution open (issue 24): every stream
# stays exact, and no character may be shown with a step the evidence does not prove.
UNKNOWN_MUTATIONS = ("give_unknown_unclaimed",)
MUTATIONS = BENIGN_MUTATIONS + HARMFUL_MUTATIONS


@dataclass
class _FrameAt:
    index: int  # position in inputs
    source: int
    seq: int
    kind: int
    streams: frozenset[int]  # streams with non-surplus records (all streams for a hello)


def _frames(workload: Workload) -> list[_FrameAt]:
    found = []
    text_ends = [t.tokens for t in workload.truth]
    everyone = frozenset(range(workload.num_streams))
    for index, item in enumerate(workload.inputs):
        if item[0] != "frame":
            continue
        try:
            frame = decode_frame(item[1])
        except FrameError:
            continue
        if frame.header.run_id.hex() != workload.run_id:
            continue
        streams: set[int] = set()
        for record in frame.records:
            if isinstance(record, wire.ProvenanceRecord):
                if record.offset < text_ends[record.stream]:
                    streams.add(record.stream)
            elif isinstance(record, wire.TextRecord):
                streams.add(record.stream)
        affected = everyone if frame.kind == wire.KIND_HELLO else frozenset(streams)
        found.append(
            _FrameAt(index, frame.header.source_id, frame.header.seq, frame.kind, affected)
        )
    return found


def _set_header(frame: bytes, *, seq: int | None = None, dropped: int | None = None) -> bytes:
    data = bytearray(frame)
    if seq is not None:
        struct.pack_into("<Q", data, 32, seq)
    if dropped is not None:
        struct.pack_into("<I", data, 56, dropped)
    return bytes(data)


def _reencode(frame_bytes: bytes, edit: Any) -> bytes:
    frame = decode_frame(frame_bytes)
    records = [replace(record) for record in frame.records]
    edit(records)
    return wire.encode_records(frame.kind, frame.header, records)


def mutate(workload: Workload, seed: int, kind: str | None = None) -> Workload:
    """Apply one fault. Falls back to another harmful kind when `kind` is impossible here."""
    rng = random.Random(seed)
    kinds = [kind] if kind is not None else list(MUTATIONS)
    rng.shuffle(kinds)
    for candidate in [*kinds, *HARMFUL_MUTATIONS]:
        mutated = _MUTATORS[candidate](workload, rng)
        if mutated is not None:
            return mutated
    raise AssertionError("no mutation applies")  # the hello can always be dropped


def _with(workload: Workload, name: str, inputs: list[Input], affected: Any, benign: bool):
    return replace(
        workload, inputs=inputs, mutation=name, affected=frozenset(affected), benign=benign
    )


def _pick(rng: random.Random, frames: list[_FrameAt], need_streams: bool = True):
    choices = [f for f in frames if f.streams] if need_streams else frames
    return rng.choice(choices) if choices else None


def _drop(workload: Workload, rng: random.Random) -> Workload | None:
    target = _pick(rng, _frames(workload))
    if target is None:
        return None
    inputs = [x for i, x in enumerate(workload.inputs) if i != target.index]
    return _with(workload, "drop", inputs, target.streams, False)


def _truncate(workload: Workload, rng: random.Random) -> Workload | None:
    target = _pick(rng, _frames(workload))
    if target is None:
        return None
    inputs = list(workload.inputs)
    data = inputs[target.index][1]
    inputs[target.index] = ("frame", data[: rng.randint(0, len(data) - 1)])
    return _with(workload, "truncate", inputs, target.streams, False)


def _queue_drop(workload: Workload, rng: random.Random) -> Workload | None:
    # Lost in the sender's queue: later frames keep consecutive seqs, the next one says so.
    frames = [f for f in _frames(workload) if f.kind != wire.KIND_HELLO]
    target = _pick(rng, frames)
    if target is None:
        return None
    inputs = list(workload.inputs)
    later = [f for f in frames if f.source == target.source and f.seq > target.seq]
    for frame in later:
        dropped = 1 if frame.seq == target.seq + 1 else None
        inputs[frame.index] = ("frame", _set_header(inputs[frame.index][1], seq=frame.seq - 1,
                                                    dropped=dropped))  # fmt: skip
    del inputs[target.index]
    return _with(workload, "queue_drop", inputs, target.streams, False)


def _move_later(
    workload: Workload, rng: random.Random, lo: int, hi: int, name: str, benign: bool
) -> Workload | None:
    frames = _frames(workload)
    options = []
    for frame in frames:
        later = [f for f in frames if f.source == frame.source and f.seq > frame.seq]
        if len(later) >= lo and (benign or frame.streams):
            options.append((frame, later))
    if not options:
        return None
    frame, later = rng.choice(options)
    anchor = later[min(len(later), rng.randint(lo, hi)) - 1]
    inputs = list(workload.inputs)
    item = inputs[frame.index]
    inputs.insert(anchor.index + 1, item)
    del inputs[frame.index]
    return _with(workload, name, inputs, frame.streams if not benign else (), benign)


def _reorder_within(workload: Workload, rng: random.Random) -> Workload | None:
    return _move_later(workload, rng, 1, 8, "reorder_within", True)


def _reorder_beyond(workload: Workload, rng: random.Random) -> Workload | None:
    # More than REORDER_WINDOW = 64 later frames of the source get buffered first: a gap.
    return _move_later(workload, rng, 65, 80, "reorder_beyond", False)


def _duplicate(workload: Workload, rng: random.Random) -> Workload | None:
    target = _pick(rng, _frames(workload), need_streams=False)
    if target is None:
        return None
    inputs = list(workload.inputs)
    position = rng.randint(target.index + 1, len(inputs))
    inputs.insert(position, inputs[target.index])
    return _with(workload, "duplicate", inputs, (), True)


def _foreign_run(workload: Workload, rng: random.Random) -> Workload | None:
    target = _pick(rng, _frames(workload), need_streams=False)
    if target is None:
        return None
    inputs = list(workload.inputs)
    data = bytearray(inputs[target.index][1])
    data[8] ^= 0x01  # another run id, same source and seq
    inputs.insert(rng.randint(0, len(inputs)), ("frame", bytes(data)))
    return _with(workload, "foreign_run", inputs, (), True)


def _flip_http_byte(workload: Workload, rng: random.Random) -> Workload | None:
    options = []
    for frame in _frames(workload):
        if frame.kind != wire.KIND_TEXT:
            continue
        for position, record in enumerate(decode_frame(workload.inputs[frame.index][1]).records):
            assert isinstance(record, wire.TextRecord)
            letters = [i for i, b in enumerate(record.http_delta) if 0x61 <= b <= 0x7A]
            if letters:
                options.append((frame, position, record.stream, letters))
    if not options:
        return None
    frame, position, stream, letters = rng.choice(options)
    byte = rng.choice(letters)

    def edit(records: list[Any]) -> None:
        delta = bytearray(records[position].http_delta)
        delta[byte] = 0x41 + (delta[byte] - 0x61)  # same letter, upper case
        records[position].http_delta = bytes(delta)

    inputs = list(workload.inputs)
    inputs[frame.index] = ("frame", _reencode(inputs[frame.index][1], edit))
    return _with(workload, "flip_http_byte", inputs, {stream}, False)


def _flip_sse_byte(workload: Workload, rng: random.Random) -> Workload | None:
    options = [
        (i, [j for j, ch in enumerate(item[2]) if "a" <= ch <= "z"])
        for i, item in enumerate(workload.inputs)
        if item[0] == "sse"
    ]
    options = [(i, letters) for i, letters in options if letters]
    if not options:
        return None
    index, letters = rng.choice(options)
    _, stream, text, ids = workload.inputs[index]
    where = rng.choice(letters)
    inputs = list(workload.inputs)
    inputs[index] = ("sse", stream, text[:where] + text[where].upper() + text[where + 1 :], ids)
    return _with(workload, "flip_sse_byte", inputs, {stream}, False)


def _change_frame_id(workload: Workload, rng: random.Random) -> Workload | None:
    text_ends = [t.tokens for t in workload.truth]
    options = []
    for frame in _frames(workload):
        if frame.kind not in (wire.KIND_PROVENANCE, wire.KIND_TEXT):
            continue
        for position, record in enumerate(decode_frame(workload.inputs[frame.index][1]).records):
            count = (
                len(record.token_ids)
                if isinstance(record, wire.ProvenanceRecord)
                else len(record.tokens)
            )
            usable = [t for t in range(count) if record.offset + t < text_ends[record.stream]]
            if usable:
                options.append((frame, position, record.stream, usable))
    if not options:
        return None
    frame, position, stream, usable = rng.choice(options)
    token = rng.choice(usable)

    def edit(records: list[Any]) -> None:
        record = records[position]
        if isinstance(record, wire.ProvenanceRecord):
            record.token_ids = list(record.token_ids)
            record.token_ids[token] ^= 0x40000
        else:
            record.tokens = [replace(t) for t in record.tokens]
            record.tokens[token].token_id ^= 0x40000

    inputs = list(workload.inputs)
    inputs[frame.index] = ("frame", _reencode(inputs[frame.index][1], edit))
    return _with(workload, "change_frame_id", inputs, {stream}, False)


def _change_sse_id(workload: Workload, rng: random.Random) -> Workload | None:
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "sse" and item[3]]
    if not options:
        return None
    index = rng.choice(options)
    _, stream, text, ids = workload.inputs[index]
    ids = list(ids)
    ids[rng.randrange(len(ids))] ^= 0x40000
    inputs = list(workload.inputs)
    inputs[index] = ("sse", stream, text, ids)
    return _with(workload, "change_sse_id", inputs, {stream}, False)


def _notice(workload: Workload, rng: random.Random) -> Workload | None:
    # A notice from the frontend released before the stream's finishing text record.
    frames = [f for f in _frames(workload) if f.kind == wire.KIND_TEXT]
    if not frames:
        return None
    target = rng.choice(frames)
    stream = rng.choice(sorted(target.streams))
    inputs = list(workload.inputs)
    header = decode_frame(inputs[target.index][1]).header
    for frame in _frames(workload):
        if frame.source == target.source and frame.seq >= target.seq:
            inputs[frame.index] = ("frame", _set_header(inputs[frame.index][1], seq=frame.seq + 1))
    notice = wire.encode_records(
        wire.KIND_NOTICE,
        replace(header),
        [wire.NoticeRecord(stream, wire.NOTICE_HOOK_ERROR, "detokenizer hook failed")],
    )
    inputs.insert(target.index, ("frame", notice))
    return _with(workload, "notice", inputs, {stream}, False)


def _record_frames(workload: Workload) -> list[tuple[int, Frame]]:
    """(input index, decoded frame) of every provenance and text frame, in input order."""
    found = []
    for index, item in enumerate(workload.inputs):
        if item[0] == "frame":
            frame = decode_frame(item[1])
            if frame.kind in (wire.KIND_PROVENANCE, wire.KIND_TEXT):
                found.append((index, frame))
    return found


def _set_step(frame_bytes: bytes, step: int) -> bytes:
    data = bytearray(frame_bytes)
    struct.pack_into("<Q", data, 40, step)
    return bytes(data)


def _step_pairs(workload: Workload) -> list[tuple[int, int, frozenset[int]]]:
    """(input index, previous frame's step, streams in both) for consecutive frames of
    one source that share a stream."""
    pairs = []
    previous: dict[int, Frame] = {}
    for index, frame in _record_frames(workload):
        source = frame.header.source_id
        before = previous.get(source)
        previous[source] = frame
        if before is None:
            continue
        shared = {r.stream for r in frame.records} & {r.stream for r in before.records}
        if shared:
            pairs.append((index, before.header.step, frozenset(shared)))
    return pairs


def _step_repeat(workload: Workload, rng: random.Random) -> Workload | None:
    # A second record of a stream in one engine step.
    pairs = _step_pairs(workload)
    if not pairs:
        return None
    index, step, streams = rng.choice(pairs)
    inputs = list(workload.inputs)
    inputs[index] = ("frame", _set_step(inputs[index][1], step))
    return _with(workload, "step_repeat", inputs, streams, False)


def _step_back(workload: Workload, rng: random.Random) -> Workload | None:
    pairs = [p for p in _step_pairs(workload) if p[1] > 0]
    if not pairs:
        return None
    index, step, streams = rng.choice(pairs)
    inputs = list(workload.inputs)
    inputs[index] = ("frame", _set_step(inputs[index][1], step - 1))
    return _with(workload, "step_back", inputs, streams, False)


def _sse_finish_reason(workload: Workload, rng: random.Random) -> Workload | None:
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "finish"]
    if not options:
        return None
    index = rng.choice(options)
    _, stream, reason = workload.inputs[index]
    inputs = list(workload.inputs)
    inputs[index] = ("finish", stream, "length" if reason == "stop" else "stop")
    return _with(workload, "sse_finish_reason", inputs, {stream}, False)


def _scheduler_finish_reason(workload: Workload, rng: random.Random) -> Workload | None:
    # The scheduler's final record says another finish reason than the detokenizer.
    options = []
    for index, frame in _record_frames(workload):
        for position, record in enumerate(frame.records):
            ending = workload.truth[record.stream].ending
            if (
                isinstance(record, wire.ProvenanceRecord)
                and record.finished
                and ending
                in (
                    "length",
                    "eos",
                )
            ):
                options.append((index, position, record.stream))
    if not options:
        return None
    index, position, stream = rng.choice(options)

    def edit(records: list[Any]) -> None:
        record = records[position]
        record.finish_reason = (
            wire.FINISH_LENGTH if record.finish_reason == wire.FINISH_STOP else wire.FINISH_STOP
        )

    inputs = list(workload.inputs)
    inputs[index] = ("frame", _reencode(inputs[index][1], edit))
    return _with(workload, "scheduler_finish_reason", inputs, {stream}, False)


def _before_finish(workload: Workload, rng: random.Random, make: Any, name: str):
    """Insert make(stream) just before a stream's ("finish", ...) input."""
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "finish"]
    if not options:
        return None
    index = rng.choice(options)
    stream = workload.inputs[index][1]
    inputs = list(workload.inputs)
    inputs.insert(index, make(stream))
    return _with(workload, name, inputs, {stream}, False)


def _sse_choice(workload: Workload, rng: random.Random) -> Workload | None:
    return _before_finish(workload, rng, lambda s: ("sse_choice", s, 1), "sse_choice")


def _usage_count(workload: Workload, rng: random.Random) -> Workload | None:
    return _before_finish(
        workload,
        rng,
        lambda s: ("sse_usage", s, workload.truth[s].tokens + 1, None, None),
        "usage_count",
    )


def _chunk_id(workload: Workload, rng: random.Random) -> Workload | None:
    # The chunk id of another stream (or of no stream of ours).
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "sse_id"]
    if not options:
        return None
    index = rng.choice(options)
    _, stream, chunk_id = workload.inputs[index]
    inputs = list(workload.inputs)
    inputs[index] = ("sse_id", stream, f"{chunk_id}0")
    return _with(workload, "chunk_id", inputs, {stream}, False)


def _duplicate_differs(workload: Workload, rng: random.Random) -> Workload | None:
    # The same source and seq again, one byte of the timestamp changed: the run fails.
    target = _pick(rng, _frames(workload), need_streams=False)
    if target is None:
        return None
    inputs = list(workload.inputs)
    data = bytearray(inputs[target.index][1])
    data[48] ^= 0x01
    inputs.insert(rng.randint(target.index + 1, len(inputs)), ("frame", bytes(data)))
    return _with(workload, "duplicate_differs", inputs, range(workload.num_streams), False)


def _late_notice(workload: Workload, rng: random.Random) -> Workload | None:
    # A notice after everything else (the stream may be exact already): it revokes.
    frames = [f for f in _frames(workload) if f.kind == wire.KIND_TEXT]
    if not frames:
        return None
    last = max(frames, key=lambda f: f.seq)
    stream = rng.randrange(workload.num_streams)
    header = decode_frame(workload.inputs[last.index][1]).header
    notice = wire.encode_records(
        wire.KIND_NOTICE,
        replace(header, seq=last.seq + 1),
        [wire.NoticeRecord(stream, wire.NOTICE_HOOK_ERROR, "late hook failure")],
    )
    return _with(workload, "late_notice", [*workload.inputs, ("frame", notice)], {stream}, False)


def _truncated_flag(workload: Workload, rng: random.Random) -> Workload | None:
    # text_truncated on a finish that kept the whole text (or with a reason other
    # than stop, which the decoders refuse: then every stream of that frame suffers).
    options = []
    for index, frame in _record_frames(workload):
        for position, record in enumerate(frame.records):
            if (
                isinstance(record, wire.TextRecord)
                and record.finished
                and not record.text_truncated
            ):
                options.append((index, position, frame))
    if not options:
        return None
    index, position, frame = rng.choice(options)
    record = frame.records[position]
    affected = {record.stream}
    if record.finish_reason != wire.FINISH_STOP:
        affected = {r.stream for r in frame.records}

    def edit(records: list[Any]) -> None:
        records[position].text_truncated = True

    inputs = list(workload.inputs)
    inputs[index] = ("frame", _reencode(inputs[index][1], edit))
    return _with(workload, "truncated_flag", inputs, affected, False)


def _drafts_beyond_k(workload: Workload, rng: random.Random) -> Workload | None:
    # More drafts scheduled than the hello's K (a record ending on a target stays valid).
    hello = next(
        decode_frame(item[1]).hello
        for item in workload.inputs
        if item[0] == "frame" and decode_frame(item[1]).kind == wire.KIND_HELLO
        and decode_frame(item[1]).hello.role == wire.SOURCE_SCHEDULER  # type: ignore[union-attr]
    )  # fmt: skip
    assert hello is not None
    options = []
    for index, frame in _record_frames(workload):
        for position, record in enumerate(frame.records):
            if isinstance(record, wire.ProvenanceRecord) and record.roles[-1] == wire.ROLE_TARGET:
                options.append((index, position, record.stream))
    if not options:
        return None
    index, position, stream = rng.choice(options)

    def edit(records: list[Any]) -> None:
        records[position].drafts_scheduled = hello.num_speculative_tokens + 1

    inputs = list(workload.inputs)
    inputs[index] = ("frame", _reencode(inputs[index][1], edit))
    return _with(workload, "drafts_beyond_k", inputs, {stream}, False)


def _metrics_mismatch(workload: Workload, rng: random.Random) -> Workload | None:
    # vLLM's per-request metrics say one step drafted one more token than the scheduler.
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "sse_usage" and item[4]]
    if not options:
        return None
    index = rng.choice(options)
    kind, stream, tokens, accepted, drafted = workload.inputs[index]
    drafted = list(drafted)
    drafted[rng.randrange(len(drafted))] += 1
    inputs = list(workload.inputs)
    inputs[index] = (kind, stream, tokens, accepted, drafted)
    return _with(workload, "metrics_mismatch", inputs, {stream}, False)


def _record_ends(workload: Workload) -> list[set[tuple[int, int]]]:
    """Per stream, (token end, HTTP byte end) of each of its text records."""
    ends: list[set[tuple[int, int]]] = [set() for _ in range(workload.num_streams)]
    http = [0] * workload.num_streams
    for _, frame in _record_frames(workload):
        for record in frame.records:
            if isinstance(record, wire.TextRecord):
                http[record.stream] += len(record.http_delta)
                ends[record.stream].add((record.offset + len(record.tokens), http[record.stream]))
    return ends


def _sse_split(workload: Workload, rng: random.Random) -> Workload | None:
    # One SSE chunk split in two where no text record ends (ids and bytes unchanged):
    # a chunk that does not carry whole steps.
    ends = _record_ends(workload)
    done = [(0, 0)] * workload.num_streams
    options = []
    for index, item in enumerate(workload.inputs):
        if item[0] != "sse":
            continue
        _, stream, text, ids = item
        tokens, size = done[stream]
        end = size + len(text.encode())
        options.extend(
            (index, k) for k in range(1, len(ids)) if (tokens + k, end) not in ends[stream]
        )
        done[stream] = (tokens + len(ids), end)
    if not options:
        return None
    index, k = rng.choice(options)
    _, stream, text, ids = workload.inputs[index]
    inputs = list(workload.inputs)
    inputs[index : index + 1] = [("sse", stream, text, ids[:k]), ("sse", stream, "", ids[k:])]
    return _with(workload, "sse_split", inputs, {stream}, False)


def _hello_differs(workload: Workload, rng: random.Random) -> Workload | None:
    # A second hello from the scheduler announcing another K, as its next frame.
    hellos = [
        (position, decode_frame(item[1]))
        for position, item in enumerate(workload.inputs)
        if item[0] == "frame" and decode_frame(item[1]).kind == wire.KIND_HELLO
    ]
    found = [(p, f) for p, f in hellos if f.hello.role == wire.SOURCE_SCHEDULER]  # type: ignore[union-attr]
    if not found:
        return None
    position, frame = found[0]
    source = frame.header.source_id
    inputs = list(workload.inputs)
    for other in _frames(workload):
        if other.source == source and other.seq >= 1:
            inputs[other.index] = ("frame", _set_header(inputs[other.index][1], seq=other.seq + 1))
    hello = replace(frame.hello, num_speculative_tokens=frame.hello.num_speculative_tokens + 1)  # type: ignore[type-var]
    if not hello.spec_method:  # speculative fields go together (protocol 2)
        hello = replace(
            hello,
            spec_method="ngram",
            role_derivation=wire.DERIVATION_DRAFT_IDS,
            async_scheduling=False,
            verification=wire.VERIFICATION_STANDARD,
        )
    data = wire.encode_hello(replace(frame.header, seq=1), hello)
    inputs.insert(position + 1 + rng.randint(0, 3), ("frame", data))
    return _with(workload, "hello_differs", inputs, range(workload.num_streams), False)


def _loss_after_verdict(workload: Workload, rng: random.Random) -> Workload | None:
    # After everything else, a frame of the frontend reports one frame it dropped: every
    # stream fails, the exact ones included (the lost frame may have been a notice).
    frames = [f for f in _frames(workload) if f.kind == wire.KIND_TEXT]
    if not frames:
        return None
    last = max(frames, key=lambda f: f.seq)
    header = decode_frame(workload.inputs[last.index][1]).header
    foreign = wire.NoticeRecord(workload.num_streams, wire.NOTICE_OTHER, "for no stream of ours")
    frame = wire.encode_records(
        wire.KIND_NOTICE, replace(header, seq=last.seq + 1, dropped=1), [foreign]
    )
    inputs = [*workload.inputs, ("frame", frame)]
    return _with(workload, "loss_after_verdict", inputs, range(workload.num_streams), False)


def _carriers(workload: Workload, known_lead: bool) -> list[tuple[int, int, int, int]]:
    """(input index, record position, token position, stream) of every token whose
    fragment claims span_back > 0 predecessors (with a known lead_len if asked)."""
    options = []
    for index, frame in _record_frames(workload):
        for position, record in enumerate(frame.records):
            if not isinstance(record, wire.TextRecord):
                continue
            for at, token in enumerate(record.tokens):
                if token.span_back and (not known_lead or token.lead_len != wire.LEAD_UNKNOWN):
                    options.append((index, position, at, record.stream))
    return options


def _give_sum(workload: Workload, rng: random.Random) -> Workload | None:
    # A carrier's lead_len one byte short of what its predecessors say they gave
    # (protocol 3: the give counts must add up to it).
    options = _carriers(workload, True)
    if not options:
        return None
    index, position, at, stream = rng.choice(options)

    def edit(records: list[Any]) -> None:
        token = records[position].tokens[at]
        token.lead_len = token.lead_len - 1 if token.lead_len else 1

    inputs = list(workload.inputs)
    inputs[index] = ("frame", _reencode(inputs[index][1], edit))
    return _with(workload, "give_sum", inputs, {stream}, False)


def _give_uncarried(workload: Workload, rng: random.Random) -> Workload | None:
    # A carrier claims one predecessor fewer: that token's bytes (its give count)
    # are in no fragment's claim.
    options = _carriers(workload, False)
    if not options:
        return None
    index, position, at, stream = rng.choice(options)

    def edit(records: list[Any]) -> None:
        token = records[position].tokens[at]
        token.span_back -= 1
        if token.span_back == 0:
            token.lead_len = 0

    inputs = list(workload.inputs)
    inputs[index] = ("frame", _reencode(inputs[index][1], edit))
    return _with(workload, "give_uncarried", inputs, {stream}, False)


def _usage_with_lists(workload: Workload, rng: random.Random) -> tuple[int, Input] | None:
    options = [i for i, item in enumerate(workload.inputs) if item[0] == "sse_usage" and item[4]]
    if not options:
        return None
    index = rng.choice(options)
    return index, workload.inputs[index]


def _one_more_drafted(drafted: list[int], rng: random.Random) -> list[int]:
    changed = list(drafted)
    changed[rng.randrange(len(changed))] += 1
    return changed


def _metrics_then_none(workload: Workload, rng: random.Random) -> Workload | None:
    # vLLM's lists contradict the records, then a usage chunk without lists (issue 24
    # finding 1: the later statement must not erase the contradiction).
    found = _usage_with_lists(workload, rng)
    if found is None:
        return None
    index, (kind, stream, tokens, accepted, drafted) = found
    inputs = list(workload.inputs)
    inputs[index] = (kind, stream, tokens, accepted, _one_more_drafted(drafted, rng))
    inputs.insert(index + 1, (kind, stream, tokens, None, None))
    return _with(workload, "metrics_then_none", inputs, {stream}, False)


def _metrics_restated(workload: Workload, rng: random.Random) -> Workload | None:
    # The true lists, then a second usage chunk whose lists differ.
    found = _usage_with_lists(workload, rng)
    if found is None:
        return None
    index, (kind, stream, tokens, accepted, drafted) = found
    inputs = list(workload.inputs)
    inputs.insert(index + 1, (kind, stream, tokens, accepted, _one_more_drafted(drafted, rng)))
    return _with(workload, "metrics_restated", inputs, {stream}, False)


def _usage_corrected(workload: Workload, rng: random.Random) -> Workload | None:
    # A wrong completion count, then a usage chunk with the right one.
    def make(stream: int) -> Input:
        return ("sse_usage", stream, workload.truth[stream].tokens + 1, None, None)

    mutated = _before_finish(workload, rng, make, "usage_corrected")
    if mutated is None:
        return None
    at = next(i for i, item in enumerate(mutated.inputs) if item not in workload.inputs)
    stream = mutated.inputs[at][1]
    mutated.inputs.insert(at + 1, ("sse_usage", stream, workload.truth[stream].tokens, None, None))
    return mutated


def _give_unknown_unclaimed(workload: Workload, rng: random.Random) -> Workload | None:
    # A carrier claims none of its predecessors, and they say their gives are unknown
    # (issue 24 finding 2): honest vLLM may send that (more than 255 pending tokens),
    # so the stream stays exact, but its characters may hold the predecessors' bytes.
    options = _carriers(workload, False)
    if not options:
        return None
    index, position, at, stream = rng.choice(options)
    inputs = list(workload.inputs)
    carrier = decode_frame(inputs[index][1]).records[position]
    assert isinstance(carrier, wire.TextRecord)
    offset = carrier.offset + at
    claimed = set(range(offset - carrier.tokens[at].span_back, offset))

    def unclaim(records: list[Any]) -> None:
        token = records[position].tokens[at]
        token.span_back, token.lead_len = 0, 0

    def unknown(records: list[Any]) -> None:
        for record in records:
            if isinstance(record, wire.TextRecord) and record.stream == stream:
                for i, token in enumerate(record.tokens):
                    if record.offset + i in claimed:
                        token.lead_len = wire.LEAD_UNKNOWN

    for frame_index, frame in _record_frames(workload):
        if frame.kind == wire.KIND_TEXT:
            inputs[frame_index] = ("frame", _reencode(inputs[frame_index][1], unknown))
    inputs[index] = ("frame", _reencode(inputs[index][1], unclaim))
    return _with(workload, "give_unknown_unclaimed", inputs, {stream}, True)


def wrongly_colored(workload: Workload, events: list[tuple[Any, ...]]) -> list[str]:
    """Characters shown with a step (or role) that is not their true one; uncolored
    characters are not wrong."""
    errors = []
    for index, truth in enumerate(workload.truth):
        expected = list(zip(truth.char_steps, truth.char_roles, strict=True))
        shown = span_characters(events, index)
        for at, ((step, role), (true_step, true_role)) in enumerate(
            zip(shown, expected, strict=True)
        ):
            if (step is not None and step != true_step) or (role is not None and role != true_role):
                errors.append(f"stream {index} character {at}: shown {step, role}, "
                              f"true {true_step, true_role}")  # fmt: skip
    return errors


_MUTATORS = {
    "metrics_then_none": _metrics_then_none,
    "metrics_restated": _metrics_restated,
    "usage_corrected": _usage_corrected,
    "give_unknown_unclaimed": _give_unknown_unclaimed,
    "give_sum": _give_sum,
    "give_uncarried": _give_uncarried,
    "sse_split": _sse_split,
    "hello_differs": _hello_differs,
    "loss_after_verdict": _loss_after_verdict,
    "metrics_mismatch": _metrics_mismatch,
    "step_repeat": _step_repeat,
    "step_back": _step_back,
    "sse_finish_reason": _sse_finish_reason,
    "scheduler_finish_reason": _scheduler_finish_reason,
    "sse_choice": _sse_choice,
    "chunk_id": _chunk_id,
    "usage_count": _usage_count,
    "duplicate_differs": _duplicate_differs,
    "late_notice": _late_notice,
    "truncated_flag": _truncated_flag,
    "drafts_beyond_k": _drafts_beyond_k,
    "drop": _drop,
    "truncate": _truncate,
    "queue_drop": _queue_drop,
    "reorder_within": _reorder_within,
    "reorder_beyond": _reorder_beyond,
    "duplicate": _duplicate,
    "foreign_run": _foreign_run,
    "flip_http_byte": _flip_http_byte,
    "flip_sse_byte": _flip_sse_byte,
    "change_frame_id": _change_frame_id,
    "change_sse_id": _change_sse_id,
    "notice": _notice,
}


# --------------------------------------------------------------- hypothesis


def workloads(**kwargs: Any) -> Any:
    """A hypothesis strategy of unmutated workloads (keyword arguments go to generate)."""
    from hypothesis import strategies as st

    return st.integers(0, 2**32 - 1).map(lambda seed: generate(seed, **kwargs))


def mutated_workloads(kinds: tuple[str, ...] = MUTATIONS, **kwargs: Any) -> Any:
    """A hypothesis strategy of workloads with one fault from `kinds`."""
    from hypothesis import strategies as st

    return st.tuples(
        st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1), st.sampled_from(kinds)
    ).map(lambda t: mutate(generate(t[0], **kwargs), t[1], t[2]))


def property_settings() -> Any:
    """Hypothesis settings of the differential properties: PH_HYPOTHESIS_EXAMPLES
    examples (default 2000), derandomized under CI, no deadline. Hypothesis is
    imported here only: the benchmarks import this module without it."""
    from hypothesis import HealthCheck, settings

    return settings(
        max_examples=int(os.environ.get("PH_HYPOTHESIS_EXAMPLES", "2000")),
        deadline=None,
        derandomize=bool(os.environ.get("CI")),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def native_test_kit(name: str) -> Any:
    """The test kit's `parallelhue._native.<name>` (`decode_frame`, `sse_inputs`,
    `read_sse_body`, `pack_inputs`: in the development build, `make native`, never
    in the shipped extension), or None without it; PH_REQUIRE_NATIVE=1 (CI) makes
    that an error."""
    try:
        from parallelhue import _native  # type: ignore[attr-defined]
    except ImportError:
        function = None
    else:
        function = getattr(_native, name, None)
    if function is None and os.environ.get("PH_REQUIRE_NATIVE") == "1":
        raise RuntimeError(
            f"PH_REQUIRE_NATIVE=1 but parallelhue._native has no {name}: "
            "build it with the test kit (`make native`)"
        )
    return function
