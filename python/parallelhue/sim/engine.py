"""The simulated engine: a batched speculative-decoding scheduler, a frontend
detokenizer with stop strings, and vLLM's output collector.

One `step()` advances every active request by one engine step: the scheduler
part picks the number of drafts and how many are accepted (emitting accepted
drafts, then a target correction, or a bonus token when all drafts pass), the
frontend part turns the step's tokens into text the way vLLM's incremental
detokenizer does, and the collector merges outputs that the HTTP writer has
not yet picked up. Telemetry goes out once per step per run.

Everything per token is a lookup into the vocabulary's precomputed cycle: a
step costs a few microseconds per request, plus the SSE chunk it writes.
"""

from __future__ import annotations

import asyncio
import random
import time
import zlib
from collections.abc import Callable

from parallelhue_vllm import wire

from .config import MAX_DRAFT_LEN, SimConfig
from .metrics import SimMetrics
from .vocab import Vocabulary

__all__ = ["Collector", "Engine", "SimRequest", "StepSink"]

FINISH_NAMES = {wire.FINISH_STOP: "stop", wire.FINISH_LENGTH: "length"}

# _ROLES[k][accepted]: the roles of a step with k drafts of which `accepted` passed.
_ROLES: list[list[list[int]]] = [
    [
        [wire.ROLE_ACCEPTED] * accepted
        + [wire.ROLE_BONUS if accepted == drafts else wire.ROLE_TARGET]
        for accepted in range(drafts + 1)
    ]
    for drafts in range(MAX_DRAFT_LEN + 1)
]
_PLAIN = [wire.ROLE_PLAIN]


# (text, token_ids, finish_reason) -> whether the consumer still keeps up.
DirectWrite = Callable[[str, list[int], str | None], bool]


class Collector:
    """vLLM's RequestOutputCollector: outputs merge while the consumer lags.

    While the HTTP connection keeps up, `direct` writes each step's output at
    once (no task switch per chunk); once it reports a backlog, outputs are
    merged here until the writer task has drained the connection. With an
    `interval`, a connection gets at most one chunk per interval and the
    steps in between are merged (an HTTP layer with a chunk-rate limit).
    """

    __slots__ = (
        "direct",
        "event",
        "finish_reason",
        "flush_handle",
        "interval",
        "merge_every",
        "next_write",
        "steps",
        "stop_reason",
        "texts",
        "token_ids",
    )

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.texts: list[str] = []
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.steps = 0
        self.direct: DirectWrite | None = None
        self.interval = 0.0
        # A fault (merge:N): hold N steps, then write them as one merged chunk, as
        # vLLM's collector does while its API server stalls.
        self.merge_every = 0
        self.next_write = 0.0
        self.flush_handle: asyncio.TimerHandle | None = None

    def put(self, text: str, token_ids: list[int], finish_reason: str | None) -> None:
        if finish_reason is not None:
            self.finish_reason = finish_reason
        direct = self.direct
        if self.merge_every > 1 and direct is not None:
            self._hold(text, token_ids)
            if self.steps >= self.merge_every or finish_reason is not None:
                text, token_ids = self._merged()
                self._write(direct, text, token_ids, finish_reason)
            return
        if direct is None:
            self._hold(text, token_ids)
            self.event.set()
            return
        if self.interval > 0.0:
            now = time.monotonic()
            if now < self.next_write and finish_reason is None:
                self._hold(text, token_ids)
                if self.flush_handle is None:
                    loop = asyncio.get_running_loop()
                    self.flush_handle = loop.call_at(self.next_write, self._flush)
                return
            self.next_write = now + self.interval
            if self.steps:
                self._hold(text, token_ids)
                text, token_ids = self._merged()
        self._write(direct, text, token_ids, finish_reason)

    def _write(
        self, direct: DirectWrite, text: str, token_ids: list[int], finish: str | None
    ) -> None:
        if not direct(text, token_ids, finish) or finish is not None:
            self.direct = None
            self.event.set()

    def _flush(self) -> None:
        """The interval passed: write what was held back."""
        self.flush_handle = None
        direct = self.direct
        if not self.steps:
            return
        if direct is None:
            self.event.set()  # the writer task owns the connection now
            return
        self.next_write = time.monotonic() + self.interval
        text, token_ids = self._merged()
        self._write(direct, text, token_ids, None)

    def cancel_flush(self) -> None:
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None

    def _hold(self, text: str, token_ids: list[int]) -> None:
        self.texts.append(text)
        self.token_ids.extend(token_ids)
        self.steps += 1

    def _merged(self) -> tuple[str, list[int]]:
        text = "".join(self.texts) if len(self.texts) != 1 else self.texts[0]
        token_ids = self.token_ids
        self.texts = []
        self.token_ids = []
        self.steps = 0
        self.cancel_flush()
        return text, token_ids

    @property
    def pending(self) -> bool:
        return self.steps > 0

    def take(self) -> tuple[str, list[int], str | None, int]:
        """Everything since the previous take, merged: text, token ids, finish reason, steps."""
        steps = self.steps
        text, token_ids = self._merged()
        self.event.clear()
        return text, token_ids, self.finish_reason, steps


class SimRequest:
    """One request as both the scheduler and the frontend see it."""

    __slots__ = (
        "aborted",
        "acceptance",
        "collector",
        "external_id",
        "internal_id",
        "max_stop_len",
        "max_tokens",
        "num_prompt_tokens",
        "offset",
        "output_text",
        "position",
        "rng",
        "run_id",
        "scheduler_done",
        "sent_chars",
        "spec_steps",
        "started",
        "step_log",
        "stop",
        "stop_pending",
        "stream",
        "text_done",
        "text_offset",
        "token_texts",
    )

    def __init__(
        self,
        *,
        internal_id: str,
        external_id: str,
        run_id: str | None,
        stream: int,
        start_position: int,
        seed: int,
        acceptance: float,
        max_tokens: int,
        stop: tuple[str, ...],
        num_prompt_tokens: int,
    ) -> None:
        self.internal_id = internal_id
        self.external_id = external_id
        self.run_id = run_id
        self.stream = stream
        self.position = start_position
        self.rng = random.Random(seed)
        self.acceptance = acceptance
        self.max_tokens = max_tokens
        self.stop = stop
        self.max_stop_len = max((len(item) for item in stop), default=0)
        self.num_prompt_tokens = num_prompt_tokens
        self.offset = 0  # tokens the scheduler has emitted
        self.text_offset = 0  # tokens the frontend has kept
        self.output_text = ""  # only kept when there are stop strings
        self.sent_chars = 0
        self.started = False
        self.scheduler_done = False
        self.text_done = False
        # Steps the scheduler still runs after the frontend stopped the request on a
        # stop string (the abort reaches the engine late, as in vLLM).
        self.stop_pending = -1
        self.aborted = False
        self.collector = Collector()
        # What a stock server reports of its steps (--stock): vLLM's per-step lists,
        # (accepted, drafted) per step with drafts, accepted counted before the
        # max_tokens cut; and per step (tokens kept, drafted, accepted), from
        # which llama-server's cumulative counters of each token follow.
        self.spec_steps: list[tuple[int, int]] = []
        self.step_log: list[tuple[int, int, int]] = []
        # --stock llamacpp: each kept token's text ("" when it ends inside a character).
        self.token_texts: list[str] | None = None


def request_seed(seed: int, stream: int, prompt: str) -> int:
    """A stable seed from the request's seed, stream index and prompt."""
    return zlib.crc32(f"{seed}|{stream}|{prompt}".encode())


# (run_id, step, records) -> None; the telemetry side of the engine.
StepSink = Callable[[str, int, list[wire.Record]], None]


class Engine:
    """The scheduler loop. Runs as a task in the server's event loop."""

    def __init__(
        self,
        config: SimConfig,
        vocab: Vocabulary,
        metrics: SimMetrics,
        *,
        provenance_sink: StepSink | None = None,
        text_sink: StepSink | None = None,
        content_faults: ContentFaultHook | None = None,
    ) -> None:
        self.config = config
        self.vocab = vocab
        self.metrics = metrics
        self.provenance_sink = provenance_sink
        self.text_sink = text_sink
        self.content_faults = content_faults
        self.active: list[SimRequest] = []
        self.step_count = 0
        self.step_records = 0  # one request's share of one step
        self.active_seconds = 0.0  # wall time with requests in flight
        # Steps run with at least `min_batch` requests (benchmarks measure these).
        self.full_batch_seconds = 0.0
        self.full_batch_steps = 0
        self.full_batch_records = 0
        self._wake = asyncio.Event()
        self._stopping = False
        # The cycle, extended so that a step's slice never wraps.
        extra = MAX_DRAFT_LEN + 2
        self._cycle_len = vocab.cycle_len
        self._ids = list(vocab.cycle_ids + vocab.cycle_ids[:extra])
        self._texts = list(vocab.cycle_texts + vocab.cycle_texts[:extra])
        self._fragments = list(vocab.cycle_fragments + vocab.cycle_fragments[:extra])
        self._text_tokens = [
            wire.TextToken(token_id, fragment, span_back, lead_len)
            for token_id, fragment, span_back, lead_len in zip(
                self._ids,
                self._fragments,
                list(vocab.cycle_span_back + vocab.cycle_span_back[:extra]),
                list(vocab.cycle_lead_len + vocab.cycle_lead_len[:extra]),
                strict=True,
            )
        ]

    # ------------------------------------------------------------------ requests
    def start_position(self, seed: int) -> int:
        starts = self.vocab.starts
        return starts[seed % len(starts)]

    def add(self, request: SimRequest) -> None:
        self.metrics.prompt_tokens += request.num_prompt_tokens
        self.active.append(request)
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """The HTTP client went away: stop scheduling the request."""
        request.aborted = True

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    # ---------------------------------------------------------------------- loop
    async def run(self) -> None:
        step_seconds = self.config.step_ms / 1000.0
        next_tick = time.monotonic()
        previous = next_tick
        min_batch = self.config.min_batch
        batch_deadline: float | None = None
        filling = True  # until the first step after the engine was idle
        while not self._stopping:
            if not self.active:
                filling = True
                batch_deadline = None
                self._wake.clear()
                await self._wake.wait()
                next_tick = previous = time.monotonic()
                continue
            if filling and len(self.active) < min_batch:
                # Benchmarks start the batch together: wait (bounded) for it to fill.
                now = time.monotonic()
                if batch_deadline is None:
                    batch_deadline = now + self.config.min_batch_wait
                if now < batch_deadline:
                    self._wake.clear()
                    try:
                        await asyncio.wait_for(self._wake.wait(), batch_deadline - now)
                    except TimeoutError:
                        pass
                    next_tick = previous = time.monotonic()
                    continue
            filling = False
            full = min_batch > 1 and len(self.active) >= min_batch
            records_before = self.step_records
            self.step()
            now = time.monotonic()
            self.active_seconds += now - previous
            if full:
                self.full_batch_seconds += now - previous
                self.full_batch_steps += 1
                self.full_batch_records += self.step_records - records_before
            previous = now
            if step_seconds <= 0.0:
                await asyncio.sleep(0)
                continue
            next_tick += step_seconds
            delay = next_tick - time.monotonic()
            if delay > 0.0:
                await asyncio.sleep(delay)
            else:
                if delay < -0.1:  # far behind: do not burst to catch up
                    next_tick = time.monotonic()
                await asyncio.sleep(0)

    def step(self) -> None:
        """One engine step over every active request."""
        self.step_count += 1
        step = self.step_count
        config = self.config
        draft_len = config.draft_len
        no_draft_rate = config.no_draft_rate
        metrics = self.metrics
        per_position = metrics.accepted_per_position
        ids_table = self._ids
        cycle_len = self._cycle_len
        provenance: dict[str, list[wire.Record]] = {}
        texts: dict[str, list[wire.Record]] = {}
        want_provenance = self.provenance_sink is not None
        want_text = self.text_sink is not None
        faults = self.content_faults
        finished_any = False
        for request in self.active:
            if request.aborted:
                request.scheduler_done = True
                finished_any = True
                continue
            rng = request.rng
            # ---- scheduler: drafts, acceptance, roles
            if not request.started or draft_len == 0 or rng.random() < no_draft_rate:
                drafts = 0
                count = 1
                roles = _PLAIN
                request.started = True
            else:
                drafts = draft_len
                acceptance = request.acceptance
                accepted = 0
                while accepted < drafts and rng.random() < acceptance:
                    accepted += 1
                count = accepted + 1
                roles = _ROLES[drafts][accepted]
                metrics.drafts += 1
                metrics.draft_tokens += drafts
                metrics.accepted_tokens += accepted
                for index in range(accepted):
                    per_position[index] += 1
            accepted_all = count - 1 if drafts else 0  # counted before the max_tokens cut
            if drafts:
                request.spec_steps.append((accepted_all, drafts))
            position = request.position
            remaining = request.max_tokens - request.offset
            finish = wire.FINISH_NONE
            trimmed = False
            if count >= remaining:
                if count > remaining:
                    count = remaining
                    roles = roles[:count]
                    trimmed = True
                finish = wire.FINISH_LENGTH
            token_ids = ids_table[position : position + count]
            offset = request.offset
            metrics.generation_tokens += count
            self.step_records += 1
            if want_provenance and request.run_id is not None:
                record = wire.ProvenanceRecord(
                    request.stream,
                    offset,
                    token_ids,
                    roles,
                    drafts,
                    0,
                    finish != wire.FINISH_NONE,
                    finish,
                    trimmed,
                )
                if faults is not None:
                    record = faults.provenance(request, record)
                provenance.setdefault(request.run_id, []).append(record)
            request.offset = offset + count
            request.position = (position + count) % cycle_len
            if finish != wire.FINISH_NONE:
                request.scheduler_done = True
            if request.stop_pending >= 0:
                # The frontend already finished this request; these are surplus steps.
                if request.stop_pending == 0:
                    request.scheduler_done = True
                request.stop_pending -= 1
                if request.scheduler_done:
                    finished_any = True
                continue
            # ---- frontend: detokenize, stop strings, collector
            request.step_log.append((count, drafts, accepted_all))
            text_record = self._frontend(request, position, count, token_ids, finish)
            if want_text and request.run_id is not None:
                if faults is not None:
                    text_record = faults.text(request, text_record)
                texts.setdefault(request.run_id, []).append(text_record)
            if request.scheduler_done:
                finished_any = True
        if finished_any:
            self.active = [request for request in self.active if not request.scheduler_done]
        if provenance and self.provenance_sink is not None:
            for run_id, records in provenance.items():
                self.provenance_sink(run_id, step, records)
        if texts and self.text_sink is not None:
            for run_id, records in texts.items():
                self.text_sink(run_id, step, records)

    def _frontend(
        self,
        request: SimRequest,
        position: int,
        count: int,
        token_ids: list[int],
        finish: int,
    ) -> wire.TextRecord:
        end = position + count
        offset = request.text_offset
        if request.token_texts is not None:
            request.token_texts.extend(self._texts[position:end])
        if not request.stop:
            text = "".join(self._texts[position:end])
            tokens = self._text_tokens[position:end]
            request.text_offset = offset + count
            finish_name = FINISH_NAMES.get(finish)
            request.collector.put(text, token_ids, finish_name)
            if finish != wire.FINISH_NONE:
                request.text_done = True
                self.metrics.requests_finished += 1
            return wire.TextRecord(
                request.stream,
                offset,
                tokens,
                text.encode("utf-8"),
                finish != wire.FINISH_NONE,
                finish,
            )
        return self._frontend_with_stop(request, position, count, token_ids, finish)

    def _frontend_with_stop(
        self,
        request: SimRequest,
        position: int,
        count: int,
        token_ids: list[int],
        finish: int,
    ) -> wire.TextRecord:
        """Detokenize with stop strings, as vLLM's detokenizer and output processor do.

        Holds back max(len(stop)) - 1 characters while unfinished; on a match the
        text ends before the stop string and the tokens after the one that
        completed it are deleted (vLLM >= 0.32).
        """
        pieces = self._texts[position : position + count]
        offset = request.text_offset
        old_length = len(request.output_text)
        output_text = request.output_text + "".join(pieces)
        new_chars = len(output_text) - old_length
        match: tuple[str, int] | None = None
        if new_chars:
            for stop_string in request.stop:
                index = output_text.find(stop_string, 1 - new_chars - len(stop_string))
                if index != -1:
                    match = (stop_string, index)
                    break
        kept = count
        text_truncated = False
        if match is not None:
            stop_string, index = match
            stop_end = index + len(stop_string)
            characters = old_length
            for kept_index, piece in enumerate(pieces):
                characters += len(piece)
                if characters >= stop_end:
                    kept = kept_index + 1
                    break
            output_text = output_text[:index]
            finish = wire.FINISH_STOP
            text_truncated = True
            request.collector.stop_reason = stop_string
            # The scheduler runs one more step before the abort reaches it.
            request.stop_pending = 0
        request.output_text = output_text
        if finish != wire.FINISH_NONE:
            upto = len(output_text)
        else:
            upto = max(len(output_text) - (request.max_stop_len - 1), request.sent_chars)
        delta = output_text[request.sent_chars : upto]
        request.sent_chars = upto
        kept_ids = token_ids if kept == count else token_ids[:kept]
        request.text_offset = offset + kept
        request.collector.put(delta, kept_ids, FINISH_NAMES.get(finish))
        if finish != wire.FINISH_NONE:
            request.text_done = True
            self.metrics.requests_finished += 1
        return wire.TextRecord(
            request.stream,
            offset,
            self._text_tokens[position : position + kept],
            delta.encode("utf-8"),
            finish != wire.FINISH_NONE,
            finish,
            text_truncated,
            kept < count,
            count - kept,
        )


class ContentFaultHook:
    """Interface of the record-level fault injector (see faults.py)."""

    def provenance(
        self, request: SimRequest, record: wire.ProvenanceRecord
    ) -> wire.ProvenanceRecord:
        return record

    def text(self, request: SimRequest, record: wire.TextRecord) -> wire.TextRecord:
        return record

    def sse(
        self, request: SimRequest, text: str, token_ids: list[int]
    ) -> tuple[str, list[int], str]:
        """Returns (content, token_ids, reasoning_content)."""
        return text, token_ids, ""
