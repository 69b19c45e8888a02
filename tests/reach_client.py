"""Test-side HTTP client: a plain HTTP/1.1 client on a socket (TLS when the URL is https), so a
test controls every byte, the receive buffer and when it reads (the probe, the fleets' checks),
and a driver that runs streaming requests of one run and feeds their SSE into reconcilers.

Used by the reach and fleet tests (tests/netns/, tests/vllm/).
"""

from __future__ import annotations

import asyncio
import json
import socket
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from parallelhue.reference.sse import ChunkInputs

PROBE_PATH = "/v1/parallelhue"
# Prompts whose output mixes CJK, Hangul, emoji, accented Latin and code (multi-byte
# characters split across tokens), shared by the live reach tests.
MIXED_SCRIPT_PROMPTS = (
    "東京は日本の首都です。北京是中国的首都。 def add(x, y): return x + y",
    "絵文字 😀🚀🌈 and text: import os, sys; print(sys.argv)",
    "서울은 한국의 수도입니다. class Foo: pass # comment 🎉",
    "Ünïcödé façade — “quotes” … for i in range(10): yield i",
)


def _connect(url: str, cafile: str | None, rcvbuf: int | None, timeout: float) -> socket.socket:
    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    port = parts.port or (443 if parts.scheme == "https" else 80)
    raw = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        # Before connect: the advertised window stays small, so the server's writes back up.
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    raw.settimeout(timeout)
    raw.connect((host, port))
    if parts.scheme != "https":
        return raw
    context = ssl.create_default_context(cafile=cafile)
    return context.wrap_socket(raw, server_hostname=host)


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Connection:
    """One HTTP/1.1 connection; responses read with Content-Length or chunked framing."""

    def __init__(
        self,
        url: str,
        *,
        cafile: str | None = None,
        rcvbuf: int | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.host = urlsplit(url).netloc
        self.sock = _connect(url, cafile, rcvbuf, timeout)
        self._buffer = b""
        self._chunk_left = 0
        self._body_done = False

    def send(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> None:
        lines = [f"{method} {path} HTTP/1.1", f"Host: {self.host}"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        if (body or method == "POST") and "Content-Length" not in (headers or {}):
            lines.append(f"Content-Length: {len(body)}")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)

    def _fill(self) -> bool:
        data = self.sock.recv(1 << 16)
        if not data:
            return False
        self._buffer += data
        return True

    def read_head(self) -> tuple[int, dict[str, str]]:
        while b"\r\n\r\n" not in self._buffer:
            if not self._fill():
                raise ConnectionError("connection closed before the response head")
        head, self._buffer = self._buffer.split(b"\r\n\r\n", 1)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        self.headers = headers
        self._body_done = False
        return status, headers

    def read_body(self, method: str = "GET") -> bytes:
        if method == "HEAD":
            return b""
        if "content-length" in self.headers:
            length = int(self.headers["content-length"])
            while len(self._buffer) < length:
                if not self._fill():
                    raise ConnectionError("connection closed inside the body")
            body, self._buffer = self._buffer[:length], self._buffer[length:]
            return body
        parts = []
        while True:
            piece = self.read_some()
            if piece is None:
                return b"".join(parts)
            parts.append(piece)

    def read_some(self) -> bytes | None:
        """The next body bytes of a chunked response; None at its end (or the connection's)."""
        while True:
            if self._body_done:
                return None
            if self._chunk_left > 0:
                if not self._buffer and not self._fill():
                    self._body_done = True
                    return None
                piece = self._buffer[: self._chunk_left]
                self._buffer = self._buffer[len(piece) :]
                self._chunk_left -= len(piece)
                if self._chunk_left == 0:
                    self._chunk_left = -2  # the CRLF after the chunk
                return piece
            if self._chunk_left == -2:
                while len(self._buffer) < 2:
                    if not self._fill():
                        self._body_done = True
                        return None
                self._buffer = self._buffer[2:]
                self._chunk_left = 0
            while b"\r\n" not in self._buffer:
                if not self._fill():
                    self._body_done = True
                    return None
            size_line, self._buffer = self._buffer.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                self._body_done = True
                return None
            self._chunk_left = size

    def request(
        self, method: str, path: str, headers: dict[str, str] | None = None, body: bytes = b""
    ) -> Response:
        self.send(method, path, headers, body)
        status, response_headers = self.read_head()
        return Response(status, response_headers, self.read_body(method))

    @property
    def finished(self) -> bool:
        """The chunked body (or the connection) ended."""
        return self._body_done

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def request(
    url: str,
    method: str,
    path: str,
    *,
    api_key: str | None = None,
    cafile: str | None = None,
    body: bytes = b"",
    headers: dict[str, str] | None = None,
) -> Response:
    conn = Connection(url, cafile=cafile)
    try:
        return conn.request(method, path, {**auth(api_key), **(headers or {})}, body)
    finally:
        conn.close()


class StreamOut:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    status: int = 0
    error: str = ""
    # The C2 SSE inputs of this stream (with its index), in order, and
    # choice 0's finish_reason: what a second reconciler is fed to replay it.
    inputs: list[tuple[Any, ...]] = field(default_factory=list)
    finish_reason: str | None = None


def run_streams(
    url: str,
    run_id: str,
    bodies: Sequence[dict[str, Any]],
    reconcilers: Sequence[Any],
    *,
    api_key: str | None = None,
    cafile: str | None = None,
    chat: bool = True,
) -> list[StreamOut]:
    """One streaming request per body (ids ph1_<run>_<i>); each delta goes to every reconciler."""
    path = "/v1/chat/completions" if chat else "/v1/completions"
    outs = [StreamOut() for _ in bodies]

    async def one(client: httpx.AsyncClient, index: int, body: dict[str, Any]) -> None:
        out = outs[index]
        headers = {"X-Request-Id": f"ph1_{run_id}_{index}", **auth(api_key)}
        async with client.stream("POST", url + path, json=body, headers=headers) as response:
            out.status = response.status_code
            if response.status_code != 200:
                out.error = (await response.aread()).decode(errors="replace")
                return
            extraction = ChunkInputs()
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                items = [
                    (kind, index, *rest) for kind, *rest in extraction.extract_payload(line[6:])
                ]
                for item in items:
                    if item[0] == "sse":
                        out.text += item[2]
                        out.token_ids += item[3]
                out.inputs += items
                for reconciler in reconcilers:
                    reconciler.push_inputs(items)
            out.finish_reason = extraction.finish_reason
        for reconciler in reconcilers:
            reconciler.finish_sse(index, out.finish_reason)

    async def main() -> None:
        limits = httpx.Limits(max_connections=len(bodies) + 2)
        verify: Any = ssl.create_default_context(cafile=cafile) if cafile else True
        async with httpx.AsyncClient(
            limits=limits, timeout=httpx.Timeout(300.0), verify=verify
        ) as client:
            await asyncio.gather(*(one(client, i, b) for i, b in enumerate(bodies)))

    asyncio.run(main())
    return outs


def settle(reconciler: Any, streams: int, timeout: float = 10.0) -> list[tuple[str, str | None]]:
    """Wait for every stream's verdict (frames may trail the SSE a little), then finalize."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(reconciler.verdict(i)[0] != "pending" for i in range(streams)):
            break
        time.sleep(0.02)
    reconciler.finalize()
    return [reconciler.verdict(i) for i in range(streams)]
