"""The body of each streaming request: the prompt plus what the run asks for.

What every stream needs for exactness is fixed here and cannot be overridden:
`stream` with the usage chunk, `return_token_ids`, the run's `request_id` and
one choice (`n`); and for server-reported steps llama-server's
`timings_per_token` (vLLM ignores the field: its request models log unknown
fields at debug level). `--extra-body` adds anything else the server accepts
(top_p, min_tokens, vLLM's sampling extensions); the dedicated flags
(`--stop`, `--ignore-eos`, `--system`, `--temperature`, `--seed`, the
penalties, `--force-full-length`) win over it.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..cli.settings import RunConfig
from ..model.endpoint import is_chat_endpoint

__all__ = ["RESERVED_BODY_KEYS", "build_body"]

# Keys --extra-body may not set: the run's correctness depends on them.
RESERVED_BODY_KEYS = (
    "stream", "stream_options", "return_token_ids", "request_id", "n", "timings_per_token",
)  # fmt: skip


class _Request(Protocol):
    @property
    def prompt(self) -> str: ...
    @property
    def seed(self) -> int: ...
    @property
    def request_id(self) -> str: ...


def build_body(config: RunConfig, model: str, request: _Request) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, **config.extra_body}
    if is_chat_endpoint(config.endpoint):
        messages = []
        if config.system is not None:
            messages.append({"role": "system", "content": config.system})
        messages.append({"role": "user", "content": request.prompt})
        body["messages"] = messages
    else:
        body["prompt"] = request.prompt
    body.update(
        {
            "max_tokens": config.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "timings_per_token": True,
            "seed": request.seed,
            "request_id": request.request_id,
        }
    )
    if config.temperature is not None:
        body["temperature"] = config.temperature
    for key in ("frequency_penalty", "presence_penalty", "repeat_penalty"):
        value = getattr(config, key)
        if value is not None:
            body[key] = value
    if config.stop:
        body["stop"] = list(config.stop)
    if config.ignore_eos or config.force_full_length:
        body["ignore_eos"] = True
    if config.force_full_length:
        body["min_tokens"] = config.max_tokens
    return body
