"""One streaming request per stream: what it sends, and the reference path's reader.

Every stream's request carries the run's request id (`ph1_<run>_<i>`, in the
body and as `X-Request-Id`), asks for token ids (`return_token_ids`) and the
usage chunk, and has its own seed. `request.build_body` and `request_headers` make
it; `native.py` hands it to the Rust HTTP thread (the shipped path, plain
http and https alike).

`read_stream` is the reference path's reader (`--reconciler python`): httpx
for the exchange, the body's raw bytes through the reference SSE reader
(`reference/sse_body.py`: every byte read as the Rust reader reads it),
every delta reported to a `StreamSink`. However a stream ends, it is
reported exactly once — a normal finish with its finish_reason, or an end
kind (`shapes.EndKind`) that `stream_errors.end_message` turns into the
user's line — and the other streams go on. `make_client` is the httpx client of a run (`/v1/models`,
`/metrics`, and the reference path's streams).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

import httpx

from parallelhue_vllm.inband import HEADER as INBAND_HEADER
from parallelhue_vllm.inband import STREAM_VERSION as INBAND_VERSION

from .. import __version__
from ..model.shapes import EndKind, Usage
from ..reference.sse_body import BodyReader

__all__ = [
    "ConnectTarget",
    "ExchangeEnded",
    "StreamRequest",
    "StreamSink",
    "StreamStopped",
    "body_bytes",
    "connect_target",
    "error_body_text",
    "exchange_end",
    "inband_header",
    "make_client",
    "read_stream",
    "request_headers",
]

# The start of an error body kept for its message.
ERROR_BODY_LIMIT = 4096


@dataclass(frozen=True)
class StreamRequest:
    index: int
    request_id: str
    prompt: str
    seed: int
    path: str | None = None  # its own path on the server (RequestShape); None: the endpoint's


@dataclass(frozen=True)
class ConnectTarget:
    """Where a completions endpoint's requests go."""

    host: str
    port: int
    tls: bool
    shown: str  # how messages name the server: host, or host:port as written
    path: str  # the request target: path and query


def connect_target(endpoint: str) -> ConnectTarget:
    parts = urlsplit(endpoint)
    tls = parts.scheme == "https"
    host = parts.hostname or ""
    shown = f"{host}:{parts.port}" if parts.port else host
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return ConnectTarget(host, parts.port or (443 if tls else 80), tls, shown, path)


class StreamSink(Protocol):
    def on_delta(self, stream: int, text: str, token_ids: list[int]) -> None: ...
    # The other SSE inputs of docs/PROTOCOL.md (C2 tuples with the stream):
    # ("sse_id", s, id), ("sse_choice", s, index), ("sse_usage", s, n, accepted, drafted),
    # ("sse_counts", s, kind, a, b, c) (a stock server's step counters: reported.py).
    def on_sse_input(self, stream: int, item: tuple[Any, ...]) -> None: ...
    # In-band telemetry: a frame the response carried; its telemetry missing frames.
    def on_frame(self, stream: int, frame: bytes) -> None: ...
    def stream_lost(self, stream: int, reason: str) -> None: ...
    def on_finish(self, stream: int, finish_reason: str) -> None: ...
    def on_end(self, stream: int, kind: EndKind, status: int, detail: str) -> None: ...
    def on_usage(self, stream: int, usage: Usage) -> None: ...


def body_bytes(body: dict[str, Any]) -> bytes:
    """The JSON body as sent (compact, UTF-8)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _host_headers(target: ConnectTarget, accept: str) -> list[tuple[str, str]]:
    default_port = 443 if target.tls else 80
    host = target.host if ":" not in target.host else f"[{target.host}]"
    return [
        ("Host", host if target.port == default_port else f"{host}:{target.port}"),
        ("User-Agent", f"parallelhue/{__version__}"),
        ("Accept", accept),
        # A stream is read as it comes; compressing it only delays it.
        ("Accept-Encoding", "identity"),
    ]


def request_headers(
    target: ConnectTarget,
    api_key: str | None,
    request_id: str,
    extra: Sequence[tuple[str, str]] = (),
    inband: bool = False,
) -> list[tuple[str, str]]:
    """The headers of a stream's request (framing headers are the sender's); `extra`
    (--header) comes last and replaces a header of the same name (Authorization).
    `inband`: ask for the request's telemetry inside its response."""
    headers = _host_headers(target, "text/event-stream")
    headers += [("Content-Type", "application/json"), ("X-Request-Id", request_id)]
    if inband:
        headers.append(inband_header())
    if api_key:
        headers.append(("Authorization", f"Bearer {api_key}"))
    replaced = {name.lower() for name, _ in extra}
    return [h for h in headers if h[0].lower() not in replaced] + list(extra)


def inband_header() -> tuple[str, str]:
    """The request header that asks for in-band telemetry (docs/PROTOCOL.md)."""
    return (INBAND_HEADER, str(INBAND_VERSION))


def tls_context() -> ssl.SSLContext:
    """Certificates httpx trusts: its defaults plus `SSL_CERT_FILE` (a private CA),
    as the Rust HTTP thread does (docs/CLIENT.md)."""
    context = ssl.create_default_context()
    try:
        import certifi

        context.load_verify_locations(cafile=certifi.where())
    except ImportError:  # pragma: no cover - httpx depends on certifi
        pass
    extra = os.environ.get("SSL_CERT_FILE")
    if extra:
        context.load_verify_locations(cafile=extra)
    return context


def make_client(
    concurrency: int,
    timeout: float,
    api_key: str | None,
    extra_headers: Sequence[tuple[str, str]] = (),
) -> httpx.AsyncClient:
    """A client with one connection per stream and a read timeout fit for long generations;
    `extra_headers` (--header) go on every request and may replace Authorization."""
    headers = {"Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    headers.update(dict(extra_headers))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(
        # --timeout bounds the silence between two bytes, not the whole generation.
        timeout=httpx.Timeout(connect=min(timeout, 30.0), read=timeout, write=30.0, pool=None),
        limits=limits,
        headers=headers,
        verify=tls_context(),
        trust_env=False,
    )


class StreamStopped(Exception):
    """Raised by a sink that already reported the stream's failure: stop reading it."""


class ExchangeEnded(Exception):
    """An exchange ended on what the server answered (an HTTP status, another content type)."""

    def __init__(self, kind: EndKind, detail: str, status: int = 0) -> None:
        super().__init__(detail)
        self.kind: EndKind = kind
        self.detail = detail
        self.status = status


async def read_stream(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    request: StreamRequest,
    sink: StreamSink,
    *,
    yield_each_read: bool = False,
    inband: bool = False,
) -> None:
    """The reference path: run one stream to its end; report every outcome once.

    `yield_each_read` returns to the event loop after every SSE event, for when
    the telemetry socket is read from the same loop (`PyReceiver`): httpx
    returns without suspending while the connection holds buffered data. Any
    exception while handling the stream ends that stream only (kind "internal").
    """
    stream = request.index
    try:
        finish_reason = await _exchange(
            client, endpoint, body, request, sink, yield_each_read, inband
        )
    except StreamStopped:
        return
    except Exception as error:
        sink.on_end(stream, *exchange_end(error, connect_target(endpoint)))
        return
    if finish_reason is None:
        sink.on_end(stream, "no_finish", 0, "")
        return
    sink.on_finish(stream, finish_reason)


def exchange_end(error: Exception, target: ConnectTarget) -> tuple[EndKind, int, str]:
    """The end kind, status and detail of an httpx exchange that raised `error`."""
    if isinstance(error, ExchangeEnded):
        return error.kind, error.status, error.detail
    if isinstance(error, httpx.ConnectError):
        from ..model.stream_errors import connect_reason

        reason = connect_reason(error)
        if reason.startswith("connection refused"):
            return "refused", 0, target.shown
        return "connect_failed", 0, f"{target.shown}: {reason}"
    if isinstance(error, httpx.ConnectTimeout):
        return "connect_timeout", 0, ""
    if isinstance(error, httpx.ReadTimeout):
        return "read_timeout", 0, ""
    if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError):
        return "closed", 0, ""
    if isinstance(error, httpx.HTTPError):
        return "io", 0, str(error) or type(error).__name__
    return "internal", 0, f"{type(error).__name__}: {error}"


async def error_body_text(response: httpx.Response) -> str:
    """The start of an error response's body (ERROR_BODY_LIMIT bytes), as text."""
    raw = b""
    async for chunk in response.aiter_bytes():
        raw += chunk
        if len(raw) >= ERROR_BODY_LIMIT:
            break
    return raw[:ERROR_BODY_LIMIT].decode("utf-8", "replace")


async def _exchange(
    client: httpx.AsyncClient,
    endpoint: str,
    body: dict[str, Any],
    request: StreamRequest,
    sink: StreamSink,
    yield_each_read: bool,
    inband: bool = False,
) -> str | None:
    headers = {
        "X-Request-Id": request.request_id,
        "Accept-Encoding": "identity",
        "Content-Type": "application/json",
    }
    if inband:
        headers[INBAND_HEADER] = str(INBAND_VERSION)
    async with client.stream(
        "POST", endpoint, content=body_bytes(body), headers=headers
    ) as response:
        if response.status_code >= 400:
            text = await error_body_text(response)
            raise ExchangeEnded("http_status", text, response.status_code)
        content_type = response.headers.get("content-type", "")
        if "text/event-stream" not in content_type.lower():
            raise ExchangeEnded("not_sse", content_type, response.status_code)
        return await _read_events(response, request.index, sink, yield_each_read)


async def _read_events(
    response: httpx.Response, stream: int, sink: StreamSink, yield_each_read: bool
) -> str | None:
    """The body's raw bytes through the reference reader (`reference/sse_body.py`,
    the Rust reader's grammar and fold in Python): every SSE input to the sink, in
    order; a chunk or line the reader refuses ends the stream with the Rust reader's
    reason. A compressed body is refused as the Rust reader refuses it."""
    coding = response.headers.get("content-encoding", "").strip().lower()
    if coding and coding != "identity":
        raise ExchangeEnded("encoding", response.headers["content-encoding"])
    reader = BodyReader()
    async for data in response.aiter_raw():
        _handle_inputs(stream, reader.feed(data), sink, reader)
        if reader.end is not None:
            break
        if yield_each_read:
            await asyncio.sleep(0)
    else:
        _handle_inputs(stream, reader.finish(), sink, reader)
    if reader.end is not None and reader.end[0] == "bad_event":
        raise ExchangeEnded("bad_sse", reader.end[1])
    return reader.finish_reason


def _handle_inputs(stream: int, inputs: list[Any], sink: StreamSink, reader: BodyReader) -> None:
    """Feed one read's SSE inputs to the sink, in order, then the usage shown."""
    for item in inputs:
        if item[0] == "sse":
            sink.on_delta(stream, item[1], item[2])
        elif item[0] == "frame":
            sink.on_frame(stream, item[1])
        elif item[0] == "lost":
            sink.stream_lost(stream, item[1])
        else:
            sink.on_sse_input(stream, (item[0], stream, *item[1:]))
    usage = reader.extraction.usage
    if usage is not None and any(item[0] == "sse_usage" for item in inputs):
        sink.on_usage(
            stream,
            Usage(
                prompt_tokens=usage.get("prompt_tokens"),
                completion_tokens=usage.get("completion_tokens"),
                total_tokens=usage.get("total_tokens"),
            ),
        )
