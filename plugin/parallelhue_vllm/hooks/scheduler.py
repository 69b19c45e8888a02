"""The EngineCore side: provenance rows from `Scheduler.update_from_output`.

Roles are derived from counts (tokens the step sampled before the stop checks
trimmed them, drafts scheduled) and kept for the tokens that survive the
scheduler's stop / max_tokens trim; a request's sampled tokens are found by its
position in the step's `ModelRunnerOutput.req_ids`, as vLLM's scheduler finds them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .. import traps, wire
from ..emitter import Emitter
from .common import PRUNE_EVERY, TelemetryError, _Base, _Bucket, _speedups, parse_ours

# vLLM's `rejection_sample_method` -> the hello's verification ("block" and
# anything newer are not classified: unknown).
_VERIFICATION = {
    "standard": wire.VERIFICATION_STANDARD,
    "synthetic": wire.VERIFICATION_SYNTHETIC,
    "fly": wire.VERIFICATION_FLY,
}

_FINISH_CODES = {
    "STOP": wire.FINISH_STOP,
    "LENGTH": wire.FINISH_LENGTH,
    "ABORT": wire.FINISH_ABORT,
    "ERROR": wire.FINISH_ERROR,
    "REPETITION": wire.FINISH_STOP,
}

_FLAG_FINISHED = wire.ROW_FLAG_FINISHED
_FLAG_TRIMMED = wire.ROW_FLAG_TRIMMED

_SCHEDULER_WHERE = "Scheduler.update_from_output"


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
            run, stream = found
            if not self.own_stream(run, stream, rid):
                self.disable(rid)
                continue
            emitter.begin_request(run, stream, rid)
            refused = self._refusal(new_request)
            if refused is not None:
                # traps: refuse rather than guess (no provenance for it).
                self.disable(rid)
                self.release_stream(run, stream, rid)
                emitter.notice(run, stream, refused[0], refused[1])
                emitter.end_request(run, stream, rid)
                continue
            make = _speedups.SchedRequest if _speedups is not None else _SchedRequest
            requests[rid] = make(run, stream, self.track(run, rid))

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
            self.release_stream(state.run, state.stream, rid)
            if self.emitter is not None:
                # After the request's last rows (queued before): its response may end.
                self.emitter.end_request(state.run, state.stream, rid)
            self.untrack(state.run, rid)

    def fail_step(self, scheduler_output: Any, where: str, error: BaseException) -> None:
        """A failure not tied to one request: every request of ours in the step loses telemetry."""
        try:
            if self.emitter is None:
                self.emitter = self._make_emitter("", 0, wire.DERIVATION_NONE, False)
            ids = [rid for rid in scheduler_output.num_scheduled_tokens if rid in self.requests]
        except Exception:
            return
        self._fail_ids(ids, where, error)

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
