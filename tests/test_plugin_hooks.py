"""The plugin's hook logic (plugin/parallelhue_vllm/hooks.py) against stand-ins for vLLM objects.

The stand-ins follow the vLLM 0.32 code paths the hooks rely on: the scheduler
trims a request's sampled-token list in place at a stop, the output processor
feeds tokens to the detokenizer's decode_next (the stop token excluded), may
delete surplus tokens after a stop string, then calls make_request_output. The
real classes are exercised by tests/vllm (signatures and the live server).
"""

from __future__ import annotations

import enum
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parallelhue.reference import decode_frame
from parallelhue.reference.decode import Frame
from parallelhue_vllm import hooks, wire
from parallelhue_vllm.adapters import (
    _wrap_make_request_output,
    _wrap_process_outputs,
    _wrap_scheduler,
)

RUN = "0123456789abcdef0123456789abcdef"
A, T, B, P = wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS, wire.ROLE_PLAIN


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2


def rid(stream: int, prefix: str = "chatcmpl-") -> str:
    return f"{prefix}ph1_{RUN}_{stream}-1a2b3c4d"


@pytest.fixture
def receiver(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory(prefix="phh", dir="/tmp") as directory:
        os.chmod(directory, 0o700)
        monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", directory)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = Path(directory) / f"{RUN}.sock"
        sock.bind(str(path))
        os.chmod(path, 0o600)
        yield sock
        sock.close()


def frames_of(sock: socket.socket, telemetry: hooks._Base) -> list[Frame]:
    assert telemetry.emitter is not None
    telemetry.emitter.close(5.0)
    sock.setblocking(False)
    frames = []
    while True:
        try:
            frames.append(decode_frame(sock.recv(1 << 17)))
        except BlockingIOError:
            return frames


# ----------------------------------------------------------------- scheduler side
class FakeScheduler:
    """update_from_output as vLLM does it: stop checks trim the sampled list in place."""

    def __init__(self, *, method: str = "ngram", k: int = 3, is_async: bool = False) -> None:
        spec = SimpleNamespace(method=method, num_speculative_tokens=k) if method else None
        self.vllm_config = SimpleNamespace(speculative_config=spec)
        self.scheduler_config = SimpleNamespace(async_scheduling=is_async)
        self.requests: dict[str, object] = {}
        self.keep: dict[str, int] = {}
        self.finish: dict[str, FinishReason] = {}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = []
        for request_id in scheduler_output.num_scheduled_tokens:
            index = model_runner_output.req_id_to_index[request_id]
            tokens = model_runner_output.sampled_token_ids[index]
            if request_id in self.keep:
                del tokens[self.keep[request_id] :]
            outputs.append(
                SimpleNamespace(
                    request_id=request_id,
                    new_token_ids=tokens,
                    finish_reason=self.finish.get(request_id),
                )
            )
        return {0: SimpleNamespace(outputs=outputs)}


def sched_step(
    scheduler: FakeScheduler,
    update: Any,
    requests: dict[str, tuple[list[int], list[int]]],
) -> Any:
    """One engine step: request id -> (sampled tokens, scheduled drafts)."""
    ids = list(requests)
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens={r: 1 + len(requests[r][1]) for r in ids},
        scheduled_spec_decode_tokens={r: list(requests[r][1]) for r in ids if requests[r][1]},
        num_invalid_spec_tokens=None,
    )
    model_runner_output = SimpleNamespace(
        sampled_token_ids=[list(requests[r][0]) for r in ids],
        req_id_to_index={r: i for i, r in enumerate(ids)},
    )
    for r in ids:
        scheduler.requests[r] = object()
    return update(scheduler, scheduler_output, model_runner_output)


def make_scheduler(**options: Any) -> tuple[FakeScheduler, Any, hooks.SchedulerTelemetry]:
    telemetry = hooks.SchedulerTelemetry("0.32.0")
    scheduler = FakeScheduler(**options)
    update = _wrap_scheduler(FakeScheduler.update_from_output, telemetry)
    return scheduler, update, telemetry


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
        "0.2.0", "0.32.0", "ngram", wire.VERIFICATION_STANDARD,
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


# ------------------------------------------------------------------ frontend side
class FakeDetokenizer:
    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces

    def decode_next(self, next_token_id: int) -> str:
        return self.pieces[next_token_id]


FakeDetokenizer.decode_next = hooks.wrap_decode_next(FakeDetokenizer.decode_next)  # type: ignore[method-assign]


class FakeRequestState:
    def __init__(self, request_id: str, detokenizer: FakeDetokenizer, **extra: Any) -> None:
        self.request_id = request_id
        self.detokenizer = detokenizer
        self.parent_req = extra.get("parent_req")
        self.stream_interval = extra.get("stream_interval", 1)
        self.output_kind = SimpleNamespace(name=extra.get("output_kind", "DELTA"))
        self.request_index = 0
        self.http_text = ""

    def make_request_output(
        self, new_token_ids: list[int], pooling_output: Any, finish_reason: Any, stop_reason: Any
    ) -> Any:
        return SimpleNamespace(outputs=[SimpleNamespace(index=0, text=self.http_text)])


class FakeProcessor:
    """process_outputs as vLLM 0.32 does it for one request per output."""

    def __init__(self) -> None:
        self.request_states: dict[str, FakeRequestState] = {}

    def process_outputs(self, engine_core_outputs: list[Any], *args: Any) -> None:
        for output in engine_core_outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue
            fed = output.new_token_ids[: output.fed]
            for token in fed:
                state.detokenizer.decode_next(token)
            if output.keep is not None:
                del output.new_token_ids[output.keep :]  # surplus after a stop string
            state.http_text = output.http_text
            state.make_request_output(
                output.new_token_ids, None, output.finish_reason, output.stop_reason
            )


def make_frontend() -> tuple[FakeProcessor, Any, hooks.FrontendTelemetry]:
    telemetry = hooks.FrontendTelemetry("0.32.0")
    processor = FakeProcessor()
    process = _wrap_process_outputs(FakeProcessor.process_outputs, telemetry)
    FakeRequestState.make_request_output = _wrap_make_request_output(  # type: ignore[method-assign]
        FakeRequestState.__dict__["make_request_output"].__dict__.get(
            "__wrapped__", FakeRequestState.__dict__["make_request_output"]
        ),
        telemetry,
    )
    return processor, process, telemetry


def output(
    request_id: str,
    tokens: list[int],
    http_text: str,
    *,
    fed: int | None = None,
    keep: int | None = None,
    finish: FinishReason | None = None,
    stop_reason: object = None,
) -> Any:
    return SimpleNamespace(
        request_id=request_id,
        new_token_ids=list(tokens),
        fed=len(tokens) if fed is None else fed,
        keep=keep,
        http_text=http_text,
        finish_reason=finish,
        stop_reason=stop_reason,
    )


PIECES = {1: "a", 2: "", 3: "日", 4: "b", 5: "", 6: "", 7: "😀", 9: "</s>", 10: "c", 11: "d"}


def text_tokens(record: wire.Record) -> list[tuple[int, bytes, int]]:
    assert isinstance(record, wire.TextRecord)
    return [(t.token_id, t.fragment, t.span_back) for t in record.tokens]


def test_fragments_span_back_and_http_delta(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.request_states[r0] = FakeRequestState(r0, FakeDetokenizer(PIECES))
    process(processor, [output(r0, [1, 2], "a")])
    process(processor, [output(r0, [3, 4, 5], "日b")])  # 2 ends inside 日, claimed by 3
    process(processor, [output(r0, [6, 7, 9], "😀", fed=2, finish=FinishReason.STOP)])
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
    final = records[-1]
    assert isinstance(final, wire.TextRecord)
    assert (final.finished, final.finish_reason, final.text_truncated, final.tokens_trimmed) == (
        True, wire.FINISH_STOP, False, False,
    )  # fmt: skip
    assert telemetry.requests == {}


def test_stop_string_surplus_trim(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.request_states[r0] = FakeRequestState(r0, FakeDetokenizer(PIECES))
    # Stop string "c": tokens 10, 11 decoded, 11 deleted as surplus, text cut before "c".
    process(
        processor,
        [output(r0, [1, 10, 11], "a", keep=2, finish=FinishReason.STOP, stop_reason="c")],
    )
    record = frames_of(receiver, telemetry)[1].records[0]
    assert isinstance(record, wire.TextRecord)
    assert text_tokens(record) == [(1, b"a", 0), (10, b"c", 0)]
    assert (record.text_truncated, record.tokens_trimmed, record.trimmed_tokens) == (True, True, 1)
    assert record.http_delta == b"a"


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
    processor.request_states[r0] = FakeRequestState(r0, FakeDetokenizer(PIECES), **extra)
    process(processor, [output(r0, [1], "a")])
    process(processor, [output(r0, [4], "b", finish=FinishReason.LENGTH)])
    frames = frames_of(receiver, telemetry)
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    assert frames[1].records == [wire.NoticeRecord(2, code, message)]


def test_detokenizer_mismatch_is_contained(receiver: socket.socket) -> None:
    processor, process, telemetry = make_frontend()
    r0 = rid(0)
    processor.request_states[r0] = FakeRequestState(r0, FakeDetokenizer(PIECES))

    class Odd(SimpleNamespace):
        pass

    bad = output(r0, [1, 4], "ab")
    original_process = FakeProcessor.process_outputs

    def skewed(self: FakeProcessor, outputs: list[Any], *args: Any) -> None:
        # The detokenizer sees token 4 first: the recorded fragments disagree with the ids.
        self.request_states[r0].detokenizer.decode_next(4)
        outputs[0].fed = 0
        original_process(self, outputs, *args)

    process = _wrap_process_outputs(skewed, telemetry)
    process(processor, [bad])
    frames = frames_of(receiver, telemetry)
    assert [f.kind for f in frames] == [wire.KIND_HELLO, wire.KIND_NOTICE]
    notice = frames[1].records[0]
    assert isinstance(notice, wire.NoticeRecord)
    assert notice.message == (
        "telemetry hook failed in OutputProcessor.process_outputs: "
        "TelemetryError: detokenizer saw token 4 where the output has 1"
    )


def test_decode_next_records_only_marked_detokenizers() -> None:
    detokenizer = FakeDetokenizer(PIECES)
    assert detokenizer.decode_next(3) == "日"
    assert hooks.FRAGMENTS_ATTR not in detokenizer.__dict__


def test_aborted_requests_are_pruned(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(hooks, "PRUNE_EVERY", 2)
    scheduler, update, telemetry = make_scheduler()
    r0, r1 = rid(0), rid(1)
    sched_step(scheduler, update, {r0: ([1], []), r1: ([2], [])})
    del scheduler.requests[r0]  # aborted: vLLM forgot it without a finished output
    sched_step(scheduler, update, {r1: ([3], [])})
    assert list(telemetry.requests) == [r1]
    assert telemetry.active == {RUN: {r1}}

    processor, process, front = make_frontend()
    processor.request_states[r0] = FakeRequestState(r0, FakeDetokenizer(PIECES))
    processor.request_states[r1] = FakeRequestState(r1, FakeDetokenizer(PIECES))
    process(processor, [output(r0, [1], "a"), output(r1, [1], "a")])
    del processor.request_states[r0]
    del processor.request_states[r1]
    process(processor, [])
    assert front.requests == {} and front.active == {}
