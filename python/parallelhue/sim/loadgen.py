"""A lean client for tests and benchmarks: N concurrent streams, one reconciler.

It does what the real client does for reconciliation (bind the run's socket,
send `ph1_<run>_<i>` request ids with `return_token_ids`, push SSE deltas and
frames into a reconciler, wait for verdicts, finalize), without any rendering,
so that tests can drive the simulated engine and benchmarks can measure the
receiving path alone.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from parallelhue.receiver import NativeReceiver, PyReceiver
from parallelhue.reconciler import ReconcilerLike, make_reconciler
from parallelhue_vllm import paths, wire

__all__ = ["SessionResult", "run_session"]


@dataclass(slots=True)
class SessionResult:
    run_id: str
    verdicts: list[tuple[str, str | None]]
    events: list[tuple[Any, ...]]
    counters: dict[str, int]
    totals: dict[str, Any]
    receiver: dict[str, int]
    sse_chunks: int = 0
    sse_tokens: int = 0
    texts: list[str] = field(default_factory=list)
    token_ids: list[list[int]] = field(default_factory=list)
    finish_reasons: list[str | None] = field(default_factory=list)
    sources: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    http_elapsed: float = 0.0

    def reasons(self) -> list[str | None]:
        return [reason for _, reason in self.verdicts]


class _StreamOut:
    """What one stream's SSE deltas do, whichever way they were read: counted,
    kept, pushed into the reconciler; at the end, finished and stored."""

    def __init__(self, stream: int, reconciler: ReconcilerLike, result: SessionResult) -> None:
        self.stream = stream
        self.reconciler = reconciler
        self.result = result
        self.texts: list[str] = []
        self.ids: list[int] = []
        self.finish: str | None = None

    def add(self, text: str, token_ids: list[int], finish_reason: str | None) -> None:
        if not text and not token_ids:
            return
        self.result.sse_chunks += 1
        self.result.sse_tokens += len(token_ids)
        self.texts.append(text)
        self.ids.extend(token_ids)
        self.reconciler.push_sse(self.stream, text, token_ids)
        if finish_reason is not None:
            self.finish = finish_reason

    def close(self) -> None:
        if self.finish is not None:
            self.reconciler.finish_sse(self.stream)
        self.result.texts[self.stream] = "".join(self.texts)
        self.result.token_ids[self.stream] = self.ids
        self.result.finish_reasons[self.stream] = self.finish


async def _one_stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict[str, Any],
    request_id: str,
    stream: int,
    reconciler: ReconcilerLike,
    result: SessionResult,
    chat: bool,
) -> None:
    out = _StreamOut(stream, reconciler, result)
    async with client.stream(
        "POST", url, json=body, headers={"X-Request-Id": request_id}
    ) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            if chat:
                text = (choice.get("delta") or {}).get("content") or ""
            else:
                text = choice.get("text") or ""
            out.add(text, choice.get("token_ids") or [], choice.get("finish_reason"))
            # While the socket holds buffered data, httpx returns without
            # suspending: yield so the receiver and the other streams run.
            await asyncio.sleep(0)
    out.close()


class _PySse:
    """SSE parsing in Python: `data:` lines, JSON, the first choice."""

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[tuple[str, list[int], str | None]]:
        self._buffer += data
        *lines, self._buffer = self._buffer.split(b"\n")
        events = []
        for line in lines:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            choices = json.loads(line[6:]).get("choices") or []
            if not choices:
                continue
            choice = choices[0]
            delta = choice.get("delta")
            text = (delta or {}).get("content") or "" if delta is not None else choice.get("text")
            events.append((text or "", choice.get("token_ids") or [], choice.get("finish_reason")))
        return events


class _RustSse:
    """SSE parsing in the Rust core (`parallelhue._native.SseParser`)."""

    def __init__(self) -> None:
        from parallelhue._native import SseParser

        self._parser = SseParser()

    def feed(self, data: bytes) -> list[tuple[str, list[int], str | None]]:
        events = []
        for event in self._parser.feed(data):
            if event["kind"] != "chunk" or not event["choices"]:
                continue
            choice = event["choices"][0]
            events.append(
                (choice["text"] or "", choice["token_ids"] or [], choice["finish_reason"])
            )
        return events


async def _raw_stream(
    host: str,
    port: int,
    path: str,
    body: dict[str, Any],
    request_id: str,
    stream: int,
    reconciler: ReconcilerLike,
    result: SessionResult,
    rust_sse: bool,
) -> None:
    """One stream over a bare HTTP/1.1 connection: no httpx, chunked decoding by hand."""
    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(
            (
                f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                f"Content-Type: application/json\r\nX-Request-Id: {request_id}\r\n"
                f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n"
            ).encode()
            + payload
        )
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"HTTP error: {head.splitlines()[0].decode()}")
        chunked = b"transfer-encoding: chunked" in head.lower()
        parser: _PySse | _RustSse = _RustSse() if rust_sse else _PySse()
        out = _StreamOut(stream, reconciler, result)
        while True:
            if chunked:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    break
                data = (await reader.readexactly(size + 2))[:-2]
            else:
                data = await reader.read(65536)
                if not data:
                    break
            for text, token_ids, finish_reason in parser.feed(data):
                out.add(text, token_ids, finish_reason)
            await asyncio.sleep(0)  # let the receiver and the other streams run
    finally:
        writer.close()
    out.close()


async def run_session(
    base_url: str,
    *,
    num_streams: int,
    socket_dir: str,
    max_tokens: int = 64,
    reconciler_kind: str = "python",
    prompt: str = "Tell me about speculative decoding.",
    stop: list[str] | None = None,
    chat: bool = True,
    grace: float = 3.0,
    seed: int | None = None,
    http: str = "httpx",
) -> SessionResult:
    """Run one session of `num_streams` concurrent streams and return its verdicts.

    `http="raw"` reads the streams over bare connections and parses SSE in the
    Rust core (Rust reconciler) or in Python (reference), without httpx: the
    benchmarks' lean client.
    """
    run_id = secrets.token_hex(16)
    reconciler = make_reconciler(reconciler_kind, run_id, num_streams)
    directory = paths.ensure_socket_dir(socket_dir, create=True)
    path = paths.socket_path(directory, run_id)
    receiver: NativeReceiver | PyReceiver
    if reconciler_kind == "rust":
        receiver = NativeReceiver(path, reconciler)
    else:
        receiver = PyReceiver(path)
    result = SessionResult(
        run_id=run_id,
        verdicts=[],
        events=[],
        counters={},
        totals={},
        receiver={},
        texts=[""] * num_streams,
        token_ids=[[] for _ in range(num_streams)],
        finish_reasons=[None] * num_streams,
    )
    endpoint = base_url + ("/v1/chat/completions" if chat else "/v1/completions")
    started = time.monotonic()

    def pump() -> None:
        frames = receiver.take()
        if frames:
            reconciler.push_frames(frames)
        result.events.extend(reconciler.drain())

    async def pump_forever() -> None:
        while True:
            pump()
            await asyncio.sleep(0.005)

    pumper = asyncio.create_task(pump_forever())
    try:
        limits = httpx.Limits(max_connections=num_streams, max_keepalive_connections=num_streams)
        timeout = httpx.Timeout(60.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            tasks = []
            for stream in range(num_streams):
                body: dict[str, Any] = {
                    "model": "parallelhue-sim",
                    "max_tokens": max_tokens,
                    "stream": True,
                    "return_token_ids": True,
                }
                if chat:
                    body["messages"] = [{"role": "user", "content": prompt}]
                else:
                    body["prompt"] = prompt
                if stop:
                    body["stop"] = stop
                if seed is not None:
                    body["seed"] = seed
                request_id = wire.request_id(run_id, stream)
                if http == "raw":
                    parts = urlsplit(endpoint)
                    tasks.append(
                        _raw_stream(
                            parts.hostname or "127.0.0.1",
                            parts.port or 80,
                            parts.path,
                            body,
                            request_id,
                            stream,
                            reconciler,
                            result,
                            reconciler_kind == "rust",
                        )
                    )
                    continue
                tasks.append(
                    _one_stream(
                        client, endpoint, body, request_id, stream, reconciler, result, chat
                    )
                )
            await asyncio.gather(*tasks)
        result.http_elapsed = time.monotonic() - started
        # Telemetry may trail the HTTP stream: wait for every verdict, up to `grace`.
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            pump()
            if all(reconciler.verdict(s)[0] != "pending" for s in range(num_streams)):
                break
            await asyncio.sleep(0.01)
        pump()
        reconciler.finalize()
        result.events.extend(reconciler.drain())
    finally:
        pumper.cancel()
        await asyncio.gather(pumper, return_exceptions=True)
        receiver.close()
    result.elapsed = time.monotonic() - started
    result.verdicts = [reconciler.verdict(s) for s in range(num_streams)]
    result.counters = dict(reconciler.counters())
    result.totals = dict(reconciler.totals())
    result.receiver = receiver.stats()
    result.sources = [dict(source) for source in reconciler.sources()]
    return result
