"""Frame admission: sources, sequencing, duplicates, hellos, losses and notices (the Rust
core's `reconcile/admission.rs`).
"""

from __future__ import annotations

import hashlib

from parallelhue.reference.decode import Frame
from parallelhue.reference.state import (
    DERIVATION_NAMES,
    ENGINE_NAMES,
    REORDER_WINDOW,
    ROLE_NAMES,
    VERIFICATION_NAMES,
    _Failed,
    _Source,
)
from parallelhue.reference.stream import StreamRules
from parallelhue_vllm.wire import (
    ALL_STREAMS,
    KIND_HELLO,
    KIND_NAMES,
    KIND_PROVENANCE,
    KIND_TEXT,
    SOURCE_FRONTEND,
    SOURCE_SCHEDULER,
    NoticeRecord,
    ProvenanceRecord,
)


class AdmissionRules(StreamRules):
    """Admits frames per source in sequence order and hands each record to its rule."""

    def _admit(self, frame: Frame, data: bytes) -> None:
        source_id = frame.header.source_id
        source = self._sources.get(source_id)
        if source is None:
            source = self._sources[source_id] = _Source(source_id)
        seq = frame.header.seq
        digest = hashlib.blake2b(data, key=self._digest_key, digest_size=16).digest()
        if seq < source.next_seq or seq in source.buffered:
            self._counters["duplicate_frames"] += 1
            # A seq given up after a gap has no digest: nothing to compare it with.
            if seq in source.digests and source.digests[seq] != digest:
                self._run_failure(
                    f"source {source_id:016x}: seq {seq} received twice with different content"
                )
            return
        source.digests[seq] = digest
        source.buffered[seq] = frame
        self._release_in_order(source)
        if len(source.buffered) > REORDER_WINDOW:
            missing = source.next_seq
            self._counters["gaps"] += 1
            self._frames_lost(f"frames lost: gap in source {source_id:016x} at seq {missing}")
            source.next_seq = min(source.buffered)
            self._release_in_order(source)

    def _release_in_order(self, source: _Source) -> None:
        while source.next_seq in source.buffered:
            frame = source.buffered.pop(source.next_seq)
            source.next_seq += 1
            self._release(source, frame)

    def _release(self, source: _Source, frame: Frame) -> None:
        header = frame.header
        kind_name = KIND_NAMES[frame.kind]
        if source.broken:
            return
        if frame.kind == KIND_HELLO:
            if source.role is not None:
                # The same hello again changes nothing; another one contradicts the first.
                if frame.hello == source.hello:
                    self._reject(f"second hello from source {source.source_id:016x}")
                else:
                    self._run_failure(
                        f"source {source.source_id:016x}: a second hello that differs from "
                        "its first"
                    )
                return
            self._register_hello(source, frame)
        elif source.role is None:
            source.broken = True
            self._run_failure(f"source {source.source_id:016x}: {kind_name} frame before its hello")
            return
        elif (frame.kind == KIND_PROVENANCE and source.role != SOURCE_SCHEDULER) or (
            frame.kind == KIND_TEXT and source.role != SOURCE_FRONTEND
        ):
            role_name = ROLE_NAMES[source.role]
            self._run_failure(
                f"source {source.source_id:016x}: {kind_name} frame from a {role_name} source"
            )
            return
        self._counters["dropped_reported"] += header.dropped
        if header.dropped > 0:
            self._frames_lost(
                f"frames lost: source {source.source_id:016x} dropped {header.dropped} "
                f"frames before seq {header.seq}"
            )
        for record in frame.records:
            if isinstance(record, NoticeRecord):
                self._notice(source, record)
                continue
            if record.stream >= self.num_streams:
                self._counters["foreign_records"] += 1
                continue
            state = self._streams[record.stream]
            if state.verdict == "failed":
                continue
            try:
                if isinstance(record, ProvenanceRecord):
                    self._provenance(state, source, record, header.step)
                else:
                    self._text(state, source, record, header.step)
                self._progress(state)
            except _Failed:
                pass

    def _register_hello(self, source: _Source, frame: Frame) -> None:
        hello = frame.hello
        assert hello is not None
        source.role = hello.role
        source.hello = hello
        self._hellos.append(
            {
                "source_id": source.source_id,
                "role": ROLE_NAMES[hello.role],
                "engine": ENGINE_NAMES[hello.engine],
                "role_derivation": DERIVATION_NAMES[hello.role_derivation],
                "async_scheduling": hello.async_scheduling,
                "num_speculative_tokens": hello.num_speculative_tokens,
                "plugin_version": hello.plugin_version,
                "engine_version": hello.engine_version,
                "spec_method": hello.spec_method,
                "verification": VERIFICATION_NAMES[hello.verification],
            }
        )

    def _run_failure(self, message: str) -> None:
        """The run's telemetry contradicts itself: every stream without a final
        verdict fails, an exact one is revoked."""
        self._events.append(("run", message))
        for state in self._streams:
            if state.verdict != "failed":
                self._set_failed(state, message)

    def _frames_lost(self, reason: str) -> None:
        """Frames were lost: every stream without a final verdict fails, an exact one is
        revoked (a lost frame may have been a notice for it)."""
        for state in self._streams:
            if state.verdict != "failed":
                self._set_failed(state, reason)

    def _notice(self, source: _Source, record: NoticeRecord) -> None:
        reason = (
            f"not exact: {record.message} (notice {record.code} from source "
            f"{source.source_id:016x})"
        )
        if record.stream == ALL_STREAMS:
            for state in self._streams:
                if state.verdict != "failed":
                    self._set_failed(state, reason)
        elif record.stream >= self.num_streams:
            self._counters["foreign_records"] += 1
        elif self._streams[record.stream].verdict != "failed":
            self._set_failed(self._streams[record.stream], reason)
