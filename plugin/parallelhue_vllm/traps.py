"""vLLM paths on which the hooks' records would not be the truth: detected, never guessed.

Read from the released wheels 0.26.0-0.34.0 (docs/PLUGIN.md, "Release
matrix"); each is tested on the real classes of the release where it first
appears (tests/vllm/test_traps_real.py):

- every release: `VLLM_USE_RUST_FRONTEND=1` makes `vllm serve` run vLLM's
  Rust frontend (vllm-rs) as the HTTP server. The API-server hooks never run
  there, so no text record would back the tokens: with one witness fewer,
  every request of ours gets notice 7 naming the variable, from both sides,
  and no provenance.
- every release: a model that samples no autoregressive token per step
  (`Scheduler.num_sampled_tokens_per_step` 0: diffusion language models,
  pooling): its "drafts" are a denoising canvas, not proposals a target
  verifies, so roles are not derivable (notice 6).
- 0.28+: `SpeculativeConfig.enable_adaptive_verification` (dspark): the
  worker sizes each request's verification budget from draft confidence and
  may verify fewer drafts than the scheduler scheduled; `ModelRunnerOutput`
  does not say how many. "All scheduled drafts accepted, hence the last token
  is a bonus" then mislabels a target token as a bonus (and counts unverified
  slots as rejected). Roles are not derivable: the scheduler sends notice 6
  for each request and no provenance for it.
- 0.29+: `SamplingParams.trace_decode_token_ids` (trace replay): the engine
  emits a given token sequence instead of sampling, so a draft is "accepted"
  when it equals the trace, not because the target verified it: notice 6 for
  that request.
- 0.33+: `SpeculativeConfig.rejection_sample_method == "fly"` (lossy): the
  hello's `verification` says 3 (hooks/scheduler.py maps it); nothing here.
- 0.33+: a streaming-input request (`RequestState.streaming_input`, set from
  `EngineCoreRequest.resumable`): its outputs go through
  `StreamingInputOutputCollector.put`, which keeps a backlog across input
  chunks, and a chunk boundary carries a finish reason on a request that has
  not finished. The frontend's records cannot describe that: notice 7, not
  tracked.
- 0.33+: an `EngineCoreOutput` carrying `error` (a paused engine rejecting a
  request, a grammar that failed to compile, a KV load failure):
  `process_outputs` queues the exception and finishes the request without
  `make_request_output`, so no text record could say how it ended; the
  scheduler's output for it carries no tokens, so no provenance record
  closes it either. Both sides send notice 7 naming the error, so the client
  fails the stream with the engine's reason instead of waiting or guessing.

Not traps (the hooks stay right; the tests hold them to it): 0.34 keeps the
first draft a grammar rejects in its slot and lets the sampler reject it,
where 0.33 cut it or padded it with -1: it is a real draft, rejected, so
the step's last token is the target's correction and `drafts_padded` does
not count it.

Each function takes vLLM objects by attribute (duck-typed, any version) and
returns the notice message, or None when the path does not apply.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

ENV_RUST_FRONTEND = "VLLM_USE_RUST_FRONTEND"


def rust_frontend(environ: Mapping[str, str] = os.environ) -> str | None:
    """Notice 7 message when vLLM's Rust frontend serves HTTP (any value but 0 or empty:
    vLLM itself accepts only integers, and refusing is the safe reading)."""
    value = environ.get(ENV_RUST_FRONTEND, "").strip()
    if value in ("", "0"):
        return None
    return (
        f"{ENV_RUST_FRONTEND}={value}: vLLM's Rust frontend serves HTTP, where the API-server "
        "hooks never run, so no text record can back the tokens; unset it for exact telemetry"
    )


def no_autoregressive_sampling(scheduler: Any) -> str | None:
    """Notice 6 message when the engine samples no autoregressive token per step."""
    per_step = getattr(scheduler, "num_sampled_tokens_per_step", 1)
    if per_step == 1:
        return None
    return (
        f"roles not derivable: the engine samples {per_step} autoregressive tokens per step "
        "(a diffusion or pooling model), so its scheduled tokens are not drafts a target "
        "verifies"
    )


def trace_replay(sampling_params: Any) -> str | None:
    """Notice 6 message for a request whose tokens replay a given trace (vLLM >= 0.29)."""
    if not getattr(sampling_params, "trace_decode_token_ids", None):
        return None
    return (
        "roles not derivable: the request replays trace_decode_token_ids, so the engine emits "
        "the trace's tokens and a draft counts as accepted when it equals the trace, not "
        "because the target verified it"
    )


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
