"""The simulated engine's HTTP API: OpenAI-compatible endpoints, errors, request ids, metrics."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from parallelhue.sim import FaultConfig, SimConfig, SimServer

ROOT = Path(__file__).resolve().parent.parent


def with_server(test: Callable[[str, SimServer], Awaitable[None]], **config: Any) -> None:
    async def main() -> None:
        server = SimServer(SimConfig(step_ms=1.0, telemetry=False, **config))
        url = await server.start()
        try:
            await test(url, server)
        finally:
            await server.stop()

    asyncio.run(main())


async def sse_chunks(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> AsyncIterator[dict[str, Any] | str]:
    async with client.stream("POST", url, json=body, headers=headers or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"] == "text/event-stream"
        async for line in response.aiter_lines():
            if not line:
                continue
            assert line.startswith("data: ")
            payload = line[6:]
            yield payload if payload == "[DONE]" else json.loads(payload)


CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 30}


def test_models_lists_one_simulated_model() -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            response = await client.get(url + "/v1/models")
        data = response.json()["data"]
        assert [(m["id"], m["owned_by"]) for m in data] == [
            ("parallelhue-sim", "parallelhue-simulated")
        ]

    with_server(check)


def test_health_and_unknown_routes() -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            assert (await client.get(url + "/health")).status_code == 200
            missing = await client.get(url + "/v2/nothing")
            wrong = await client.get(url + "/v1/chat/completions")
        assert missing.status_code == 404
        assert missing.json()["error"]["message"].startswith("no route /v2/nothing: ")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["message"] == "/v1/chat/completions takes POST, not GET"

    with_server(check)


def test_chat_stream_with_token_ids_prompt_ids_and_usage() -> None:
    async def check(url: str, server: SimServer) -> None:
        body = {
            **CHAT,
            "stream": True,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        }
        chunks: list[dict[str, Any] | str] = []
        async with httpx.AsyncClient() as client:
            async for chunk in sse_chunks(client, url + "/v1/chat/completions", body):
                chunks.append(chunk)
        assert chunks[-1] == "[DONE]"
        objects = [c for c in chunks if isinstance(c, dict)]
        first, usage = objects[0], objects[-1]
        assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
        assert first["prompt_token_ids"]
        content = objects[1:-1]
        assert all("prompt_token_ids" not in c for c in content)
        ids = [i for c in content for i in c["choices"][0]["token_ids"]]
        assert len(ids) == 30
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        assert all(c["choices"][0]["finish_reason"] is None for c in content[:-1])
        assert usage["choices"] == []
        assert usage["usage"]["completion_tokens"] == 30
        assert usage["usage"]["prompt_tokens"] == len(first["prompt_token_ids"])
        # Token ids decode to exactly the streamed text.
        text = "".join(c["choices"][0]["delta"]["content"] for c in content)
        assert server.vocab.decode(ids).decode("utf-8", "ignore").startswith(text)

    with_server(check)


def test_multibyte_characters_split_across_steps_give_empty_chunks() -> None:
    async def check(url: str, server: SimServer) -> None:
        empty_with_ids = 0
        non_ascii = False
        async with httpx.AsyncClient() as client:
            for seed in range(6):
                body = {**CHAT, "max_tokens": 200, "stream": True, "return_token_ids": True}
                body["seed"] = seed
                async for chunk in sse_chunks(client, url + "/v1/chat/completions", body):
                    if not isinstance(chunk, dict) or "token_ids" not in chunk["choices"][0]:
                        continue
                    choice = chunk["choices"][0]
                    content = choice["delta"]["content"]
                    non_ascii |= not content.isascii()
                    if content == "" and choice["token_ids"]:
                        empty_with_ids += 1
        assert non_ascii
        assert empty_with_ids > 0

    with_server(check, draft_len=1, acceptance=0.0)


def test_completions_stream_puts_ids_on_the_choice() -> None:
    async def check(url: str, server: SimServer) -> None:
        body = {"prompt": "abc", "max_tokens": 12, "stream": True, "return_token_ids": True}
        async with httpx.AsyncClient() as client:
            chunks = [
                c
                async for c in sse_chunks(client, url + "/v1/completions", body)
                if isinstance(c, dict)
            ]
        first = chunks[0]
        assert first["id"].startswith("cmpl-")
        assert first["object"] == "text_completion"
        assert first["choices"][0]["prompt_token_ids"] == server.vocab.encode_bytes(b"abc")
        assert sum(len(c["choices"][0]["token_ids"]) for c in chunks) == 12

    with_server(check)


def test_non_streaming_responses_hold_the_whole_text() -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            chat = (
                await client.post(
                    url + "/v1/chat/completions", json={**CHAT, "return_token_ids": True}
                )
            ).json()
            streamed = ""
            body = {**CHAT, "stream": True}
            async for chunk in sse_chunks(client, url + "/v1/chat/completions", body):
                if isinstance(chunk, dict) and chunk["choices"]:
                    streamed += chunk["choices"][0]["delta"].get("content", "")
        choice = chat["choices"][0]
        assert choice["message"]["content"] == streamed
        assert len(choice["token_ids"]) == 30
        assert chat["usage"]["completion_tokens"] == 30
        assert chat["prompt_token_ids"]

    with_server(check)


def test_request_id_header_wins_and_names_the_stream() -> None:
    async def check(url: str, server: SimServer) -> None:
        body = {**CHAT, "stream": True, "request_id": "from-body"}
        async with httpx.AsyncClient() as client:
            ids = {
                c["id"]
                async for c in sse_chunks(
                    client, url + "/v1/chat/completions", body, {"X-Request-Id": "hdr-1"}
                )
                if isinstance(c, dict)
            }
            body_ids = {
                c["id"]
                async for c in sse_chunks(client, url + "/v1/chat/completions", body)
                if isinstance(c, dict)
            }
        assert ids == {"chatcmpl-hdr-1"}
        assert body_ids == {"chatcmpl-from-body"}

    with_server(check)


def test_stop_string_is_excluded_and_reported() -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            free = (await client.post(url + "/v1/completions", json={"prompt": "p"})).json()
            text = free["choices"][0]["text"]
            stop = text[20:23]
            cut = (
                await client.post(
                    url + "/v1/completions",
                    json={"prompt": "p", "stop": [stop, "\u0000"], "return_token_ids": True},
                )
            ).json()
        choice = cut["choices"][0]
        assert choice["text"] == text[: text.index(stop)]
        assert choice["finish_reason"] == "stop"
        assert choice["stop_reason"] == stop

    with_server(check)


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/v1/completions", b"{bad", 400, "request body is not valid JSON: "),
        ("/v1/completions", b"[1]", 400, "request body must be a JSON object"),
        (
            "/v1/completions",
            b'{"prompt": "x", "n": 2}',
            400,
            "n=2 is not supported by the simulated engine: use n=1",
        ),
        ("/v1/completions", b'{"prompt": 5}', 400, "'prompt' must be a string"),
        (
            "/v1/completions",
            b'{"prompt": "x", "max_tokens": 0}',
            400,
            "'max_tokens' must be >= 1, got 0",
        ),
        (
            "/v1/completions",
            b'{"prompt": "x", "stop": 3}',
            400,
            "'stop' must be a string or a list of strings",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": []}',
            400,
            "'messages' must be a non-empty list of {role, content} objects",
        ),
        (
            "/v1/chat/completions",
            b'{"messages": [{"role": "user", "content": "x"}], "model": "gpt"}',
            404,
            "The model `gpt` does not exist.",
        ),
        (
            "/v1/completions",
            b'{"prompt": "x", "stream": "yes"}',
            400,
            "'stream' must be a boolean, got \"yes\"",
        ),
    ],
)
def test_bad_requests_get_json_errors(path: str, body: bytes, status: int, message: str) -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            response = await client.post(url + path, content=body)
        assert response.status_code == status
        error = response.json()["error"]
        assert error["message"].startswith(message)
        assert error["code"] == status

    with_server(check)


def _raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def test_malformed_http_and_keep_alive_on_raw_sockets() -> None:
    async def check(url: str, server: SimServer) -> None:
        port = int(url.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        garbage = await loop.run_in_executor(None, _raw, port, b"NONSENSE\r\n\r\n")
        assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
        assert b'"message": "malformed request line"' in garbage
        # Two requests on one connection; the second closes it.
        two = (
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        answer = await loop.run_in_executor(None, _raw, port, two)
        assert answer.count(b"HTTP/1.1 200 OK") == 2
        assert b"parallelhue-simulated" in answer
        # An HTTP/1.0 client gets a close-delimited stream (no chunked encoding).
        body = json.dumps({"prompt": "x", "max_tokens": 5, "stream": True}).encode()
        old = b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n" % len(body) + body
        streamed = await loop.run_in_executor(None, _raw, port, old)
        assert b"Transfer-Encoding" not in streamed
        assert streamed.rstrip().endswith(b"data: [DONE]")
        chunked = b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        refused = await loop.run_in_executor(None, _raw, port, chunked)
        assert refused.startswith(b"HTTP/1.1 411 ")
        assert b"send Content-Length" in refused

    with_server(check)


def test_stop_ends_connections_whose_request_arrives_as_it_stops() -> None:
    # `parallelhue demo` quit with q before its embedded engine had read the
    # requests: their bytes arrived in the loop iteration in which stop()
    # cancelled the connections. On Python 3.11, asyncio.wait_for swallows a
    # cancellation when the awaitable it wraps finished in the same iteration:
    # the requests were served anyway, their streams waited on the stopped
    # engine, and stop() (so the demo, so the shell prompt) never returned.
    async def main() -> None:
        server = SimServer(SimConfig(step_ms=40.0, telemetry=False))
        url = await server.start()
        port = int(url.rsplit(":", 1)[1])
        body = json.dumps({"prompt": "x", "max_tokens": 3000, "stream": True}).encode()
        request = b"POST /v1/completions HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(8)]
        try:
            while len(server._connections) < len(clients):  # accepted, waiting for a request
                await asyncio.sleep(0.01)
            for client in clients:
                client.sendall(request + body)
            time.sleep(0.2)  # the bytes wait in the kernel: the loop sees them all at once
            await asyncio.sleep(0)  # one iteration: every request becomes readable
            done, _ = await asyncio.wait([asyncio.ensure_future(server.stop())], timeout=10)
            assert done, "stop() did not return"
            assert server.engine.active == [] or all(r.aborted for r in server.engine.active)
        finally:
            for client in clients:
                client.close()

    asyncio.run(main())


def test_metrics_use_vllm_names_and_count_what_was_streamed() -> None:
    async def check(url: str, server: SimServer) -> None:
        async with httpx.AsyncClient() as client:
            for _ in range(3):
                await client.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 40})
            text = (await client.get(url + "/metrics")).text
        samples = {
            (sample.name, sample.labels.get("position")): sample
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        generation = samples[("vllm:generation_tokens_total", None)]
        assert generation.value == 120
        assert generation.labels == {"model_name": "parallelhue-sim", "engine": "0"}
        drafts = samples[("vllm:spec_decode_num_drafts_total", None)].value
        draft_tokens = samples[("vllm:spec_decode_num_draft_tokens_total", None)].value
        accepted = samples[("vllm:spec_decode_num_accepted_tokens_total", None)].value
        assert draft_tokens == 4 * drafts > 0
        per_position = [
            samples[("vllm:spec_decode_num_accepted_tokens_per_pos_total", str(i))].value
            for i in range(4)
        ]
        assert sum(per_position) == accepted
        assert per_position == sorted(per_position, reverse=True)

    with_server(check)


def test_telemetry_failures_never_reach_the_client() -> None:
    """No client socket at all: the engine still streams every token."""

    async def check(url: str, server: SimServer) -> None:
        request_id = "ph1_" + "c" * 32 + "_0"
        async with httpx.AsyncClient() as client:
            response = await client.post(
                url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 20, "return_token_ids": True},
                headers={"X-Request-Id": request_id},
            )
        assert len(response.json()["choices"][0]["token_ids"]) == 20

    async def main() -> None:
        directory = tempfile.mkdtemp(prefix="phst")
        server = SimServer(SimConfig(step_ms=1.0, socket_dir=directory))
        url = await server.start()
        try:
            await check(url, server)
        finally:
            await server.stop()
        shutil.rmtree(directory, ignore_errors=True)
        stats = server.telemetry_stats()
        assert stats["scheduler"]["sent"] == 0
        assert stats["scheduler"]["dropped"] > 0

    asyncio.run(main())


# ------------------------------------------------------------------ standalone CLI


def run_module(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    return subprocess.run(
        [sys.executable, "-m", "parallelhue.sim", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--draft-len", "x"], "argument --draft-len: invalid int value: 'x'"),
        (["--draft-len", "20"], "draft length must be 0..16, got 20"),
        (["--acceptance", "1.2"], "argument --acceptance: acceptance 1.2 is outside 0..1"),
        (["--step-ms", "-3"], "step time must be 0..10000 ms, got -3.0"),
        (["--fault", "explode"], "unknown fault 'explode': choose from "),
        (["--socket-dir", "/" + "d" * 100], "is 139 bytes, the AF_UNIX limit is 107"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_standalone_rejects_bad_flags_in_one_line(args: list[str], message: str) -> None:
    result = run_module(*args)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("python -m parallelhue.sim: error: ")
    assert message in lines[0]
    assert lines[0].endswith("(see --help)")


def test_standalone_serves_and_says_it_is_simulated() -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "python"))
    process = subprocess.Popen(
        [sys.executable, "-m", "parallelhue.sim", "--port", "0", "--step-ms", "1"],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stderr is not None
        url = ""
        for _ in range(10):
            line = process.stderr.readline()
            if "serving http://" in line:
                url = line.rsplit(" ", 1)[1].strip()
                break
        assert line.startswith("SIMULATED engine")
        response = httpx.post(url + "/v1/completions", json={"prompt": "x", "max_tokens": 7})
        assert response.json()["usage"]["completion_tokens"] == 7
    finally:
        process.terminate()
        assert process.wait(10) == 0


def test_fault_config_reaches_the_server() -> None:
    server = SimServer(SimConfig(faults=FaultConfig(sse_byte=True), telemetry=False))
    assert server.content_faults is not None
    assert server.fault_proxy is None


def test_standalone_names_a_port_in_use() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_module("--port", str(port))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"python -m parallelhue.sim: error: port {port} on 127.0.0.1 is in use: "
        "choose another --port"
    )
