"""Small local HTTP servers for the client tests (asyncio, 127.0.0.1 only).

`FakeServer` answers each completion request according to its prompt, so one
run can mix healthy streams with every kind of failure:
  ok          three SSE chunks with token ids, a finish_reason, usage, [DONE]
  evil        SSE text full of terminal escapes and controls
  error500    HTTP 500 with a JSON error whose message has escapes and newlines
  error404    HTTP 404 with a plain-text body
  html        HTTP 200 with text/html instead of SSE
  disconnect  one SSE chunk, then the connection drops mid-body
  nofinish    one SSE chunk and [DONE] without any finish_reason
  error400    HTTP 400 with vLLM's JSON error for a prompt over the context length
  surrogate   a delta whose JSON text is a lone surrogate (\\ud800), then the rest
  noids       like ok, but without token_ids (only usage.completion_tokens counts them)
With `chunk_id` every chunk carries that id instead of one naming the request
(a server that ignores request ids: Ollama, llama.cpp). With `frames` (and the
client's `socket_dir`) it sends `frames(run_id, stream)` to the client's
telemetry socket before answering each request (a plugin's telemetry).
It runs its own event loop in a thread, so synchronous CLI calls can use it.
With `tls` (an ssl.SSLContext with the server's certificate) it speaks https.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

EVIL_TEXT = "A\x1b[2J\x1b]0;pwned\x07B\rC\u202eD\u200bE\x9b31mF\x07G"


def free_port() -> int:
    """A port nobody listens on (for refused-connection tests)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _sse(payload: Any) -> bytes:
    text = payload if isinstance(payload, str) else json.dumps(payload)
    return _chunk(f"data: {text}\n\n".encode())


def _delta(text: str, ids: list[int], finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if ids:  # a server that sends no token ids leaves the key out
        choice["token_ids"] = ids
    return {"id": "chatcmpl-x", "object": "chat.completion.chunk", "choices": [choice]}


class FakeServer:
    def __init__(
        self,
        models: list[str] | None = None,
        metrics: str | None = None,
        tls: ssl.SSLContext | None = None,
        models_status: int = 200,
        chunk_id: str | None = None,
        frames: Callable[[str, int], list[bytes]] | None = None,
        socket_dir: str | None = None,
    ) -> None:
        self.chunk_id = chunk_id
        self.completion_status = 200  # 401: every completion refuses the key
        self.frames = frames
        self.socket_dir = socket_dir
        self.models = ["fake-model"] if models is None else models
        self.tls = tls
        self.metrics = metrics
        self.models_status = models_status
        self.requests: list[dict[str, Any]] = []
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.base_events.Server | None = None
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.port = 0

    def __enter__(self) -> FakeServer:
        self._thread.start()
        future = asyncio.run_coroutine_threadsafe(self._start(), self.loop)
        future.result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0, ssl=self.tls)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (line.partition(":") for line in lines[1:] if line)
            }
            length = int(headers.get("content-length", "0"))
            body = await reader.readexactly(length) if length else b""
            await self._route(method, path, headers, body, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            with contextlib.suppress(Exception):
                writer.close()

    def _respond(self, writer: asyncio.StreamWriter, status: int, ctype: str, body: bytes) -> None:
        writer.write(
            f"HTTP/1.1 {status} X\r\ncontent-type: {ctype}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + body
        )

    async def _route(
        self,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes,
        writer: asyncio.StreamWriter,
    ) -> None:
        if method == "GET" and path.endswith("/models") and self.models_status != 200:
            error = {"error": {"message": "invalid api key", "code": self.models_status}}
            self._respond(
                writer, self.models_status, "application/json", json.dumps(error).encode()
            )
            return
        if method == "GET" and path.endswith("/models"):
            data = {"object": "list", "data": [{"id": m} for m in self.models]}
            self._respond(writer, 200, "application/json", json.dumps(data).encode())
            return
        if method == "GET" and path == "/metrics":
            if self.metrics is None:
                self._respond(writer, 404, "text/plain", b"not found")
            else:
                self._respond(writer, 200, "text/plain; version=0.0.4", self.metrics.encode())
            return
        if not path.endswith("/completions"):
            # A server without ParallelHue's route (e.g. /v1/parallelhue): like vLLM, 404.
            self._respond(writer, 404, "application/json", b'{"detail":"Not Found"}')
            return
        if self.completion_status != 200:
            error = {"error": {"message": "invalid api key", "code": self.completion_status}}
            body_out = json.dumps(error).encode()
            self._respond(writer, self.completion_status, "application/json", body_out)
            return
        request = json.loads(body)
        request["_headers"] = headers
        self.requests.append(request)
        messages = request.get("messages")
        prompt = messages[0]["content"] if messages else request.get("prompt", "")
        request_id = headers.get("x-request-id", "x")
        if self.frames is not None:
            self._send_frames(request_id)
        await self._complete(prompt, writer, request_id)

    def _send_frames(self, request_id: str) -> None:
        from parallelhue_vllm.paths import socket_path

        _, run_id, stream = request_id.split("_")
        assert self.frames is not None and self.socket_dir is not None
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(socket_path(self.socket_dir, run_id))
            for frame in self.frames(run_id, int(stream)):
                sock.send(frame)

    async def _complete(
        self, prompt: str, writer: asyncio.StreamWriter, request_id: str = "x"
    ) -> None:
        # Chunk ids carry the request id, as vLLM's do (chatcmpl-<X-Request-Id>).
        def sse(payload: Any) -> bytes:
            if isinstance(payload, dict) and "id" in payload:
                payload = {**payload, "id": self.chunk_id or f"chatcmpl-{request_id}"}
            return _sse(payload)

        if prompt == "error500":
            error = {"error": {"message": "boom\x1b[31m red\nsecond line", "code": 500}}
            self._respond(writer, 500, "application/json", json.dumps(error).encode())
            return
        if prompt == "error400":
            error = {
                "object": "error",
                "message": "This model's maximum context length is 8 tokens.",
                "type": "BadRequestError",
                "code": 400,
            }
            self._respond(writer, 400, "application/json", json.dumps(error).encode())
            return
        if prompt == "error404":
            self._respond(writer, 404, "text/plain", b"no such\troute\n")
            return
        if prompt == "html":
            self._respond(writer, 200, "text/html; charset=utf-8", b"<html>hi</html>")
            return
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        )
        if prompt == "disconnect":
            writer.write(sse(_delta("partial ", [7])))
            await writer.drain()
            return  # closing without the final chunk: a broken body
        if prompt == "stall":
            writer.write(sse(_delta("slow ", [7])))
            await writer.drain()
            await asyncio.sleep(3.0)  # longer than the test's --timeout
            return
        if prompt == "badchunk":
            writer.write(sse(_delta("ok ", [7])) + b"zz\r\n")
            await writer.drain()
            return
        if prompt == "nofinish":
            writer.write(sse(_delta("half", [7])) + _sse("[DONE]") + _chunk(b""))
            await writer.drain()
            return
        if prompt == "surrogate":
            writer.write(_sse(_delta("\ud800", [9])))
        text = EVIL_TEXT if prompt == "evil" else "Hello"
        ids: list[list[int]] = [[], [], []] if prompt == "noids" else [[1, 2], [3], [4]]
        parts = [
            sse({"id": "", "choices": [{"index": 0, "delta": {"role": "assistant"}}]}),
            sse(_delta(text, ids[0])),
            sse(_delta(" world", ids[1])),
            sse(_delta("!", ids[2], "stop")),
            sse({"id": "", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 4}}),
            _sse("[DONE]"),
            _chunk(b""),
        ]
        for part in parts:
            writer.write(part)
            await writer.drain()
