"""One streaming HTTP request per stream, on httpx's asyncio client.

With the Rust reconciler, a plain-http stream goes through the lean transport
(`transport.py`) and, after its response head, is read by the Rust SSE thread
(`stream_reader.py`): HTTP framing, SSE, JSON and the push into the reconciler
happen without Python; the screen model is updated in batches.

A stream's request carries the run's request id (`ph1_<run>_<i>`, in the body
and as `X-Request-Id`), asks for token ids (`return_token_ids`) and the usage
chunk, and has its own seed. Whatever goes wrong with one stream (refused
connection, HTTP error, an answer that is not SSE, a disconnect) ends that
stream with one sanitized line; the other streams go on.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from .endpoint import is_chat_endpoint
from .sanitize import one_line
from .stream_reader import NativeStreamReader
from .transport import LEAN_EXTENSION, LeanBody, LeanTransport, lean_response

__all__ = [
    "StreamRequest",
    "StreamSink",
    "build_body",
    "make_client",
    "native_parser_factory",
    "run_stream",
]

_ERROR_BODY_LIMIT = 4096


@dataclass(frozen=True)
class StreamRequest:
    index: int
    request_id: str
    prompt: str
    seed: int


class StreamSink(Protocol):
    def on_delta(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    def on_reads(
        self, stream: int, texts: list[str], times: list[float], tokens: int, text_bytes: int
    ) -> None: ...
    def on_finish(self, stream: int, finish_reason: str) -> None: ...
    def on_error(self, stream: int, message: str) -> None: ...
    def on_usage(self, stream: int, usage: dict[str, Any]) -> None: ...


def build_body(
    endpoint: str,
    model: str,
    request: StreamRequest,
    max_tokens: int,
    temperature: float | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model}
    if is_chat_endpoint(endpoint):
        body["messages"] = [{"role": "user", "content": request.prompt}]
    else:
        body["prompt"] = request.prompt
    body.update(
        {
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
            "seed": request.seed,
            "request_id": request.request_id,
        }
    )
    if temperature is not None:
        body["temperature"] = temperature
    return body


def make_client(concurrency: int, timeout: float, api_key: str | None) -> httpx.AsyncClient:
    """A client with one connection per stream and a read timeout fit for long generations."""
    headers = {"Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(
        # --timeout bounds the silence between two bytes, not the whole generation.
        timeout=httpx.Timeout(connect=min(timeout, 30.0), read=timeout, write=30.0, pool=None),
        # Streams marked LEAN_EXTENSION get one connection each from the lean
        # transport; everything else goes through httpx's own pool.
        transport=LeanTransport(httpx.AsyncHTTPTransport(limits=limits, trust_env=False)),
        headers=headers,
        trust_env=False,
    )


def _error_message(status: int, body: bytes) -> str:
    return f"HTTP {status}: {_error_detail(body)}"


def _error_detail(body: bytes) -> str:
    """The server's error message from a JSON error body, else the body, on one line."""
    text = body.decode("utf-8", "replace")
    detail = text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            detail = error["message"]
        elif isinstance(error, str):
            detail = error
        elif isinstance(data.get("message"), str):
            detail = data["message"]
        elif isinstance(data.get("detail"), str):
            detail = data["detail"]
    return one_line(detail) or "(empty body)"


def _connect_message(error: Exception, endpoint: str) -> str:
    parts = urlsplit(endpoint)
    where = parts.hostname or "?"
    if parts.port:
        where = f"{where}:{parts.port}"
    return f"cannot connect to {where}: {connect_reason(error)}"


def connect_reason(error: BaseException) -> str:
    """Why a connection failed, found in the exception chain (httpx hides the errno)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return "connection refused (is the server running?)"
        if isinstance(seen, OSError) and seen.strerror:
            return one_line(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    return one_line(str(error) or type(error).__name__)


def _parse_choice(data: dict[str, Any]) -> tuple[str, list[int], str | None]:
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        return "", [], None
    choice = choices[0]
    if not isinstance(choice, dict):
        return "", [], None
    text = ""
    delta = choice.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("content"), str):
        text = delta["content"]
    elif isinstance(choice.get("text"), str):
        text = choice["text"]
    ids = choice.get("token_ids")
    token_ids = [int(t) for t in ids if isinstance(t, int)] if isinstance(ids, list) else []
    finish = choice.get("finish_reason")
    return text, token_ids, finish if isinstance(finish, str) else None


class _StreamEnded(Exception):
    pass


async def run_stream(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    request: StreamRequest,
    sink: StreamSink,
    timeout: float,
    *,
    parser_factory: Callable[[], Any] | None = None,
    yield_each_read: bool = False,
    stream_reader: NativeStreamReader | None = None,
) -> None:
    """Run one stream to its end; every outcome is reported to `sink` exactly once.

    With `parser_factory` (`parallelhue._native.SseParser`) the body is read as raw
    network chunks and each chunk is parsed (SSE lines and JSON) by one Rust call;
    without it, SSE lines and JSON are parsed in Python (the reference path).
    `yield_each_read` returns to the event loop after every read, for when the
    telemetry socket is read from the same loop (`PyReceiver`): httpx returns
    without suspending while the connection holds buffered data.
    With `stream_reader`, a plain-http body is read by the Rust thread (deltas
    reach the sink through `on_reads`, pushed into the reconciler already).
    """
    stream = request.index
    finish_reason: str | None = None
    try:
        async with client.stream(
            "POST",
            endpoint,
            json=body,
            # An SSE body is read as it comes; compressing it only delays it.
            headers={"X-Request-Id": request.request_id, "Accept-Encoding": "identity"},
            extensions={LEAN_EXTENSION: stream_reader is not None},
        ) as response:
            if response.status_code >= 400:
                raw = b""
                async for chunk in response.aiter_bytes():
                    raw += chunk
                    if len(raw) >= _ERROR_BODY_LIMIT:
                        break
                sink.on_error(stream, _error_message(response.status_code, raw))
                return
            content_type = response.headers.get("content-type", "")
            if "text/event-stream" not in content_type.lower():
                shown = one_line(content_type.split(";")[0]) or "no content type"
                sink.on_error(
                    stream,
                    f"not an SSE stream: the server answered {shown} "
                    f"(HTTP {response.status_code}); is --endpoint a streaming completions URL?",
                )
                return
            lean = lean_response(response)
            if stream_reader is not None and lean is not None and _identity_encoding(response):
                finish_reason = await _read_lean(lean, stream_reader, stream, sink)
            elif parser_factory is not None and _identity_encoding(response):
                finish_reason = await _read_native(
                    response, parser_factory(), stream, sink, yield_each_read
                )
            else:
                finish_reason = await _read_python(response, stream, sink, yield_each_read)
    except _StreamEnded:
        return
    except httpx.ConnectError as error:
        sink.on_error(stream, _connect_message(error, endpoint))
        return
    except httpx.ConnectTimeout:
        sink.on_error(stream, f"connecting timed out after {min(timeout, 30.0):g} s")
        return
    except httpx.ReadTimeout:
        sink.on_error(stream, f"no data from the server for {timeout:g} s (raise --timeout)")
        return
    except (httpx.RemoteProtocolError, httpx.ReadError):
        sink.on_error(stream, "the server closed the connection mid-stream")
        return
    except httpx.HTTPError as error:
        sink.on_error(stream, f"HTTP failure: {one_line(str(error) or type(error).__name__)}")
        return
    if finish_reason is None:
        sink.on_error(stream, "the stream ended without a finish_reason (server closed it early)")
        return
    sink.on_finish(stream, finish_reason)


def _identity_encoding(response: httpx.Response) -> bool:
    """Raw body bytes are the SSE bytes (no gzip/deflate to undo)."""
    encoding = response.headers.get("content-encoding", "identity").strip().lower()
    return encoding in ("", "identity")


def native_parser_factory() -> Callable[[], Any] | None:
    """`parallelhue._native.SseParser`, or None when the extension is not built."""
    try:
        from ._native import SseParser
    except ImportError:
        return None
    return SseParser


async def _read_lean(
    lean: LeanBody, stream_reader: NativeStreamReader, stream: int, sink: StreamSink
) -> str | None:
    """The body is read by the Rust thread; this waits for its end and reports it."""
    ended = await stream_reader.read(stream, lean)
    if ended.usage is not None:
        sink.on_usage(stream, dict(ended.usage))
    if ended.end in ("done", "eof"):
        return ended.finish_reason
    if ended.end == "timeout":
        raise httpx.ReadTimeout("no data")
    if ended.end in ("cut", "io"):
        raise httpx.ReadError(ended.message or "connection lost")
    if ended.end == "error":
        sink.on_error(stream, "bad SSE data: " + one_line(ended.message or ""))
    else:
        sink.on_error(stream, "invalid HTTP body: " + one_line(ended.message or ""))
    raise _StreamEnded


async def _read_native(
    response: httpx.Response,
    parser: Any,
    stream: int,
    sink: StreamSink,
    yield_each_read: bool,
) -> str | None:
    """Read the body with the Rust SSE parser: one parse call per network read."""
    finish_reason: str | None = None
    feed = parser.feed
    on_delta = sink.on_delta
    ended = False
    async for raw in response.aiter_raw():
        for event in feed(raw):
            kind = event["kind"]
            if kind == "chunk":
                choices = event["choices"]
                if choices:
                    choice = choices[0]
                    text = choice["text"]
                    token_ids = choice["token_ids"]
                    if text or token_ids:
                        on_delta(stream, text, token_ids or [])
                    finish = choice["finish_reason"]
                    if finish is not None:
                        finish_reason = finish
                elif event["usage"] is not None:
                    sink.on_usage(stream, dict(event["usage"]))
            elif kind == "done":
                ended = True
                break
            elif kind == "error":
                sink.on_error(stream, "bad SSE data: " + one_line(str(event["message"])))
                raise _StreamEnded
            # kind "other": an event with its own `event:` type; not a completion chunk.
        if ended:
            return finish_reason
        if yield_each_read:
            await asyncio.sleep(0)
    # Like the reference path, a last event without its blank line still counts.
    for event in [*feed(b"\n\n"), *parser.finish()]:
        kind = event["kind"]
        if kind == "chunk" and event["choices"]:
            choice = event["choices"][0]
            if choice["text"] or choice["token_ids"]:
                on_delta(stream, choice["text"], choice["token_ids"] or [])
            if choice["finish_reason"] is not None:
                finish_reason = choice["finish_reason"]
        elif kind == "error":
            sink.on_error(stream, "bad SSE data: " + one_line(str(event["message"])))
            raise _StreamEnded
    return finish_reason


async def _read_python(
    response: httpx.Response, stream: int, sink: StreamSink, yield_each_read: bool
) -> str | None:
    """The reference path: httpx's line splitting and `json` in Python."""
    finish_reason: str | None = None
    data_lines: list[str] = []
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data_lines.append(line[5:].removeprefix(" "))
            continue
        if line.strip() or not data_lines:
            continue  # comments, event names, keep-alives
        payload = "\n".join(data_lines)
        data_lines = []
        if payload.strip() == "[DONE]":
            return finish_reason
        result = _handle_payload(stream, payload, sink)
        if result is not None:
            finish_reason = result
        if yield_each_read:
            await asyncio.sleep(0)
    if data_lines:
        payload = "\n".join(data_lines)
        if payload.strip() != "[DONE]":
            result = _handle_payload(stream, payload, sink)
            if result is not None:
                finish_reason = result
    return finish_reason


def _handle_payload(stream: int, payload: str, sink: StreamSink) -> str | None:
    """Feed one SSE event to the sink; return its finish_reason if it has one."""
    try:
        data = json.loads(payload)
    except ValueError:
        sink.on_error(stream, f"bad SSE data (not JSON): {one_line(payload, 80)}")
        raise _StreamEnded from None
    if not isinstance(data, dict):
        sink.on_error(stream, f"bad SSE data (not an object): {one_line(payload, 80)}")
        raise _StreamEnded
    if "error" in data:
        sink.on_error(stream, "server error in stream: " + _error_detail(payload.encode()))
        raise _StreamEnded
    usage = data.get("usage")
    if isinstance(usage, dict) and not data.get("choices"):
        sink.on_usage(stream, usage)
        return None
    text, token_ids, finish = _parse_choice(data)
    if text or token_ids:
        sink.on_delta(stream, text, token_ids)
    return finish
