"""The --record tap writes the inputs in the order the reconciler applied them.

Span boundaries depend on which input completed them, so re-feeding the
recorded items in their order to a fresh reconciler reproduces the live run's
spans exactly only if the recording's order is the applied order (frames from
the receiver thread and SSE deltas from the HTTP thread interleaved).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from parallelhue.headless import HeadlessResult, run_headless
from parallelhue.ingest.record import RECONCILER_INPUT_KINDS, read_recording
from parallelhue.sim import SimConfig, SimServer

native = pytest.importorskip("parallelhue._native")


@pytest.fixture
def socket_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="phtap", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def recorded_run(socket_dir: str, record: Path, **config: Any) -> HeadlessResult:
    async def main() -> HeadlessResult:
        server = SimServer(SimConfig(step_ms=1.0, socket_dir=socket_dir, seed=4, **config))
        url = await server.start()
        try:
            return await run_headless(
                url, num_streams=8, socket_dir=socket_dir, max_tokens=80,
                reconciler_kind="rust", mode="auto", record=str(record),
            )  # fmt: skip
        finally:
            await server.stop()

    return asyncio.run(main())


def test_refeeding_the_recording_in_order_gives_the_live_spans(
    socket_dir: str, tmp_path: Path
) -> None:
    record = tmp_path / "run.phr"
    live = recorded_run(socket_dir, record)
    assert [v for v, _ in live.verdicts] == ["exact"] * 8
    recording = read_recording(str(record))
    kinds = [event[1] for event in recording.events]
    # Frames and SSE deltas really are interleaved in the file.
    first_sse, last_sse = kinds.index("sse"), len(kinds) - 1 - kinds[::-1].index("sse")
    assert "frame" in kinds[first_sse:last_sse]
    # Each item carries its arrival time (the read that brought it): in order per
    # stream and for the frames; across them, the applied order can differ from
    # the arrival order by at most a reading round or two.
    frame_times = [e[0] for e in recording.events if e[1] == "frame"]
    assert frame_times == sorted(frame_times)
    for stream in range(8):
        sse_times = [e[0] for e in recording.events if e[1] == "sse" and e[2] == stream]
        assert sse_times == sorted(sse_times) and sse_times
    latest = 0.0
    for event in recording.events:
        assert event[0] > latest - 0.1, event
        latest = max(latest, event[0])

    again = native.Reconciler(recording.header["run_id"], 8)
    for event in recording.events:
        kind = event[1]
        if kind in RECONCILER_INPUT_KINDS:
            again.push_inputs([tuple(event[1:])])
        elif kind == "finalize":
            again.finalize()
    spans: list[list[tuple[str, int | None]]] = [[] for _ in range(8)]
    for event in again.drain():
        if event[0] == "span":
            spans[event[1]].append((event[3], event[4]))
    for stream, state in enumerate(live.model.streams):
        shown = list(state.spans)
        first = next(
            (i for i, (a, b) in enumerate(zip(shown, spans[stream], strict=False)) if a != b), None
        )
        assert shown == spans[stream], (stream, first, len(shown), len(spans[stream]))
    assert [again.verdict(i) for i in range(8)] == live.verdicts


def _events_after(recording_path: Path, run_id: str, n: int, order: Any = None) -> list[Any]:
    events = read_recording(str(recording_path)).events
    if order is not None:
        events = sorted(events, key=order)
    again = native.Reconciler(run_id, n)
    for event in events:
        kind = event[1]
        if kind in RECONCILER_INPUT_KINDS:
            again.push_inputs([tuple(event[1:])])
        elif kind == "finalize":
            again.finalize()
    return again.drain()


def test_inputs_from_two_threads_are_recorded_in_the_applied_order(tmp_path: Path) -> None:
    """Frames and SSE deltas pushed concurrently by two threads: the recording
    re-fed in its order gives the very event sequence the live reconciler
    produced (spans of all streams interleaved as they were applied)."""
    import sys
    import threading

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import workloads

    workload = workloads.generate(7, num_streams=6, tokens=120, k=3, coalesce=0.3)
    frames = [item[1] for item in workload.inputs if item[0] == "frame"]
    sse = [item for item in workload.inputs if item[0] != "frame"]
    live = native.Reconciler(workload.run_id, workload.num_streams)
    path = tmp_path / "two-threads.phr"
    live.record(str(path), json.dumps({"run_id": workload.run_id}))

    # The threads take turns in small slices (a frame slice, then an SSE slice, ...),
    # so their inputs interleave whatever the machine's scheduling.
    turn = threading.Condition()
    frames_turn = [True]
    done = {True: False, False: False}

    def take_turns(mine: bool, items: list[Any], push: Any, size: int) -> None:
        for start in range(0, len(items), size):
            with turn:
                turn.wait_for(lambda: frames_turn[0] is mine or done[not mine])
            for item in items[start : start + size]:
                push(item)
            with turn:
                frames_turn[0] = not mine
                turn.notify_all()
        with turn:
            done[mine] = True
            turn.notify_all()

    def push_one_sse(item: Any) -> None:
        live.push_inputs([item])

    def push_frames() -> None:
        take_turns(True, frames, lambda frame: live.push_frames([frame]), 3)

    def push_sse() -> None:
        take_turns(False, sse, push_one_sse, 17)

    threads = [threading.Thread(target=push_frames), threading.Thread(target=push_sse)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    live.finalize()
    live.close_record('{"end": true}')
    live_events = live.drain()
    assert sum(1 for e in live_events if e[0] == "span") > 100

    kinds = [e[1] == "frame" for e in read_recording(str(path)).events if e[1] != "finalize"]
    switches = sum(1 for a, b in itertools.pairwise(kinds) if a != b)
    assert switches > 10  # the two threads' inputs really interleaved

    replayed = _events_after(path, workload.run_id, workload.num_streams)
    assert replayed == live_events
    # The event sequence depends on the order of the inputs, so the check above
    # can fail: every frame first and every SSE delta first give other sequences.
    n = workload.num_streams
    frames_first = _events_after(path, workload.run_id, n, order=lambda e: e[1] != "frame")
    sse_first = _events_after(path, workload.run_id, n, order=lambda e: e[1] == "frame")
    assert frames_first != sse_first


def test_push_recorded_applies_a_recording_like_the_single_calls(
    socket_dir: str, tmp_path: Path
) -> None:
    import gzip

    record = tmp_path / "run.phr"
    live = recorded_run(socket_dir, record)
    with gzip.open(record, "rb") as handle:
        data = handle.read()
    assert data[:6] == b"PHREC\x04"
    packed = native.Reconciler(live.run_id, 8)
    packed.push_recorded(data[6:])
    assert [packed.verdict(i) for i in range(8)] == live.verdicts
    assert packed.totals() == live.totals
    with pytest.raises(ValueError) as caught:
        packed.push_recorded(data[6:30])
    assert str(caught.value).startswith("the recording is cut short inside the item at byte ")
