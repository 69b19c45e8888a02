"""What both collectors share: the accelerator, per-process bookkeeping, a step's rows.

`_Base` keeps, per process, which runs have requests here, each run's rows of the
current step (`_Bucket`, flat columns wire.py's row layout reads) and the emitter
they go to; `parse_ours` finds ParallelHue's request ids (once per request).
"""

from __future__ import annotations

import logging
import re
from typing import Any

from .. import __version__, accelerator, wire
from ..emitter import Emitter

# The optional C versions of the hottest loops (plugin/speedups/src), or None: the
# hooks' Python code then does the same work (accelerator.py decides).
_speedups: Any
_speedups, IMPLEMENTATION = accelerator.load()

log = logging.getLogger("vllm.parallelhue")

# Prune state of requests vLLM forgot without telling the hooks (aborts) every
# this many steps.
PRUNE_EVERY = 256

# Failed requests remembered so they are not admitted again (bounded).
MAX_DISABLED = 8192

_CHILD_ID = re.compile(r"[0-9]+_")


class TelemetryError(Exception):
    """Engine state the plugin cannot turn into exact records."""


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
        self.requests: dict[str, Any] = {}  # request id -> the collector's state for it
        # (run, stream) -> the request of ours that has it here: a second live request
        # with the same stream is refused (in-band, each request's frames are its own).
        self.owners: dict[tuple[str, int], str] = {}

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

    def own_stream(self, run: str, stream: int, request_id: str) -> bool:
        """Take (run, stream) for `request_id`; False when another live request has it."""
        key = (run, stream)
        owner = self.owners.get(key)
        if owner is not None and owner != request_id and owner in self.requests:
            self.warn_once(
                f"duplicate:{run}",
                f"two requests claim stream {stream} of run {run}; the later one "
                f"({request_id}) gets no telemetry",
            )
            return False
        self.owners[key] = request_id
        return True

    def release_stream(self, run: str, stream: int, request_id: str) -> None:
        if self.owners.get((run, stream)) == request_id:
            del self.owners[(run, stream)]

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

    def _fail_ids(self, request_ids: list[str], where: str, error: BaseException) -> None:
        """A failure not tied to one request: every request of ours in the step loses
        telemetry."""
        try:
            for rid in request_ids:
                state = self.requests.get(rid)
                if state is None:
                    continue
                self.fail_request(state.run, state.stream, where, error)
                self._forget(rid, keep_disabled=True)
            self.end_emptied_runs()
        except Exception:  # pragma: no cover - nothing may reach vLLM
            log.debug("parallelhue: failure while reporting a failure", exc_info=True)

    def _forget(self, rid: str, keep_disabled: bool = False) -> None:
        raise NotImplementedError  # each collector forgets its own kind of request


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
