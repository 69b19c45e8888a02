"""CPU cost of the plugin's hooks per engine step, measured without vLLM's noise.

The live benchmark (bench_plugin_overhead.py) is dominated by run-to-run
variation on a shared 2-core machine. This measures the work the plugin adds
directly: the patched methods' wrappers around stand-in vLLM methods that do
nothing, for a step of 16 requests with K=3 drafts (4 tokens each, a byte-level
fragment per token), plus the sender thread's encode + send of the two frames
(provenance and text) that step produces.

    .venv/bin/python benches/hook_cost.py
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from types import SimpleNamespace
from typing import Any

from parallelhue_vllm import hooks, wire
from parallelhue_vllm.adapters import (
    _wrap_make_request_output,
    _wrap_process_outputs,
    _wrap_scheduler,
)

STREAMS = 16
TOKENS = 4  # K=3 drafts all accepted + bonus
RUN = "0123456789abcdef0123456789abcdef"


class Detokenizer:
    def decode_next(self, token: int) -> str:
        return "ab"


class RequestState:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id
        self.detokenizer = Detokenizer()
        self.parent_req = None
        self.stream_interval = 1
        self.output_kind = SimpleNamespace(name="DELTA")
        self.request_index = 0

    def make_request_output(self, new_token_ids: Any, pooling: Any, finish: Any, stop: Any) -> Any:
        return SimpleNamespace(outputs=[SimpleNamespace(index=0, text="abababab")])


class Processor:
    def __init__(self, ids: list[str]) -> None:
        self.request_states = {rid: RequestState(rid) for rid in ids}

    def process_outputs(self, outputs: list[Any], *args: Any) -> None:
        for output in outputs:
            state = self.request_states[output.request_id]
            for token in output.new_token_ids:
                state.detokenizer.decode_next(token)
            state.make_request_output(output.new_token_ids, None, None, None)


class Scheduler:
    def __init__(self) -> None:
        self.vllm_config = SimpleNamespace(
            speculative_config=SimpleNamespace(method="ngram", num_speculative_tokens=3)
        )
        self.scheduler_config = SimpleNamespace(async_scheduling=False)
        self.requests: dict[str, object] = {}

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = [
            SimpleNamespace(request_id=rid, new_token_ids=tokens, finish_reason=None)
            for rid, tokens in zip(
                scheduler_output.num_scheduled_tokens,
                model_runner_output.sampled_token_ids,
                strict=True,
            )
        ]
        return {0: SimpleNamespace(outputs=outputs)}


def per_call(function: Any, repeat: int) -> float:
    """Median of 5 batches, CPU seconds of this thread per call (robust to other load)."""
    results = []
    for _ in range(5):
        start = time.thread_time()
        for _ in range(repeat):
            function()
        results.append((time.thread_time() - start) / repeat)
    results.sort()
    return results[2]


def measure(ours: bool, tokens: int = TOKENS, repeat: int = 2000) -> dict[str, float]:
    """Microseconds per step added by the wrappers (ours: requests carry ph1 ids)."""
    ids = [
        f"chatcmpl-ph1_{RUN}_{i}-1a2b3c4d" if ours else f"chatcmpl-other-{i}-1a2b3c4d"
        for i in range(STREAMS)
    ]
    scheduler = Scheduler()
    scheduler.requests = dict.fromkeys(ids)
    scheduler_output = SimpleNamespace(
        num_scheduled_tokens=dict.fromkeys(ids, tokens),
        scheduled_spec_decode_tokens={rid: list(range(1, tokens)) for rid in ids if tokens > 1},
        num_invalid_spec_tokens=None,
    )
    sampled = list(range(1, tokens + 1))
    runner = SimpleNamespace(
        sampled_token_ids=[list(sampled) for _ in ids],
        req_id_to_index={rid: i for i, rid in enumerate(ids)},
    )
    sched_telemetry = hooks.SchedulerTelemetry("bench")
    front_telemetry = hooks.FrontendTelemetry("bench")
    # The emitters must not send during the timing: the sender is measured below.
    sched_telemetry.emitter = _NullEmitter()  # type: ignore[assignment]
    front_telemetry.emitter = _NullEmitter()  # type: ignore[assignment]
    wrapped_update = _wrap_scheduler(Scheduler.update_from_output, sched_telemetry)

    processor = Processor(ids)
    outputs = [
        SimpleNamespace(request_id=rid, new_token_ids=list(sampled), finish_reason=None)
        for rid in ids
    ]
    plain_make = RequestState.make_request_output
    plain_decode = Detokenizer.decode_next
    wrapped_process = _wrap_process_outputs(Processor.process_outputs, front_telemetry)

    def plain_sched() -> None:
        runner.sampled_token_ids = [list(sampled) for _ in ids]
        Scheduler.update_from_output(scheduler, scheduler_output, runner)

    def hooked_sched() -> None:
        runner.sampled_token_ids = [list(sampled) for _ in ids]
        wrapped_update(scheduler, scheduler_output, runner)

    def plain_front() -> None:
        Processor.process_outputs(processor, outputs)

    def hooked_front() -> None:
        wrapped_process(processor, outputs)

    sched = per_call(hooked_sched, repeat) - per_call(plain_sched, repeat)
    base_front = per_call(plain_front, repeat)
    RequestState.make_request_output = _wrap_make_request_output(  # type: ignore[method-assign]
        plain_make, front_telemetry
    )
    Detokenizer.decode_next = hooks.wrap_decode_next(plain_decode)  # type: ignore[method-assign]
    try:
        front = per_call(hooked_front, repeat) - base_front
    finally:
        RequestState.make_request_output = plain_make  # type: ignore[method-assign]
        Detokenizer.decode_next = plain_decode  # type: ignore[method-assign]
    return {"scheduler_us": sched * 1e6, "frontend_us": front * 1e6}


class _NullEmitter:
    def submit(self, *args: Any) -> bool:
        return True

    def notice(self, *args: Any) -> None:
        pass

    def end_run(self, *args: Any) -> None:
        pass


def sender_cost(tokens: int = TOKENS, repeat: int = 2000) -> float:
    """Microseconds of the sender thread per step: encode + send both frames."""
    header = wire.Header(bytes.fromhex(RUN), 7, 1, 1, 0)
    roles = [1] * (tokens - 1) + [3] if tokens > 1 else [0]
    provenance: list[wire.Record] = [
        wire.ProvenanceRecord(i, 100, list(range(tokens)), roles, tokens - 1)
        for i in range(STREAMS)
    ]
    text: list[wire.Record] = [
        wire.TextRecord(i, 100, [wire.TextToken(t, b"ab") for t in range(tokens)], b"ab" * tokens)
        for i in range(STREAMS)
    ]
    with tempfile.TemporaryDirectory(prefix="phk", dir="/tmp") as directory:
        path = os.path.join(directory, "s")
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        receiver.bind(path)
        receiver.setblocking(False)
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sender.connect(path)

        def step() -> None:
            sender.send(wire.encode_records(wire.KIND_PROVENANCE, header, provenance))
            sender.send(wire.encode_records(wire.KIND_TEXT, header, text))
            receiver.recv(65536)
            receiver.recv(65536)

        cost = per_call(step, repeat)
        # Subtract the receiving side, which runs in the client, not the server.
        frame_p = wire.encode_records(wire.KIND_PROVENANCE, header, provenance)
        frame_t = wire.encode_records(wire.KIND_TEXT, header, text)

        def receive_only() -> None:
            sender.send(frame_p)
            sender.send(frame_t)
            receiver.recv(65536)
            receiver.recv(65536)

        cost -= per_call(receive_only, repeat) / 2  # keep the send syscalls
        receiver.close()
        sender.close()
    return cost * 1e6


def report(tokens: int = TOKENS) -> dict[str, float]:
    """Microseconds per step of 16 requests that each emit `tokens` tokens."""
    ours = measure(True, tokens)
    other = measure(False, tokens)
    return {
        "tokens_per_step": float(STREAMS * tokens),
        "scheduler_us": ours["scheduler_us"],
        "frontend_us": ours["frontend_us"],
        "sender_us": sender_cost(tokens),
        "idle_scheduler_us": other["scheduler_us"],
        "idle_frontend_us": other["frontend_us"],
    }


if __name__ == "__main__":
    for step_tokens in (1, TOKENS):
        print(f"{STREAMS} requests x {step_tokens} tokens per step:")
        for key, value in report(step_tokens).items():
            print(f"  {key}: {value:.1f}")
