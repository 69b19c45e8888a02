"""The plugin on the real classes of one vLLM release (no GPU needed), for test_traps_real.py.

Run with the vLLM venv's python and the release's wheel Python sources first on
sys.path (their compiled kernels are not needed to import the config, the
scheduler's outputs, the output processor and the detokenizer):

    PYTHONPATH=SRC:REPO/plugin python traps_real.py MODEL_DIR SOCKET_DIR

Chooses and installs the plugin's adapter on those classes (its real signature
and field checks), then runs every scenario whose first release is not after
the imported one, each on its own stream:

- 0 (0.33+) a request that gets two tokens and then an output carrying `error`,
  through a real OutputProcessor; 1 (0.33+) a streaming-input request behind the
  real StreamingInputOutputCollector;
- 2 (0.28+) the scheduler hook under a real SpeculativeConfig with adaptive
  verification on; 3 (0.33+) the same with `fly` rejection sampling;
- 4 and 5 (0.29+) two requests, stream 4 with real SamplingParams replaying
  trace_decode_token_ids;
- 6 (0.33+) async drafts the grammar rejects, through the real
  Scheduler.update_draft_token_ids_in_output (0.33 pads them with -1; 0.34 keeps
  the first one for the sampler to reject);
- 7 and 8 (0.26+) two requests in one step whose worker batch is in the other
  order than the scheduler's, one finishing trimmed: the hook finds each
  request's sampled tokens by its place in req_ids (0.34 has no req_id_to_index);
- 9 (0.26+) a plain request through the real OutputProcessor (text records);
- 10 (0.26+, last) VLLM_USE_RUST_FRONTEND=1 as vLLM's real envs module reads it:
  both sides send the notice.

Only the Scheduler itself is a stand-in (a real one needs a whole VllmConfig).
Prints JSON as the last line of stdout: facts, what the real collectors delivered,
and every frame sent (hex).
"""

from __future__ import annotations

import inspect
import json
import os
import socket
import sys
import threading
import time
import typing
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

RUN = "0123456789abcdef0123456789abcdef"


def rid(stream: int) -> str:
    return f"cmpl-ph1_{RUN}_{stream}-0a1b2c3d"


class Release:
    """The imported release's classes, and helpers that build them on any release."""

    def __init__(self, model: str) -> None:
        from transformers import AutoTokenizer
        from vllm.config import speculative
        from vllm.sampling_params import RequestOutputKind, SamplingParams
        from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
        from vllm.v1.engine import EngineCoreOutput, EngineCoreOutputs, EngineCoreRequest
        from vllm.v1.engine import output_processor as op
        from vllm.v1.outputs import ModelRunnerOutput

        import vllm

        self.version = str(vllm.__version__)
        self.speculative = speculative
        self.kind, self.sampling = RequestOutputKind, SamplingParams
        self.new_data, self.scheduler_output = NewRequestData, SchedulerOutput
        self.output, self.outputs, self.request = (
            EngineCoreOutput,
            EngineCoreOutputs,
            EngineCoreRequest,
        )
        self.op, self.runner_output = op, ModelRunnerOutput
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.prompt = self.tokenizer.encode("Hello", add_special_tokens=False)
        self.ids = self.tokenizer.encode(" the world", add_special_tokens=False)

    def engine_request(self, stream: int, resumable: bool = False) -> Any:
        fields = set(self.request.__struct_fields__)
        values = {
            "request_id": rid(stream), "prompt_token_ids": list(self.prompt),
            "mm_features": None, "pooling_params": None, "arrival_time": time.time(),
            "lora_request": None, "cache_salt": None, "data_parallel_rank": None,
            "resumable": resumable, "external_req_id": rid(stream),
            "sampling_params": self.sampling(max_tokens=16, output_kind=self.kind.DELTA,
                                             skip_special_tokens=True),
        }  # fmt: skip
        return self.request(**{k: v for k, v in values.items() if k in fields})

    def new_request(self, stream: int, sampling: Any = None) -> Any:
        values = {
            "req_id": rid(stream), "prompt_token_ids": list(self.prompt), "mm_features": [],
            "sampling_params": sampling or self.sampling(max_tokens=16), "pooling_params": None,
            "block_ids": ([0],), "num_computed_tokens": 0, "lora_request": None,
            "prefill_token_ids": list(self.prompt),  # 0.34: what to prefill
        }  # fmt: skip
        fields = self.new_data.__dataclass_fields__
        return self.new_data(**{k: v for k, v in values.items() if k in fields})

    def model_runner_output(self, req_ids: list[str], sampled: list[list[int]]) -> Any:
        values: dict[str, Any] = {"req_ids": req_ids, "sampled_token_ids": sampled}
        if "req_id_to_index" in self.runner_output.__dataclass_fields__:
            values["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
        return self.runner_output(**values)


# One scheduler step: {stream: (new request data or None, scheduled tokens, drafts,
# sampled tokens, tokens kept by the stop checks or None, finish reason or None)}.
Step = dict[int, tuple[Any, int, list[int], list[int], Any, Any]]


def scheduler_run(
    real: Release,
    config: Any,
    steps: list[Step],
    *,
    is_async: bool = False,
    invalid: Callable[[int], dict[str, int]] | None = None,
    batch_order: Callable[[list[str]], list[str]] = list,
) -> None:
    """Drive the wrapped scheduler hook with real outputs; a stand-in Scheduler returns
    the EngineCoreOutputs vLLM's would (the stop checks trimming the sampled lists)."""
    from parallelhue_vllm import adapters, hooks

    telemetry = hooks.SchedulerTelemetry(real.version)
    scheduler = SimpleNamespace(
        vllm_config=SimpleNamespace(speculative_config=config),
        scheduler_config=SimpleNamespace(async_scheduling=is_async),
        requests={}, num_sampled_tokens_per_step=1,
    )  # fmt: skip
    for at, step in enumerate(steps):
        out = real.scheduler_output.make_empty()
        out.scheduled_new_reqs = [new for new, *_ in step.values() if new is not None]
        out.num_scheduled_tokens = {rid(s): entry[1] for s, entry in step.items()}
        out.total_num_scheduled_tokens = sum(out.num_scheduled_tokens.values())
        out.scheduled_spec_decode_tokens = {rid(s): e[2] for s, e in step.items() if e[2]}
        if invalid is not None:
            out.num_invalid_spec_tokens = invalid(at) or None
        batch = batch_order([rid(s) for s in step])
        sampled = {rid(s): list(e[3]) for s, e in step.items()}
        runner = real.model_runner_output(batch, [sampled[r] for r in batch])
        for s in step:
            scheduler.requests[rid(s)] = object()

        def update(self: Any, scheduler_output: Any, runner: Any, step: Step = step) -> Any:
            outputs = []
            for s, (_new, _n, _drafts, _sampled, kept, finish) in step.items():
                at = runner.req_ids.index(rid(s))
                tokens = runner.sampled_token_ids[at]
                if kept is not None:
                    del tokens[kept:]  # the stop checks trim the worker's list in place
                outputs.append(real.output(rid(s), tokens, finish_reason=finish))
            return {0: real.outputs(outputs=outputs)}

        adapters._wrap_scheduler(update, telemetry)(scheduler, out, runner)
    if telemetry.emitter is not None:
        telemetry.emitter.close(5.0)


def frontend_scenarios(real: Release, delivered: dict[str, Any], error_paths: bool) -> None:
    """Streams 0 and 1 (0.33+: engine error, streaming input) and 9 (plain text)."""
    from vllm.v1.engine import FinishReason

    from parallelhue_vllm import traps

    op, kind, ids = real.op, real.kind, real.ids
    processor = op.OutputProcessor(real.tokenizer, log_stats=False)
    plain = real.engine_request(9)
    queue = op.RequestOutputCollector(kind.DELTA, plain.request_id)
    processor.add_request(plain, None, queue=queue)
    texts = []
    for tokens, finish in ((ids[:2], None), (ids[2:], FinishReason.LENGTH)):
        processor.process_outputs([real.output(plain.request_id, list(tokens),
                                               finish_reason=finish)])  # fmt: skip
        texts.append(queue.get_nowait().outputs[0].text)
    delivered["plain_texts"] = texts
    delivered["plain_ids"] = list(ids)
    if not error_paths:
        return
    from vllm.outputs import RequestError

    first = real.engine_request(0)
    queue = op.RequestOutputCollector(kind.DELTA, first.request_id)
    processor.add_request(first, None, queue=queue)
    processor.process_outputs([real.output(first.request_id, list(ids[:2]))])
    got = queue.get_nowait()
    delivered["error_first_text"] = got.outputs[0].text if got is not None else None
    error = RequestError(code="kv_load_failure", message="KV blocks lost", retryable=True)
    processor.process_outputs(
        [real.output(first.request_id, [], finish_reason=FinishReason.ERROR, error=error)]
    )
    try:
        queue.get_nowait()
        delivered["error_raised"] = None
    except Exception as raised:  # what generate() raises to the API server
        delivered["error_raised"] = f"{type(raised).__name__}: {raised}"
    delivered["error_state_left"] = first.request_id in processor.request_states
    second = real.engine_request(1, resumable=True)
    squeue = op.StreamingInputOutputCollector(kind.DELTA, second.request_id)
    processor.add_request(second, None, queue=squeue)
    processor.process_outputs([real.output(second.request_id, list(ids[:1]))])
    got = squeue.get_nowait()
    delivered["streaming_text"] = got.outputs[0].text if got is not None else None
    delivered["streaming_message"] = traps.streaming_input(
        processor.request_states[second.request_id]
    )


def ngram(real: Release, **extra: Any) -> Any:
    return real.speculative.SpeculativeConfig(
        method="ngram", num_speculative_tokens=3, prompt_lookup_max=4, prompt_lookup_min=2,
        **extra,
    )  # fmt: skip


def grammar_drafts(real: Release, facts: dict[str, Any]) -> None:
    """Stream 6: async drafts [7, 8, 99] where the grammar accepts 7 and 8 only, handed
    back through the real update_draft_token_ids_in_output; the worker accepts 7 and 8
    and samples 20 (the grammar-masked target's token)."""
    from vllm.v1.core.sched.scheduler import Scheduler

    update_in_output = inspect.unwrap(Scheduler.update_draft_token_ids_in_output)
    request = SimpleNamespace(is_finished=lambda: False)

    def validate_tokens(req: Any, tokens: list[int]) -> list[int]:  # the grammar (0.33)
        return [t for t in tokens if t != 99]

    owner = SimpleNamespace(
        requests={rid(6): request},
        structured_output_manager=SimpleNamespace(validate_tokens=validate_tokens),
    )
    out = real.scheduler_output.make_empty()
    out.scheduled_spec_decode_tokens = {rid(6): [-1, -1, -1]}  # async placeholders
    drafts = SimpleNamespace(req_ids=[rid(6)], draft_token_ids=[[7, 8, 99]])
    update_in_output(owner, drafts, out)
    facts["grammar_scheduled"] = list(out.scheduled_spec_decode_tokens[rid(6)])
    facts["grammar_invalid"] = dict(out.num_invalid_spec_tokens or {})
    invalid = dict(out.num_invalid_spec_tokens or {})
    steps: list[Step] = [
        {6: (real.new_request(6), len(real.prompt), [], [6], None, None)},
        # Under async scheduling the scheduler's own copy holds placeholders only.
        {6: (None, 4, [-1, -1, -1], [7, 8, 20], None, None)},
    ]
    scheduler_run(real, ngram(real), steps, is_async=True,
                  invalid=lambda at: invalid if at == 1 else {})  # fmt: skip


def main() -> int:
    model, socket_dir = sys.argv[1], sys.argv[2]
    os.environ["PARALLELHUE_SOCKET_DIR"] = socket_dir
    os.environ.pop("VLLM_USE_RUST_FRONTEND", None)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(socket_dir, f"{RUN}.sock")
    if os.path.exists(path):
        os.unlink(path)  # left by an earlier run that was killed
    sock.bind(path)
    os.chmod(path, 0o600)
    # Read as the client does, all along: the kernel queues only a few datagrams.
    frames: list[str] = []
    done = threading.Event()  # set when every sender closed; then read 2 s more
    sock.settimeout(0.2)

    def read() -> None:
        quiet_since = time.monotonic()
        while not done.is_set() or time.monotonic() - quiet_since < 2.0:
            try:
                frames.append(sock.recv(1 << 17).hex())
                quiet_since = time.monotonic()
            except TimeoutError:
                pass

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    import vllm
    from parallelhue_vllm import adapters, hooks, traps
    from parallelhue_vllm.adapters.targets import release_key

    version = str(vllm.__version__)
    facts: dict[str, Any] = {"vllm": version}
    choice = adapters.choose(version)
    facts["adapter"] = choice.adapter.label if choice.adapter is not None else choice.reason
    facts["installed"] = adapters.install(choice)
    real = Release(model)
    at_least = release_key(version)[:2].__ge__
    delivered: dict[str, Any] = {}
    fields = real.speculative.SpeculativeConfig.__dataclass_fields__
    facts["adaptive_field"] = "enable_adaptive_verification" in fields
    facts["trace_field"] = "trace_decode_token_ids" in real.sampling.__struct_fields__
    methods = typing.get_args(getattr(real.speculative, "RejectionSampleMethod", None))
    facts["rejection_methods"] = list(methods)

    frontend_scenarios(real, delivered, error_paths=at_least((0, 33)))
    if at_least((0, 33)):
        facts["streaming_collector_overrides_put"] = (
            "put" in real.op.StreamingInputOutputCollector.__dict__
        )
        facts["error_field"] = "error" in real.output.__struct_fields__
    spec_steps = lambda s: [  # noqa: E731 - the prefill step, then three drafts
        {s: (real.new_request(s), len(real.prompt), [], [6], None, None)},
        {s: (None, 4, [7, 8, 9], [7, 8, 9, 10], None, None)},
    ]
    if at_least((0, 28)):
        # 0.28-0.32 validate it for dspark only, whose config needs a draft model: the
        # real field is set on a real ngram config (what the hook reads is the same).
        config = ngram(real)
        object.__setattr__(config, "enable_adaptive_verification", True)
        facts["adaptive_message"] = traps.roles_unverifiable(config)
        scheduler_run(real, config, spec_steps(2))
    if at_least((0, 33)):
        scheduler_run(real, ngram(real, rejection_sample_method="fly"), spec_steps(3))
        grammar_drafts(real, facts)
    if at_least((0, 29)):
        replay = real.sampling(max_tokens=16, trace_decode_token_ids=[7, 8, 9, 10])
        scheduler_run(real, ngram(real), [
            {4: (real.new_request(4, replay), len(real.prompt), [], [6], None, None),
             5: (real.new_request(5), len(real.prompt), [], [6], None, None)},
            {4: (None, 4, [7, 8, 9], [7, 8, 9, 10], None, None),
             5: (None, 4, [7, 8, 9], [7, 8, 9, 10], None, None)},
        ])  # fmt: skip
    from vllm.v1.engine import FinishReason

    scheduler_run(real, ngram(real), [
        {7: (real.new_request(7), len(real.prompt), [], [6], None, None),
         8: (real.new_request(8), len(real.prompt), [], [6], None, None)},
        # Stream 8 stops after two of its four sampled tokens (a stop token).
        {7: (None, 4, [7, 8, 9], [30], None, None),
         8: (None, 4, [7, 8, 9], [7, 8, 9, 10], 2, FinishReason.STOP)},
    ], batch_order=lambda ids: ids[::-1])  # fmt: skip

    # Last: the Rust frontend, read by vLLM's own envs module, on fresh collectors.
    os.environ["VLLM_USE_RUST_FRONTEND"] = "1"
    from vllm import envs

    facts["rust_env_read_by_vllm"] = bool(envs.VLLM_USE_RUST_FRONTEND)
    scheduler_run(real, ngram(real), spec_steps(10))
    front = hooks.FrontendTelemetry(version)
    processor_class = type("Processor", (real.op.OutputProcessor,), {})
    for name, wrap in (("add_request", adapters._wrap_add_request),
                       ("process_outputs", adapters._wrap_process_outputs)):  # fmt: skip
        original = inspect.unwrap(getattr(real.op.OutputProcessor, name))
        setattr(processor_class, name, wrap(original, front))
    processor = processor_class(real.tokenizer, log_stats=False)
    request = real.engine_request(10)
    queue = real.op.RequestOutputCollector(real.kind.DELTA, request.request_id)
    processor.add_request(request, None, queue=queue)
    processor.process_outputs([real.output(request.request_id, list(real.ids[:2]))])
    delivered["rust_text"] = queue.get_nowait().outputs[0].text
    for telemetry in (front,):
        if telemetry.emitter is not None:
            telemetry.emitter.close(5.0)
    for installed in _installed_emitters():
        installed.close(5.0)

    done.set()
    reader.join()  # ends 2 s after the last frame
    sock.close()
    os.unlink(path)
    # The last line of stdout (vLLM may log there too).
    sys.stdout.write("\n" + json.dumps({"facts": facts, "delivered": delivered,
                                         "frames": frames}) + "\n")  # fmt: skip
    return 0


def _installed_emitters() -> list[Any]:
    """The emitters of the collectors the adapter installed (the frontend's)."""
    from vllm.v1.engine.output_processor import OutputProcessor

    from parallelhue_vllm import hooks

    found = []
    for cell in OutputProcessor.process_outputs.__closure__ or ():
        content = cell.cell_contents
        if isinstance(content, hooks.FrontendTelemetry) and content.emitter is not None:
            found.append(content.emitter)
    return found


if __name__ == "__main__":
    raise SystemExit(main())
