"""A lean HTTP/1.1 transport under httpx, for the SSE streams.

httpx's own transport (httpcore + h11) walks every HTTP chunk through a Python
state machine: about 33 µs per chunk even when one network read holds twenty
(docs/benchmarks/client.md). A vLLM server sends one chunk per engine step per
stream, so at 64 streams that alone costs more CPU than the whole client may
use. This transport keeps httpx's API — requests, responses, headers,
timeouts, exceptions — and, for requests that ask for it with the
`parallelhue_lean` extension over plain `http://`, speaks HTTP/1.1 itself on an
asyncio protocol: one connection per request (`Connection: close`), the body
decoded in Rust. `LeanBody.detach` hands the connection, right after its
response head, to the Rust SSE reading thread (`stream_reader.py`), so reading
the body costs the Python interpreter nothing at all; Python only reads the
head and, by iteration, error bodies and non-SSE answers.

Everything else — `https://`, `/v1/models`, `/metrics`, any request without
the extension — goes to httpx's own transport unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import httpx

__all__ = ["LEAN_EXTENSION", "LeanBody", "LeanTransport", "lean_response"]

LEAN_EXTENSION = "parallelhue_lean"
# Longest response head (status line and headers) accepted.
MAX_HEAD_BYTES = 64 * 1024
# Buffered body bytes before reading pauses (only when read by iteration).
_HIGH_WATER = 256 * 1024


class _Connection(asyncio.Protocol):
    """One HTTP/1.1 exchange on one TCP connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, read_timeout: float | None) -> None:
        self._loop = loop
        self.read_timeout = read_timeout
        self.transport: asyncio.Transport | None = None
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._eof = False
        self._lost: Exception | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._last_read = loop.time()
        self._timer: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        self._buffer.append(data)
        self._buffered += len(data)
        if self._buffered > _HIGH_WATER and self.transport is not None:
            self.transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool:
        return False  # close our side too: one exchange per connection

    def connection_lost(self, exc: Exception | None) -> None:
        self._eof = True
        self._lost = exc
        self._wake()

    # --- reading ----------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _arm_timer(self) -> None:
        if self.read_timeout is not None and self._timer is None:
            self._timer = self._loop.call_at(
                self._last_read + self.read_timeout, self._check_timeout
            )

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check_timeout(self) -> None:
        # Re-armed from the last read, so a steady stream never pays for a timer per read.
        self._timer = None
        assert self.read_timeout is not None
        if self._loop.time() - self._last_read < self.read_timeout:
            self._arm_timer()
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(httpx.ReadTimeout(f"no data for {self.read_timeout:g} s"))

    async def read(self) -> bytes:
        """The next bytes read from the connection; b"" at the end."""
        while not self._buffer:
            if self._eof:
                if self._lost is not None:
                    raise httpx.ReadError(str(self._lost) or type(self._lost).__name__)
                return b""
            self._waiter = self._loop.create_future()
            self._arm_timer()
            try:
                await self._waiter
            finally:
                self._waiter = None
                self._cancel_timer()
        data = b"".join(self._buffer) if len(self._buffer) > 1 else self._buffer[0]
        self._buffer.clear()
        self._buffered = 0
        if self.transport is not None and not self._eof:
            self.transport.resume_reading()
        return data

    def unread(self, data: bytes) -> None:
        if data:
            self._buffer.insert(0, data)
            self._buffered += len(data)

    def detach(self) -> tuple[int, bytes]:
        """Stop reading here and hand the connection over: a duplicate of its
        descriptor (-1 if it already closed) and the bytes read but not consumed."""
        pending = b"".join(self._buffer)
        self._buffer.clear()
        self._buffered = 0
        self._cancel_timer()
        transport = self.transport
        if self._eof or transport is None or transport.is_closing():
            return -1, pending
        transport.pause_reading()
        sock = transport.get_extra_info("socket")
        return os.dup(sock.fileno()), pending

    def close(self) -> None:
        self._cancel_timer()
        if self.transport is not None:
            self.transport.close()


class LeanBody(httpx.AsyncByteStream):
    """A lean response's body: httpx iterates it (error bodies, non-SSE
    answers), and `response.extensions[LEAN_EXTENSION]` is this same object, so
    a stream can hand the connection over instead (`detach`)."""

    def __init__(self, connection: _Connection, framing: str, length: int | None) -> None:
        self._connection = connection
        self.framing = framing
        self.length = length

    @property
    def read_timeout(self) -> float | None:
        return self._connection.read_timeout

    def detach(self) -> tuple[int, bytes]:
        """(a duplicate descriptor, or -1 if the connection already closed;
        body bytes already read). The response still closes its own descriptor."""
        return self._connection.detach()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        from ._native import HttpBody

        decoder = HttpBody(self.framing, self.length)
        while not decoder.complete:
            data = await self._connection.read()
            try:
                if not data:
                    decoder.close()
                    return
                body = decoder.feed(data)
            except ValueError as error:
                raise httpx.RemoteProtocolError(str(error)) from None
            if body:
                yield body

    async def aclose(self) -> None:
        self._connection.close()


def _request_head(request: httpx.Request, body: bytes) -> bytes:
    target = request.url.raw_path or b"/"
    lines = [request.method.encode("ascii") + b" " + target + b" HTTP/1.1"]
    for name, value in request.headers.raw:
        if name.lower() in (b"connection", b"content-length", b"transfer-encoding"):
            continue
        lines.append(name + b": " + value)
    if body or request.method in ("POST", "PUT", "PATCH"):
        lines.append(b"Content-Length: " + str(len(body)).encode("ascii"))
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _parse_head(raw: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
    lines = raw.replace(b"\r\n", b"\n").split(b"\n")
    version, _, rest = lines[0].partition(b" ")
    code, _, reason = rest.partition(b" ")
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise httpx.RemoteProtocolError(
            f"not an HTTP/1.x status line: {lines[0][:80].decode('latin-1')!r}"
        )
    headers: list[tuple[bytes, bytes]] = []
    for line in lines[1:]:
        if not line:
            continue
        if line[:1] in (b" ", b"\t"):
            raise httpx.RemoteProtocolError("obsolete folded header line in the response")
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise httpx.RemoteProtocolError(
                f"malformed response header line: {line[:80].decode('latin-1')!r}"
            )
        headers.append((name, value.strip()))
    return int(code), reason, headers


def _framing(
    method: str, status: int, headers: list[tuple[bytes, bytes]]
) -> tuple[str, int | None]:
    """How the body ends (RFC 9112 §6.3)."""
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return "length", 0
    codings = [v for n, v in headers if n.lower() == b"transfer-encoding"]
    if codings:
        last = b",".join(codings).split(b",")[-1].strip().lower()
        return ("chunked", None) if last == b"chunked" else ("close", None)
    lengths = {v.strip() for n, v in headers if n.lower() == b"content-length"}
    if not lengths:
        return "close", None
    if len(lengths) > 1 or not next(iter(lengths)).isdigit():
        raise httpx.RemoteProtocolError("invalid Content-Length in the response")
    return "length", int(next(iter(lengths)))


class LeanTransport(httpx.AsyncBaseTransport):
    """httpx transport: lean HTTP/1.1 for marked plain-http requests, else `fallback`."""

    def __init__(self, fallback: httpx.AsyncBaseTransport) -> None:
        self._fallback = fallback

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not request.extensions.get(LEAN_EXTENSION) or request.url.scheme != "http":
            return await self._fallback.handle_async_request(request)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        loop = asyncio.get_running_loop()
        connection = _Connection(loop, timeouts.get("read"))
        host = request.url.host
        port = request.url.port or 80
        try:
            await asyncio.wait_for(
                loop.create_connection(lambda: connection, host, port),
                timeouts.get("connect"),
            )
        except TimeoutError:
            raise httpx.ConnectTimeout(f"connecting to {host}:{port} timed out") from None
        except OSError as error:
            raise httpx.ConnectError(str(error) or type(error).__name__) from error
        try:
            return await self._exchange(request, connection)
        except BaseException:
            connection.close()
            raise

    async def _exchange(self, request: httpx.Request, connection: _Connection) -> httpx.Response:
        transport = connection.transport
        assert transport is not None
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        body = await request.aread()
        transport.write(_request_head(request, body) + body)
        while True:
            status, reason, headers, rest = await self._read_head(connection)
            connection.unread(rest)
            if status == 101 or not 100 <= status < 200:
                break  # 1xx interim answers (100 Continue, 103) are skipped
        body_stream = LeanBody(connection, *_framing(request.method, status, headers))
        return httpx.Response(
            status_code=status,
            headers=headers,
            stream=body_stream,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": reason,
                LEAN_EXTENSION: body_stream,
            },
        )

    async def _read_head(
        self, connection: _Connection
    ) -> tuple[int, bytes, list[tuple[bytes, bytes]], bytes]:
        head = b""
        while True:
            data = await connection.read()
            if not data:
                raise httpx.RemoteProtocolError(
                    "the server closed the connection without sending a response"
                )
            head += data
            end = head.find(b"\r\n\r\n")
            size = 4
            if end < 0:
                end = head.find(b"\n\n")
                size = 2
            if end >= 0:
                status, reason, headers = _parse_head(head[:end])
                return status, reason, headers, head[end + size :]
            if len(head) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError(f"response head longer than {MAX_HEAD_BYTES} bytes")

    async def aclose(self) -> None:
        await self._fallback.aclose()


def lean_response(response: httpx.Response) -> LeanBody | None:
    """The `LeanBody` of a response this transport read, else None."""
    body = response.extensions.get(LEAN_EXTENSION)
    return body if isinstance(body, LeanBody) else None
