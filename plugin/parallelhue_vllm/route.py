"""The telemetry route, independent of the web framework.

Two routes under `/v1` (so vLLM's `--api-key` guards them like every other
`/v1` route, and they are TLS when vLLM serves TLS):

- `GET|HEAD /v1/parallelhue`: the probe. 200 with a JSON description when the
  plugin answers (`exact` says whether telemetry can be served), so a
  client's `--telemetry auto` can tell the route from a 404.
- `POST /v1/parallelhue/runs`: creates a run and streams its telemetry in the
  response body (docs/PROTOCOL.md, "HTTP telemetry stream"). The server picks
  the 128-bit run id and announces it in the stream's preamble; the run
  exists in the hub before the client learns its id, so no request can name
  it earlier and none of its frames is lost. No route takes a run id from
  the client: another run's frames cannot be asked for.

`endpoint.py` adapts this to vLLM's FastAPI app, the simulated engine
(`parallelhue.sim.server`) to its own HTTP server.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from . import __version__
from . import telemetry_stream as ts
from .hub import Hub, HubFull, Subscription

__all__ = [
    "BODY_TIMEOUT_SECONDS",
    "MAX_REQUEST_BODY",
    "PROBE_PATH",
    "RUNS_PATH",
    "RouteError",
    "check_create_body",
    "error_body",
    "probe",
    "read_body",
    "stream_body",
    "stream_headers",
    "subscribe",
]

PROBE_PATH = "/v1/parallelhue"
RUNS_PATH = "/v1/parallelhue/runs"
MAX_REQUEST_BODY = 1024
BODY_TIMEOUT_SECONDS = 5.0

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "PayloadTooLarge",
    503: "ServiceUnavailable",
}


class RouteError(Exception):
    """A refused request: HTTP status and a one-line message naming the fix."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def error_body(status: int, message: str) -> bytes:
    """vLLM's error shape."""
    error = {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": None}
    return json.dumps({"error": {**error, "code": status}}).encode()


def probe(hub: Hub | None, *, engine: str, off_reason: str | None) -> dict[str, Any]:
    """What GET /v1/parallelhue answers."""
    body: dict[str, Any] = {
        "object": "parallelhue.telemetry",
        "plugin_version": __version__,
        "engine": engine,
        "stream_version": ts.STREAM_VERSION,
        "create_run": RUNS_PATH,
        "exact": hub is not None,
        "reason": None if hub is not None else off_reason,
    }
    if hub is not None:
        limits = hub.limits
        body["hub"] = {
            **hub.stats(),
            "buffer_bytes": limits.buffer_bytes,
            "total_bytes": limits.total_bytes,
            "max_subscribers": limits.max_subscribers,
            "heartbeat_ms": int(limits.heartbeat_seconds * 1000),
            "stall_seconds": limits.stall_seconds,
        }
    return body


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None) -> bytes:
    """The request body, refused beyond MAX_REQUEST_BODY bytes or BODY_TIMEOUT_SECONDS."""
    if content_length is not None:
        if not content_length.isdigit():
            raise RouteError(400, f"invalid Content-Length '{content_length}'")
        _check_size(int(content_length))
    data = bytearray()

    async def collect() -> None:
        async for chunk in chunks:
            data.extend(chunk)
            _check_size(len(data))

    try:
        await asyncio.wait_for(collect(), BODY_TIMEOUT_SECONDS)
    except asyncio.TimeoutError:  # noqa: UP041 - the plugin also runs on Python 3.10
        raise RouteError(
            408, f"request body not received within {BODY_TIMEOUT_SECONDS:g} s"
        ) from None
    return bytes(data)


def _check_size(size: int) -> None:
    if size > MAX_REQUEST_BODY:
        raise RouteError(
            413,
            f"request body of {size} bytes exceeds {MAX_REQUEST_BODY}: send an empty body or {{}}",
        )


def check_create_body(body: bytes) -> None:
    """An empty body, or a JSON object whose only known field is `stream_version`."""
    _check_size(len(body))
    if not body.strip():
        return
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RouteError(400, "request body must be empty or a JSON object") from None
    if not isinstance(value, dict):
        raise RouteError(400, "request body must be empty or a JSON object")
    for key in value:
        if key != "stream_version":
            raise RouteError(400, f"unknown field '{key}' (known: stream_version)")
    version = value.get("stream_version", ts.STREAM_VERSION)
    if version != ts.STREAM_VERSION or isinstance(version, bool):
        raise RouteError(
            400,
            f"stream_version {json.dumps(version)} is not supported "
            f"(this server speaks {ts.STREAM_VERSION})",
        )


def subscribe(hub: Hub | None, off_reason: str) -> Subscription:
    """A new run in this process's hub, or the error the client should see."""
    if hub is None:
        raise RouteError(503, off_reason)
    try:
        return hub.subscribe()
    except HubFull as error:
        raise RouteError(503, f"{error}: try again later") from None


def stream_headers() -> list[tuple[str, str]]:
    """Response headers of the telemetry stream (proxies must not buffer or cache it)."""
    return [
        ("Content-Type", ts.CONTENT_TYPE),
        ("Cache-Control", "no-store"),
        ("X-Accel-Buffering", "no"),
    ]


async def stream_body(sub: Subscription) -> AsyncIterator[bytes]:
    """The response body of one run; frees the subscription however the response ends."""
    try:
        while True:
            chunk = await sub.next_chunk()
            if chunk is None:
                return
            yield chunk
    finally:
        sub.close()
