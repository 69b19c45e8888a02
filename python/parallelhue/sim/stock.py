"""The simulated engine playing a stock server without our plugin (`--stock`).

- `vllm`: vLLM's own SSE chunks (the engine's usual ones: one chunk per engine
  step while the reader keeps up, merged steps when it lags), no telemetry
  frames, and in the final usage chunk vLLM's per-request speculative metrics
  as `--per-request-spec-decode-metrics detailed` gives them: a top-level
  `metrics.speculative_decoding` with the summary counts and the ordered
  `per_step_accepted` / `per_step_drafted` lists, one entry per step that had
  drafts, accepted counted before the max_tokens cut. None after a stop
  string (the frontend ends such a request, not the engine).
- `llamacpp`: llama-server's OpenAI-compatible stream: one chunk per token
  (none for a token that ends inside a UTF-8 character; its bytes come with
  the next one), each with cumulative `timings` when the request asks for
  `timings_per_token`: `predicted_n` (tokens so far), `draft_n` and
  `draft_n_accepted` (left out while no draft was made), bumped once per verify
  step before that step's tokens go out; the final chunk(s) carry the
  finish reason, the usage and the last timings, then `[DONE]`.

The facts are read from vLLM 0.32's `v1/metrics/stats.py` and llama.cpp's
`tools/server/server-context.cpp`, `server-common.cpp` and `server-task.cpp`
(the copy vendored in llama-cpp-python 0.3.36). Everything is SIMULATED.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable
from typing import Any

from .config import FaultConfig
from .engine import SimRequest

__all__ = ["LlamaStream", "lie_lists", "vllm_metrics"]


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def lie_lists(accepted: list[int], drafted: list[int]) -> None:
    """Move one accepted draft from a listed step to the next one that has room:
    the sums (and vLLM's summary counts) stay right, the grouping does not."""
    for i in range(len(accepted) - 1):
        if accepted[i] >= 1 and accepted[i + 1] < drafted[i + 1]:
            accepted[i] -= 1
            accepted[i + 1] += 1
            return


def vllm_metrics(request: SimRequest, num_spec_tokens: int, faults: FaultConfig | None) -> str:
    """The final usage chunk's `"metrics"` member (with its leading comma), or ""
    when vLLM sends none: the request was ended by a stop string, or the server
    does not speculate (vLLM refuses --per-request-spec-decode-metrics without
    a --speculative-config)."""
    if request.collector.stop_reason is not None or num_spec_tokens == 0:
        return ""
    accepted = [a for a, _ in request.spec_steps]
    drafted = [d for _, d in request.spec_steps]
    if faults is not None and faults.reported_lie and request.stream == faults.target_stream:
        lie_lists(accepted, drafted)
    histogram = [0] * (num_spec_tokens + 1)
    for a in accepted:
        histogram[min(a, num_spec_tokens)] += 1
    steps = len(accepted)
    total_accepted = sum(accepted)
    total_drafted = sum(drafted)
    spec: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + total_accepted / steps if steps else 1.0,
        "draft_acceptance_rate": total_accepted / total_drafted if total_drafted else 0.0,
        "acceptance_histogram": histogram,
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": total_accepted,
        "num_draft_tokens": total_drafted,
        "num_spec_tokens": num_spec_tokens,
    }
    if steps:  # vLLM includes the lists only when they have entries
        spec["per_step_accepted"] = accepted
        spec["per_step_drafted"] = drafted
    return f',"metrics":{_dumps({"speculative_decoding": spec})}'


class LlamaStream:
    """llama-server's chunks of one streaming request, token by token.

    `chunks()` turns the tokens the engine kept since the last call into SSE
    events; `final()` gives the closing ones. A `reported_lie` fault on the
    target stream bumps one verify step's accepted count a token late.
    """

    def __init__(
        self,
        request: SimRequest,
        *,
        chat: bool,
        model: str,
        created: int,
        prompt_tokens: int,
        include_usage: bool,
        timings: bool,
        faults: FaultConfig | None,
    ) -> None:
        self.request = request
        self.chat = chat
        self.model = model
        self.created = created
        self.prompt_tokens = prompt_tokens
        self.include_usage = include_usage
        self.timings = timings
        self.lie = (
            faults is not None and faults.reported_lie and request.stream == faults.target_stream
        )
        self.lie_offset = faults.target_offset if faults is not None else 0
        self.lied = False
        self.id = ("chatcmpl-" if chat else "cmpl-") + secrets.token_hex(16)
        self.sent = 0  # tokens turned into chunks (or skipped)
        self.step = 0  # index into request.step_log of token `sent`
        self.step_start = 0  # token index where that step starts
        self.drafted = 0  # counters through that step
        self.accepted = 0
        self.late = 0  # the lie: accepted drafts not yet shown
        self.first = True

    def _head(self) -> dict[str, Any]:
        return {
            "created": self.created,
            "id": self.id,
            "model": self.model,
            "system_fingerprint": "b0-simulated",
            "object": "chat.completion.chunk" if self.chat else "text_completion",
        }

    def _timings(self, predicted: int) -> dict[str, Any]:
        timings: dict[str, Any] = {
            "cache_n": 0,
            "prompt_n": self.prompt_tokens,
            "prompt_ms": 1.0,
            "prompt_per_token_ms": 1.0,
            "prompt_per_second": 1000.0,
            "predicted_n": predicted,
            "predicted_ms": float(predicted),
            "predicted_per_token_ms": 1.0,
            "predicted_per_second": 1000.0,
        }
        if self.drafted > 0:  # left out while no draft was made (server_slot_stats::to_json)
            timings["draft_n"] = self.drafted
            timings["draft_n_accepted"] = self.accepted - self.late
        return timings

    def _advance(self, token: int) -> None:
        """Move the counters to the step holding `token` (bumped at its first token)."""
        log = self.request.step_log
        while token >= self.step_start + log[self.step][0]:
            self.step_start += log[self.step][0]
            self.step += 1
        if token == self.step_start:
            _, drafted, accepted = log[self.step]
            self.drafted += drafted
            self.accepted += accepted
            if self.lie and not self.lied and accepted and token >= self.lie_offset:
                self.lied = True
                self.late = accepted  # shown from the step's second token on
        elif self.late and token == self.step_start + 1:
            self.late = 0

    def _event(self, chunk: dict[str, Any]) -> bytes:
        return f"data: {_dumps(chunk)}\n\n".encode()

    def chunks(self, emit: Callable[[bytes], None]) -> None:
        texts = self.request.token_texts or []
        while self.sent < len(texts):
            token = self.sent
            self._advance(token)
            self.sent += 1
            text = texts[token]
            if not text:
                continue  # ends inside a character: llama-server sends nothing yet
            if self.chat:
                if self.first:
                    role = {"role": "assistant", "content": None}
                    emit(self._event({"choices": [_delta(role)], **self._head()}))
                chunk: dict[str, Any] = {"choices": [_delta({"content": text})], **self._head()}
            else:
                chunk = {"choices": [_text(text)], **self._head()}
            self.first = False
            if self.timings:
                chunk["timings"] = self._timings(self.sent)
            emit(self._event(chunk))

    def final(self, finish_reason: str) -> bytes:
        """The closing events: finish reason, usage (when asked for), timings, [DONE]."""
        self.late = 0
        n = self.sent
        usage = {"completion_tokens": n, "prompt_tokens": self.prompt_tokens,
                 "total_tokens": n + self.prompt_tokens}  # fmt: skip
        events: list[dict[str, Any]] = []
        if self.chat:
            events.append({"choices": [_delta({}, finish_reason)], **self._head()})
            if self.include_usage:
                events.append({"choices": [], **self._head(), "usage": usage})
        else:
            events.append({"choices": [_text("", finish_reason)], **self._head(), "usage": usage})
        events[-1]["timings"] = self._timings(n)  # the final response always has them
        return b"".join(self._event(e) for e in events) + b"data: [DONE]\n\n"


def _delta(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"finish_reason": finish, "index": 0, "delta": delta}


def _text(text: str, finish: str | None = None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
