"""Stand-ins for the vLLM objects the plugin's hooks touch, shared by the plugin tests
(test_plugin_hooks, test_traps, test_attribution) and benches/hook_cost.py.

They follow the vLLM 0.32 code paths the hooks rely on: the scheduler trims a
request's sampled-token list in place at a stop, the output processor feeds
tokens to the detokenizer's decode_next (the stop token excluded), may delete
surplus tokens after a stop string, then calls make_request_output, whose
output goes to the request's queue. The real classes are exercised by
tests/vllm (signatures and the live server).

The plugin is imported by module (`adapters._wrap_...` looked up when called)
and the client's reference decoder only where used, so that the bench can run
these stand-ins against an older plugin (whose wire.py the decoder may not know).
"""

from __future__ import annotations

import enum
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import pytest

from parallelhue_vllm import adapters, hooks

if TYPE_CHECKING:
    from parallelhue.reference.decode import Frame

RUN = "0123456789abcdef0123456789abcdef"


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


def raw_frames(sock: socket.socket, telemetry: hooks.common._Base) -> list[bytes]:
    """Every frame the telemetry's emitter sent to `sock`, after closing it (sends all)."""
    assert telemetry.emitter is not None
    telemetry.emitter.close(5.0)
    sock.setblocking(False)
    out = []
    while True:
        try:
            out.append(sock.recv(1 << 17))
        except BlockingIOError:
            return out


def frames_of(sock: socket.socket, telemetry: hooks.common._Base) -> list[Frame]:
    from parallelhue.reference import decode_frame

    return [decode_frame(frame) for frame in raw_frames(sock, telemetry)]


def reconcilers() -> list[Any]:
    """The reference reconciler and, where built, the Rust one (required in CI)."""
    from parallelhue.reference import Reconciler

    found: list[Any] = [Reconciler]
    try:
        from parallelhue import _native  # type: ignore[attr-defined]
    except ImportError:
        if os.environ.get("PH_REQUIRE_NATIVE") == "1":
            raise
        return found
    found.append(_native.Reconciler)
    return found


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
            # vLLM 0.34: the position in req_ids (0.26-0.33 had req_id_to_index, the same).
            index = model_runner_output.req_ids.index(request_id)
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
    sampling: dict[str, Any] | None = None,
) -> Any:
    """One engine step: request id -> (sampled tokens, scheduled drafts).

    Like vLLM's scheduler, a request's first step lists it in scheduled_new_reqs
    (with its sampling parameters, from `sampling`), and the ids finished or
    aborted since the previous step are in finished_req_ids.
    """
    ids = list(requests)
    params = sampling or {}
    scheduler_output = SimpleNamespace(
        scheduled_new_reqs=[
            SimpleNamespace(req_id=r, sampling_params=params.get(r))
            for r in ids
            if r not in scheduler.scheduled
        ],
        num_scheduled_tokens={r: 1 + len(requests[r][1]) for r in ids},
        scheduled_spec_decode_tokens={r: list(requests[r][1]) for r in ids if requests[r][1]},
        num_invalid_spec_tokens=None,
        finished_req_ids=set(scheduler.finished_since),
    )
    scheduler.finished_since.clear()
    # The worker's batch order, not the scheduler's (no req_id_to_index: vLLM 0.34).
    batch = ids[::-1]
    model_runner_output = SimpleNamespace(
        req_ids=batch, sampled_token_ids=[list(requests[r][0]) for r in batch]
    )
    for r in ids:
        scheduler.requests.setdefault(r, object())
        scheduler.scheduled.add(r)
    return update(scheduler, scheduler_output, model_runner_output)


def make_scheduler(**options: Any) -> tuple[FakeScheduler, Any, hooks.SchedulerTelemetry]:
    telemetry = hooks.SchedulerTelemetry("0.32.0")
    scheduler = FakeScheduler(**options)
    update = adapters._wrap_scheduler(FakeScheduler.update_from_output, telemetry)
    return scheduler, update, telemetry


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


class CompletionOutput:
    """vLLM's CompletionOutput (a dataclass there: instance attributes, no slots)."""

    def __init__(
        self, index: int, text: str, token_ids: list[int], finish_reason: Any,
        stop_reason: Any = None,
    ) -> None:  # fmt: skip
        self.index = index
        self.text = text
        self.token_ids = token_ids
        self.cumulative_logprob = None
        self.logprobs = None
        self.finish_reason = finish_reason
        self.stop_reason = stop_reason


class RequestOutput:
    """vLLM's RequestOutput, the fields make_request_output fills for a streamed delta."""

    def __init__(self, request_id: str, outputs: list[CompletionOutput], finished: bool) -> None:
        self.request_id = request_id
        self.prompt = None
        self.prompt_token_ids = [1, 2, 3]
        self.outputs = outputs
        self.finished = finished
        self.metrics = None


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
        completion = CompletionOutput(
            self.request_index,
            text,
            new_token_ids,
            finish_reason.name.lower() if finished else None,
            stop_reason if finished else None,
        )
        return RequestOutput(self.request_id, [completion], finished)


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
    process = adapters._wrap_process_outputs(FakeProcessor.process_outputs, telemetry)
    add = adapters._wrap_add_request(FakeProcessor.add_request, telemetry)

    def add_request(request_id: str, state: FakeRequestState) -> None:
        add(processor, SimpleNamespace(request_id=request_id, state=state), None)

    processor.add = add_request  # type: ignore[attr-defined]
    return processor, process, telemetry


def output(request_id: str, tokens: list[int], *, finish: FinishReason | None = None) -> Any:
    return SimpleNamespace(request_id=request_id, new_token_ids=list(tokens), finish_reason=finish)
