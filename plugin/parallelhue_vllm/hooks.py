"""What the patched vLLM methods do: turn engine state into provenance and text rows.

Version-independent. The adapters (adapters/targets.py, one table for every
release) check the signatures of the methods they rely on and then wrap them
(adapters/wrappers.py) with the functions here. Two collectors, one per vLLM process:

- `SchedulerTelemetry` runs in the EngineCore process around
  `Scheduler.update_from_output`: roles derived from counts (tokens the step
  produced before the stop checks, drafts scheduled), kept for the tokens that
  survive the scheduler's stop / max_tokens trim.
- `FrontendTelemetry` runs in the API-server process: `OutputProcessor.add_request`
  admits a request of ours and wraps, on that request's own objects only,
  `RequestState.make_request_output` (the text delta handed to HTTP) and the
  detokenizer's `decode_next` (each token's fragment); `process_outputs` hands
  the step's rows to the emitter.

Cost model (docs/benchmarks/plugin.md): a request without a ParallelHue id is
looked at once, when it arrives (one regular expression over its id); after
that no hook does anything per step or per token for it. The scheduler learns
of requests from `SchedulerOutput.scheduled_new_reqs`, the frontend from
`add_request`, so a step without requests of ours costs two attribute checks.
The hooks build one plain tuple ("row", wire.py's row layout) per request and
step; the emitter's sender thread turns rows into bytes, off vLLM's loop.

Any exception is contained per request: logged once, telemetry for that request
turned off and a notice frame sent so the client knows why.
"""

from __future__ import annotations

import functools
import importlib
import logging
import re
from collections.abc import Iterable
from typing import Any

from . import __version__, accelerator, attribution, traps, wire
from .emitter import Emitter

# The optional C versions of the hottest loops (_speedups.c), or None: this
# module's Python code then does the same work (accelerator.py decides).
_speedups: Any
_speedups, IMPLEMENTATION = accelerator.load()

log = logging.getLogger("vllm.parallelhue")

# Prune state of requests vLLM forgot without telling the hooks (aborts) every
# this many steps.
PRUNE_EVERY = 256
MAX_SPAN_BACK = 255
# Failed requests remembered so they are not admitted again (bounded).
MAX_DISABLED = 8192
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
_FLAG_FINISHED = wire.ROW_FLAG_FINISHED
_FLAG_TRIMMED = wire.ROW_FLAG_TRIMMED
_FLAG_TEXT_TRUNCATED = wire.ROW_FLAG_TEXT_TRUNCATED
_FLAG_TOKENS_TRIMMED = wire.ROW_FLAG_TOKENS_TRIMMED
_SCHEDULER_WHERE = "Scheduler.update_from_output"
_FRONTEND_WHERE = "OutputProcessor.process_outputs"


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


def _role_bytes(generated: int, drafts: int) -> bytes:
    roles = bytes(step_roles(generated, drafts))
    if len(_ROLE_BYTES) < 4096:
        _ROLE_BYTES[generated << 16 | drafts] = roles
    return roles


# step_roles as bytes, keyed by generated << 16 | drafts: one dict lookup per row.
_ROLE_BYTES: dict[int, bytes] = {}
_PLAIN_ROLE = bytes((wire.ROLE_PLAIN,))
# The same for the C loop: _ROLE_TABLE[drafts][generated] (None: impossible counts).
_ROLE_TABLE: list[list[bytes | None] | None] = [None]
for _drafts in range(1, 33):
    _ROLE_TABLE.append([None] + [_role_bytes(_generated, _drafts) for _generated in
                                 range(1, _drafts + 2)])  # fmt: skip


def parse_ours(request_id: str, *, skip_children: bool) -> tuple[str, int] | None:
    """(run, stream) when the request id is ParallelHue's, else None.

    Runs once per request, when it arrives, never per step.
    """
    found = wire.parse_request_id(request_id)
    if found is not None and skip_children and _CHILD_ID.match(request_id):
        return None  # an n > 1 child: the frontend sends the notice for it
    return found


class _Base:
    """Per-process bookkeeping shared by both collectors."""

    role = 0

    def __init__(self, engine_version: str) -> None:
        self.engine_version = engine_version
        self.emitter: Emitter | None = None
        self.step = 0
        self.active: dict[str, set[str]] = {}  # run -> request ids with state here
        # run -> this step's rows of that run; one bucket per run for the run's
        # life, so a hook appends to it without looking the run up.
        self.buckets: dict[str, _Bucket] = {}
        self.emptied: set[str] = set()  # runs whose last request went this step
        self.disabled: set[str] = set()  # failed or refused: never admitted again
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

    def track(self, run: str, request_id: str) -> _Bucket:
        """Count a request of `run` in; returns the run's bucket."""
        self.active.setdefault(run, set()).add(request_id)
        bucket = self.buckets.get(run)
        if bucket is None:
            bucket = self.buckets[run] = _Bucket()
        return bucket

    def flush_rows(self, kind: int) -> None:
        """Hand this step's rows of every run to the emitter (one queue item)."""
        by_run = None
        records = 0
        for run, bucket in self.buckets.items():
            if bucket.meta:
                if by_run is None:
                    by_run = {}
                records += len(bucket.meta) // wire.ROW_WIDTH
                by_run[run] = bucket.take(kind)
        if by_run is not None and self.emitter is not None:
            self.emitter.submit_rows(kind, self.step, by_run, records)

    def untrack(self, run: str, request_id: str) -> None:
        requests = self.active.get(run)
        if requests is None:
            return
        requests.discard(request_id)
        if not requests:
            self.emptied.add(run)

    def disable(self, request_id: str) -> None:
        if len(self.disabled) >= MAX_DISABLED:
            self.disabled.clear()  # bounded; ids of requests long gone
        self.disabled.add(request_id)

    def end_emptied_runs(self) -> None:
        """At the end of a step (never mid-step): end runs with no request left here."""
        for run in self.emptied:
            if not self.active.get(run):
                self.active.pop(run, None)
                self.buckets.pop(run, None)
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


class _Bucket:
    """One run's rows of the current step, as columns (wire.ProvenanceStep / wire.TextStep).

    `meta` holds wire.ROW_WIDTH ints per row, `ids` every row's token ids,
    `extra` one object per row (provenance: the roles; text: the HTTP text);
    text also keeps the fragments, the rows' span_backs and their lead_lens
    (`leads`, only for rows with span_backs; see attribution.py). Flat lists of ints
    and strings: building a row allocates nothing the garbage collector tracks.
    """

    __slots__ = ("extra", "fragments", "ids", "leads", "meta", "span_backs")

    def __init__(self) -> None:
        self.meta: list[int] = []
        self.ids: list[int] = []
        self.extra: list[Any] = []
        self.fragments: list[str] = []
        self.span_backs: dict[int, list[int]] = {}
        self.leads: dict[int, list[int]] = {}

    def take(self, kind: int) -> Any:
        """This step's columns (for the sender), leaving the bucket empty."""
        if kind != wire.KIND_TEXT:
            return _take_lists(self.meta, self.ids, self.extra)
        columns = _take_lists(self.meta, self.ids, self.extra, self.fragments)
        step = (*columns, dict(self.span_backs) if self.span_backs else {},
                dict(self.leads) if self.leads else {})  # fmt: skip
        self.span_backs.clear()
        self.leads.clear()
        return step


def _has_empty(fragments: list[str]) -> bool:
    """Whether a step's fragments hold a "" (a token that decoded to no text yet)."""
    if _speedups is not None:
        found: bool = _speedups.has_empty(fragments)
        return found
    return "" in fragments


def _take_lists(*lists: list[Any]) -> tuple[list[Any], ...]:
    """Each list's items in a list of their own; the lists left empty.

    The hooks' stand-ins hold these very lists, so they cannot be replaced: the
    C accelerator moves the items out (keeping the room for the next step)
    instead of copying and clearing them.
    """
    if _speedups is not None:
        taken: tuple[list[Any], ...] = _speedups.take_lists(*lists)
        return taken
    copies = tuple(column[:] for column in lists)
    for column in lists:
        column.clear()
    return copies


class _SchedRequest:
    __slots__ = ("extra", "ids", "meta", "offset", "run", "stream")

    def __init__(self, run: str, stream: int, bucket: _Bucket) -> None:
        self.run = run
        self.stream = stream
        self.offset = 0
        # The run's bucket lists (this step's rows of every request of the run).
        self.meta = bucket.meta
        self.ids = bucket.ids
        self.extra = bucket.extra


class SchedulerTelemetry(_Base):
    """Provenance from `Scheduler.update_from_output` (EngineCore process)."""

    role = wire.SOURCE_SCHEDULER

    def __init__(self, engine_version: str) -> None:
        super().__init__(engine_version)
        self.requests: dict[str, _SchedRequest] = {}
        self.is_async = False
        # traps.roles_unverifiable / no_autoregressive_sampling: roles are not derivable
        # on this engine (notice 6).
        self.roles_problem: str | None = None
        # traps.rust_frontend: no text witness on this server (notice 7).
        self.rust_frontend = traps.rust_frontend()

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
            self.roles_problem = traps.roles_unverifiable(spec) or (
                traps.no_autoregressive_sampling(scheduler)
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
    ) -> list[int] | None:
        """Before vLLM's update: admit new requests; the tokens each request sampled.

        The stop checks trim the sampled lists in place, so their lengths are
        taken now, for the whole batch at once (C-level, no per-request bytecode).
        None: no request of ours in this process, nothing to do after the update.
        """
        new_requests = scheduler_output.scheduled_new_reqs
        if new_requests:
            self._admit(scheduler, new_requests)
        if not self.requests:
            return None
        gone = scheduler_output.finished_req_ids
        if gone:
            self._forget_finished(gone)
            if not self.requests:
                self.end_emptied_runs()
                return None
        sampled = model_runner_output.sampled_token_ids
        if not sampled:
            return []
        if _speedups is not None and type(sampled) is list:
            lengths: list[int] = _speedups.sampled_lengths(sampled)
            return lengths
        return list(map(len, sampled))

    def _admit(self, scheduler: Any, new_requests: Iterable[Any]) -> None:
        requests = self.requests
        for new_request in new_requests:
            rid = new_request.req_id
            if rid in requests or rid in self.disabled:
                continue  # resumed after preemption (listed as new again), or failed
            found = parse_ours(rid, skip_children=True)
            if found is None:
                continue
            emitter = self._ensure_emitter(scheduler)
            refused = self._refusal(new_request)
            if refused is not None:
                # traps: refuse rather than guess (no provenance for it).
                self.disable(rid)
                emitter.notice(found[0], found[1], refused[0], refused[1])
                continue
            make = _speedups.SchedRequest if _speedups is not None else _SchedRequest
            requests[rid] = make(found[0], found[1], self.track(found[0], rid))

    def _refusal(self, new_request: Any) -> tuple[int, str] | None:
        """Why a new request of ours gets a notice instead of provenance (traps), or None."""
        if self.rust_frontend is not None:
            return wire.NOTICE_HOOK_BYPASSED, self.rust_frontend
        if self.roles_problem is not None:
            return wire.NOTICE_ROLES_UNVERIFIABLE, self.roles_problem
        replay = traps.trace_replay(getattr(new_request, "sampling_params", None))
        if replay is not None:
            return wire.NOTICE_ROLES_UNVERIFIABLE, replay
        return None

    def after(
        self,
        scheduler: Any,
        scheduler_output: Any,
        model_runner_output: Any,
        lengths: list[int],
        result: Any,
    ) -> None:
        """Build this step's provenance rows from the outputs vLLM returns.

        The common row (not finished, no padding) takes the loop below; anything
        else goes through `_row`. The token lists are vLLM's own, not copied:
        the engine process never changes them after this call (the API server's
        copies, which it does change, are other objects).
        """
        self.step += 1
        spec_tokens = scheduler_output.scheduled_spec_decode_tokens
        invalid = getattr(scheduler_output, "num_invalid_spec_tokens", None)
        # Under async scheduling every scheduled draft is a -1 placeholder.
        padding = not self.is_async
        index_of = _SampledIndex(model_runner_output)
        finished: list[str] = []
        if _speedups is not None and not invalid and type(spec_tokens) is dict:

            def special(state: _SchedRequest, output: Any) -> None:
                if self._special_row(state, output, scheduler_output, index_of, lengths):
                    finished.append(output.request_id)

            _speedups.scheduler_rows(result.values(), self.requests, spec_tokens, _ROLE_TABLE,
                                     _PLAIN_ROLE, padding, special)  # fmt: skip
        else:
            self._python_rows(
                result, scheduler_output, index_of, lengths, spec_tokens, invalid, finished
            )
        self.flush_rows(wire.KIND_PROVENANCE)
        # Only after the step's rows are queued: forgetting the last request of a
        # run ends the run in the emitter.
        for rid in finished:
            self._forget(rid)
        if self.step % PRUNE_EVERY == 0:
            self._prune(scheduler)
        self.end_emptied_runs()

    def _python_rows(
        self,
        result: Any,
        scheduler_output: Any,
        index_of: _SampledIndex,
        lengths: list[int],
        spec_tokens: dict[str, list[int]],
        invalid: Any,
        finished: list[str],
    ) -> None:
        """The loop of after() in Python (_speedups.scheduler_rows does the same in C)."""
        get = self.requests.get
        spec_get = spec_tokens.get
        roles_of = _ROLE_BYTES.get
        plain = _PLAIN_ROLE
        padding = not self.is_async
        for outputs in result.values():
            for output in outputs.outputs:
                state = get(output.request_id)
                if state is None:
                    continue
                tokens = output.new_token_ids
                count = len(tokens)
                drafts = spec_get(output.request_id)
                if drafts:
                    scheduled = len(drafts)
                    roles = roles_of(count << 16 | scheduled)
                    slow = roles is None or invalid or (padding and -1 in drafts)
                else:
                    scheduled = 0
                    roles = plain
                    slow = count != 1
                if slow or output.finish_reason is not None:
                    if self._special_row(state, output, scheduler_output, index_of, lengths):
                        finished.append(output.request_id)
                    continue
                state.meta.extend((state.stream, 0, 0, state.offset, count, scheduled, 0))
                state.ids.extend(tokens)
                state.extra.append(roles)
                state.offset += count

    def _special_row(
        self,
        state: _SchedRequest,
        output: Any,
        scheduler_output: Any,
        index_of: _SampledIndex,
        lengths: list[int],
    ) -> bool:
        """A row that finishes, was trimmed, carries padded drafts or looks impossible.

        True when the request finished (it is forgotten after the step's rows are queued).
        """
        rid = output.request_id
        reason = output.finish_reason
        try:
            tokens = output.new_token_ids
            count = len(tokens)
            if not count:
                if reason is not None and finish_code(reason) == wire.FINISH_ERROR:
                    # traps: an engine error in a step without tokens (no record closes it).
                    problem = traps.finished_without_tokens(output, True)
                    if problem is not None and self.emitter is not None:
                        self.emitter.notice(
                            state.run, state.stream, wire.NOTICE_HOOK_BYPASSED, problem
                        )
                return reason is not None
            index = index_of.get(rid)
            generated = lengths[index] if lengths and index is not None else 0
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(rid) or ()
            scheduled = len(drafts)
            # Placeholders: -1 drafts; under async scheduling every draft is -1 in
            # the scheduler, so only the grammar-invalidated ones count there.
            padded = 0 if self.is_async else sum(1 for token in drafts if token < 0)
            if not padded:
                invalid = getattr(scheduler_output, "num_invalid_spec_tokens", None) or {}
                padded = int(invalid.get(rid, 0))
            padded = min(padded, scheduled)
            if count > generated:
                raise TelemetryError(f"{count} tokens out of a step that sampled {generated}")
            roles = _role_bytes(generated, scheduled)
            flags = 0
            if count < generated:
                roles = roles[:count]
                flags = _FLAG_TRIMMED
            code = 0
            if reason is not None:
                flags |= _FLAG_FINISHED
                code = finish_code(reason)
        except Exception as error:
            self.fail_request(state.run, state.stream, _SCHEDULER_WHERE, error)
            self._forget(rid, keep_disabled=True)
            return False
        state.meta.extend((state.stream, flags, code, state.offset, count, scheduled, padded))
        state.ids.extend(tokens)
        state.extra.append(roles)
        state.offset += count
        return reason is not None

    def idle_step(self, scheduler: Any) -> None:
        """A step without requests of ours (the wrapper skips before/after)."""
        self.step += 1

    def _forget_finished(self, request_ids: Iterable[str]) -> None:
        """Requests vLLM finished or aborted since the previous step."""
        requests = self.requests
        for rid in request_ids:
            if rid in requests:
                self._forget(rid)
        self.disabled.difference_update(request_ids)

    def _forget(self, rid: str, keep_disabled: bool = False) -> None:
        state = self.requests.pop(rid, None)
        if keep_disabled:
            self.disable(rid)
        if state is not None:
            self.untrack(state.run, rid)

    def fail_step(self, scheduler_output: Any, where: str, error: BaseException) -> None:
        """A failure not tied to one request: every request of ours in the step loses telemetry."""
        try:
            if self.emitter is None:
                self.emitter = self._make_emitter("", 0, wire.DERIVATION_NONE, False)
            ids = [rid for rid in scheduler_output.num_scheduled_tokens if rid in self.requests]
        except Exception:
            return
        _fail_ids(self, ids, where, error)

    def _prune(self, scheduler: Any) -> None:
        alive = scheduler.requests
        for rid in [rid for rid in self.requests if rid not in alive]:
            self._forget(rid)
        self.disabled.intersection_update(alive)


class _SampledIndex:
    """Where each request's sampled tokens are in a step's ModelRunnerOutput: its
    position in `req_ids`, as vLLM's scheduler finds them (0.34 builds that dict
    from req_ids; 0.26-0.33 read `req_id_to_index`, which their model runners built
    from the same list). Built on first use: only special rows need it."""

    __slots__ = ("_index", "_output")

    def __init__(self, model_runner_output: Any) -> None:
        self._output = model_runner_output
        self._index: dict[str, int] | None = None

    def get(self, request_id: str) -> int | None:
        if self._index is None:
            self._index = {rid: at for at, rid in enumerate(self._output.req_ids)}
        return self._index.get(request_id)


class _FrontRequest:
    """A request of ours in the API server, and what the hooks put on its objects."""

    __slots__ = (
        "bucket",
        "capture",
        "detokenizer",
        "fragments",
        "pre_len",
        "queue",
        "recorder",
        "req_state",
        "run",
        "stream",
    )

    def __init__(self, run: str, stream: int, req_state: Any, bucket: _Bucket) -> None:
        self.run = run
        self.stream = stream
        self.req_state = req_state
        self.detokenizer: Any = req_state.detokenizer
        self.queue: Any = req_state.queue  # vLLM's own output queue, put back at the end
        self.bucket = bucket  # the run's rows, ids and fragments of this step
        self.fragments: list[str] = []  # what each token decoded to this step, in order
        # Tokens of this step before a stop-string trim (requests with stop strings
        # only, set at the start of process_outputs; -1: none).
        self.pre_len = -1
        self.recorder: Any = None  # our stand-in for the detokenizer's decode stream
        self.capture: Any = None  # our stand-in for the request's output queue


class _StreamRecorder:
    """Stands in for a fast detokenizer's `stream` (tokenizers.DecodeStream).

    vLLM's FastIncrementalDetokenizer.decode_next returns `stream.step(...) or ""`
    (when spaces_between_special_tokens holds): recording that here gives each
    token's string without touching the detokenizer object's attributes.

    `recover` (see _reset_stream) does vLLM's own recovery from the error after
    which vLLM would replace the stream with a new one: the recorder stays in
    place and keeps recording. After any other error the token is recorded as
    "" (what decode_next returns when vLLM survives the error) and the error
    goes on to vLLM unchanged.
    """

    __slots__ = ("_append", "_recover", "_step", "stream")

    def __init__(self, stream: Any, fragments: list[str], recover: Any = None) -> None:
        self.stream = stream
        self._step = stream.step
        self._append = fragments.append
        self._recover = recover

    def step(self, tokenizer: Any, token_id: int) -> Any:
        try:
            text = self._step(tokenizer, token_id)
        except Exception as error:
            stream: Any = None
            step: Any = None
            if self._recover is not None:
                try:
                    stream = self._recover(error)
                    step = stream.step if stream is not None else None
                except Exception:
                    step = None  # recover's own failure: as if it gave nothing
            if step is None:
                self._append("")
                raise
            self.stream, self._step = stream, step
            try:
                text = step(tokenizer, token_id)
            except Exception:
                self._append("")
                raise
        self._append(text or "")
        return text


def stream_recorder(detokenizer: Any, fragments: list[str]) -> Any:
    """The recorder (the C one when built) to put in place of a fast detokenizer's stream."""
    make = _speedups.StreamRecorder if _speedups is not None else _StreamRecorder
    recover = functools.partial(
        _reset_stream, getattr(detokenizer, "skip_special_tokens", True),
        getattr(detokenizer, "request_id", None),
    )  # fmt: skip
    return make(detokenizer.stream, fragments, recover)


# tokenizers' error after which vLLM's FastIncrementalDetokenizer starts a new
# DecodeStream (vLLM's INVALID_PREFIX_ERR_MSG, the same in 0.26 to 0.33).
_INVALID_PREFIX = "Invalid prefix encountered"


def _reset_stream(skip_special_tokens: Any, request_id: Any, error: BaseException) -> Any:
    """The new decode stream vLLM would make after `error`, or None (another error).

    vLLM 0.26-0.33 (`_protected_step`): a DecodeStream without the prompt, looked
    up on the module as vLLM does. Done by the recorder, vLLM would replace the
    recorder itself and the rest of the request's fragments would go unrecorded.
    """
    if not str(error).startswith(_INVALID_PREFIX):
        return None
    decoders = importlib.import_module("tokenizers.decoders")
    log.warning(
        "Encountered invalid prefix detokenization error for request %s, resetting decode "
        "stream (done by the ParallelHue recorder, as vLLM does).",
        request_id,
    )
    return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)


class _QueueCapture:
    """Stands in for a request's output queue (RequestOutputCollector): notes each
    output (`put`) and keeps what the request's rows need.

    At the end of process_outputs, `_take_rows` takes the step's row from each
    noted RequestOutput vLLM handed to HTTP (the common row there, every other
    one through `special`), in one loop for the whole step.
    """

    __slots__ = (
        "_failed",
        "_fragments",
        "_fragments_extend",
        "_ids_extend",
        "_index",
        "_meta_extend",
        "_put",
        "_seen",
        "_special",
        "_stream",
        "_texts_append",
        "active",
        "offset",
        "pending_empty",
        "queue",
    )

    def __init__(
        self,
        queue: Any,
        fragments: list[str],
        bucket: _Bucket,
        stream: int,
        index: int,
        special: Any,
        failed: Any,
        seen: list[Any],
    ) -> None:
        self.queue = queue
        self._put = queue.put  # bound once, as the C version does
        self._seen = seen
        self._fragments = fragments
        self._meta_extend = bucket.meta.extend
        self._ids_extend = bucket.ids.extend
        self._texts_append = bucket.extra.append
        self._fragments_extend = bucket.fragments.extend
        self._stream = stream
        self._index = index
        self._special = special
        self._failed = failed
        self.offset = 0
        self.pending_empty = 0  # tokens that returned "" and no fragment has claimed yet
        self.active = True  # False once the request's telemetry ended (_uninstall)

    def put(self, output: Any) -> Any:
        """vLLM's queue.put: the output noted in the process's `seen` list (nothing
        else runs per output), then passed on to vLLM's queue. Nothing it adds can
        raise into vLLM: a failure goes to `failed`."""
        try:
            seen = self._seen
            seen.append(self)
            seen.append(output)
        except Exception as error:  # pragma: no cover - only MemoryError can get here
            self._failed(error)
        put = self._put
        return put(output)


def _take_rows(seen: list[Any]) -> None:
    """The rows of a step's noted (capture, output) pairs, in the order vLLM put the
    outputs (_speedups.take_rows does the same in C). `seen` is emptied first; a
    capture without its output (its put could not note it) or no longer active is
    skipped."""
    if type(seen) is not list:
        raise TypeError("take_rows(seen): a list")
    items = seen[:]
    seen.clear()
    at, end = 0, len(items)
    while at < end:
        capture = items[at]
        at += 1
        if not _is_capture(capture):
            continue
        if at >= end or _is_capture(items[at]):
            continue
        output = items[at]
        at += 1
        if capture.active:
            _take_row(capture, output)


def _take_row(capture: _QueueCapture, output: Any) -> None:
    """One noted output's row: the common row here, every other one through `special`."""
    try:
        completions = getattr(output, "outputs", None)
        if type(completions) is list and completions:
            completion = completions[0]
            token_ids = completion.token_ids
            fragments = capture._fragments
            count = len(token_ids)
            # The common row: not finished (only a finished step can have been
            # trimmed after a stop string), every token decoded to text.
            if (
                completion.finish_reason is None
                and completion.index == capture._index
                and 0 < count <= _MAX_TOKENS
                and len(fragments) == count
                and not capture.pending_empty
                and "" not in fragments
            ):
                text = completion.text
                capture._ids_extend(token_ids)  # a copy: outputs are merged later
                capture._fragments_extend(fragments)
                fragments.clear()
                capture._texts_append(text)
                capture._meta_extend((capture._stream, 0, 0, capture.offset, count, count, 0))
                capture.offset += count
            else:
                capture._special(token_ids, completion.finish_reason, completion.stop_reason,
                                 completion.text, completion.index)  # fmt: skip
    except Exception as error:
        capture._failed(error)


def _is_capture(item: Any) -> bool:
    return type(item) is _QueueCapture or (
        _speedups is not None and type(item) is _speedups.CaptureState
    )


def _capture_type() -> type:
    """The capture class for the implementation in use (the C one: its put in C)."""
    if _speedups is None:
        return _QueueCapture
    made: type = _speedups.CaptureState
    return made


# vLLM's finish reason strings (CompletionOutput.finish_reason) -> protocol codes.
_FINISH_NAMES = {
    "stop": wire.FINISH_STOP,
    "length": wire.FINISH_LENGTH,
    "abort": wire.FINISH_ABORT,
    "error": wire.FINISH_ERROR,
    "repetition": wire.FINISH_STOP,
}
_STREAM_WHERE = "RequestOutputCollector.put"
_MAX_TOKENS = wire.MAX_TOKENS_PER_RECORD


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
        problem = _refusal(req_state, self.rust_frontend)
        if problem is not None:
            self.disable(request_id)
            key = (run, stream)
            if key not in self.noticed:
                if len(self.noticed) > MAX_DISABLED:
                    self.noticed.clear()
                self.noticed.add(key)
                self._ensure_emitter().notice(run, stream, problem[0], problem[1])
            return
        self._ensure_emitter()
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
        _fail_ids(self, ids, where, error)

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


def _record_decode_next(detokenizer: Any, fragments: list[str]) -> None:
    """For detokenizers without a decode stream: a per-instance decode_next (private dict)."""
    _own_dict(detokenizer)
    decode = detokenizer.decode_next
    append = fragments.append

    def decode_next(next_token_id: int) -> str:
        text: str = decode(next_token_id)
        append(text)
        return text

    detokenizer.decode_next = decode_next


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


def _own_dict(obj: Any) -> None:
    """Give a vLLM object a private attribute dict before the hooks add attributes to it.

    CPython 3.11+ stores instance attributes against keys shared by all
    instances of a class; adding a new name to one instance adds it to those
    shared keys, and from then on method calls on EVERY instance (other users'
    requests included) take a slower, unspecialized path. A private dict keeps
    the shared keys as vLLM made them.
    """
    obj.__dict__ = dict(obj.__dict__)


def _uninstall(state: _FrontRequest) -> None:
    """Put vLLM's own objects back (ours also hold references to them)."""
    detokenizer: Any = state.detokenizer
    recorder: Any = state.recorder
    if recorder is not None and recorder is getattr(detokenizer, "stream", None):
        detokenizer.stream = state.recorder.stream
    if state.capture is not None:
        state.capture.active = False  # outputs it noted this step are not taken
        if getattr(state.req_state, "queue", None) is state.capture:
            state.req_state.queue = state.queue
    if state.recorder is None:  # the per-instance decode_next (private dict)
        getattr(detokenizer, "__dict__", {}).pop("decode_next", None)


def _fail_ids(
    telemetry: SchedulerTelemetry | FrontendTelemetry,
    request_ids: list[str],
    where: str,
    error: BaseException,
) -> None:
    """A failure not tied to one request: every request of ours in the step loses telemetry."""
    try:
        for rid in request_ids:
            state = telemetry.requests.get(rid)
            if state is None:
                continue
            telemetry.fail_request(state.run, state.stream, where, error)
            telemetry._forget(rid, keep_disabled=True)
        telemetry.end_emptied_runs()
    except Exception:  # pragma: no cover - nothing may reach vLLM
        log.debug("parallelhue: failure while reporting a failure", exc_info=True)
