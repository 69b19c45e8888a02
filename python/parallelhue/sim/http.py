"""The simulated engine's HTTP/1.1 server: h11 on asyncio streams.

h11 parses requests and frames responses: keep-alive, Content-Length request
bodies, responses with Content-Length, chunked streaming (close-delimited for
HTTP/1.0 clients). Every malformed request gets a JSON error in the OpenAI /
vLLM shape, with this module's limits and texts (`_protocol_error` maps h11's).
A fault that cuts a stream (server.py) aborts the transport itself; the
connection is never reused after a response that did not end cleanly.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import h11

__all__ = ["HttpError", "HttpRequest", "HttpResponder", "serve_connection"]

MAX_HEADER_LINE = 16_384
MAX_HEADERS = 100
# The whole request head (request line and headers) h11 buffers before it is complete.
MAX_HEAD = 256 * 1024
MAX_BODY = 4 << 20
READ_BYTES = 65_536
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
    501: "Not Implemented",
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
_CHUNKED_REFUSED = "chunked request bodies are not supported: send Content-Length"


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
        """h11's rule: HTTP/1.1 without `Connection: close` (HTTP/1.0 always closes)."""
        connection = self.headers.get("connection", "").lower()
        return self.version == "HTTP/1.1" and "close" not in connection


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
    """Writes one response through h11: either whole, or as a stream of chunks."""

    __slots__ = (
        "_chunked",
        "_connection",
        "_head_request",
        "_keep_alive",
        "_started",
        "reader",
        "writer",
    )

    def __init__(
        self,
        connection: h11.Connection,
        writer: asyncio.StreamWriter,
        keep_alive: bool,
        reader: asyncio.StreamReader | None = None,
        *,
        head_request: bool = False,
    ) -> None:
        self._connection = connection
        self.writer = writer
        # For long responses that must notice the client leaving while idle.
        self.reader = reader
        self._keep_alive = keep_alive
        self._head_request = head_request
        self._started = False
        self._chunked = False

    @property
    def keep_alive(self) -> bool:
        return self._keep_alive

    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        self._started = True
        headers.append(("Connection", "keep-alive" if self._keep_alive else "close"))
        response = h11.Response(
            status_code=status, headers=headers, reason=_REASONS.get(status, "OK")
        )
        return self._connection.send(response) or b""

    async def send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        *,
        head: bool = False,
    ) -> None:
        """A whole response; `head`: the headers a GET would get, without the body (HEAD)."""
        data = self._head(
            status, [("Content-Type", content_type), ("Content-Length", str(len(body)))]
        )
        if body and not (head or self._head_request):
            data += self._connection.send(h11.Data(data=body)) or b""
        data += self._connection.send(h11.EndOfMessage()) or b""
        self.writer.write(data)
        await self.writer.drain()

    async def send_error(self, status: int, message: str) -> None:
        await self.send(status, error_body(status, message))

    async def start_stream(
        self,
        content_type: str,
        chunked: bool,
        extra_headers: list[tuple[str, str]] | None = None,
    ) -> None:
        """Begin a streamed body of unknown length. h11 frames it chunked for an
        HTTP/1.1 client and close-delimited for an HTTP/1.0 one; `chunked` False
        closes the connection after it."""
        if not chunked:
            self._keep_alive = False
        headers = [("Content-Type", content_type)]
        headers += extra_headers or [("Cache-Control", "no-cache")]
        head = self._head(200, headers)
        self._chunked = b"transfer-encoding: chunked" in head.lower()
        self.writer.write(head)

    def write(self, data: bytes) -> None:
        # The body's framing as h11 writes it, without h11's per-call cost (26x the
        # framing itself, paid per chunk per stream): h11 keeps no state across a
        # chunked or close-delimited body's Data, and EndOfMessage still goes through it.
        # An empty chunk would read as the end of a chunked body: none is written.
        if not data:
            return
        if self._chunked:
            self.writer.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.writer.write(data)

    async def end_stream(self) -> None:
        self.writer.write(self._connection.send(h11.EndOfMessage()) or b"")
        await self.writer.drain()

    @property
    def started(self) -> bool:
        return self._started

    def close_after(self) -> None:
        """Close the connection once this response is done."""
        self._keep_alive = False


Handler = Callable[[HttpRequest, HttpResponder], Awaitable[None]]


def _protocol_error(error: h11.RemoteProtocolError) -> HttpError:
    """h11's complaint about a request, as this server's status and text."""
    text = str(error)
    if text.startswith(("illegal request line", "no request line")):
        return HttpError(400, "malformed request line")
    if text.startswith(("illegal header line", "continuation line")):
        return HttpError(400, "malformed header line")
    if text == "Receive buffer too long":
        return HttpError(431, f"request line and headers exceed {MAX_HEAD} bytes")
    if text == "bad Content-Length":
        return HttpError(400, "invalid Content-Length")
    if text.startswith("Only Transfer-Encoding: chunked"):
        return HttpError(
            411, "Transfer-Encoding request bodies are not supported: send Content-Length"
        )
    return HttpError(error.error_status_hint, text)


def _new_connection(received: bytes) -> h11.Connection:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
    connection.receive_data(received)
    return connection


class _Closed(Exception):
    """The client closed the connection before its request was complete."""


async def _read_request(
    reader: asyncio.StreamReader, received: bytes
) -> tuple[h11.Connection, HttpRequest] | None:
    """Read one request (`received`: bytes of it already read); None at a clean end
    of the connection (or when it stays idle)."""
    # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
    # cancellation (the server stopping) when the read it wraps completes in
    # the same loop iteration, and the request would be served after stop().
    try:
        async with asyncio.timeout(IDLE_SECONDS):
            while not received.strip():
                data = await reader.read(READ_BYTES)
                if not data:
                    return None
                received += data
    except TimeoutError:
        return None
    try:
        async with asyncio.timeout(REQUEST_SECONDS):
            return await _read_rest(reader, received)
    except TimeoutError:
        raise HttpError(408, f"request not received within {REQUEST_SECONDS:g} s") from None
    except h11.RemoteProtocolError as error:
        if "closed connection" in str(error):
            return None  # the client left mid-request: nobody to answer
        raise _protocol_error(error) from None
    except _Closed:
        return None


async def _next_event(connection: h11.Connection, reader: asyncio.StreamReader) -> object:
    """The next event of the request's body, reading as needed."""
    while True:
        event = connection.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await reader.read(READ_BYTES)
        connection.receive_data(data)  # b"": the client closed its side


async def _read_rest(
    reader: asyncio.StreamReader, received: bytes
) -> tuple[h11.Connection, HttpRequest]:
    connection = _new_connection(received)
    added_host = 0
    while True:
        try:
            event = connection.next_event()
        except h11.RemoteProtocolError as error:
            if str(error) != "Missing mandatory Host: header" or added_host:
                raise
            # h11 wants Host on HTTP/1.1 (RFC 9112 3.2); this server, on
            # loopback for its own clients, has no use for it and serves
            # requests without one: give the head an empty one and parse again.
            end = received.index(b"\n") + 1
            received = received[:end] + b"Host: \r\n" + received[end:]
            connection = _new_connection(received)
            added_host = 1
            continue
        if event is h11.NEED_DATA:
            data = await reader.read(READ_BYTES)
            received += data
            connection.receive_data(data)
            continue
        break
    if not isinstance(event, h11.Request):
        raise _Closed
    version = event.http_version.decode("ascii")
    if version not in ("1.1", "1.0"):
        raise HttpError(505, f"unsupported HTTP version HTTP/{version}: use HTTP/1.1")
    if len(event.target) > MAX_HEADER_LINE:
        raise HttpError(431, "request line too long")
    if len(event.headers) - added_host > MAX_HEADERS:
        raise HttpError(431, f"more than {MAX_HEADERS} request headers")
    headers: dict[str, str] = {}
    for name, value in event.headers:
        if len(name) + len(value) > MAX_HEADER_LINE:
            raise HttpError(431, "request header line too long")
        headers[name.decode("latin-1")] = value.decode("latin-1")
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise HttpError(411, _CHUNKED_REFUSED)
    length = int(headers.get("content-length", "0"))  # h11 checked it is a number
    if length > MAX_BODY:
        raise HttpError(413, f"request body of {length} bytes exceeds {MAX_BODY}")
    body = bytearray()
    while True:
        part = await _next_event(connection, reader)
        if isinstance(part, h11.Data):
            body += part.data
        elif isinstance(part, h11.EndOfMessage):
            break
        else:
            raise _Closed
    target = event.target.decode("latin-1")
    request = HttpRequest(
        method=event.method.decode("ascii"),
        path=target.split("?", 1)[0],
        version=f"HTTP/{version}",
        headers=headers,
        body=bytes(body),
    )
    return connection, request


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
) -> None:
    """Serve requests on one connection until it closes or a response ends it."""
    # Bytes of the next request read with the last one (a pipelining client).
    pending = b""
    try:
        while True:
            try:
                read = await _read_request(reader, pending)
            except HttpError as error:
                failed = h11.Connection(h11.SERVER)
                responder = HttpResponder(failed, writer, keep_alive=False)
                await responder.send_error(error.status, error.message)
                return
            if read is None:
                return
            connection, request = read
            responder = HttpResponder(
                connection,
                writer,
                keep_alive=request.keep_alive,
                reader=reader,
                head_request=request.method == "HEAD",
            )
            try:
                await handler(request, responder)
            except HttpError as error:
                if responder.started:
                    return
                await responder.send_error(error.status, error.message)
            if not responder.keep_alive or connection.our_state is not h11.DONE:
                return
            pending, closed = connection.trailing_data
            if closed and not pending.strip():
                return
    except (ConnectionError, h11.LocalProtocolError):
        return
    finally:
        try:
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass
