"""The plugin's hook logic (plugin/parallelhue_vllm/hooks/) against stand-ins for vLLM
objects (tests/plugin_standins.py: the vLLM 0.32 code paths the hooks rely on; the
real classes are exercised by tests/vllm, signatures and the live server).
"""

from __future__ import annotations

import os
import socket
from types import SimpleNamespace
from typing import Any

import pytest
from tests.test_plugin_speedups import load_speedups

from parallelhue_vllm import __version__, hooks, wire
from parallelhue_vllm import emitter as emitter_module
from parallelhue_vllm.adapters import _wrap_process_outputs, _wrap_scheduler
from plugin_standins import (  # the shared vLLM stand-ins
    RUN,
    FakeCollector,
    FakeDetokenizer,
    FakeProcessor,
    FakeRequestState,
    FakeSlowDetokenizer,
    FinishReason,
    frames_of,
    make_frontend,
    make_scheduler,
    output,
    raw_frames,
    receiver,
    rid,
    sched_step,
)

__all__ = ["receiver"]  # the fixture, imported for pytest

A, T, B, P = wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS, wire.ROLE_PLAIN


def speedups() -> Any:
    """The C accelerator (built in place for a checkout, else the one installed); None
    when there is none (then skipped, not in CI)."""
    try:
        return load_speedups()
    except pytest.skip.Exception:
        return None


def use_speedups(monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
    """The C accelerator (or None: the Python code) for every hooks module and the emitter."""
    for hooks_module in hooks.MODULES:
        monkeypatch.setattr(hooks_module, "_speedups", module)
    monkeypatch.setattr(emitter_module, "_speedups", module)


@pytest.fixture(params=["c", "python"], autouse=True)
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C accelerator and with the pure-Python code
    ("both": the test switches between them itself)."""
    if request.param == "both":
        return "both"
    if request.param == "python":
        use_speedups(monkeypatch, None)
        return "python"
    module = speedups()
    if module is None:
        if os.environ.get("CI"):
            pytest.fail("parallelhue_vllm._speedups could not be built (a C compiler is needed)")
        pytest.skip("no C compiler: only the pure-Python hooks are tested")
    use_speedups(monkeypatch, module)
    return "c"


@pytest.mark.parametrize(
    ("generated", "drafts", "roles"),
    [
        (1, 0, [P]),
        (1, 3, [T]),
        (3, 3, [A, A, T]),
        (4, 3, [A, A, A, B]),
        (2, 1, [A, B]),
    ],
)
def test_step_roles_from_counts(generated: int, drafts: int, roles: list[int]) -> None:
    assert hooks.step_roles(generated, drafts) == roles


@pytest.mark.parametrize(
    ("generated", "drafts", "message"),
    [
        (2, 0, "a step without drafts produced 2 tokens"),
        (5, 3, "a step with 3 drafts produced 5 tokens"),
        (0, 3, "a step with 3 drafts produced 0 tokens"),
    ],
)
def test_step_roles_refuse_impossible_counts(generated: int, drafts: int, message: str) -> None:
    with pytest.raises(hooks.TelemetryError) as info:
        hooks.step_roles(generated, drafts)
    assert str(info.value) == message


def test_provenance_roles_offsets_and_trim(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1, "cmpl-")
    foreign = "chatcmpl-someone-else-1234"
    sched_step(scheduler, update, {r0: ([10], []), r1: ([20], []), foreign: ([1], [])})
    sched_step(scheduler, update, {r0: ([11, 12, 13, 14], [11, 12, 13]), r1: ([21, 22], [5, 6])})
    # A stop token in the middle of the step: the scheduler keeps 2 of 4 tokens.
    scheduler.keep[r0] = 2
    scheduler.finish[r0] = FinishReason.STOP
    sched_step(scheduler, update, {r0: ([15, 16, 17, 18], [15, 16, 17]), r1: ([23], [9, 9])})
    frames = frames_of(receiver, telemetry)
    assert frames[0].kind == wire.KIND_HELLO
    assert frames[0].hello == wire.Hello(
        wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_DRAFT_IDS, False, 3,
        __version__, "0.32.0", "ngram", wire.VERIFICATION_STANDARD,
    )  # fmt: skip
    records = [[(r.stream, r.offset, r.token_ids, r.roles) for r in f.records] for f in frames[1:]]
    assert records == [
        [(0, 0, [10], [P]), (1, 0, [20], [P])],
        [(0, 1, [11, 12, 13, 14], [A, A, A, B]), (1, 1, [21, 22], [A, T])],
        [(0, 5, [15, 16], [A, A]), (1, 3, [23], [T])],
    ]
    last = frames[-1].records[0]
    assert isinstance(last, wire.ProvenanceRecord)
    assert (last.finished, last.finish_reason, last.trimmed, last.drafts_scheduled) == (
        True, wire.FINISH_STOP, True, 3,
    )  # fmt: skip
    assert [f.header.step for f in frames[1:]] == [1, 2, 3]
    # The finished request's state is gone; the other is still tracked.
    assert list(telemetry.requests) == [r1]


def test_run_ends_only_after_the_last_frame(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1)
    sched_step(scheduler, update, {r0: ([1], []), r1: ([2], [])})
    scheduler.finish.update({r0: FinishReason.LENGTH, r1: FinishReason.LENGTH})
    sched_step(scheduler, update, {r0: ([3], []), r1: ([4], [])})
    frames = frames_of(receiver, telemetry)
    # One source: the final step's records are sent before the run is forgotten.
    assert len({f.header.source_id for f in frames}) == 1
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_PROVENANCE, wire.KIND_PROVENANCE]
    assert telemetry.requests == {} and telemetry.active == {}


def test_async_scheduling_derives_roles_from_counts(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler(method="eagle3", k=2, is_async=True)
    sched_step(scheduler, update, {rid(0): ([5, 6], [-1, -1])})
    frames = frames_of(receiver, telemetry)
    hello = frames[0].hello
    assert hello is not None
    assert (hello.role_derivation, hello.async_scheduling, hello.spec_method) == (
        wire.DERIVATION_COUNTS, True, "eagle3",
    )  # fmt: skip
    record = frames[1].records[0]
    assert isinstance(record, wire.ProvenanceRecord)
    assert (record.roles, record.drafts_scheduled, record.drafts_padded) == ([A, T], 2, 0)


def test_padded_drafts_are_counted_without_async(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    sched_step(scheduler, update, {rid(0): ([5], [7, -1, -1])})
    record = frames_of(receiver, telemetry)[1].records[0]
    assert isinstance(record, wire.ProvenanceRecord)
    assert (record.roles, record.drafts_scheduled, record.drafts_padded) == ([T], 3, 2)


def test_parallel_sampling_children_are_left_to_the_frontend(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    sched_step(scheduler, update, {"0_" + rid(0): ([5], []), "1_" + rid(0): ([6], [])})
    assert telemetry.emitter is None  # nothing of ours: no emitter, no socket


def test_impossible_step_turns_telemetry_off_with_a_notice(
    receiver: socket.socket, caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1)
    with caplog.at_level("WARNING", logger="vllm.parallelhue"):
        result = sched_step(scheduler, update, {r0: ([5, 6], []), r1: ([7], [])})
        sched_step(scheduler, update, {r0: ([8], []), r1: ([9], [])})
    # vLLM got its own result untouched.
    assert [o.new_token_ids for o in result[0].outputs] == [[5, 6], [7]]
    frames = frames_of(receiver, telemetry)
    kinds = [(f.kind, [r.stream for r in f.records]) for f in frames]
    assert kinds == [
        (wire.KIND_HELLO, []),
        (wire.KIND_NOTICE, [0]),
        (wire.KIND_PROVENANCE, [1]),
        (wire.KIND_PROVENANCE, [1]),
    ]
    notice = frames[1].records[0]
    assert isinstance(notice, wire.NoticeRecord)
    assert notice.code == wire.NOTICE_HOOK_ERROR
    assert notice.message == (
        "telemetry hook failed in Scheduler.update_from_output: "
        "TelemetryError: a step without drafts produced 2 tokens"
    )
    assert [r.getMessage() for r in caplog.records] == [
        "parallelhue: telemetry hook failed in Scheduler.update_from_output (TelemetryError: "
        "a step without drafts produced 2 tokens); telemetry is off for the affected request, "
        "the client is told by a notice"
    ]


def test_broken_engine_objects_never_reach_vllm(receiver: socket.socket) -> None:
    telemetry = hooks.SchedulerTelemetry("0.32.0")

    def original(self: Any, scheduler_output: Any, model_runner_output: Any) -> str:
        return "vllm result"

    update = _wrap_scheduler(original, telemetry)
    # Outputs without the attributes the hook reads.
    assert update(object(), SimpleNamespace(), SimpleNamespace()) == "vllm result"


PIECES = {1: "a", 2: "", 3: "日", 4: "b", 5: "", 6: "", 7: "😀", 9: "</s>", 10: "c", 11: "d"}


def text_tokens(record: wire.Record) -> list[tuple[int, bytes, int]]:
    assert isinstance(record, wire.TextRecord)
    return [(t.token_id, t.fragment, t.span_back) for t in record.tokens]


@pytest.mark.parametrize("detokenizer", [FakeDetokenizer, FakeSlowDetokenizer])
def test_fragments_span_back_and_http_delta(receiver: socket.socket, detokenizer: type) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    state = FakeRequestState(r0, detokenizer(PIECES))
    processor.add(r0, state)
    process(processor, [output(r0, [1, 2])])
    process(processor, [output(r0, [3, 4, 5])])  # 2 ends inside 日, claimed by 3
    process(processor, [output(r0, [6, 7, 9], finish=FinishReason.STOP)])
    frames = frames_of(receiver, telemetry)
    assert frames[0].hello is not None and frames[0].hello.role == wire.SOURCE_FRONTEND
    records = [f.records[0] for f in frames[1:]]
    assert [text_tokens(r) for r in records] == [
        [(1, b"a", 0), (2, b"", 0)],
        [(3, "日".encode(), 1), (4, b"b", 0), (5, b"", 0)],
        # 5 and 6 returned "" and are claimed by 7; the stop token 9 was never decoded.
        [(6, b"", 0), (7, "😀".encode(), 2), (9, b"", 0)],
    ]
    assert [(r.offset, r.http_delta) for r in records if isinstance(r, wire.TextRecord)] == [
        (0, b"a"),
        (2, "日b".encode()),
        (5, "😀".encode()),
    ]
    # Every output reached vLLM's own queue, which is back in place.
    assert type(state.queue) is FakeCollector
    assert [o.outputs[0].text for o in state.queue.outputs] == ["a", "日b", "😀"]
    final = records[-1]
    assert isinstance(final, wire.TextRecord)
    assert (final.finished, final.finish_reason, final.text_truncated, final.tokens_trimmed) == (
        True, wire.FINISH_STOP, False, False,
    )  # fmt: skip
    assert telemetry.requests == {}


def test_stop_string_surplus_trim(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.add(r0, FakeRequestState(r0, FakeDetokenizer(PIECES, stop=["c"])))
    # Stop string "c": tokens 10, 11 decoded, 11 deleted as surplus, text cut before "c".
    process(processor, [output(r0, [1, 10, 11])])
    record = frames_of(receiver, telemetry)[1].records[0]
    assert isinstance(record, wire.TextRecord)
    assert text_tokens(record) == [(1, b"a", 0), (10, b"c", 0)]
    assert (record.finished, record.finish_reason) == (True, wire.FINISH_STOP)
    assert (record.text_truncated, record.tokens_trimmed, record.trimmed_tokens) == (True, True, 1)
    assert record.http_delta == b"a"


def test_stop_string_and_stop_token_in_one_step(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.add(r0, FakeRequestState(r0, FakeDetokenizer(PIECES, stop=["c"])))
    # The engine stopped on token 9 and the text holds the stop string: 11 and 9 go.
    process(processor, [output(r0, [1, 10, 11, 9], finish=FinishReason.STOP)])
    record = frames_of(receiver, telemetry)[1].records[0]
    assert isinstance(record, wire.TextRecord)
    assert text_tokens(record) == [(1, b"a", 0), (10, b"c", 0)]
    assert (record.tokens_trimmed, record.trimmed_tokens, record.http_delta) == (True, 2, b"a")


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        ({"stream_interval": 4}, wire.NOTICE_STREAM_INTERVAL, "stream_interval=4"),
        (
            {"parent_req": SimpleNamespace(n=3)},
            wire.NOTICE_N,
            "n=3: choices of a parallel-sampling request are not tracked",
        ),
        (
            {"output_kind": "CUMULATIVE"},
            wire.NOTICE_OTHER,
            "cumulative output mode is not supported",
        ),
    ],
)
def test_requests_that_cannot_be_exact_get_a_notice(
    receiver: socket.socket, extra: dict[str, Any], code: int, message: str
) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(2)
    state = FakeRequestState(r0, FakeDetokenizer(PIECES), **extra)
    processor.add(r0, state)
    process(processor, [output(r0, [1])])
    process(processor, [output(r0, [4], finish=FinishReason.LENGTH)])
    frames = frames_of(receiver, telemetry)
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    assert frames[1].records == [wire.NoticeRecord(2, code, message)]
    assert type(state.queue) is FakeCollector  # nothing installed on it


def test_detokenizer_mismatch_is_contained(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.add(r0, FakeRequestState(r0, FakeDetokenizer(PIECES)))
    original_process = FakeProcessor.process_outputs

    def skewed(self: FakeProcessor, outputs: list[Any], *args: Any) -> None:
        # Something decodes token 4 outside update(): the fragments no longer line up.
        self.request_states[r0].detokenizer.decode_next(4)
        original_process(self, outputs, *args)

    process = _wrap_process_outputs(skewed, telemetry)
    process(processor, [output(r0, [1, 4])])
    process(processor, [output(r0, [1])])  # telemetry stays off for the request
    frames = frames_of(receiver, telemetry)
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    notice = frames[1].records[0]
    assert isinstance(notice, wire.NoticeRecord)
    assert notice.message == (
        "telemetry hook failed in RequestOutputCollector.put: "
        "TelemetryError: the detokenizer decoded 3 tokens of a step of 2"
    )
    assert telemetry.requests == {}


def test_other_requests_are_never_touched(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0, foreign = rid(0), "chatcmpl-someone-else-1a2b3c4d"
    ours = FakeRequestState(r0, FakeDetokenizer(PIECES))
    theirs = FakeRequestState(foreign, FakeDetokenizer(PIECES))
    their_queue, their_stream = theirs.queue, theirs.detokenizer.stream
    processor.add(foreign, theirs)
    assert telemetry.requests == {} and telemetry.emitter is None
    names = set(vars(ours)), set(vars(ours.detokenizer))
    our_queue, our_stream = ours.queue, ours.detokenizer.stream
    processor.add(r0, ours)
    # Only the values of two attributes vLLM already has are ours; no name is added.
    assert (set(vars(ours)), set(vars(ours.detokenizer))) == names
    assert ours.queue is not our_queue and ours.detokenizer.stream is not our_stream
    assert (theirs.queue, theirs.detokenizer.stream) == (their_queue, their_stream)
    process(processor, [output(foreign, [1]), output(r0, [1]), output(foreign, [4])])
    process(processor, [output(r0, [4], finish=FinishReason.LENGTH)])
    frames = frames_of(receiver, telemetry)
    assert [[r.stream for r in f.records] for f in frames[1:]] == [[0], [0]]
    # A finished request gets vLLM's objects back (ours also hold references to them).
    assert (ours.queue, ours.detokenizer.stream) == (our_queue, our_stream)
    assert [o.outputs[0].text for o in our_queue.outputs] == ["a", "b"]


def test_requests_with_stop_strings_count_their_tokens_first(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    plain, stopping = rid(0), rid(1)
    processor.add(plain, FakeRequestState(plain, FakeDetokenizer(PIECES)))
    processor.add(stopping, FakeRequestState(stopping, FakeDetokenizer(PIECES, stop=["zz"])))
    assert list(telemetry.stopping) == [stopping]
    process(processor, [output(plain, [1]), output(stopping, [4])])
    frames = frames_of(receiver, telemetry)
    assert [r.stream for r in frames[1].records] == [0, 1]


def test_requests_that_are_not_streamed_get_a_notice(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(3)
    processor.add(r0, FakeRequestState(r0, FakeDetokenizer(PIECES), output_kind="FINAL_ONLY"))
    process(processor, [output(r0, [1], finish=FinishReason.LENGTH)])
    frames = frames_of(receiver, telemetry)
    message = "only streamed requests are tracked (this one is not)"
    assert frames[1].records == [wire.NoticeRecord(3, wire.NOTICE_OTHER, message)]


def test_aborted_requests_are_pruned(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    for module in (hooks.scheduler, hooks.frontend):
        monkeypatch.setattr(module, "PRUNE_EVERY", 2)
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1)
    sched_step(scheduler, update, {r0: ([1], []), r1: ([2], [])})
    del scheduler.requests[r0]  # vLLM forgot it without a finished output or a notice
    sched_step(scheduler, update, {r1: ([3], [])})
    assert list(telemetry.requests) == [r1]
    assert telemetry.active == {RUN: {r1}}

    processor, process, front = make_frontend()
    state0 = FakeRequestState(r0, FakeDetokenizer(PIECES))
    processor.add(r0, state0)
    processor.add(r1, FakeRequestState(r1, FakeDetokenizer(PIECES)))
    process(processor, [output(r0, [1]), output(r1, [1])])
    del processor.request_states[r0]
    del processor.request_states[r1]
    process(processor, [])
    assert front.requests == {} and front.active == {}
    assert type(state0.queue) is FakeCollector
    for emitter in (telemetry.emitter, front.emitter):
        assert emitter is not None
        emitter.close()


def test_an_abort_output_put_between_steps_goes_out_with_the_next_step(
    receiver: socket.socket,
) -> None:
    """vLLM's abort_requests puts a final output outside process_outputs: the capture
    notes it there, and the next step takes its row before that step's own rows,
    in the order the outputs were put (as when each row was taken at put)."""
    processor, process, front = make_frontend()
    r0, r1 = rid(0), rid(1)
    state0 = FakeRequestState(r0, FakeDetokenizer(PIECES))
    processor.add(r0, state0)
    processor.add(r1, FakeRequestState(r1, FakeDetokenizer(PIECES)))
    process(processor, [output(r0, [1]), output(r1, [4])])
    capture = front.requests[r0].capture
    assert front.seen == []  # every noted output was taken at the end of the step
    # OutputProcessor.abort_requests: the state leaves vLLM's table, its final output is put.
    del processor.request_states[r0]
    state0.queue.put(state0.make_request_output([], None, FinishReason.ABORT, None))
    assert front.seen[0] is capture and len(front.seen) == 2  # noted, not taken yet
    process(processor, [output(r1, [10])])
    assert front.seen == [] and list(front.requests) == [r1]
    assert capture.active is False and type(state0.queue) is FakeCollector
    frames = frames_of(receiver, front)
    steps = [[(r.stream, r.offset, r.finished, r.finish_reason) for r in f.records]
             for f in frames[1:]]  # fmt: skip
    assert steps == [
        [(0, 0, False, wire.FINISH_NONE), (1, 0, False, wire.FINISH_NONE)],
        [(0, 1, True, wire.FINISH_ABORT), (1, 1, False, wire.FINISH_NONE)],
    ]


def test_aborts_reported_by_the_scheduler_end_the_run_at_once(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1)
    sched_step(scheduler, update, {r0: ([1], []), r1: ([2], [])})
    scheduler.abort(r0)
    sched_step(scheduler, update, {r1: ([3], [])})
    assert list(telemetry.requests) == [r1]
    scheduler.abort(r1)
    sched_step(scheduler, update, {})
    assert telemetry.requests == {} and telemetry.active == {}
    frames = frames_of(receiver, telemetry)
    assert [[r.stream for r in f.records] for f in frames[1:]] == [[0, 1], [1]]


def test_a_request_listed_as_new_again_keeps_its_offsets(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    r0 = rid(0)
    sched_step(scheduler, update, {r0: ([1], [])})
    scheduler.scheduled.clear()  # resumed after preemption: listed in scheduled_new_reqs again
    sched_step(scheduler, update, {r0: ([2], [])})
    frames = frames_of(receiver, telemetry)
    assert [f.records[0].offset for f in frames[1:]] == [0, 1]


def test_a_request_never_listed_as_new_is_not_ours(receiver: socket.socket) -> None:
    scheduler, update, telemetry = make_scheduler()
    scheduler.scheduled.add(rid(0))  # e.g. the plugin was installed after it arrived
    sched_step(scheduler, update, {rid(0): ([1], [])})
    assert telemetry.emitter is None and telemetry.requests == {}


# ------------------------------------------------- the accelerator changes no byte
def raw_frames_of(sock: socket.socket, telemetry: hooks.common._Base) -> list[bytes]:
    """Every datagram the telemetry sent, with the two header fields that differ
    between any two runs (the random source id, the send timestamp) zeroed."""
    frames = []
    for raw in raw_frames(sock, telemetry):
        frame = bytearray(raw)
        frame[24:32] = bytes(8)  # source_id
        frame[48:56] = bytes(8)  # timestamp
        frames.append(bytes(frame))
    return frames


def mixed_workload(receiver: socket.socket) -> list[bytes]:
    """Both collectors through every kind of row the hooks know, beside foreign requests."""
    scheduler, update, sched = make_scheduler()
    r0, r1, r2, foreign = rid(0), rid(1), rid(2), "chatcmpl-someone-else-1a2b3c4d"
    sched_step(scheduler, update, {r0: ([10], []), r1: ([20], []), foreign: ([1], [])})
    sched_step(
        scheduler, update,
        {r0: ([11, 12, 13, 14], [11, 12, 13]), r1: ([21, 22], [5, 6]), r2: ([30], [7, -1, -1]),
         foreign: ([2, 3], [2, 9])},
    )  # fmt: skip
    scheduler.keep[r0] = 2
    scheduler.finish[r0] = FinishReason.STOP
    scheduler.finish[r2] = FinishReason.LENGTH
    sched_step(scheduler, update, {r0: ([15, 16, 17, 18], [15, 16, 17]), r1: ([23], [9, 9]),
                                   r2: ([31], [])})  # fmt: skip
    sched_step(scheduler, update, {r1: ([24, 25], [0])})
    accelerator = hooks.scheduler._speedups
    python_kind = hooks.scheduler._SchedRequest
    expected = accelerator.SchedRequest if accelerator is not None else python_kind
    assert type(sched.requests[r1]) is expected  # the implementation under test ran
    frames = raw_frames_of(receiver, sched)  # the two senders' frames, one after the other

    processor, process, front = make_frontend()
    states = {
        r0: FakeRequestState(r0, FakeDetokenizer(PIECES)),
        r1: FakeRequestState(r1, FakeSlowDetokenizer(PIECES)),
        r2: FakeRequestState(r2, FakeDetokenizer(PIECES, stop=["c"])),
        foreign: FakeRequestState(foreign, FakeDetokenizer(PIECES)),
    }
    for request_id, state in states.items():
        processor.add(request_id, state)
    process(processor, [output(r0, [1, 2]), output(r1, [4]), output(foreign, [1]),
                        output(r2, [4, 4])])  # fmt: skip
    process(processor, [output(r0, [3, 4, 5]), output(r1, [1, 3]), output(r2, [1, 10, 11])])
    capture = front.requests[r0].capture
    expected = accelerator.CaptureState if accelerator is not None else hooks.standins._QueueCapture
    assert type(capture) is expected
    process(processor, [output(r0, [6, 7, 9], finish=FinishReason.STOP),
                        output(r1, [11], finish=FinishReason.LENGTH)])  # fmt: skip
    return frames + raw_frames_of(receiver, front)


@pytest.mark.parametrize("implementation", ["both"], indirect=True)
def test_the_accelerator_and_the_python_code_send_the_same_bytes(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch, implementation: str
) -> None:
    module = speedups()
    if module is None:
        if os.environ.get("CI"):
            pytest.fail("parallelhue_vllm._speedups could not be built (a C compiler is needed)")
        pytest.skip("no C compiler: nothing to compare the pure-Python hooks with")
    use_speedups(monkeypatch, module)
    accelerated = mixed_workload(receiver)
    use_speedups(monkeypatch, None)
    pure = mixed_workload(receiver)
    # hello + 4 provenance steps, hello + 3 text steps of which r0's first two wait for
    # its "" tokens' give counts (attribution.HeldText) and go out as frames of their
    # own: nothing lost, nothing extra.
    assert [frame[5] for frame in pure] == [wire.KIND_HELLO] + [wire.KIND_PROVENANCE] * 4 + [
        wire.KIND_HELLO
    ] + [wire.KIND_TEXT] * 5
    assert accelerated == pure


def test_the_empty_fragment_test_is_pythons_in() -> None:
    """hooks.frontend._has_empty (the C one and the Python one) answers `"" in fragments`, the
    per-step test that sends a run's text through attribution.HeldText."""

    class EqualsEverything:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    cases: list[list[Any]] = [
        [], ["a"], ["a", ""], ["", "b"], ["ab", "c", "d"], [EqualsEverything()], [1, None, "z"]
    ]  # fmt: skip
    for fragments in cases:
        assert hooks.frontend._has_empty(fragments) == ("" in fragments), fragments
