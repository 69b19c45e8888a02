"""The lean HTTP/1.1 transport (transport.py), the Rust SSE reading thread
(stream_reader.py, `_native.SseReader`) and the body decoder (`_native.HttpBody`)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import pytest

from parallelhue.stream_reader import NativeStreamReader
from parallelhue.transport import LEAN_EXTENSION, LeanTransport, lean_response

native = pytest.importorskip("parallelhue._native")
if not hasattr(native, "SseReader"):
    pytest.skip("the Rust SSE reader needs Unix", allow_module_level=True)

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@contextlib.asynccontextmanager
async def serve(handler: Handler) -> AsyncIterator[str]:
    """A one-off HTTP server whose every connection runs `handler` (after the request)."""
    requests: list[bytes] = []

    async def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = await reader.readexactly(length) if length else b""
            requests.append(head + body)
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(on_connect, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        serve.requests = requests  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def client() -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=LeanTransport(httpx.AsyncHTTPTransport()),
        timeout=httpx.Timeout(5.0),
        headers={"Authorization": "Bearer sk-x", "Connection": "keep-alive"},
    )


def respond(raw: bytes) -> Handler:
    async def handler(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return handler


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def event(text: str, ids: list[int], finish: str | None = None) -> bytes:
    import json

    choice = {"index": 0, "delta": {"content": text}, "token_ids": ids, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


# --- the transport, through httpx's API ------------------------------------------


def test_request_is_http11_with_connection_close_and_one_content_length() -> None:
    async def main() -> tuple[int, bytes, bytes]:
        raw = b"HTTP/1.1 201 Made\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello+garbage"
        async with serve(respond(raw)) as url, client() as c:
            response = await c.post(
                url + "/v1/x?q=1", json={"a": 1}, extensions={LEAN_EXTENSION: True}
            )
            return response.status_code, response.content, serve.requests[0]  # type: ignore[attr-defined]

    status, content, request = asyncio.run(main())
    assert (status, content) == (201, b"hello")
    head, _, body = request.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x?q=1 HTTP/1.1"
    lowered = [line.lower() for line in lines]
    assert lowered.count(b"connection: close") == 1 and b"connection: keep-alive" not in lowered
    assert [line for line in lowered if line.startswith(b"content-length")] == [
        b"content-length: %d" % len(body)
    ]
    assert b"authorization: bearer sk-x" in lowered
    assert body == b'{"a":1}'


def test_error_body_chunked_and_interim_response_are_read() -> None:
    async def main() -> tuple[int, str, str]:
        raw = (
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 500 Oops\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunked(b'{"error":', b' "boom"}')
        )
        async with serve(respond(raw)) as url, client() as c:
            response = await c.post(url + "/v1/x", json={}, extensions={LEAN_EXTENSION: True})
            return response.status_code, response.text, response.reason_phrase

    assert asyncio.run(main()) == (500, '{"error": "boom"}', "Oops")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"HTTP/2 200 OK\r\n\r\n", "not an HTTP/1.x status line: 'HTTP/2 200 OK'"),
        (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n",
         "malformed response header line: 'broken header'"),
        (b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n", "obsolete folded header line in the response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
         "invalid Content-Length in the response"),
        (b"", "the server closed the connection without sending a response"),
    ],
)  # fmt: skip
def test_bad_response_heads_are_protocol_errors(raw: bytes, message: str) -> None:
    async def main() -> str:
        async with serve(respond(raw)) as url, client() as c:
            with pytest.raises(httpx.RemoteProtocolError) as caught:
                await c.post(url + "/v1/x", json={}, extensions={LEAN_EXTENSION: True})
            return str(caught.value)

    assert asyncio.run(main()) == message


def test_body_cut_short_and_bad_chunk_are_protocol_errors() -> None:
    async def main(raw: bytes) -> str:
        async with serve(respond(raw)) as url, client() as c:
            with pytest.raises(httpx.RemoteProtocolError) as caught:
                await c.post(url + "/v1/x", json={}, extensions={LEAN_EXTENSION: True})
            return str(caught.value)

    cut = b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf"
    assert asyncio.run(main(cut)) == (
        "the connection closed before the end of the Content-Length body"
    )
    bad = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabcXX"
    assert asyncio.run(main(bad)) == "chunk data not followed by CRLF"


def test_refused_connection_and_read_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    async def refused() -> BaseException | None:
        async with client() as c:
            with pytest.raises(httpx.ConnectError) as caught:
                await c.post(f"http://127.0.0.1:{port}/", extensions={LEAN_EXTENSION: True})
            return caught.value.__cause__

    assert isinstance(asyncio.run(refused()), ConnectionRefusedError)

    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(2)

    async def timeout() -> float:
        async with serve(silent) as url, client() as c:
            started = time.monotonic()
            with pytest.raises(httpx.ReadTimeout):
                await c.post(url + "/", extensions={LEAN_EXTENSION: True, "timeout": {"read": 0.2}})
            return time.monotonic() - started

    assert 0.15 < asyncio.run(timeout()) < 1.5


def test_unmarked_and_https_requests_use_the_fallback() -> None:
    seen: list[httpx.Request] = []

    class Fallback(httpx.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
            seen.append(request)
            return httpx.Response(204)

    async def main() -> None:
        async with httpx.AsyncClient(transport=LeanTransport(Fallback())) as c:
            plain = await c.get("http://127.0.0.1:9/metrics")
            tls = await c.post("https://127.0.0.1:9/v1/x", extensions={LEAN_EXTENSION: True})
            assert lean_response(plain) is None and lean_response(tls) is None

    asyncio.run(main())
    assert [str(r.url) for r in seen] == ["http://127.0.0.1:9/metrics", "https://127.0.0.1:9/v1/x"]


# --- the Rust reading thread -----------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.texts: list[str] = []
        self.times: list[float] = []
        self.tokens = 0
        self.bytes = 0

    def on_reads(
        self, stream: int, texts: list[str], times: list[float], tokens: int, text_bytes: int
    ) -> None:
        assert stream == 1
        self.texts.extend(texts)
        self.times.extend(times)
        self.tokens += tokens
        self.bytes += text_bytes


def read_with_thread(handler: Handler, reconciler: Any = None) -> tuple[Any, Sink, float, float]:
    async def main() -> tuple[Any, Sink, float, float]:
        sink = Sink()
        reader = NativeStreamReader.create(reconciler, sink)
        assert reader is not None
        try:
            async with serve(handler) as url, client() as c:
                before = time.monotonic()
                async with c.stream(
                    "POST", url + "/v1/x", json={}, extensions={LEAN_EXTENSION: True}
                ) as response:
                    lean = lean_response(response)
                    assert lean is not None and lean.framing == "chunked"
                    ended = await reader.read(1, lean)
                reader.collect()
                return ended, sink, before, time.monotonic()
        finally:
            reader.close()

    return asyncio.run(main())


def test_thread_reads_a_stream_split_anywhere_into_sink_and_reconciler() -> None:
    body = chunked(
        event("h\u00e9", [5, 6]), event("", [7]), event("\u4e16!", [8], "stop"), b"data: [DONE]\n\n"
    )

    async def dribble(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = SSE_HEAD + body
        for start in range(0, len(raw), 7):  # split inside heads, chunks and UTF-8
            writer.write(raw[start : start + 7])
            await writer.drain()
            await asyncio.sleep(0.001)

    reconciler = native.Reconciler("00" * 16, 2)
    ended, sink, before, after = read_with_thread(dribble, reconciler)
    assert (ended.end, ended.message, ended.finish_reason) == ("done", None, "stop")
    assert sink.texts == ["h\u00e9", "\u4e16!"]
    assert (len(sink.times), sink.tokens, sink.bytes) == (3, 4, len("h\u00e9\u4e16!".encode()))
    # Arrival times are on time.monotonic()'s clock, in order.
    assert before <= sink.times[0] <= sink.times[-1] <= after
    assert sink.times == sorted(sink.times)
    # The reconciler saw exactly what push_sse would have given it.
    twin = native.Reconciler("00" * 16, 2)
    for text, ids in (("h\u00e9", [5, 6]), ("", [7]), ("\u4e16!", [8])):
        twin.push_sse(1, text, ids)
    for r in (reconciler, twin):
        r.finish_sse(1)
        r.finalize()
    assert reconciler.verdict(1) == twin.verdict(1)
    assert reconciler.verdict(1)[0] == "failed"  # no telemetry here


@pytest.mark.parametrize(
    ("tail", "end", "message"),
    [
        (b"", "cut", "the connection closed before the end of the chunked body"),
        (b"zz\r\n", "framing", 'invalid chunk size line "zz" in a chunked body'),
        (
            b"%x\r\ndata: {oops\n\n\r\n" % len(b"data: {oops\n\n"),
            "error",
            "invalid JSON in SSE data: key must be a string at line 1 column 2",
        ),
        (b"0\r\n\r\n", "eof", None),
    ],
)
def test_thread_reports_how_a_body_ended(tail: bytes, end: str, message: str | None) -> None:
    first = event("a", [1])
    raw = SSE_HEAD + b"%x\r\n%s\r\n" % (len(first), first) + tail
    ended, sink, _before, _after = read_with_thread(respond(raw))
    assert (ended.end, ended.message) == (end, message)
    assert sink.texts == ["a"]


def test_sse_reader_rejects_bad_arguments_with_exact_errors() -> None:
    reconciler = native.Reconciler("00" * 16, 2)
    reader = native.SseReader(reconciler)
    try:
        with pytest.raises(ValueError) as caught:
            reader.add(2, -1, "close", None, b"", None)
        assert str(caught.value) == "stream 2 out of range 0..2"
        with pytest.raises(ValueError) as caught:
            reader.add(-1, -1, "close", None, b"", None)
        assert str(caught.value) == "stream -1 out of range 0..2"
        with pytest.raises(ValueError) as caught:
            reader.add(0, -1, "length", None, b"", None)
        assert str(caught.value) == (
            "framing must be 'chunked', 'close' or 'length' with a length, got \"length\" with None"
        )
        with pytest.raises(ValueError) as caught:
            reader.add(0, -1, "close", None, b"", 0.0)
        assert str(caught.value) == "timeout must be positive, got 0"
    finally:
        reader.close()
    assert reader.closed
    with pytest.raises(ValueError) as caught:
        native.SseReader(None, 2.0)
    assert str(caught.value) == "min_interval must be between 0 and 1 s, got 2"


def test_http_body_decoder() -> None:
    body = native.HttpBody("chunked")
    assert body.feed(b"3\r\nabc\r\n2") + body.feed(b"\r\nde\r\n0\r\n\r\n") == b"abcde"
    assert body.complete
    cut = native.HttpBody("length", 4)
    assert cut.feed(b"ab") == b"ab" and not cut.complete
    with pytest.raises(ValueError) as caught:
        cut.close()
    assert str(caught.value) == "the connection closed before the end of the Content-Length body"
    with pytest.raises(ValueError) as caught:
        native.HttpBody("gzip")
    assert "framing must be 'chunked', 'close' or 'length'" in str(caught.value)


def test_a_failing_sink_reaches_the_waiting_stream_instead_of_hanging() -> None:
    class Broken(Sink):
        def on_reads(self, *args: Any) -> None:
            raise RuntimeError("sink broke")

    async def main() -> str:
        reader = NativeStreamReader.create(None, Broken())
        assert reader is not None
        raw = SSE_HEAD + chunked(event("a", [1]), b"data: [DONE]\n\n")
        try:
            async with serve(respond(raw)) as url, client() as c:
                async with c.stream(
                    "POST", url + "/v1/x", json={}, extensions={LEAN_EXTENSION: True}
                ) as response:
                    lean = lean_response(response)
                    assert lean is not None
                    with pytest.raises(RuntimeError) as caught:
                        await asyncio.wait_for(reader.read(1, lean), 10)
                    return str(caught.value)
        finally:
            reader.close()

    assert asyncio.run(main()) == "sink broke"


def test_a_dead_reader_thread_fails_the_waiting_streams() -> None:
    class DeadThread:
        failed = True

        def __init__(self, *_args: Any) -> None:
            self.removed: list[int] = []

        def add(self, *_args: Any) -> None:
            pass

        def remove(self, stream: int) -> None:
            self.removed.append(stream)

        def take(self) -> tuple[list[Any], list[Any]]:
            return [], []

        def close(self) -> None:
            pass

    class Response:
        framing, length, read_timeout = "close", None, None

        def detach(self) -> tuple[int, bytes]:
            return -1, b""

    async def main() -> str:
        reader = NativeStreamReader(DeadThread, None, Sink())
        try:
            with pytest.raises(RuntimeError) as caught:
                await asyncio.wait_for(reader.read(3, Response()), 5)  # type: ignore[arg-type]
            return str(caught.value)
        finally:
            reader.close()

    assert asyncio.run(main()) == "the Rust SSE reading thread stopped unexpectedly"
