"""The shipped path's HTTP side: `_native.HttpStreams` driven by `ingest.RustIngest`.

Each test serves canned bytes from a local asyncio server and checks what the
Rust thread sent, what reached the reconciler and the screen model, and the
one-line message every kind of end gets (stream_errors.end_message).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from parallelhue.ingest.feed import Feed
from parallelhue.ingest.streams import StreamRequest
from parallelhue.model.backend import Backend
from parallelhue.model.state import RunModel, StreamState

native = pytest.importorskip("parallelhue._native")
if not hasattr(native, "HttpStreams"):
    pytest.skip("the Rust HTTP thread needs Unix", allow_module_level=True)

from parallelhue.ingest import native as ingest_module  # noqa: E402
from parallelhue.ingest.native import RustIngest  # noqa: E402

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
RUN_ID = "00" * 16


@contextlib.asynccontextmanager
async def serve(handler: Handler, requests: list[bytes]) -> AsyncIterator[str]:
    """A one-off HTTP server whose every connection runs `handler` (after the request)."""

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
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


def respond(raw: bytes) -> Handler:
    async def handler(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return handler


def chunked(*parts: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def event(text: str, ids: list[int], finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": text}, "token_ids": ids, "finish_reason": finish}
    return b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n"


SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
)


def new_model(n: int) -> RunModel:
    return RunModel(
        streams=[StreamState(index=i, mode="auto") for i in range(n)],
        mode="auto",
        backend=Backend("generic", False, "test"),
        no_color=True,
    )


class Ran:
    def __init__(self, model: RunModel, ingest: RustIngest, requests: list[bytes]) -> None:
        self.model = model
        self.ingest = ingest
        self.requests = requests
        self.before = 0.0
        self.after = 0.0


def run_ingest(
    handler: Handler,
    n: int = 1,
    *,
    timeout: float = 5.0,
    url: str | None = None,
    between: Callable[[RustIngest], None] | None = None,
) -> Ran:
    """Every stream through RustIngest against `handler`, until each ended."""

    async def main() -> Ran:
        requests: list[bytes] = []
        async with serve(handler, requests) as served:
            model = new_model(n)
            feed = Feed(model, timeout=timeout)
            ingest = RustIngest(
                model,
                feed,
                run_id=RUN_ID,
                endpoint=(url or served) + "/v1/x?q=1",
                api_key="sk-x",
                timeout=timeout,
                telemetry=None,
                min_interval=0.0,
            )
            ingest.begin(
                [(StreamRequest(i, f"ph1_{RUN_ID}_{i}", "hi", i), {"a": i}) for i in range(n)]
            )
            ran = Ran(model, ingest, requests)
            try:
                ran.before = time.monotonic()
                ingest.start()
                deadline = time.monotonic() + 20
                while not ingest.streams_done():
                    assert time.monotonic() < deadline, "the streams never ended"
                    await asyncio.sleep(0.005)
                    ingest.poll()
                    if between is not None:
                        between(ingest)
                ran.after = time.monotonic()
            finally:
                ingest.close()
            return ran

    return asyncio.run(main())


# --- the request -------------------------------------------------------------------


def test_request_is_http11_with_connection_close_and_one_content_length() -> None:
    ran = run_ingest(respond(SSE_HEAD + chunked(event("a", [1], "stop"), b"data: [DONE]\n\n")))
    head, _, body = ran.requests[0].partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"POST /v1/x?q=1 HTTP/1.1"
    lowered = [line.lower() for line in lines]
    assert lowered.count(b"connection: close") == 1 and b"connection: keep-alive" not in lowered
    assert [line for line in lowered if line.startswith(b"content-length")] == [
        b"content-length: %d" % len(body)
    ]
    assert b"authorization: bearer sk-x" in lowered
    assert f"x-request-id: ph1_{RUN_ID}_0".encode() in lowered
    assert b"accept-encoding: identity" in lowered
    assert body == b'{"a":0}'
    assert ran.model.streams[0].finish_reason == "stop"


def test_bad_headers_and_arguments_are_exact_errors() -> None:
    reconciler = native.Reconciler(RUN_ID, 2)
    streams = native.HttpStreams(reconciler, "127.0.0.1", 9, False, "127.0.0.1:9", 1.0, None)
    try:
        with pytest.raises(ValueError) as caught:
            streams.add(2, "POST", "/", [], b"")
        assert str(caught.value) == "stream 2 out of range 0..2"
        with pytest.raises(ValueError) as caught:
            streams.add(-1, "POST", "/", [], b"")
        assert str(caught.value) == "stream -1 out of range 0..2"
        with pytest.raises(ValueError) as caught:
            streams.add(0, "POST", "/", [("X-A", "1\r\nX-Evil: 2")], b"")
        assert str(caught.value) == "the value of header X-A holds a line break or NUL"
    finally:
        streams.close()
    assert streams.closed
    with pytest.raises(ValueError) as caught:
        native.HttpStreams(reconciler, "h", 1, False, "h", 1.0, None, min_interval=2.0)
    assert str(caught.value) == "min_interval must be between 0 and 1 s, got 2"
    with pytest.raises(ValueError) as caught:
        native.HttpStreams(reconciler, "h", 1, False, "h", 1.0, 0.0)
    assert str(caught.value) == "read_timeout must be positive, got 0"


# --- the body, read by the thread ------------------------------------------------


def test_a_stream_split_anywhere_reaches_reconciler_and_model() -> None:
    body = chunked(
        event("h\u00e9", [5, 6]), event("", [7]), event("\u4e16!", [8], "stop"), b"data: [DONE]\n\n"
    )

    async def dribble(_r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raw = SSE_HEAD + body
        for start in range(0, len(raw), 7):  # split inside heads, chunks and UTF-8
            writer.write(raw[start : start + 7])
            await writer.drain()
            await asyncio.sleep(0.001)

    ran = run_ingest(dribble, 2 - 1)
    state = ran.model.streams[0]
    assert (state.sse_finished, state.finish_reason, state.error) == (True, "stop", None)
    assert list(state.chunks) == ["h\u00e9", "\u4e16!"]
    assert state.text == "h\u00e9\u4e16!"
    assert (len(state.delta_times), state.sse_tokens) == (3, 4)
    assert state.sse_byte_count == len("h\u00e9\u4e16!".encode())
    # Arrival times are on time.monotonic()'s clock, in order; the start is before them.
    assert state.started_at is not None
    assert ran.before <= state.started_at <= state.delta_times[0] <= ran.after
    assert list(state.delta_times) == sorted(state.delta_times)
    # The reconciler saw exactly what push_sse would have given it, and the
    # thread finished the stream itself.
    twin = native.Reconciler(RUN_ID, 1)
    twin.push_sse_id(0, "")  # the chunks have no id
    for text, ids in (("h\u00e9", [5, 6]), ("", [7]), ("\u4e16!", [8])):
        twin.push_sse(0, text, ids)
    twin.finish_sse(0, "stop")
    reconciler = ran.ingest.reconciler
    for r in (reconciler, twin):
        r.finalize()
    assert reconciler.verdict(0) == twin.verdict(0)
    assert reconciler.verdict(0)[0] == "failed"  # no telemetry here


def head_then(tail: bytes) -> bytes:
    first = event("a", [1])
    return SSE_HEAD + b"%x\r\n%s\r\n" % (len(first), first) + tail


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (head_then(b""), "the server closed the connection mid-stream"),
        (head_then(b"zz\r\n"), 'invalid HTTP body: invalid chunk size line "zz" in a chunked body'),
        (
            SSE_HEAD + b"3\r\nabcXX",
            "invalid HTTP body: chunk data not followed by CRLF",
        ),
        (
            head_then(b"%x\r\ndata: {oops\n\n\r\n" % len(b"data: {oops\n\n")),
            "bad SSE data: invalid JSON in SSE data: key must be a string at line 1 column 2",
        ),
        (
            head_then(b"0\r\n\r\n"),
            "the stream ended without a finish_reason (server closed it early)",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\ncontent-type: text/event-stream\r\n\r\nhalf",
            "the server closed the connection mid-stream",
        ),
        (
            b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 500 Oops\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunked(b'{"error":', b' "boom"}'),
            "HTTP 500: boom",
        ),
        (
            b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n"
            b"content-length: 2\r\n\r\nhi",
            "not an SSE stream: the server answered text/html (HTTP 200); "
            "is --endpoint a streaming completions URL?",
        ),
        (
            b"HTTP/2 200 OK\r\n\r\n",
            "invalid HTTP response: not an HTTP/1.x status line: 'HTTP/2 200 OK'",
        ),
        (
            b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n",
            "invalid HTTP response: malformed response header line: 'broken header'",
        ),
        (
            b"HTTP/1.1 200 OK\r\n folded: x\r\n\r\n",
            "invalid HTTP response: obsolete folded header line in the response",
        ),
        (
            b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
            "invalid HTTP response: invalid Content-Length in the response",
        ),
        (b"", "the server closed the connection without sending a response"),
    ],
)  # fmt: skip
def test_every_end_has_its_one_line_message(raw: bytes, message: str) -> None:
    ran = run_ingest(respond(raw))
    assert ran.model.streams[0].error == message


def test_refused_connection_and_read_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ran = run_ingest(respond(b""), url=f"http://127.0.0.1:{port}")
    assert ran.model.streams[0].error == (
        f"cannot connect to 127.0.0.1:{port}: connection refused (is the server running?)"
    )

    async def silent(_r: asyncio.StreamReader, _w: asyncio.StreamWriter) -> None:
        await asyncio.sleep(2)

    ran = run_ingest(silent, timeout=0.2)
    assert ran.model.streams[0].error == "no data from the server for 0.2 s (raise --timeout)"
    assert 0.15 < ran.after - ran.before < 1.5


def test_a_cancelled_stream_ends_as_cancelled_and_the_others_go_on() -> None:
    async def slow_or_fast(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(SSE_HEAD)
        await writer.drain()
        await asyncio.sleep(0.3)
        writer.write(chunked(event("ok", [1], "stop"), b"data: [DONE]\n\n"))
        await writer.drain()

    cancelled: list[int] = []

    def cancel_first(ingest: RustIngest) -> None:
        if not cancelled:
            cancelled.append(0)
            ingest.cancel(0)

    ran = run_ingest(slow_or_fast, 3, between=cancel_first)
    states = ran.model.streams
    assert [s.cancelled for s in states] == [True, False, False]
    # (The others failed at once: these chunks carry no id, which no exact stream lacks.)
    assert [s.label for s in states] == ["CANCELLED", "SSE CHUNK MODE", "SSE CHUNK MODE"]
    assert [s.text for s in states] == ["", "ok", "ok"]


# --- one stream's failure is its own ----------------------------------------------


def test_an_exception_handling_one_stream_fails_only_that_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    original = StreamState.add_text

    def broken(self: StreamState, *args: Any) -> None:
        if self.index == 1:
            raise RuntimeError("screen model broke")
        original(self, *args)

    monkeypatch.setattr(StreamState, "add_text", broken)
    ran = run_ingest(respond(SSE_HEAD + chunked(event("x", [1], "stop"), b"data: [DONE]\n\n")), 3)
    states = ran.model.streams
    assert states[1].error == "internal error in this stream: RuntimeError: screen model broke"
    assert [s.error for s in (states[0], states[2])] == [None, None]
    assert [s.text for s in states] == ["x", "", "x"]


def test_a_dead_http_thread_fails_every_unfinished_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    class DeadThread:
        failed = True
        closed = False

        def __init__(self, *_args: Any, **_kwargs: Any) -> None:
            pass

        def add(self, *_args: Any) -> float:
            return time.monotonic()

        def cancel(self, _stream: int) -> None:
            pass

        def close(self) -> None:
            self.closed = True

    monkeypatch.setattr(ingest_module._native, "HttpStreams", DeadThread)
    ran = run_ingest(respond(b""), 2)
    assert [s.error for s in ran.model.streams] == [
        "internal error in this stream: the Rust HTTP thread stopped unexpectedly"
    ] * 2


def test_a_connect_that_never_completes_times_out_in_one_line() -> None:
    # A listener whose accept queue is full drops further SYNs: connect() hangs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(8):
            filler = socket.socket()
            filler.setblocking(False)
            with contextlib.suppress(BlockingIOError):
                filler.connect(("127.0.0.1", port))
            fillers.append(filler)
        time.sleep(0.1)
        ran = run_ingest(respond(b""), url=f"http://127.0.0.1:{port}", timeout=0.3)
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert ran.model.streams[0].error == "connecting timed out after 0.3 s"
    assert 0.25 < ran.after - ran.before < 2.0
