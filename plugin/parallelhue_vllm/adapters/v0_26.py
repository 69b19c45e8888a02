"""vLLM 0.26.x: no `weight_version` / `error` parameters, no frontend surplus-token trim."""

from __future__ import annotations

from . import Fields, Target

VERSION_PREFIXES = ("0.26.",)

_SCHED = "vllm.v1.core.sched.scheduler"
_OUTPUT = "vllm.v1.engine.output_processor"
_DETOK = "vllm.v1.engine.detokenizer"

TARGETS: tuple[Target, ...] = (
    Target(_SCHED, "Scheduler", "update_from_output",
           ("self", "scheduler_output", "model_runner_output")),
    Target(_OUTPUT, "OutputProcessor", "process_outputs",
           ("self", "engine_core_outputs", "engine_core_timestamp", "iteration_stats")),
    Target(_OUTPUT, "OutputProcessor", "add_request",
           ("self", "request", "prompt", "parent_req", "request_index", "queue")),
    # Checked only: the hooks read the output it makes, at the request's queue.
    Target(_OUTPUT, "RequestState", "make_request_output",
           ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason",
            "kv_transfer_params", "ec_transfer_params"),
           patched=False),
    Target(_OUTPUT, "RequestState", "__init__",
           ("self", "request_id", "external_req_id", "parent_req", "request_index",
            "lora_request", "output_kind", "prompt", "prompt_token_ids", "prompt_embeds",
            "logprobs_processor", "detokenizer", "max_tokens_param", "arrival_time", "queue",
            "log_stats", "stream_interval", "top_p", "n", "temperature", "stream_input"),
           patched=False),
    # The hooks stand in for the request's output queue (RequestState.queue) and
    # read every output put there.
    Target(_OUTPUT, "RequestOutputCollector", "put", ("self", "output"), patched=False),
    # decode_next returns `_protected_step(id) or ""`, which calls `self.stream.step`:
    # the hooks stand in for `stream` (the fast path of every fast tokenizer).
    Target(_DETOK, "FastIncrementalDetokenizer", "decode_next", ("self", "next_token_id"),
           patched=False),
    Target(_DETOK, "FastIncrementalDetokenizer", "_protected_step", ("self", "next_token_id"),
           patched=False),
    # Other detokenizers get a decode_next of their own (per instance).
    Target(_DETOK, "SlowIncrementalDetokenizer", "decode_next", ("self", "next_token_id"),
           patched=False),
    Target(_DETOK, "BaseIncrementalDetokenizer", "update",
           ("self", "new_token_ids", "stop_terminated"), patched=False),
)  # fmt: skip

# Attributes the hooks read on vLLM's data classes (checked at install).
FIELDS: tuple[Fields, ...] = (
    Fields("vllm.v1.core.sched.output", "SchedulerOutput",
           ("scheduled_new_reqs", "num_scheduled_tokens", "scheduled_spec_decode_tokens",
            "finished_req_ids", "num_invalid_spec_tokens")),
    Fields("vllm.v1.core.sched.output", "NewRequestData", ("req_id",)),
    Fields("vllm.v1.outputs", "ModelRunnerOutput", ("req_id_to_index", "sampled_token_ids")),
    Fields("vllm.v1.engine", "EngineCoreOutput", ("request_id", "new_token_ids", "finish_reason")),
    Fields("vllm.outputs", "CompletionOutput",
           ("index", "text", "token_ids", "finish_reason", "stop_reason")),
)  # fmt: skip

# Detokenizers whose decode_next is `stream.step(...) or ""` (hooks.FrontendTelemetry).
STREAM_DETOKENIZERS = ((_DETOK, "FastIncrementalDetokenizer"),)
