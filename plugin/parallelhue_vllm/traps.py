"""vLLM 0.33 paths on which the hooks' records would not be the truth, detected, never guessed.

Read from the 0.33.0 wheel (`vllm/config/speculative.py`,
`vllm/v1/engine/output_processor.py`, `vllm/v1/core/sched/scheduler.py`):

- `SpeculativeConfig.enable_adaptive_verification` (dspark): the worker sizes
  each request's verification budget from draft confidence and may verify
  fewer drafts than the scheduler scheduled; `ModelRunnerOutput` does not say
  how many. "All scheduled drafts accepted, hence the last token is a bonus"
  then mislabels a target token as a bonus (and counts unverified slots as
  rejected). Roles are not derivable: the scheduler sends notice 6 for each
  request and no provenance for it.
- `SpeculativeConfig.rejection_sample_method == "fly"` (lossy): the hello's
  `verification` says 3 (hooks.py maps it); nothing here.
- A streaming-input request (`RequestState.streaming_input`, set from
  `EngineCoreRequest.resumable`): its outputs go through
  `StreamingInputOutputCollector.put`, which keeps a backlog across input
  chunks, and a chunk boundary carries a finish reason on a request that has
  not finished. The frontend's records cannot describe that: notice 7, not
  tracked.
- An `EngineCoreOutput` carrying `error` (a paused engine rejecting a
  request, a grammar that failed to compile, a KV load failure):
  `process_outputs` queues the exception and finishes the request without
  `make_request_output`, so no text record could say how it ended; the
  scheduler's output for it carries no tokens, so no provenance record
  closes it either. Both sides send notice 7 naming the error, so the client
  fails the stream with the engine's reason instead of waiting or guessing.

Each function takes vLLM objects by attribute (duck-typed, any version) and
returns the notice message, or None when the path does not apply.
"""

from __future__ import annotations

from typing import Any


def roles_unverifiable(speculative_config: Any) -> str | None:
    """Notice 6 message when the worker may verify fewer drafts than were scheduled."""
    if speculative_config is None:
        return None
    if getattr(speculative_config, "enable_adaptive_verification", False) is not True:
        return None
    method = getattr(speculative_config, "method", None) or "?"
    return (
        f"roles not derivable: {method} adaptive verification is on "
        "(enable_adaptive_verification), so the worker may verify fewer drafts than "
        "were scheduled and a bonus cannot be told from a correction"
    )


def streaming_input(req_state: Any) -> str | None:
    """Notice 7 message for a streaming-input request (vLLM >= 0.33)."""
    if getattr(req_state, "streaming_input", False) is not True:
        return None
    return (
        "streaming-input request: its outputs pass StreamingInputOutputCollector across "
        "input chunks, which the telemetry hooks do not follow"
    )


def _describe(error: Any) -> str:
    code = getattr(error, "code", None)
    message = getattr(error, "message", None)
    if code is None and message is None:
        return str(error)[:200]
    return f"{code}: {str(message)[:200]}" if code else str(message)[:200]


def engine_error(engine_core_output: Any) -> str | None:
    """Notice 7 message for an output that carries an engine error (vLLM >= 0.33).

    The frontend: such an output is queued as an exception and the request
    finished without `make_request_output`.
    """
    error = getattr(engine_core_output, "error", None)
    if error is None:
        return None
    return (
        f"the engine ended the request with an error ({_describe(error)}); "
        "its last output did not pass the telemetry hooks"
    )


def finished_without_tokens(output: Any, is_error: bool) -> str | None:
    """Notice 7 message (scheduler side) for a request the engine finished with an error
    in a step that gave it no tokens: no provenance record can close it."""
    if not is_error or list(getattr(output, "new_token_ids", ()) or ()):
        return None
    error = getattr(output, "error", None)
    why = f" ({_describe(error)})" if error is not None else ""
    return (
        f"the engine finished the request with an error{why} in a step without tokens; "
        "the scheduler's records cannot close it"
    )
