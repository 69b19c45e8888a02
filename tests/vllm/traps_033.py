"""The plugin's hooks on real vLLM 0.33.0 classes (no GPU needed for these), for test_traps_033.py.

Run with the vLLM venv's python and the 0.33.0 wheel's Python sources first on
sys.path (their compiled kernels are not needed to import the config, the
output processor and the detokenizer):

    PYTHONPATH=SRC_0_33:REPO/plugin python traps_033.py MODEL_DIR SOCKET_DIR

Installs the adapter the plugin chooses for them (its real signature check,
then the patches) into the real 0.33 OutputProcessor / RequestState / detokenizers,
then drives a real OutputProcessor with real EngineCoreRequests and
EngineCoreOutputs: (1) a request that gets two tokens and then an output
carrying `error` (what a paused engine, a grammar error or a KV load failure
sends), (2) a streaming-input request (`resumable`, collected by the real
StreamingInputOutputCollector). Prints JSON: facts read from the real 0.33
config classes, what each queue delivered, and every frame the hooks sent
(hex), for the test to decode and reconcile.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import typing

RUN = "0123456789abcdef0123456789abcdef"


def main() -> int:
    model, socket_dir = sys.argv[1], sys.argv[2]
    os.environ["PARALLELHUE_SOCKET_DIR"] = socket_dir
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = os.path.join(socket_dir, f"{RUN}.sock")
    sock.bind(path)
    os.chmod(path, 0o600)

    from transformers import AutoTokenizer
    from vllm.config import speculative
    from vllm.outputs import RequestError
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine import output_processor as op

    import vllm
    from parallelhue_vllm import adapters, traps

    facts: dict[str, object] = {"vllm": vllm.__version__}
    fields = speculative.SpeculativeConfig.__dataclass_fields__
    facts["adaptive_field_default"] = fields["enable_adaptive_verification"].default
    facts["rejection_methods"] = list(typing.get_args(speculative.RejectionSampleMethod))
    facts["streaming_collector_overrides_put"] = "put" in op.StreamingInputOutputCollector.__dict__
    facts["error_field"] = "error" in EngineCoreOutput.__struct_fields__
    choice = adapters.choose(vllm.__version__)
    facts["adapter"] = choice.adapter.label if choice.adapter is not None else choice.reason
    facts["installed"] = adapters.install(choice)

    tokenizer = AutoTokenizer.from_pretrained(model)
    processor = op.OutputProcessor(tokenizer, log_stats=False)
    prompt = tokenizer.encode("Hello", add_special_tokens=False)
    ids = tokenizer.encode(" the world", add_special_tokens=False)

    def request(stream: int, resumable: bool = False) -> EngineCoreRequest:
        request_id = f"cmpl-ph1_{RUN}_{stream}-0a1b2c3d"
        return EngineCoreRequest(
            request_id=request_id,
            prompt_token_ids=list(prompt),
            mm_features=None,
            sampling_params=SamplingParams(
                max_tokens=16, output_kind=RequestOutputKind.DELTA, skip_special_tokens=True
            ),
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
            resumable=resumable,
            external_req_id=request_id,
        )

    delivered: dict[str, object] = {}
    # (1) two tokens, then the engine's error output.
    first = request(0)
    queue = op.RequestOutputCollector(RequestOutputKind.DELTA, first.request_id)
    processor.add_request(first, None, queue=queue)
    processor.process_outputs([EngineCoreOutput(first.request_id, list(ids[:2]))])
    got = queue.get_nowait()
    delivered["error_first_text"] = got.outputs[0].text if got is not None else None
    error = RequestError(code="kv_load_failure", message="KV blocks lost", retryable=True)
    processor.process_outputs(
        [EngineCoreOutput(first.request_id, [], finish_reason=FinishReason.ERROR, error=error)]
    )
    try:
        queue.get_nowait()
        delivered["error_raised"] = None
    except Exception as raised:  # what generate() raises to the API server
        delivered["error_raised"] = f"{type(raised).__name__}: {raised}"
    delivered["error_state_left"] = first.request_id in processor.request_states
    # (2) a streaming-input request through the real StreamingInputOutputCollector.
    second = request(1, resumable=True)
    squeue = op.StreamingInputOutputCollector(RequestOutputKind.DELTA, second.request_id)
    processor.add_request(second, None, queue=squeue)
    processor.process_outputs([EngineCoreOutput(second.request_id, list(ids[:1]))])
    got = squeue.get_nowait()
    delivered["streaming_text"] = got.outputs[0].text if got is not None else None
    delivered["streaming_message"] = traps.streaming_input(
        processor.request_states[second.request_id]
    )

    # (3) the scheduler hook under real 0.33 SpeculativeConfigs (adaptive verification
    # on; fly rejection), real SchedulerOutputs (the request new in a prefill step,
    # then three drafts), ModelRunnerOutputs and EngineCoreOutputs; the Scheduler
    # itself is a stand-in (a real one needs a whole VllmConfig and KV cache).
    from types import SimpleNamespace

    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
    from vllm.v1.engine import EngineCoreOutputs
    from vllm.v1.outputs import ModelRunnerOutput

    from parallelhue_vllm import hooks

    configs = {
        2: speculative.SpeculativeConfig(
            method="ngram", num_speculative_tokens=3, prompt_lookup_max=4,
            prompt_lookup_min=2, enable_adaptive_verification=True,
        ),
        3: speculative.SpeculativeConfig(
            method="ngram", num_speculative_tokens=3, prompt_lookup_max=4,
            prompt_lookup_min=2, rejection_sample_method="fly",
        ),
    }  # fmt: skip
    for stream, config in configs.items():
        telemetry = hooks.SchedulerTelemetry("0.33.0")
        scheduler = SimpleNamespace(
            vllm_config=SimpleNamespace(speculative_config=config),
            scheduler_config=SimpleNamespace(async_scheduling=False),
            requests={},
        )
        rid = f"cmpl-ph1_{RUN}_{stream}-0a1b2c3d"
        scheduler.requests[rid] = object()
        new = NewRequestData(
            req_id=rid, prompt_token_ids=list(prompt), mm_features=[],
            sampling_params=SamplingParams(max_tokens=16), pooling_params=None,
            block_ids=([0],), num_computed_tokens=0, lora_request=None,
        )  # fmt: skip
        # (new requests, scheduled tokens, drafts, sampled tokens) per step.
        steps = [([new], len(prompt), [], [6]), ([], 4, [7, 8, 9], [7, 8, 9, 10])]
        for new_requests, scheduled, drafts, sampled in steps:
            scheduler_output = SchedulerOutput.make_empty()
            scheduler_output.scheduled_new_reqs = new_requests
            scheduler_output.num_scheduled_tokens = {rid: scheduled}
            scheduler_output.total_num_scheduled_tokens = scheduled
            scheduler_output.scheduled_spec_decode_tokens = {rid: drafts} if drafts else {}
            runner = ModelRunnerOutput(
                req_ids=[rid], req_id_to_index={rid: 0}, sampled_token_ids=[list(sampled)]
            )

            def update(
                self: object,
                scheduler_output: object,
                runner: object,
                out: list[int] = sampled,
                rid: str = rid,
            ) -> object:
                return {0: EngineCoreOutputs(outputs=[EngineCoreOutput(rid, list(out))])}

            adapters._wrap_scheduler(update, telemetry)(scheduler, scheduler_output, runner)
        assert telemetry.emitter is not None
        telemetry.emitter.close(5.0)
    facts["adaptive_message"] = traps.roles_unverifiable(configs[2])

    frames: list[str] = []
    sock.settimeout(2.0)
    try:
        while True:
            frames.append(sock.recv(1 << 17).hex())
    except TimeoutError:
        pass
    sock.close()
    os.unlink(path)
    json.dump({"facts": facts, "delivered": delivered, "frames": frames}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
