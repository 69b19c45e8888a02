"""One SSE chunk's JSON -> the reconciler's SSE inputs (docs/PROTOCOL.md "Inputs").

The reference of the Rust extraction (`rust/core/src/sse/parser.rs` `parse_chunk`,
`rust/core/src/sse/inputs.rs`): the same JSON is accepted and rejected alike,
every shape error has the same message, and the same inputs come out, so the
`--reconciler python` path sees exactly what the Rust path sees. This only
extracts; every check of the inputs against the other witnesses is a
reconciler rule.

JSON is read as serde_json reads it: `NaN`/`Infinity`, numbers outside the
double range, lone surrogate escapes (`"\\ud800"`) and nesting deeper than
serde_json's limit are invalid JSON, not values.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["MAX_NESTING", "ChunkInputs", "SseError", "parse_data", "shown_reason"]

U32_MAX = 0xFFFFFFFF
U64_MAX = 0xFFFFFFFFFFFFFFFF
# serde_json's recursion limit: arrays and objects nest at most this deep.
MAX_NESTING = 127

Input = tuple[Any, ...]

# vLLM's summary counts beside the per-step lists, and llama-server's `timings`
# counters (rust/core/src/sse/chunk.rs SPEC_SUMMARY_KEYS, TIMINGS_KEYS): the
# server-reported tier's inputs ("sse_counts"); no reconciler reads them.
SPEC_SUMMARY_KEYS = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
TIMINGS_KEYS = ("predicted_n", "draft_n", "draft_n_accepted")


class SseError(ValueError):
    """A chunk the extraction refuses; str() is the same message as the Rust one."""


def _json_error(detail: str) -> SseError:
    return SseError(f"invalid JSON in SSE data: {detail}")


def _shape(path: str, expected: str) -> SseError:
    return SseError(f"invalid SSE chunk: {path} must be {expected}")


def _no_constant(name: str) -> Any:
    raise _json_error(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise _json_error("number out of range")
    return value


def _bounded_int(text: str) -> int | float:
    # serde_json reads -0 as the double -0.0, and an integer beyond u64/i64 as a
    # double: out of the double range, an error.
    if text == "-0":
        return -0.0
    if len(text) > 20 and math.isinf(float(text)):
        raise _json_error("number out of range")
    return int(text)


def _check_tree(value: Any, depth: int = 0) -> None:
    """Lone surrogates anywhere and over-deep nesting are JSON errors (as in serde_json)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise _json_error("lone surrogate in a string escape") from None
    elif isinstance(value, (list, dict)):
        if depth >= MAX_NESTING:
            raise _json_error("recursion limit exceeded")
        if isinstance(value, dict):
            for key, item in value.items():
                _check_tree(key, depth + 1)
                _check_tree(item, depth + 1)
        else:
            for item in value:
                _check_tree(item, depth + 1)


def parse_data(payload: str) -> Any:
    """An event's `data:` payload as JSON, accepted and rejected as serde_json does."""
    try:
        value = json.loads(
            payload,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            parse_int=_bounded_int,
        )
    except SseError:
        raise
    except RecursionError:
        raise _json_error("recursion limit exceeded") from None
    except ValueError as error:  # JSONDecodeError, or an integer of too many digits
        raise _json_error(str(error)) from None
    _check_tree(value)
    return value


def _int(value: Any) -> int | None:
    """A JSON integer (never a bool, never a float such as 1.0), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _opt_str(value: Any, path: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise _shape(path, "a string or null")


def _opt_u64(value: Any, path: str) -> int | None:
    if value is None:
        return None
    number = _int(value)
    if number is None or not 0 <= number <= U64_MAX:
        raise _shape(path, "a non-negative integer")
    return number


def _u32(value: Any, path: str) -> int:
    number = _int(value)
    if number is None or not 0 <= number <= U32_MAX:
        raise _shape(path, "an integer in 0..=4294967295")
    return number


def _opt_u32_list(value: Any, path: str) -> list[int] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise _shape(path, "an array of integers or null")
    return [_u32(item, f"{path}[{index}]") for index, item in enumerate(value)]


def _server_error(error: Any) -> SseError:
    """An error object's `message`, else the object as compact JSON (keys sorted, as
    serde_json writes its maps)."""
    message = error.get("message") if isinstance(error, dict) else None
    if not isinstance(message, str):
        message = json.dumps(error, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
    return SseError(f"server error in SSE stream: {message}")


def shown_reason(reason: str | None) -> str:
    """A finish_reason in a message: quoted (at most 40 characters), or null."""
    if reason is None:
        return "null"
    return f"'{reason[:40]}…'" if len(reason) > 40 else f"'{reason}'"


def _choice(index: int, value: Any) -> tuple[int, str, list[int] | None, str | None]:
    """(index, text, token_ids, finish_reason) of one choice."""
    if not isinstance(value, dict):
        raise _shape(f"choices[{index}]", "an object")
    if "index" not in value:
        raise _shape(f"choices[{index}].index", "present")
    number = _int(value["index"])
    if number is None or not 0 <= number <= U32_MAX:
        raise _shape(f"choices[{index}].index", "an integer in 0..=4294967295")
    delta = value.get("delta")
    if delta is not None and not isinstance(delta, dict):
        raise _shape(f"choices[{index}].delta", "an object")
    if delta is not None:
        text = _opt_str(delta.get("content"), f"choices[{index}].delta.content")
    else:
        text = _opt_str(value.get("text"), f"choices[{index}].text")
    # The choice's own token_ids win, even null, over the delta's.
    if "token_ids" in value:
        ids_value, ids_path = value["token_ids"], "token_ids"
    else:
        ids_value = delta.get("token_ids") if delta is not None else None
        ids_path = "delta.token_ids"
    token_ids = _opt_u32_list(ids_value, f"choices[{index}].{ids_path}")
    finish = _opt_str(value.get("finish_reason"), f"choices[{index}].finish_reason")
    return number, text or "", token_ids, finish


class ChunkInputs:
    """One stream's extraction: chunk after chunk, the inputs they hold.

    The inputs are the C2 tuples without the stream: ("sse", text, token_ids),
    ("sse_id", id), ("sse_choice", index), ("sse_usage", completion_tokens,
    per_step_accepted, per_step_drafted), and for the server-reported tier
    ("sse_counts", "spec" | "timings", a, b, c).
    """

    def __init__(self) -> None:
        self._last_id: str | None = None  # None before the first chunk
        self._choice_reported = False
        self.finish_reason: str | None = None  # choice 0's finish_reason, once given
        self.prompt_tokens: int | None = None  # usage.prompt_tokens, once given
        self.usage: dict[str, Any] | None = None  # the last chunk's usage object

    def extract_payload(self, payload: str) -> list[Input]:
        """Parse one `data:` payload and extract its inputs; SseError if refused."""
        return self.extract(parse_data(payload))

    def extract(self, data: Any) -> list[Input]:
        """The inputs of one chunk (already parsed JSON); SseError if refused."""
        if not isinstance(data, dict):
            raise _shape("the data", "a JSON object")
        if "error" in data:
            raise _server_error(data["error"])
        if data.get("object") == "error":
            raise _server_error(data)
        chunk_id = _opt_str(data.get("id"), "id") or ""
        if "choices" not in data:
            raise _shape("choices", "present")
        choices = data["choices"]
        if not isinstance(choices, list):
            raise _shape("choices", "an array")
        parsed = [_choice(index, value) for index, value in enumerate(choices)]
        usage = data.get("usage")
        completion_tokens = None
        if usage is not None:
            if not isinstance(usage, dict):
                raise _shape("usage", "an object or null")
            for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
                number = _opt_u64(usage.get(key), f"usage.{key}")
                if key == "completion_tokens":
                    completion_tokens = number
        steps = self._spec_steps(data.get("metrics"))
        summary = self._spec_summary(data.get("metrics"))
        timings = _timings(data.get("timings"))
        zero = next((c for c in parsed if c[0] == 0), None)
        self._restatements(zero, usage)
        inputs: list[Input] = []
        if chunk_id != self._last_id:
            inputs.append(("sse_id", chunk_id))
            self._last_id = chunk_id
        other = next((c[0] for c in parsed if c is not zero), None)
        if other is not None and not self._choice_reported:
            self._choice_reported = True
            inputs.append(("sse_choice", other))
        if zero is not None:
            _, text, token_ids, finish = zero
            if text or token_ids:
                inputs.append(("sse", text, token_ids or []))
            if finish is not None:
                self.finish_reason = finish
        if isinstance(usage, dict) and self.prompt_tokens is None:
            self.prompt_tokens = usage.get("prompt_tokens")
        if usage is not None or steps is not None:
            self.usage = usage if isinstance(usage, dict) else self.usage
            accepted, drafted = steps if steps is not None else (None, None)
            inputs.append(("sse_usage", completion_tokens, accepted, drafted))
        for kind, counts in (("spec", summary), ("timings", timings)):
            if counts is not None and any(value is not None for value in counts):
                inputs.append(("sse_counts", kind, *counts))
        return inputs

    def _restatements(
        self, zero: tuple[int, str, list[int] | None, str | None] | None, usage: Any
    ) -> None:
        """What the stream already said stays said (evidence is monotone): no content of
        choice 0 after its finish_reason, no other finish_reason, no other
        usage.prompt_tokens. Checked before any input of the chunk."""
        if zero is not None and self.finish_reason is not None:
            if zero[1] or zero[2]:
                raise SseError("invalid SSE chunk: choice 0 has content after its finish_reason")
            if zero[3] is not None and zero[3] != self.finish_reason:
                raise SseError(
                    f"invalid SSE chunk: choice 0's finish_reason {shown_reason(zero[3])} "
                    f"after {shown_reason(self.finish_reason)}"
                )
        prompt = usage.get("prompt_tokens") if isinstance(usage, dict) else None
        if prompt is not None and self.prompt_tokens is not None and prompt != self.prompt_tokens:
            raise SseError(
                f"invalid SSE chunk: usage.prompt_tokens {prompt} after {self.prompt_tokens}"
            )

    @staticmethod
    def _spec_steps(metrics: Any) -> tuple[list[int] | None, list[int] | None] | None:
        """vLLM's `metrics.speculative_decoding` per-step lists, when the chunk has them."""
        if metrics is None:
            return None
        if not isinstance(metrics, dict):
            raise _shape("metrics", "an object or null")
        spec = metrics.get("speculative_decoding")
        if spec is None:
            return None
        if not isinstance(spec, dict):
            raise _shape("metrics.speculative_decoding", "an object or null")
        path = "metrics.speculative_decoding"
        return (
            _opt_u32_list(spec.get("per_step_accepted"), f"{path}.per_step_accepted"),
            _opt_u32_list(spec.get("per_step_drafted"), f"{path}.per_step_drafted"),
        )

    @staticmethod
    def _spec_summary(metrics: Any) -> tuple[int | None, ...] | None:
        """vLLM's summary counts beside the lists (shapes checked by _spec_steps first)."""
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if not isinstance(spec, dict):
            return None
        path = "metrics.speculative_decoding"
        return tuple(_opt_u64(spec.get(key), f"{path}.{key}") for key in SPEC_SUMMARY_KEYS)


def _timings(value: Any) -> tuple[int | None, ...] | None:
    """llama-server's `timings` counters, when the chunk has a `timings` object."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _shape("timings", "an object or null")
    return tuple(_opt_u64(value.get(key), f"timings.{key}") for key in TIMINGS_KEYS)
