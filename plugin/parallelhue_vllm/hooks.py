"""What the patched vLLM methods do: turn engine state into provenance and text records.

Version-independent. The adapters (adapters/v0_26.py, adapters/v0_33.py) check
the signatures of the methods they patch and then wrap them with the
functions here. Two collectors, one per vLLM process:

- `SchedulerTelemetry` runs in the EngineCore process around
  `Scheduler.update_from_output`: roles derived from counts (tokens the step
  produced before the stop checks, drafts scheduled), kept for the tokens that
  survive the scheduler's stop / max_tokens trim.
- `FrontendTelemetry` runs in the API-server process around
  `OutputProcessor.process_outputs`, `RequestState.make_request_output` and the
  detokenizers' `decode_next`: each token's fragment and the text delta handed
  to HTTP.

Both only ever touch requests whose id holds `ph1_<run>_<stream>`. Any
exception is contained per request: logged once, telemetry for that request
turned off and a notice frame sent so the client knows why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import __version__, wire
from .emitter import Emitter

log = logging.getLogger("vllm.parallelhue")

FRAGMENTS_ATTR = "_parallelhue_fragments"
# Prune state of requests vLLM forgot (aborts) every this many steps.
PRUNE_EVERY = 256
MAX_CACHED_IDS = 8192
MAX_SPAN_BACK = 255
# vLLM's `rejection_sample_method` -> the hello's verification ("block" and
# anything newer are not classified: unknown).
_VERIFICATION = {
    "standard": wire.VERIFICATION_STANDARD,
    "synthetic": wire.VERIFICATION_SYNTHETIC,
    "fly": wire.VERIFICATION_FLY,
}

_CHILD_ID = re.compile(r"[0-9]+_")
_FINISH_CODES = {
    "STOP": wire.FINISH_STOP,
    "LENGTH": wire.FINISH_LENGTH,
    "ABORT": wire.FINISH_ABORT,
    "ERROR": wire.FINISH_ERROR,
    "REPETITION": wire.FINISH_STOP,
}


class TelemetryError(Exception):
    """Engine state the plugin cannot turn into exact records."""


def finish_code(reason: object) -> int:
    """Protocol finish reason for a vLLM FinishReason (None = not finished)."""
    if reason is None:
        return wire.FINISH_NONE
    return _FINISH_CODES.get(getattr(reason, "name", str(reason).upper()), wire.FINISH_ERROR)


def step_roles(generated: int, drafts: int) -> list[int]:
    """Roles of the tokens one step produced, from counts alone.

    Standard rejection sampling: the accepted drafts come first, then one
    token sampled by the target, a correction when a draft was rejected, a
    bonus when all were accepted. No drafts: one plain token.
    """
    if drafts == 0:
        if generated != 1:
            raise TelemetryError(f"a step without drafts produced {generated} tokens")
        return [wire.ROLE_PLAIN]
    accepted = generated - 1
    if not 0 <= accepted <= drafts:
        raise TelemetryError(f"a step with {drafts} drafts produced {generated} tokens")
    last = wire.ROLE_BONUS if accepted == drafts else wire.ROLE_TARGET
    return [wire.ROLE_ACCEPTED] * accepted + [last]


class RequestIds:
    """Cached `ph1_<run>_<stream>` lookups (one regex per request id, not per step)."""

    def __init__(self, *, skip_children: bool) -> None:
        self._cache: dict[str, tuple[str, int] | None] = {}
        self._skip_children = skip_children

    def lookup(self, request_id: str) -> tuple[str, int] | None:
        try:
            return self._cache[request_id]
        except KeyError:
            pass
        found = wire.parse_request_id(request_id)
        if found is not None and self._skip_children and _CHILD_ID.match(request_id):
            found = None  # an n > 1 child: the frontend sends the notice for it
        if len(self._cache) >= MAX_CACHED_IDS:
            self._cache.clear()
        self._cache[request_id] = found
        return found

    def forget(self, request_id: str) -> None:
        self._cache.pop(request_id, None)


class _Base:
    """Per-process bookkeeping shared by both collectors."""

    role = 0

    def __init__(self, engine_version: str) -> None:
        self.engine_version = engine_version
        self.emitter: Emitter | None = None
        self.step = 0
        self.active: dict[str, set[str]] = {}  # run -> request ids with state here
        self.emptied: set[str] = set()  # runs whose last request went this step
        self.warned: set[str] = set()

    def _make_emitter(
        self,
        method: str,
        tokens: int,
        derivation: int,
        is_async: bool,
        verification: int | None = None,
    ) -> Emitter:
        return Emitter(
            role=self.role,
            engine=wire.ENGINE_VLLM,
            engine_version=self.engine_version,
            plugin_version=__version__,
            spec_method=method,
            num_speculative_tokens=tokens,
            role_derivation=derivation,
            async_scheduling=is_async,
            verification=verification,
        )

    def warn_once(self, key: str, message: str) -> None:
        if key not in self.warned and len(self.warned) < 1024:
            self.warned.add(key)
            log.warning("parallelhue: %s", message)

    def track(self, run: str, request_id: str) -> None:
        self.active.setdefault(run, set()).add(request_id)

    def untrack(self, run: str, request_id: str) -> None:
        requests = self.active.get(run)
        if requests is None:
            return
        requests.discard(request_id)
        if not requests:
            self.emptied.add(run)

    def end_emptied_runs(self) -> None:
        """At the end of a step (never mid-step): end runs with no request left here."""
        for run in self.emptied:
            if not self.active.get(run):
                self.active.pop(run, None)
                if self.emitter is not None:
                    self.emitter.end_run(run)
        self.emptied.clear()

    def fail_request(self, run: str, stream: int, where: str, error: BaseException) -> None:
        reason = f"{type(error).__name__}: {error}"
        self.warn_once(
            f"{where}:{type(error).__name__}",
            f"telemetry hook failed in {where} ({reason}); telemetry is off for the "
            "affected request, the client is told by a notice",
        )
        if self.emitter is not None:
            self.emitter.notice(
                run, stream, wire.NOTICE_HOOK_ERROR, f"telemetry hook failed in {where}: {reason}"
            )


@dataclass(slots=True)
class _SchedRequest:
    run: str
    stream: int
    offset: int = 0


class SchedulerTelemetry(_Base):
    """Provenance from `Scheduler.update_from_output` (EngineCore process)."""

    role = wire.SOURCE_SCHEDULER

    def __init__(self, engine_version: str) -> None:
        super().__init__(engine_version)
        self.ids = RequestIds(skip_children=True)
        self.requests: dict[str, _SchedRequest] = {}
        self.disabled: set[str] = set()
        self.is_async = False

    def idle_step(self, scheduler: Any) -> None:
        """A step without requests of ours: still prune what vLLM forgot (aborts)."""
        self.step += 1
        if self.requests and self.step % PRUNE_EVERY == 0:
            self._prune(scheduler)
            self.end_emptied_runs()

    def _ensure_emitter(self, scheduler: Any) -> Emitter:
        if self.emitter is None:
            spec = getattr(scheduler.vllm_config, "speculative_config", None)
            method = str(getattr(spec, "method", "") or "") if spec is not None else ""
            tokens = int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec else 0
            scheduler_config = getattr(scheduler, "scheduler_config", None)
            self.is_async = bool(getattr(scheduler_config, "async_scheduling", False)) or (
                type(scheduler).__name__ == "AsyncScheduler"
            )
            verification = _VERIFICATION.get(
                str(getattr(spec, "rejection_sample_method", "standard")), wire.VERIFICATION_UNKNOWN
            )
            if not method or tokens == 0:
                method, tokens, derivation = "", 0, wire.DERIVATION_NONE
                verification = wire.VERIFICATION_NONE
            elif self.is_async:
                derivation = wire.DERIVATION_COUNTS
            else:
                derivation = wire.DERIVATION_DRAFT_IDS
            self.emitter = self._make_emitter(
                method, tokens, derivation, self.is_async, verification
            )
        return self.emitter

    def before(
        self, scheduler: Any, scheduler_output: Any, model_runner_output: Any
    ) -> dict[str, tuple[int, int, int]] | None:
        """Snapshot, per request of ours, what the stop checks will trim in place."""
        lookup = self.ids.lookup
        ours = [rid for rid in scheduler_output.num_scheduled_tokens if lookup(rid) is not None]
        if not ours:
            return None
        self._ensure_emitter(scheduler)
        sampled = model_runner_output.sampled_token_ids
        index_of = model_runner_output.req_id_to_index
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        invalid = getattr(scheduler_output, "num_invalid_spec_tokens", None) or {}
        snapshot: dict[str, tuple[int, int, int]] = {}
        for rid in ours:
            if rid in self.disabled:
                continue
            index = index_of.get(rid)
            generated = len(sampled[index]) if sampled and index is not None else 0
            drafts = spec_tokens.get(rid) or ()
            # Placeholders: -1 drafts; under async scheduling every draft is -1 in
            # the scheduler, so only the grammar-invalidated ones count as padding.
            if self.is_async:
                padded = int(invalid.get(rid, 0))
            else:
                padded = sum(1 for token in drafts if token < 0) or int(invalid.get(rid, 0))
            snapshot[rid] = (generated, len(drafts), min(padded, len(drafts)))
        return snapshot

    def after(self, scheduler: Any, snapshot: dict[str, tuple[int, int, int]], result: Any) -> None:
        """Build this step's provenance records from the outputs vLLM returns."""
        self.step += 1
        emitter = self._ensure_emitter(scheduler)
        by_run: dict[str, list[wire.Record]] = {}
        finished: list[str] = []
        for outputs in result.values():
            for output in outputs.outputs:
                rid = output.request_id
                counts = snapshot.get(rid)
                if counts is None:
                    continue
                found = self.ids.lookup(rid)
                if found is None:  # pragma: no cover - snapshot only holds ours
                    continue
                run, stream = found
                try:
                    record = self._record(rid, run, stream, counts, output)
                except Exception as error:
                    self.fail_request(run, stream, "Scheduler.update_from_output", error)
                    self._forget(rid, keep_disabled=True)
                    continue
                if record is not None:
                    by_run.setdefault(run, []).append(record)
                if output.finish_reason is not None:
                    finished.append(rid)
        for run, records in by_run.items():
            emitter.submit(run, wire.KIND_PROVENANCE, self.step, records)
        # Only after the step's frames are queued: forgetting the last request of
        # a run ends the run in the emitter.
        for rid in finished:
            self._forget(rid)
        if self.step % PRUNE_EVERY == 0:
            self._prune(scheduler)
        self.end_emptied_runs()

    def _record(
        self,
        rid: str,
        run: str,
        stream: int,
        counts: tuple[int, int, int],
        output: Any,
    ) -> wire.ProvenanceRecord | None:
        state = self.requests.get(rid)
        if state is None:
            state = self.requests[rid] = _SchedRequest(run, stream)
            self.track(run, rid)
        generated, drafts, padded = counts
        tokens = list(output.new_token_ids)
        finished = output.finish_reason is not None
        if not tokens:
            return None
        if len(tokens) > generated:
            raise TelemetryError(f"{len(tokens)} tokens out of a step that sampled {generated}")
        roles = step_roles(generated, drafts)[: len(tokens)]
        record = wire.ProvenanceRecord(
            stream=stream,
            offset=state.offset,
            token_ids=tokens,
            roles=roles,
            drafts_scheduled=drafts,
            drafts_padded=padded,
            finished=finished,
            finish_reason=finish_code(output.finish_reason),
            trimmed=len(tokens) < generated,
        )
        state.offset += len(tokens)
        return record

    def _forget(self, rid: str, keep_disabled: bool = False) -> None:
        state = self.requests.pop(rid, None)
        if keep_disabled:
            self.disabled.add(rid)
        else:
            self.disabled.discard(rid)
            self.ids.forget(rid)
        if state is not None:
            self.untrack(state.run, rid)

    def fail_step(self, scheduler_output: Any, where: str, error: BaseException) -> None:
        try:
            self._ensure_emitter_quietly()
            ids = list(scheduler_output.num_scheduled_tokens)
        except Exception:
            return
        _fail_ids(self, ids, where, error)

    def _ensure_emitter_quietly(self) -> None:
        if self.emitter is None:
            self.emitter = self._make_emitter("", 0, wire.DERIVATION_NONE, False)

    def _prune(self, scheduler: Any) -> None:
        alive = scheduler.requests
        for rid in [rid for rid in self.requests if rid not in alive]:
            self._forget(rid)
        self.disabled.intersection_update(alive)


@dataclass(slots=True)
class _FrontRequest:
    run: str
    stream: int
    offset: int = 0
    pending_empty: int = 0  # tokens that returned "" and no fragment has claimed yet
    in_step: bool = False
    pre_len: int = 0
    captured: tuple[list[int], object, object, str] | None = None
    detokenizer: Any = None


@dataclass(slots=True)
class _StepWork:
    items: list[tuple[str, _FrontRequest, Any]] = field(default_factory=list)


class FrontendTelemetry(_Base):
    """Text frames from the output processor and the detokenizer (API-server process)."""

    role = wire.SOURCE_FRONTEND

    def __init__(self, engine_version: str) -> None:
        super().__init__(engine_version)
        self.ids = RequestIds(skip_children=False)
        self.requests: dict[str, _FrontRequest] = {}
        self.disabled: set[str] = set()
        self.noticed: set[tuple[str, int]] = set()

    def idle_step(self, processor: Any) -> None:
        """A call without outputs of ours: still prune what vLLM forgot (aborts)."""
        self.step += 1
        if self.requests and self.step % PRUNE_EVERY == 0:
            self._prune(processor.request_states)
            self.end_emptied_runs()

    def _ensure_emitter(self) -> Emitter:
        if self.emitter is None:
            # The frontend cannot see the speculative config: the scheduler's hello
            # announces the method; this source only carries text.
            self.emitter = self._make_emitter("", 0, wire.DERIVATION_NONE, False)
        return self.emitter

    def before(self, processor: Any, engine_core_outputs: Any) -> _StepWork | None:
        work: _StepWork | None = None
        lookup = self.ids.lookup
        states = processor.request_states
        for output in engine_core_outputs:
            rid = output.request_id
            found = lookup(rid)
            if found is None or rid in self.disabled:
                continue
            req_state = states.get(rid)
            if req_state is None:
                continue
            run, stream = found
            state = self.requests.get(rid)
            try:
                if state is None:
                    state = self._admit(rid, run, stream, req_state)
                    if state is None:
                        continue
                fragments: list[tuple[int, str]] = []
                detokenizer = req_state.detokenizer
                if detokenizer is not None:
                    detokenizer.__dict__[FRAGMENTS_ATTR] = fragments
                state.detokenizer = detokenizer
                state.in_step = True
                state.captured = None
                state.pre_len = len(output.new_token_ids)
            except Exception as error:
                self._disable(rid, run, stream, "OutputProcessor.process_outputs", error)
                continue
            if work is None:
                work = _StepWork()
            work.items.append((rid, state, output))
        return work

    def _admit(self, rid: str, run: str, stream: int, req_state: Any) -> _FrontRequest | None:
        """First sight of a request: refuse (with a notice) what cannot be exact."""
        problem: tuple[int, str] | None = None
        if req_state.parent_req is not None:
            n = getattr(req_state.parent_req, "n", None) or getattr(req_state, "n", "?")
            problem = (
                wire.NOTICE_N,
                f"n={n}: choices of a parallel-sampling request are not tracked",
            )
        elif req_state.stream_interval != 1:
            problem = (wire.NOTICE_STREAM_INTERVAL, f"stream_interval={req_state.stream_interval}")
        elif getattr(req_state.output_kind, "name", "DELTA") == "CUMULATIVE":
            problem = (wire.NOTICE_OTHER, "cumulative output mode is not supported")
        if problem is not None:
            self.disabled.add(rid)
            key = (run, stream)
            if key not in self.noticed:
                self.noticed.add(key)
                self._ensure_emitter().notice(run, stream, problem[0], problem[1])
            return None
        state = self.requests[rid] = _FrontRequest(run, stream)
        self.track(run, rid)
        return state

    def on_request_output(self, req_state: Any, args: tuple[Any, ...], result: Any) -> None:
        """Inside make_request_output: what this step handed to HTTP."""
        state = self.requests.get(req_state.request_id)
        if state is None or not state.in_step:
            return
        new_token_ids, _pooling, finish_reason, stop_reason = args[:4]
        text = ""
        if result is not None:
            index = req_state.request_index
            for completion in getattr(result, "outputs", ()):
                if getattr(completion, "index", index) == index:
                    text = completion.text or ""
                    break
        # No copy: the list is read in after(), within the same process_outputs call.
        state.captured = (new_token_ids or [], finish_reason, stop_reason, text)

    def after(self, processor: Any, work: _StepWork) -> None:
        self.step += 1
        emitter = self._ensure_emitter()
        by_run: dict[str, list[wire.Record]] = {}
        finished: list[str] = []
        for rid, state, output in work.items:
            state.in_step = False
            detokenizer = state.detokenizer
            fragments: list[tuple[int, str]] = []
            if detokenizer is not None:
                fragments = detokenizer.__dict__.pop(FRAGMENTS_ATTR, None) or []
            state.detokenizer = None
            if rid in self.disabled:
                continue  # failed inside make_request_output; the notice is queued
            try:
                record = self._record(state, output, fragments)
            except Exception as error:
                self._disable(
                    rid, state.run, state.stream, "OutputProcessor.process_outputs", error
                )
                continue
            if record is not None:
                by_run.setdefault(state.run, []).append(record)
                if record.finished:
                    finished.append(rid)
        for run, records in by_run.items():
            emitter.submit(run, wire.KIND_TEXT, self.step, records)
        for rid in finished:
            self._forget(rid)
        if self.step % PRUNE_EVERY == 0:
            self._prune(processor.request_states)
        self.end_emptied_runs()

    def _record(
        self, state: _FrontRequest, output: Any, fragments: list[tuple[int, str]]
    ) -> wire.TextRecord | None:
        captured = state.captured
        if captured is None:
            # vLLM made no output for it this step (e.g. rejected on arrival).
            if output.finish_reason is None and not output.new_token_ids:
                return None
            raise TelemetryError("no request output was made for this step")
        token_ids, finish_reason, stop_reason, text = captured
        finished = finish_reason is not None
        if len(token_ids) > wire.MAX_TOKENS_PER_RECORD:
            raise TelemetryError(f"{len(token_ids)} tokens in one step")
        tokens: list[wire.TextToken] = []
        append = tokens.append
        text_token = wire.TextToken
        pending = state.pending_empty
        fed = len(fragments)
        for position, token_id in enumerate(token_ids):
            if position < fed:
                fed_id, piece = fragments[position]
                if fed_id != token_id:
                    raise TelemetryError(
                        f"detokenizer saw token {fed_id} where the output has {token_id}"
                    )
                if piece:
                    span_back = pending if pending <= MAX_SPAN_BACK else MAX_SPAN_BACK
                    # The byte split inside the fragment is not computed yet: unknown.
                    lead = wire.LEAD_UNKNOWN if span_back else 0
                    append(text_token(token_id, piece.encode("utf-8"), span_back, lead))
                    pending = 0
                else:
                    append(text_token(token_id, b"", 0))
                    pending += 1
            else:
                # Never fed to the detokenizer (a stop token kept out of the text).
                append(text_token(token_id, b"", 0))
        state.pending_empty = pending
        http_delta = text.encode("utf-8") if text else b""
        if not finished:
            if not tokens:
                if http_delta:
                    raise TelemetryError("text without tokens before the request finished")
                return None
            record = wire.TextRecord(state.stream, state.offset, tokens, http_delta)
        else:
            trimmed = max(state.pre_len - len(token_ids), 0)
            record = wire.TextRecord(
                stream=state.stream,
                offset=state.offset,
                tokens=tokens,
                http_delta=http_delta,
                finished=True,
                finish_reason=finish_code(finish_reason),
                text_truncated=isinstance(stop_reason, str),
                tokens_trimmed=trimmed > 0,
                trimmed_tokens=trimmed,
            )
        state.offset += len(tokens)
        return record

    def fail_step(self, engine_core_outputs: Any, where: str, error: BaseException) -> None:
        try:
            self._ensure_emitter()
            ids = [output.request_id for output in engine_core_outputs]
        except Exception:
            return
        _fail_ids(self, ids, where, error)

    def fail_request_state(self, req_state: Any, where: str, error: BaseException) -> None:
        try:
            state = self.requests.get(req_state.request_id)
            if state is not None:
                self._disable(req_state.request_id, state.run, state.stream, where, error)
        except Exception:  # pragma: no cover
            log.debug("parallelhue: failure while reporting a failure", exc_info=True)

    def _disable(self, rid: str, run: str, stream: int, where: str, error: BaseException) -> None:
        self.disabled.add(rid)
        self._ensure_emitter()
        self.fail_request(run, stream, where, error)
        self._forget(rid, keep_disabled=True)

    def _forget(self, rid: str, keep_disabled: bool = False) -> None:
        state = self.requests.pop(rid, None)
        if not keep_disabled:
            self.disabled.discard(rid)
            self.ids.forget(rid)
        if state is not None:
            if state.detokenizer is not None:
                state.detokenizer.__dict__.pop(FRAGMENTS_ATTR, None)
            self.untrack(state.run, rid)

    def _prune(self, processor_states: Any) -> None:
        # Requests aborted by the client never finish here; drop what vLLM forgot.
        for rid in [rid for rid in self.requests if rid not in processor_states]:
            self._forget(rid)
        self.disabled.intersection_update(processor_states)
        if len(self.noticed) > MAX_CACHED_IDS:
            self.noticed.clear()


def wrap_decode_next(original: Callable[..., str]) -> Callable[..., str]:
    """Record each token's returned string, only on detokenizers marked by the frontend."""

    def decode_next(self: Any, next_token_id: int) -> str:
        text = original(self, next_token_id)
        fragments = self.__dict__.get(FRAGMENTS_ATTR)
        if fragments is not None:
            fragments.append((next_token_id, text))
        return text

    decode_next.__wrapped__ = original  # type: ignore[attr-defined]
    decode_next.__parallelhue__ = True  # type: ignore[attr-defined]
    return decode_next


def _fail_ids(
    telemetry: SchedulerTelemetry | FrontendTelemetry,
    request_ids: list[str],
    where: str,
    error: BaseException,
) -> None:
    """A failure not tied to one request: every request of ours in the step loses telemetry."""
    try:
        for rid in request_ids:
            found = telemetry.ids.lookup(rid)
            if found is None or rid in telemetry.disabled:
                continue
            telemetry.fail_request(found[0], found[1], where, error)
            telemetry._forget(rid, keep_disabled=True)
        telemetry.end_emptied_runs()
    except Exception:  # pragma: no cover - nothing may reach vLLM
        log.debug("parallelhue: failure while reporting a failure", exc_info=True)
