"""vLLM 0.26.x: no `weight_version` / `error` parameters, no frontend surplus-token trim."""

from __future__ import annotations

from . import Target

VERSION_PREFIXES = ("0.26.",)

_SCHED = "vllm.v1.core.sched.scheduler"
_OUTPUT = "vllm.v1.engine.output_processor"
_DETOK = "vllm.v1.engine.detokenizer"

TARGETS: tuple[Target, ...] = (
    Target(_SCHED, "Scheduler", "update_from_output",
           ("self", "scheduler_output", "model_runner_output")),
    Target(_OUTPUT, "OutputProcessor", "process_outputs",
           ("self", "engine_core_outputs", "engine_core_timestamp", "iteration_stats")),
    Target(_OUTPUT, "RequestState", "make_request_output",
           ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason",
            "kv_transfer_params", "ec_transfer_params")),
    Target(_OUTPUT, "RequestState", "__init__",
           ("self", "request_id", "external_req_id", "parent_req", "request_index",
            "lora_request", "output_kind", "prompt", "prompt_token_ids", "prompt_embeds",
            "logprobs_processor", "detokenizer", "max_tokens_param", "arrival_time", "queue",
            "log_stats", "stream_interval", "top_p", "n", "temperature", "stream_input"),
           patched=False),
    Target(_DETOK, "FastIncrementalDetokenizer", "decode_next", ("self", "next_token_id")),
    Target(_DETOK, "SlowIncrementalDetokenizer", "decode_next", ("self", "next_token_id")),
    Target(_DETOK, "BaseIncrementalDetokenizer", "update",
           ("self", "new_token_ids", "stop_terminated"), patched=False),
)  # fmt: skip
