"""Drive concurrent streaming requests at a vLLM server and reconcile them.

Used by the real-vLLM tests and the overhead benchmark, from the project venv.
Each run: a fresh run id, a telemetry socket bound by the Rust receiver
(`parallelhue._native.Receiver`) feeding the Rust reconciler, N concurrent
streaming requests with request ids `ph1_<run>_<i>` and `return_token_ids`,
every SSE delta pushed into the reconciler, then the verdicts.

PARALLELHUE_E2E_RECONCILER=python switches to the pure-Python reference
reconciler and a Python socket reader (development only).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from parallelhue.reference.sse import ChunkInputs
from parallelhue_vllm import paths

SPEC_METRICS = {
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "drafts": "vllm:spec_decode_num_drafts_total",
    "generation": "vllm:generation_tokens_total",
}


@dataclass(frozen=True)
class Shape:
    """One request: endpoint, prompt and sampling."""

    endpoint: str  # "chat" or "completions"
    prompt: str
    max_tokens: int
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    extra: tuple[tuple[str, Any], ...] = ()  # more body fields, e.g. (("n", 2),)


@dataclass
class StreamResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    chunks: int = 0
    error: str | None = None
    usage_chunk: dict[str, Any] | None = None  # the last chunk carrying `usage`


@dataclass
class RunResult:
    run_id: str
    streams: list[StreamResult]
    verdicts: list[tuple[str, str | None]]
    totals: dict[str, Any]
    counters: dict[str, int]
    sources: list[dict[str, Any]]
    seconds: float
    reconciler_kind: str


def scrape_metrics(url: str) -> dict[str, float]:
    """Server-wide counters, summed over label sets."""
    text = httpx.get(url + "/metrics", timeout=10).text
    wanted = set(SPEC_METRICS.values())
    values = dict.fromkeys(SPEC_METRICS, 0.0)
    reverse = {name: key for key, name in SPEC_METRICS.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                values[reverse[sample.name]] += float(sample.value)
    return values


def _body(shape: Shape, model: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": model,
        "stream": True,
        "max_tokens": shape.max_tokens,
        "temperature": shape.temperature,
        "return_token_ids": True,
    }
    if shape.stop:
        body["stop"] = list(shape.stop)
    if shape.seed is not None:
        body["seed"] = shape.seed
    if shape.ignore_eos:
        body["ignore_eos"] = True
    body.update(dict(shape.extra))
    if shape.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": shape.prompt}]
    else:
        body["prompt"] = shape.prompt
    return body


class _PyReceiver:
    """Development fallback: a Python thread collecting datagrams for the reference reconciler."""

    def __init__(self, path: str, reconciler: Any, lock: threading.Lock) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        self.sock.bind(path)
        os.chmod(path, 0o600)
        self.sock.settimeout(0.1)
        self.reconciler = reconciler
        self.lock = lock
        self.running = True
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while self.running:
            try:
                frame = self.sock.recv(65537)
            except TimeoutError:
                continue
            except OSError:
                return
            with self.lock:
                self.reconciler.push_frame(frame)

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        self.sock.close()


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


async def _stream(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    run_id: str,
    shape: Shape,
    model: str,
    reconciler: Any,
    lock: Any,
    result: StreamResult,
    telemetry: bool,
) -> None:
    path = "/v1/chat/completions" if shape.endpoint == "chat" else "/v1/completions"
    # Without telemetry the id carries no `ph1_` marker: the plugin ignores the request.
    request_id = f"ph1_{run_id}_{index}" if telemetry else f"plain-{run_id}-{index}"
    headers = {"X-Request-Id": request_id}
    async with client.stream(
        "POST", url + path, json=_body(shape, model), headers=headers
    ) as response:
        if response.status_code != 200:
            result.error = f"HTTP {response.status_code}: {(await response.aread())[:300]!r}"
            return
        extraction = ChunkInputs()  # the client's reference extraction of SSE inputs
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("usage") is not None:
                result.usage_chunk = chunk
            for item in extraction.extract_payload(data):
                if item[0] == "sse":
                    result.chunks += 1
                    result.text += item[1]
                    result.token_ids.extend(item[2])
                with lock:
                    reconciler.push_inputs([(item[0], index, *item[1:])])
            result.finish_reason = extraction.finish_reason
    with lock:
        reconciler.finish_sse(index, result.finish_reason)


def run(
    url: str,
    shapes: list[Shape],
    socket_dir: str,
    *,
    model: str = "tiny",
    settle_seconds: float = 10.0,
    telemetry: bool = True,
) -> RunResult:
    """Run one batch of concurrent streams (one per shape) and reconcile them."""
    run_id = secrets.token_hex(16)
    kind = os.environ.get("PARALLELHUE_E2E_RECONCILER", "native")
    directory = paths.ensure_socket_dir(socket_dir, create=True)
    path = paths.socket_path(directory, run_id)
    receiver: Any = None
    lock: Any
    if kind == "python":
        from parallelhue.reference.reconciler import Reconciler as PyReconciler

        reconciler: Any = PyReconciler(run_id, len(shapes))
        lock = threading.Lock()
        if telemetry:
            receiver = _PyReceiver(path, reconciler, lock)
    else:
        from parallelhue import _native

        reconciler = _native.Reconciler(run_id, len(shapes))
        lock = _NoLock()
        if telemetry:
            receiver = _native.Receiver(path, reconciler)
    results = [StreamResult() for _ in shapes]
    started = time.monotonic()

    async def main() -> None:
        limits = httpx.Limits(max_connections=len(shapes) + 4)
        timeout = httpx.Timeout(600.0, connect=10.0)
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            await asyncio.gather(
                *(
                    _stream(
                        client, url, i, run_id, s, model, reconciler, lock, results[i], telemetry
                    )
                    for i, s in enumerate(shapes)
                )
            )

    try:
        asyncio.run(main())
        seconds = time.monotonic() - started
        # Frames are sent within milliseconds of the HTTP chunks; wait for verdicts.
        deadline = time.monotonic() + settle_seconds
        while telemetry and time.monotonic() < deadline:
            with lock:
                pending = [reconciler.verdict(i)[0] == "pending" for i in range(len(shapes))]
            if not any(pending):
                break
            time.sleep(0.05)
        with lock:
            reconciler.finalize()
            verdicts = [reconciler.verdict(i) for i in range(len(shapes))]
            totals = reconciler.totals()
            counters = reconciler.counters()
            sources = reconciler.sources()
    finally:
        if receiver is not None:
            receiver.close()
        try:
            os.unlink(path)
        except OSError:
            pass
    return RunResult(run_id, results, verdicts, totals, counters, sources, seconds, kind)
