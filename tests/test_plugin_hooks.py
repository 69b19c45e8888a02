"""The plugin's hook logic (plugin/parallelhue_vllm/hooks.py) against stand-ins for vLLM objects.

The stand-ins follow the vLLM 0.32 code paths the hooks rely on: the scheduler
trims a request's sampled-token list in place at a stop, the output processor
feeds tokens to the detokenizer's decode_next (the stop token excluded), may
delete surplus tokens after a stop string, then calls make_request_output. The
real classes are exercised by tests/vllm (signatures and the live server).
"""

from __future__ import annotations

import enum
import importlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from parallelhue.reference import decode_frame
from parallelhue.reference.decode import Frame
from parallelhue_vllm import __version__, hooks, wire
from parallelhue_vllm import emitter as emitter_module
from parallelhue_vllm.adapters import _wrap_add_request, _wrap_process_outputs, _wrap_scheduler

RUN = "0123456789abcdef0123456789abcdef"
A, T, B, P = wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS, wire.ROLE_PLAIN


class FinishReason(enum.IntEnum):
    STOP = 0
    LENGTH = 1
    ABORT = 2


def rid(stream: int, prefix: str = "chatcmpl-") -> str:
    return f"{prefix}ph1_{RUN}_{stream}-1a2b3c4d"


def speedups() -> Any:
    """The C accelerator, built in place; None when it cannot be built (then skipped, not in CI)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "plugin"))
    try:
        import build_speedups

        build_speedups.build()
        return importlib.import_module("parallelhue_vllm._speedups")
    except (OSError, ImportError, subprocess.CalledProcessError):
        return None
    finally:
        sys.path.pop(0)


@pytest.fixture(params=["c", "python"], autouse=True)
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C accelerator and with the pure-Python code
    ("both": the test switches between them itself)."""
    if request.param == "both":
        return "both"
    if request.param == "python":
        monkeypatch.setattr(hooks, "_speedups", None)
        monkeypatch.setattr(emitter_module, "_speedups", None)
        return "python"
    module = speedups()
    if module is None:
        if os.environ.get("CI"):
            pytest.fail("parallelhue_vllm._speedups could not be built (a C compiler is needed)")
        pytest.skip("no C compiler: only the pure-Python hooks are tested")
    monkeypatch.setattr(hooks, "_speedups", module)
    monkeypatch.setattr(emitter_module, "_speedups", module)
    return "c"


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
        self.scheduled: set[str] = set()  # ids scheduled before (not "new" any more)
        self.finished_since: set[str] = set()  # finished or aborted since the last step

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = []
        for request_id in scheduler_output.num_scheduled_tokens:
            index = model_runner_output.req_id_to_index[request_id]
            tokens = model_runner_output.sampled_token_ids[index]
            if request_id in self.keep:
                del tokens[self.keep[request_id] :]
            reason = self.finish.get(request_id)
            if reason is not None:
                self.finished_since.add(request_id)
                self.requests.pop(request_id, None)
            outputs.append(
                SimpleNamespace(request_id=request_id, new_token_ids=tokens, finish_reason=reason)
            )
        return {0: SimpleNamespace(outputs=outputs)}

    def abort(self, request_id: str) -> None:
        self.requests.pop(request_id, None)
        self.finished_since.add(request_id)


def sched_step(
    scheduler: FakeScheduler,
    update: Any,
    requests: dict[str, tuple[list[int], list[int]]],
) -> Any:
    """One engine step: request id -> (sampled tokens, scheduled drafts).

    Like vLLM's scheduler, a request's first step lists it in scheduled_new_reqs,
    and the ids finished or aborted since the previous step are in finished_req_ids.
    """
    ids = list(requests)
    scheduler_output = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r) for r in ids if r not in scheduler.scheduled],
        num_scheduled_tokens={r: 1 + len(requests[r][1]) for r in ids},
        scheduled_spec_decode_tokens={r: list(requests[r][1]) for r in ids if requests[r][1]},
        num_invalid_spec_tokens=None,
        finished_req_ids=set(scheduler.finished_since),
    )
    scheduler.finished_since.clear()
    model_runner_output = SimpleNamespace(
        sampled_token_ids=[list(requests[r][0]) for r in ids],
        req_id_to_index={r: i for i, r in enumerate(ids)},
    )
    for r in ids:
        scheduler.requests.setdefault(r, object())
        scheduler.scheduled.add(r)
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


# ------------------------------------------------------------------ frontend side
class FakeStream:
    """tokenizers.decoders.DecodeStream: step() is None until a token completes text."""

    def __init__(self, pieces: dict[int, str]) -> None:
        self.pieces = pieces

    def step(self, tokenizer: Any, token_id: int) -> str | None:
        return self.pieces[token_id] or None


class FakeDetokenizer:
    """vLLM 0.32's FastIncrementalDetokenizer: update / get_next_output_text, decode_next
    returning `stream.step(...) or ""`."""

    def __init__(self, pieces: dict[int, str], stop: list[str] | None = None) -> None:
        self.stream = FakeStream(pieces)
        self.tokenizer = object()
        self.spaces_between_special_tokens = True
        self.stop = stop or []
        self.include_stop_str_in_output = False
        self.stop_buffer_length = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.output_text = ""
        self.sent = 0

    def decode_next(self, next_token_id: int) -> str:
        return self._protected_step(next_token_id) or ""

    def _protected_step(self, next_token_id: int) -> str | None:
        return self.stream.step(self.tokenizer, next_token_id)

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        if not new_token_ids:
            return None
        fed = new_token_ids
        if stop_terminated and not self.include_stop_str_in_output:
            fed = new_token_ids[:-1]  # the stop token is kept out of the text
        first = len(self.token_ids)
        ends = [len(self.output_text)]
        for token in fed:
            self.token_ids.append(token)
            self.output_text += self.decode_next(token)
            ends.append(len(self.output_text))
        if len(fed) < len(new_token_ids):
            self.token_ids.append(new_token_ids[-1])
        for stop in self.stop:
            at = self.output_text.find(stop, ends[0] - len(stop) + 1 if ends[0] else 0)
            if at >= 0:
                # Keep the tokens up to the one that completes the stop string.
                kept = next(i for i, end in enumerate(ends) if end >= at + len(stop))
                del self.token_ids[first + kept :]
                self.output_text = self.output_text[:at]
                return stop
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        length = len(self.output_text) - (0 if finished else self.stop_buffer_length)
        text = self.output_text[self.sent : length] if self.sent < length else ""
        self.sent = max(self.sent, length)
        return text


class FakeSlowDetokenizer(FakeDetokenizer):
    """A detokenizer that decodes without a stream (vLLM's SlowIncrementalDetokenizer)."""

    def __init__(self, pieces: dict[int, str], stop: list[str] | None = None) -> None:
        super().__init__(pieces, stop)
        del self.stream
        self.pieces = pieces

    def decode_next(self, next_token_id: int) -> str:
        return self.pieces[next_token_id]


class FakeCollector:
    """RequestOutputCollector: what the HTTP side would read."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []

    def put(self, output: Any) -> None:
        self.outputs.append(output)


class FakeRequestState:
    def __init__(self, request_id: str, detokenizer: Any, **extra: Any) -> None:
        self.request_id = request_id
        self.detokenizer = detokenizer
        self.parent_req = extra.get("parent_req")
        self.stream_interval = extra.get("stream_interval", 1)
        self.output_kind = SimpleNamespace(name=extra.get("output_kind", "DELTA"))
        self.request_index = 0
        self.queue = FakeCollector()

    def make_request_output(
        self,
        new_token_ids: list[int],
        pooling_output: Any,
        finish_reason: Any,
        stop_reason: Any,
        kv_transfer_params: Any = None,
        ec_transfer_params: Any = None,
        error: Any = None,
    ) -> Any:
        finished = finish_reason is not None
        text = self.detokenizer.get_next_output_text(finished, True)
        completion = SimpleNamespace(
            index=self.request_index,
            text=text,
            token_ids=new_token_ids,
            finish_reason=finish_reason.name.lower() if finished else None,
            stop_reason=stop_reason if finished else None,
        )
        return SimpleNamespace(outputs=[completion], finished=finished)


class FakeProcessor:
    """OutputProcessor.add_request / process_outputs as vLLM 0.32 does them (n = 1)."""

    def __init__(self) -> None:
        self.request_states: dict[str, FakeRequestState] = {}

    def add_request(self, request: Any, prompt: Any, parent_req: Any = None,
                    request_index: int = 0, queue: Any = None) -> None:  # fmt: skip
        self.request_states[request.request_id] = request.state

    def process_outputs(self, engine_core_outputs: list[Any], *args: Any) -> None:
        for output in engine_core_outputs:
            state = self.request_states.get(output.request_id)
            if state is None:
                continue
            finish, stop_reason = output.finish_reason, None
            detokenizer = state.detokenizer
            before = len(detokenizer.token_ids)
            stop = detokenizer.update(output.new_token_ids, finish == FinishReason.STOP)
            if stop:
                finish, stop_reason = FinishReason.STOP, stop
                del output.new_token_ids[len(detokenizer.token_ids) - before :]
            request_output = state.make_request_output(
                output.new_token_ids, None, finish, stop_reason, None, None, error=None
            )
            if request_output is not None:
                state.queue.put(request_output)
            if finish is not None:
                del self.request_states[output.request_id]


def make_frontend() -> tuple[FakeProcessor, Any, hooks.FrontendTelemetry]:
    telemetry = hooks.FrontendTelemetry("0.32.0", stream_detokenizers=(FakeDetokenizer,))
    processor = FakeProcessor()
    process = _wrap_process_outputs(FakeProcessor.process_outputs, telemetry)
    add = _wrap_add_request(FakeProcessor.add_request, telemetry)

    def add_request(request_id: str, state: FakeRequestState) -> None:
        add(processor, SimpleNamespace(request_id=request_id, state=state), None)

    processor.add = add_request  # type: ignore[attr-defined]
    return processor, process, telemetry


def output(request_id: str, tokens: list[int], *, finish: FinishReason | None = None) -> Any:
    return SimpleNamespace(request_id=request_id, new_token_ids=list(tokens), finish_reason=finish)


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
    monkeypatch.setattr(hooks, "PRUNE_EVERY", 2)
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
def raw_frames_of(sock: socket.socket, telemetry: hooks._Base) -> list[bytes]:
    """Every datagram the telemetry sent, with the two header fields that differ
    between any two runs (the random source id, the send timestamp) zeroed."""
    assert telemetry.emitter is not None
    telemetry.emitter.close(5.0)
    sock.setblocking(False)
    frames = []
    while True:
        try:
            frame = bytearray(sock.recv(1 << 17))
        except BlockingIOError:
            return frames
        frame[24:32] = bytes(8)  # source_id
        frame[48:56] = bytes(8)  # timestamp
        frames.append(bytes(frame))


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
    accelerator = hooks._speedups
    expected = accelerator.SchedRequest if accelerator is not None else hooks._SchedRequest
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
    expected = accelerator.QueueCapture if accelerator is not None else hooks._QueueCapture
    assert type(front.requests[r0].capture) is expected
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
    monkeypatch.setattr(hooks, "_speedups", module)
    monkeypatch.setattr(emitter_module, "_speedups", module)
    accelerated = mixed_workload(receiver)
    monkeypatch.setattr(hooks, "_speedups", None)
    monkeypatch.setattr(emitter_module, "_speedups", None)
    pure = mixed_workload(receiver)
    # hello + 4 provenance steps, hello + 3 text steps of which r0's first two wait for
    # its "" tokens' give counts (attribution.HeldText) and go out as frames of their
    # own: nothing lost, nothing extra.
    assert [frame[5] for frame in pure] == [wire.KIND_HELLO] + [wire.KIND_PROVENANCE] * 4 + [
        wire.KIND_HELLO
    ] + [wire.KIND_TEXT] * 5
    assert accelerated == pure


def test_the_empty_fragment_test_is_pythons_in() -> None:
    """hooks._has_empty (the C one and the Python one) answers `"" in fragments`, the
    per-step test that sends a run's text through attribution.HeldText."""

    class EqualsEverything:
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = object.__hash__

    cases: list[list[Any]] = [
        [], ["a"], ["a", ""], ["", "b"], ["ab", "c", "d"], [EqualsEverything()], [1, None, "z"]
    ]  # fmt: skip
    for fragments in cases:
        assert hooks._has_empty(fragments) == ("" in fragments), fragments
