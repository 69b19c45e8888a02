"""Per-chunk CPU floor of httpx vs bare asyncio, reading paced SSE chunks from 64 connections."""

import asyncio
import json
import os
import resource
import socket
import subprocess
import sys
import time

EV = (
    "data: "
    + json.dumps(
        {
            "id": "chatcmpl-x",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "sim",
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": " hello"},
                    "logprobs": None,
                    "finish_reason": None,
                    "token_ids": [123, 456],
                }
            ],
        }
    )
    + "\n\n"
).encode()
CH = f"{len(EV):x}\r\n".encode() + EV + b"\r\n"


def server(port, n, step, burst):
    async def main():
        writers = []
        ready = asyncio.Event()

        async def handle(r, w):
            await r.readuntil(b"\r\n\r\n")
            w.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\n\r\n"
            )
            writers.append(w)
            if len(writers) == 64:
                ready.set()
            await asyncio.sleep(3600)

        await asyncio.start_server(handle, "127.0.0.1", port)
        await ready.wait()
        for _i in range(n // burst):
            for w in writers:
                w.write(CH * burst)
            await asyncio.sleep(step)
        for w in writers:
            w.write(b"0\r\n\r\n")
            w.close()
        await asyncio.sleep(0.5)

    asyncio.run(main())


async def client_httpx(port, parse):
    import httpx

    from parallelhue._native import SseParser

    c = httpx.AsyncClient(limits=httpx.Limits(max_connections=64), timeout=60)
    count = 0

    async def one():
        nonlocal count
        p = SseParser()
        async with c.stream("POST", f"http://127.0.0.1:{port}/x", json={}) as r:
            async for raw in r.aiter_raw():
                if parse:
                    p.feed(raw)
                count += 1

    await asyncio.gather(*[one() for _ in range(64)])
    return count


async def client_bare(port, parse):
    from parallelhue._native import SseParser

    count = 0

    async def one():
        nonlocal count
        p = SseParser()
        r, w = await asyncio.open_connection("127.0.0.1", port)
        w.write(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n")
        await r.readuntil(b"\r\n\r\n")
        while True:
            d = await r.read(65536)
            if not d:
                break
            if parse:
                p.feed(d)
            count += 1

    await asyncio.gather(*[one() for _ in range(64)])
    return count


if sys.argv[1] == "server":
    server(int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5]))
    sys.exit()
if sys.argv[1] == "client":
    mode, port = sys.argv[2], int(sys.argv[3])
    fn = client_httpx if mode.startswith("httpx") else client_bare
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    n = asyncio.run(fn(port, mode.endswith("parse")))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        json.dumps(
            {
                "burst": os.environ.get("BURST"),
                "mode": mode,
                "reads": n,
                "cpu_s": round(cpu, 3),
                "us_per_chunk": round(cpu / (64 * int(sys.argv[4])) * 1e6, 2),
            }
        )
    )
    sys.exit()
n, step, burst = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[5])
for _rep in range(int(sys.argv[4])):
    for mode in sys.argv[1].split(","):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        srv = subprocess.Popen(
            [sys.executable, __file__, "server", str(port), str(n), str(step), str(burst)],
            stderr=subprocess.DEVNULL,
        )
        time.sleep(0.5)
        subprocess.run(
            [sys.executable, __file__, "client", mode, str(port), str(n)],
            env=dict(os.environ, PYTHONPATH="/work/main/python", BURST=str(burst)),
        )
        srv.wait()
