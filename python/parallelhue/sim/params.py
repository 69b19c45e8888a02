"""The simulated engine's request bodies: validated into the parameters of one generation."""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from typing import Any

from .config import SimConfig
from .http import HttpError, HttpRequest


@dataclass(slots=True)
class Params:
    """A validated generation request."""

    chat: bool
    prompt: str
    stream: bool
    include_usage: bool
    return_token_ids: bool
    max_tokens: int
    stop: tuple[str, ...]
    seed: int
    base_id: str
    timings_per_token: bool = False  # llama-server's request field (--stock llamacpp)


def json_dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _int_field(body: dict[str, Any], name: str, default: int | None, low: int) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise HttpError(400, f"'{name}' must be an integer, got {json_dumps(value)}")
    if value < low:
        raise HttpError(400, f"'{name}' must be >= {low}, got {value}")
    return value


def _bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise HttpError(400, f"'{name}' must be a boolean, got {json_dumps(value)}")
    return value


def _chat_prompt(messages: object) -> str:
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "'messages' must be a non-empty list of {role, content} objects")
    lines: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise HttpError(400, "each message must be an object with a string 'role'")
        content = message.get("content")
        if isinstance(content, list):
            texts = [
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            ]
            content = "".join(text for text in texts if isinstance(text, str))
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise HttpError(400, "message 'content' must be a string or a list of text parts")
        lines.append(f"<|{message['role']}|>{content}")
    lines.append("<|assistant|>")
    return "\n".join(lines)


def parse_params(request: HttpRequest, chat: bool, config: SimConfig) -> Params:
    """The request body as a validated generation request; HttpError names what is wrong."""
    try:
        body = json.loads(request.body)
    except (ValueError, UnicodeDecodeError) as error:
        raise HttpError(400, f"request body is not valid JSON: {error}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != config.model:
        raise HttpError(404, f"The model `{model}` does not exist.")
    n = _int_field(body, "n", 1, 1)
    if n != 1:
        raise HttpError(400, f"n={n} is not supported by the simulated engine: use n=1")
    if chat:
        prompt = _chat_prompt(body.get("messages"))
        max_tokens = _int_field(body, "max_completion_tokens", None, 1)
        if max_tokens is None:
            max_tokens = _int_field(body, "max_tokens", None, 1)
    else:
        raw_prompt = body.get("prompt")
        if isinstance(raw_prompt, list) and len(raw_prompt) == 1:
            raw_prompt = raw_prompt[0]
        if not isinstance(raw_prompt, str):
            raise HttpError(400, "'prompt' must be a string")
        prompt = raw_prompt
        max_tokens = _int_field(body, "max_tokens", None, 1)
    if max_tokens is None:
        max_tokens = config.default_max_tokens
    if max_tokens > config.max_model_len:
        raise HttpError(
            400,
            f"'max_tokens' {max_tokens} exceeds the model length {config.max_model_len}",
        )
    stop_value = body.get("stop")
    stop: tuple[str, ...]
    if stop_value is None:
        stop = ()
    elif isinstance(stop_value, str):
        stop = (stop_value,) if stop_value else ()
    elif isinstance(stop_value, list) and all(isinstance(item, str) for item in stop_value):
        stop = tuple(item for item in stop_value if item)
    else:
        raise HttpError(400, "'stop' must be a string or a list of strings")
    temperature = body.get("temperature")
    if temperature is not None and (
        isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0
    ):
        raise HttpError(400, "'temperature' must be a number >= 0")
    seed = body.get("seed")
    if seed is None:
        seed = config.seed
    elif isinstance(seed, bool) or not isinstance(seed, int):
        raise HttpError(400, f"'seed' must be an integer, got {json_dumps(seed)}")
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise HttpError(400, "'stream_options' must be an object")
    stream = _bool_field(body, "stream")
    include_usage = _bool_field(stream_options, "include_usage")
    base_id = request.headers.get("x-request-id") or body.get("request_id")
    if base_id is None:
        base_id = secrets.token_hex(16)
    if not isinstance(base_id, str) or not base_id:
        raise HttpError(400, "'request_id' must be a non-empty string")
    return Params(
        chat=chat,
        prompt=prompt,
        stream=stream,
        include_usage=include_usage,
        return_token_ids=_bool_field(body, "return_token_ids"),
        max_tokens=max_tokens,
        stop=stop,
        seed=seed,
        base_id=base_id,
        timings_per_token=_bool_field(body, "timings_per_token"),
    )
