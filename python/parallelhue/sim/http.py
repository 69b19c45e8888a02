"""A small HTTP/1.1 server on asyncio streams: just what an OpenAI-style API needs.

Keep-alive, Content-Length request bodies, responses with Content-Length,
chunked streaming (close-delimited for HTTP/1.0 clients), and a clean JSON
error for every malformed request. No dependencies.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

__all__ = ["HttpError", "HttpRequest", "HttpResponder", "serve_connection"]

MAX_HEADER_LINE = 16_384
MAX_HEADERS = 100
MAX_BODY = 4 << 20
# A request that started must be complete within this (a slow sender holds
# only its own connection, never the server); an idle connection is closed after IDLE_SECONDS.
REQUEST_SECONDS = 10.0
IDLE_SECONDS = 120.0

_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    411: "Length Required",
    413: "Payload Too Large",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "PayloadTooLarge",
    503: "ServiceUnavailable",
}


class HttpError(Exception):
    """An error answered with a JSON body in the OpenAI / vLLM error shape."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(slots=True)
class HttpRequest:
    method: str
    path: str
    version: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return connection == "keep-alive"
        return connection != "close"


def error_body(status: int, message: str) -> bytes:
    return json.dumps(
        {
            "error": {
                "message": message,
                "type": _ERROR_TYPES.get(status, "InternalServerError"),
                "param": None,
                "code": status,
            }
        }
    ).encode()


class HttpResponder:
    """Writes one response: either whole, or as a stream of chunks."""

    __slots__ = ("_chunked", "_keep_alive", "_started", "reader", "writer")

    def __init__(
        self,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        reader: asyncio.StreamReader | None = None,
    ) -> None:
        self.writer = writer
        # For long responses that must notice the client leaving while idle.
        self.reader = reader
        self._keep_alive = keep_alive
        self._chunked = False
        self._started = False

    @property
    def keep_alive(self) -> bool:
        return self._keep_alive

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}"]
        lines.extend(f"{name}: {value}" for name, value in headers)
        lines.append("Connection: keep-alive" if self._keep_alive else "Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode()

    async def send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        head: bool = False,
    ) -> None:
        """A whole response; `head`: the headers a GET would get, without the body (HEAD)."""
        self._started = True
        lines = self._head(
            status, [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        self.writer.write(lines if head else lines + body)
        await self.writer.drain()

    async def send_error(self, status: int, message: str) -> None:
        await self.send(status, error_body(status, message))

    async def start_stream(
        self,
        content_type: str,
        chunked: bool,
        extra_headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """Begin a streamed body: chunked, or delimited by closing the connection."""
        self._started = True
        self._chunked = chunked
        if not chunked:
            self._keep_alive = False
        headers = [("Content-Type", content_type)]
        headers += extra_headers or [("Cache-Control", "no-cache")]
        if chunked:
            headers.append(("Transfer-Encoding", "chunked"))
        self.writer.write(self._head(200, headers))

    def write(self, data: bytes) -> None:
        if self._chunked:
            self.writer.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.writer.write(data)

    async def end_stream(self) -> None:
        if self._chunked:
            self.writer.write(b"0\r\n\r\n")
        await self.writer.drain()

    @property
    def started(self) -> bool:
        return self._started

    def close_after(self) -> None:
        """Close the connection once this response is done."""
        self._keep_alive = False


Handler = Callable[[HttpRequest, HttpResponder], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> HttpRequest | None:
    """Read one request; None at a clean end of the connection (or when it stays idle)."""
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
    # cancellation (the server stopping) when the read it wraps completes in
    # the same loop iteration, and the request would be served after stop().
    try:
        async with asyncio.timeout(IDLE_SECONDS):
            line = await reader.readuntil(b"\r\n")
    except TimeoutError:
        return None
    except asyncio.IncompleteReadError as error:
        if not error.partial.strip():
            return None
        raise HttpError(400, "malformed request line") from None
    except asyncio.LimitOverrunError:
        raise HttpError(431, "request line too long") from None
    try:
        async with asyncio.timeout(REQUEST_SECONDS):
            return await _read_rest(reader, line)
    except TimeoutError:
        raise HttpError(408, f"request not received within {REQUEST_SECONDS:g} s") from None


async def _read_rest(reader: asyncio.StreamReader, line: bytes) -> HttpRequest:
    parts = line.decode("latin-1").strip().split(" ")
    if len(parts) != 3 or not parts[2].startswith("HTTP/"):
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise HttpError(505, f"unsupported HTTP version {version}: use HTTP/1.1")
    headers: dict[str, str] = {}
    while True:
        try:
            header_line = await reader.readuntil(b"\r\n")
        except asyncio.LimitOverrunError:
            raise HttpError(431, "request header line too long") from None
        if header_line == b"\r\n":
            break
        if len(headers) >= MAX_HEADERS:
            raise HttpError(431, f"more than {MAX_HEADERS} request headers")
        name, colon, value = header_line.decode("latin-1").partition(":")
        if not colon or not name.strip():
            raise HttpError(400, "malformed header line")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, "chunked request bodies are not supported: send Content-Length")
    length_text = headers.get("content-length")
    if length_text is not None:
        if not length_text.isdigit():
            raise HttpError(400, f"invalid Content-Length '{length_text}'")
        length = int(length_text)
        if length > MAX_BODY:
            raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY}")
        body = await reader.readexactly(length)
    path = target.split("?", 1)[0]
    return HttpRequest(method=method, path=path, version=version, headers=headers, body=body)


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
) -> None:
    """Serve requests on one connection until it closes or a response ends it."""
    try:
        while True:
            try:
                request = await _read_request(reader)
            except HttpError as error:
                responder = HttpResponder(writer, keep_alive=False)
                await responder.send_error(error.status, error.message)
                return
            if request is None:
                return
            responder = HttpResponder(writer, keep_alive=request.keep_alive, reader=reader)
            try:
                await handler(request, responder)
            except HttpError as error:
                if responder.started:
                    return
                await responder.send_error(error.status, error.message)
            if not responder.keep_alive:
                return
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        return
    finally:
        try:
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
