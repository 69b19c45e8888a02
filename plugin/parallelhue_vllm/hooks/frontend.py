"""The API-server side: text rows from the output processor and the detokenizer.

`OutputProcessor.add_request` admits a request of ours and puts stand-ins
(standins.py) in place of two values on that request's own objects: its
output queue (whose `put` notes each RequestOutput handed to HTTP) and, for
fast tokenizers, its detokenizer's decode stream (which records each token's
fragment); at the end of `process_outputs` the step's rows are taken from the
noted outputs and handed to the emitter.
"""

from __future__ import annotations

from typing import Any

from .. import attribution, inband, traps, wire
from ..emitter import Emitter
from .common import MAX_DISABLED, PRUNE_EVERY, TelemetryError, _Base, _speedups, log, parse_ours
from .standins import (
    _capture_type,
    _FrontRequest,
    _record_decode_next,
    _take_rows,
    _uninstall,
    stream_recorder,
)

MAX_SPAN_BACK = 255

_FLAG_FINISHED = wire.ROW_FLAG_FINISHED
_FLAG_TEXT_TRUNCATED = wire.ROW_FLAG_TEXT_TRUNCATED
_FLAG_TOKENS_TRIMMED = wire.ROW_FLAG_TOKENS_TRIMMED


def _has_empty(fragments: list[str]) -> bool:
    """Whether a step's fragments hold a "" (a token that decoded to no text yet)."""
    if _speedups is not None:
        found: bool = _speedups.has_empty(fragments)
        return found
    return "" in fragments


# vLLM's finish reason strings (CompletionOutput.finish_reason) -> protocol codes.
_FINISH_NAMES = {
    "stop": wire.FINISH_STOP,
    "length": wire.FINISH_LENGTH,
    "abort": wire.FINISH_ABORT,
    "error": wire.FINISH_ERROR,
    "repetition": wire.FINISH_STOP,
}

_STREAM_WHERE = "RequestOutputCollector.put"


class FrontendTelemetry(_Base):
    """Text rows from the output processor and the detokenizer (API-server process).

    `stream_detokenizers`: detokenizer classes whose decode_next is `stream.step`
    (vLLM's FastIncrementalDetokenizer); other detokenizers get a per-instance
    decode_next on a private attribute dict (slower, but still theirs alone).
    """

    role = wire.SOURCE_FRONTEND

    def __init__(self, engine_version: str, *, stream_detokenizers: tuple[type, ...] = ()) -> None:
        super().__init__(engine_version)
        self.requests: dict[str, _FrontRequest] = {}
        self.stopping: dict[str, _FrontRequest] = {}  # requests with stop strings
        self.noticed: set[tuple[str, int]] = set()
        self.finished: list[str] = []
        self.stream_detokenizers = stream_detokenizers
        # traps.rust_frontend: set where vLLM serves HTTP from Rust (notice 7).
        self.rust_frontend = traps.rust_frontend()
        # run -> its text steps held back for give counts (attribution.HeldText).
        self.held: dict[str, attribution.HeldText] = {}
        # This step's outputs of our requests as (capture, output), in the order
        # vLLM put them (the captures' put notes them; end_step takes their rows).
        self.seen: list[Any] = []

    def _ensure_emitter(self) -> Emitter:
        if self.emitter is None:
            # The frontend cannot see the speculative config: the scheduler's hello
            # announces the method; this source only carries text.
            self.emitter = self._make_emitter("", 0, wire.DERIVATION_NONE, False)
        return self.emitter

    # ------------------------------------------------------------ admission
    def admit(self, processor: Any, request_id: str) -> None:
        """After `OutputProcessor.add_request`: put our stand-ins on a request of ours."""
        if request_id in self.requests or request_id in self.disabled:
            return  # a streaming-input update of a known request, or refused
        found = parse_ours(request_id, skip_children=False)
        if found is None:
            return
        req_state = processor.request_states.get(request_id)
        if req_state is None:
            return
        run, stream = found
        if not self.own_stream(run, stream, request_id):
            self.disable(request_id)
            return
        # The request's in-band claim (if it asked) takes this id's frames, from now.
        inband.bind_current(request_id)
        problem = _refusal(req_state, self.rust_frontend)
        if problem is not None:
            self.disable(request_id)
            self.release_stream(run, stream, request_id)
            key = (run, stream)
            if key not in self.noticed:
                if len(self.noticed) > MAX_DISABLED:
                    self.noticed.clear()
                self.noticed.add(key)
                emitter = self._ensure_emitter()
                emitter.begin_request(run, stream, request_id)
                emitter.notice(run, stream, problem[0], problem[1])
                emitter.end_request(run, stream, request_id, refused=True)
            return
        self._ensure_emitter().begin_request(run, stream, request_id)
        state = _FrontRequest(run, stream, req_state, self.track(run, request_id))
        self._install(state)
        self.requests[request_id] = state
        if getattr(state.detokenizer, "stop", None):
            self.stopping[request_id] = state

    def _install(self, state: _FrontRequest) -> None:
        """Replace the values of two attributes vLLM already has; add no attribute.

        Adding a name to an instance (CPython 3.11+) adds it to the keys every
        instance of the class shares and de-optimizes method calls on all of
        them, other users' requests included; a private dict for our objects
        avoids that but slows every attribute access on them. Replacing the
        value of `detokenizer.stream` and `req_state.queue` costs neither.
        """
        detokenizer = state.detokenizer
        fragments = state.fragments
        if (
            type(detokenizer) in self.stream_detokenizers
            and getattr(detokenizer, "spaces_between_special_tokens", False) is True
            and getattr(detokenizer, "stream", None) is not None
        ):
            state.recorder = stream_recorder(detokenizer, fragments)
            detokenizer.stream = state.recorder
        else:
            _record_decode_next(detokenizer, fragments)

        def special(
            token_ids: list[int], finish_reason: Any, stop_reason: Any, text: str, index: int
        ) -> None:
            self._special_row(state, token_ids, finish_reason, stop_reason, text, index)

        def failed(error: BaseException) -> None:
            self._disable(state, _STREAM_WHERE, error)

        state.capture = _capture_type()(
            state.queue, fragments, state.bucket, state.stream, state.req_state.request_index,
            special, failed, self.seen,
        )  # fmt: skip
        state.req_state.queue = state.capture

    # ----------------------------------------------------------------- steps
    def note_lengths(self, engine_core_outputs: Any) -> None:
        """Before process_outputs: the token counts a stop string may cut (stop-string requests)."""
        stopping = self.stopping
        for output in engine_core_outputs:
            state = stopping.get(output.request_id)
            if state is not None:
                state.pre_len = len(output.new_token_ids)

    def _special_row(
        self,
        state: _FrontRequest,
        token_ids: list[int],
        finish_reason: str | None,
        stop_reason: Any,
        text: str,
        index: int,
    ) -> None:
        """Every row the common path does not take: finished, trimmed, "" fragments, checks."""
        if index != state.req_state.request_index:
            raise TelemetryError(f"output index {index}, expected {state.req_state.request_index}")
        fragments = state.fragments
        fed = len(fragments)
        used = fragments[:]
        fragments.clear()
        count = len(token_ids)
        before_trim = state.pre_len if state.pre_len >= 0 else count
        state.pre_len = -1
        finished = finish_reason is not None
        if count > wire.MAX_TOKENS_PER_RECORD:
            raise TelemetryError(f"{count} tokens in one step")
        # The detokenizer decodes every token of the step, except a stop token
        # it keeps out of the text (the last one, when the request finished).
        if fed != before_trim and not (finished and fed == before_trim - 1):
            raise TelemetryError(f"the detokenizer decoded {fed} tokens of a step of {before_trim}")
        text = text or ""
        if fed > count:
            used = used[:count]  # decoded, then deleted after a stop string
        capture = state.capture
        span_backs = leads = None
        earlier: list[tuple[int, int]] = []
        pending = capture.pending_empty
        if pending or "" in used:
            span_backs, pending = _span_backs(used, count, pending)
            leads, earlier = _leads(state.detokenizer, capture.offset, token_ids, used, span_backs)
        if not finished:
            if not count:
                if text:
                    raise TelemetryError("text without tokens before the request finished")
                return
            meta = (state.stream, 0, 0, capture.offset, count, len(used), 0)
        else:
            trimmed = before_trim - count if before_trim > count else 0
            flags = _FLAG_FINISHED
            if isinstance(stop_reason, str):
                flags |= _FLAG_TEXT_TRUNCATED
            if trimmed:
                flags |= _FLAG_TOKENS_TRIMMED
            code = _FINISH_NAMES.get(str(finish_reason), wire.FINISH_ERROR)
            meta = (state.stream, flags, code, capture.offset, count, len(used), trimmed)
            self.finished.append(state.req_state.request_id)
            pending = 0  # no fragment will claim them: nothing holds the run's text back
        # Nothing can fail from here on: the row's columns go in together.
        capture.pending_empty = pending
        if earlier:
            held = self.held.get(state.run)
            for offset, give in earlier:
                if held is not None:
                    held.set_give(state.stream, offset, give)
        bucket = state.bucket
        if span_backs is not None:
            record = len(bucket.meta) // wire.ROW_WIDTH
            bucket.span_backs[record] = span_backs
            if leads is not None:
                bucket.leads[record] = leads
        bucket.meta.extend(meta)
        bucket.ids.extend(token_ids)
        bucket.fragments.extend(used)
        bucket.extra.append(text)
        capture.offset += count

    def flush_rows(self, kind: int) -> None:
        """Hand this step's text rows of every run to the emitter, except the records of
        streams that have tokens that decoded to "" and that no fragment has claimed
        yet: those wait (attribution.HeldText) for their give counts, which come with
        the fragment that carries their bytes."""
        by_run = None
        records = 0
        for run, bucket in self.buckets.items():
            held = self.held.get(run)
            if not bucket.meta and held is None:
                continue
            rows = bucket.take(kind) if bucket.meta else None
            if held is not None or (rows is not None and _has_empty(rows[3])):
                if held is None:
                    held = self.held[run] = attribution.HeldText()
                sending = held.pass_step(self.step, rows, self._dangling(run))
                if not held:
                    del self.held[run]
                rows = None
                for step, part in sending:
                    if step == self.step:
                        rows = part  # this step's: with the other runs' below
                    else:
                        self._send_held(run, step, part)
            if rows is not None:
                if by_run is None:
                    by_run = {}
                records += len(rows[2])
                by_run[run] = rows
        if by_run is not None and self.emitter is not None:
            self.emitter.submit_rows(kind, self.step, by_run, records)

    def _dangling(self, run: str) -> set[int]:
        """The run's streams with tokens that decoded to "" that no fragment claimed."""
        requests = self.requests
        streams = set()
        for rid in self.active.get(run, ()):
            state = requests.get(rid)
            if state is not None and state.capture is not None and state.capture.pending_empty:
                streams.add(state.stream)
        return streams

    def _send_held(self, run: str, step: int, rows: Any) -> None:
        if self.emitter is not None:
            self.emitter.submit_rows(wire.KIND_TEXT, step, {run: rows}, len(rows[2]))

    def _release(self, run: str) -> None:
        """Send a run's held text records, in order."""
        held = self.held.pop(run, None)
        if held is not None:
            for step, rows in held.release():
                self._send_held(run, step, rows)

    def end_emptied_runs(self) -> None:
        for run in self.emptied:
            if not self.active.get(run):
                self._release(run)  # before the emitter ends the run
        super().end_emptied_runs()

    def end_step(self, processor: Any, engine_core_outputs: Any = ()) -> None:
        """At the end of process_outputs: the step's rows of the outputs vLLM put, then
        to the sender."""
        self.step += 1
        if self.seen:
            if _speedups is not None:
                _speedups.take_rows(self.seen)
            else:
                _take_rows(self.seen)
        self.flush_rows(wire.KIND_TEXT)
        if self.finished:
            finished, self.finished = self.finished, []
            for rid in finished:
                self._forget(rid)
        states = processor.request_states
        # One C-level containment test per step; the list only when one is gone.
        if not states.keys() >= self.requests.keys():
            vanished = [rid for rid in self.requests if rid not in states]
            self._vanished(vanished, engine_core_outputs)
        if self.step % PRUNE_EVERY == 0:
            self._prune(processor.request_states)
        self.end_emptied_runs()

    def _vanished(self, request_ids: list[str], engine_core_outputs: Any) -> None:
        """Requests of ours vLLM dropped without a finished row (rare).

        traps.engine_error: vLLM finished it with an error outside
        make_request_output: notice 7 naming the error. Otherwise (aborted by
        the client) it is forgotten, as the periodic prune would.
        """
        errors: dict[str, str] = {}
        gone = set(request_ids)
        for output in engine_core_outputs:
            rid = getattr(output, "request_id", None)
            if rid in gone:
                bypass = traps.engine_error(output)
                if bypass is not None:
                    errors[rid] = bypass
        for rid in request_ids:
            state = self.requests.get(rid)
            bypass = errors.get(rid)
            if bypass is not None and state is not None:
                self._ensure_emitter().notice(
                    state.run, state.stream, wire.NOTICE_HOOK_BYPASSED, bypass
                )
                self._forget(rid, keep_disabled=True)
            else:
                self._forget(rid)

    def idle_step(self, processor: Any) -> None:
        """A call without requests of ours in this process."""
        self.step += 1

    # -------------------------------------------------------------- failures
    def fail_step(self, engine_core_outputs: Any, where: str, error: BaseException) -> None:
        try:
            self._ensure_emitter()
            ids = [output.request_id for output in engine_core_outputs]
            ids = [rid for rid in ids if rid in self.requests]
        except Exception:
            return
        self._fail_ids(ids, where, error)

    def fail_admission(self, request: Any, where: str, error: BaseException) -> None:
        try:
            rid = request.request_id
            found = parse_ours(rid, skip_children=False)
            if found is None:
                return
            self._ensure_emitter()
            self.fail_request(found[0], found[1], where, error)
            self._forget(rid, keep_disabled=True)
            self.end_emptied_runs()
        except Exception:  # pragma: no cover - nothing may reach vLLM
            log.debug("parallelhue: failure while reporting a failure", exc_info=True)

    def _disable(self, state: _FrontRequest, where: str, error: BaseException) -> None:
        self._ensure_emitter()
        self.fail_request(state.run, state.stream, where, error)
        self._forget(state.req_state.request_id, keep_disabled=True)

    def _forget(self, rid: str, keep_disabled: bool = False) -> None:
        state = self.requests.pop(rid, None)
        self.stopping.pop(rid, None)
        if keep_disabled:
            self.disable(rid)
        else:
            self.disabled.discard(rid)
        if state is not None:
            _uninstall(state)
            self.release_stream(state.run, state.stream, rid)
            self.untrack(state.run, rid)

    def _prune(self, processor_states: Any) -> None:
        # Requests aborted by the client never finish here; drop what vLLM forgot.
        for rid in [rid for rid in self.requests if rid not in processor_states]:
            self._forget(rid)
        self.disabled.intersection_update(processor_states)
        if len(self.noticed) > MAX_DISABLED:
            self.noticed.clear()


def _refusal(req_state: Any, rust_frontend: str | None) -> tuple[int, str] | None:
    """Why a request of ours cannot be exact (a notice), or None."""
    if rust_frontend is not None:
        return wire.NOTICE_HOOK_BYPASSED, rust_frontend
    if req_state.parent_req is not None:
        n = getattr(req_state.parent_req, "n", None) or getattr(req_state, "n", "?")
        return wire.NOTICE_N, f"n={n}: choices of a parallel-sampling request are not tracked"
    if req_state.stream_interval != 1:
        return wire.NOTICE_STREAM_INTERVAL, f"stream_interval={req_state.stream_interval}"
    kind = getattr(req_state.output_kind, "name", "DELTA")
    if kind == "CUMULATIVE":
        return wire.NOTICE_OTHER, "cumulative output mode is not supported"
    bypass = traps.streaming_input(req_state)
    if bypass is not None:
        return wire.NOTICE_HOOK_BYPASSED, bypass
    if kind == "FINAL_ONLY" or req_state.queue is None:
        return wire.NOTICE_OTHER, "only streamed requests are tracked (this one is not)"
    if not hasattr(req_state.detokenizer, "decode_next"):
        return wire.NOTICE_OTHER, "the request has no detokenizer (no text to attribute)"
    return None


def _span_backs(fragments: list[str], count: int, pending: int) -> tuple[list[int], int]:
    """Per token: how many preceding tokens that returned "" its fragment claims.

    `fragments` holds the decoded strings of the first len(fragments) tokens;
    the rest of the `count` tokens were never decoded (a stop token kept out of
    the text) and claim nothing. Returns the span_backs and the new pending count.
    """
    span_backs = [0] * count
    for position, piece in enumerate(fragments):
        if piece:
            span_backs[position] = pending if pending <= MAX_SPAN_BACK else MAX_SPAN_BACK
            pending = 0
        else:
            pending += 1
    return span_backs, pending


def _leads(
    detokenizer: Any, offset: int, token_ids: list[int], fragments: list[str], span_backs: list[int]
) -> tuple[list[int] | None, list[tuple[int, int]]]:
    """Per token of a row with span_backs: its lead_len (0 for a fragment without
    span_back; for a token that decoded to "", its give count, LEAD_UNKNOWN until
    known: protocol 3), and the give counts of earlier rows' tokens, as
    (offset, give) pairs.

    Only the tokens with span_back > 0 cost anything (attribution.lead_and_gives,
    which never raises and says LEAD_UNKNOWN rather than guess); None when no
    token of the row claims a predecessor.
    """
    leads = None
    earlier: list[tuple[int, int]] = []
    for position, back in enumerate(span_backs):
        if back:
            if leads is None:
                leads = [
                    0 if index < len(fragments) and fragments[index] else wire.LEAD_UNKNOWN
                    for index in range(len(span_backs))
                ]
            leads[position], gives = attribution.lead_and_gives(
                detokenizer, offset + position, token_ids[position], back,
                fragments[position].encode("utf-8"),
            )  # fmt: skip
            for index, give in enumerate(gives):
                at = position - back + index  # the predecessor's position in this row
                if at >= 0:
                    leads[at] = give
                else:
                    earlier.append((offset + at, give))
    return leads, earlier
