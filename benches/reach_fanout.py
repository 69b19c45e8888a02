"""CPU cost of sending telemetry to the hubs, side by side with the client's socket alone.

What an emitter's sender thread pays per frame (`RunSink.send`) when its run
goes to the client's socket only (the path before hubs existed), to the socket
and one or two hubs (one per API-server process), or to a hub only; and what a
hub process pays per frame: its receiving thread, and the subscriber's
coroutine that turns frames into the HTTP body. As in a server, every hub and
the client's socket live in processes of their own (forked), so the numbers
are not mixed up by one GIL. Rounds alternate between the configurations; the
median of the rounds is printed. No vLLM, no HTTP: the frame is encoded once
(a 16-record text frame, what a 16-stream step produces), the subscriber's
body bytes are discarded.

    .venv/bin/python benches/reach_fanout.py [--frames N] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import shutil
import socket
import statistics
import tempfile
import threading
import time
from multiprocessing.connection import Connection

from parallelhue_vllm import wire
from parallelhue_vllm.destination import Destination
from parallelhue_vllm.hub import Hub, HubLimits


def text_frame(run: bytes, streams: int = 16) -> bytes:
    records: list[wire.Record] = [
        wire.TextRecord(
            stream=i,
            offset=40,
            tokens=[wire.TextToken(1000 + j, b"ab", 0) for j in range(4)],
            http_delta=b"abababab",
        )
        for i in range(streams)
    ]
    header = wire.Header(run, 7, 1, 9, time.monotonic_ns())
    return wire.encode_records(wire.KIND_TEXT, header, records)


def thread_cpu(native_id: int) -> float:
    """utime + stime of one thread of this process, in seconds (clock-tick resolution)."""
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hub_process(base: str, scope: str, name: str, subscribe: bool, pipe: Connection) -> None:
    """A hub, as an API-server process runs it; with `subscribe`, a reader taking every chunk."""
    hub = Hub(
        scope, base=base, limits=HubLimits(buffer_bytes=1 << 30, total_bytes=1 << 30), name=name
    )
    hub.start()
    assert hub._thread is not None and hub._thread.native_id is not None
    hub_thread = hub._thread.native_id
    main_thread = threading.get_native_id()

    async def serve() -> None:
        sub = hub.subscribe() if subscribe else None
        pipe.send(sub.run_id if sub is not None else b"")
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_request() -> None:
            if pipe.recv() == "stop":
                stop.set()
            else:
                pipe.send((hub.stats()["frames"], thread_cpu(hub_thread), thread_cpu(main_thread)))

        loop.add_reader(pipe.fileno(), on_request)
        while not stop.is_set():
            if sub is None:
                await asyncio.sleep(0.05)
                continue
            reading = asyncio.ensure_future(sub.next_chunk())
            stopping = asyncio.ensure_future(stop.wait())
            await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            if not reading.done():
                reading.cancel()
        hub.close()

    asyncio.run(serve())


def socket_process(path: str, pipe: Connection) -> None:
    """The client's socket, drained."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.settimeout(0.1)
    pipe.send(b"ready")
    while not pipe.poll():
        try:
            sock.recv(1 << 17)
        except TimeoutError:
            continue
    sock.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--frames", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    root = tempfile.mkdtemp(prefix="phbench", dir="/tmp")
    os.chmod(root, 0o700)
    sock_dir = os.path.join(root, "s")
    os.mkdir(sock_dir, 0o700)
    base = os.path.join(root, "h")
    context = multiprocessing.get_context("fork")
    children: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []

    def spawn(target: object, *args: object) -> Connection:
        mine, theirs = context.Pipe()
        process = context.Process(target=target, args=(*args, theirs), daemon=True)
        process.start()
        children.append((process, mine))
        return mine

    # Two hubs in one scope, as two API-server processes run them (the run is
    # subscribed in the first; the second discards its frames), and one alone.
    pair = [spawn(hub_process, base, "be", "0", True), spawn(hub_process, base, "be", "1", False)]
    single = spawn(hub_process, base, "be1", "0", True)
    pair_run, _, single_run = (p.recv() for p in (*pair, single))
    for run in (pair_run, single_run):
        spawn(socket_process, os.path.join(sock_dir, f"{run.hex()}.sock")).recv()
    pair_dir, single_dir = os.path.join(base, "be"), os.path.join(base, "be1")
    cases = {
        "client socket only": (Destination(sock_dir, 2.0, use_env_scope=False), single_run, []),
        "socket + 1 hub": (
            Destination(sock_dir, 2.0, hub_dir=single_dir, use_env_scope=False),
            single_run,
            [single],
        ),
        "socket + 2 hubs": (
            Destination(sock_dir, 2.0, hub_dir=pair_dir, use_env_scope=False),
            pair_run,
            pair,
        ),
        "1 hub only": (
            Destination(None, 2.0, client_sockets=False, hub_dir=single_dir, use_env_scope=False),
            single_run,
            [single],
        ),
    }
    sender: dict[str, list[float]] = {name: [] for name in cases}
    hub_thread: dict[str, list[float]] = {name: [] for name in cases}
    reader: dict[str, list[float]] = {name: [] for name in cases}

    def ask(pipe: Connection) -> tuple[int, float, float]:
        pipe.send("stats")
        result: tuple[int, float, float] = pipe.recv()
        return result

    for _ in range(options.rounds):
        for name, (destination, run, hubs) in cases.items():
            sink = destination.open(run.hex())
            frame = text_frame(run)
            before = [ask(h) for h in hubs]
            start = time.thread_time()
            for _ in range(options.frames):
                sink.send(frame)
            sender[name].append((time.thread_time() - start) / options.frames * 1e6)
            sink.close()
            if not hubs:
                continue
            while True:
                after = [ask(h) for h in hubs]
                if all(a[0] >= b[0] + options.frames for a, b in zip(after, before, strict=True)):
                    break
                time.sleep(0.01)
            time.sleep(0.05)  # let the reader take the last chunk
            after = [ask(h) for h in hubs]
            per_hub = options.frames * len(hubs)
            hub_thread[name].append(
                sum(a[1] - b[1] for a, b in zip(after, before, strict=True)) / per_hub * 1e6
            )
            # Only the first hub of a case has a reader.
            reader[name].append((after[0][2] - before[0][2]) / options.frames * 1e6)
    print(
        f"frame: {len(text_frame(single_run))} bytes (a 16-record text frame); "
        f"{options.frames} frames x {options.rounds} alternating rounds; median us per frame"
    )
    for name in cases:
        line = f"  {name:20s} sender thread {statistics.median(sender[name]):5.1f}"
        if hub_thread[name]:
            line += (
                f"   hub thread {statistics.median(hub_thread[name]):5.1f} (per hub)"
                f"   subscriber coroutine {statistics.median(reader[name]):5.1f}"
            )
        print(line)
    for process, pipe in children:
        pipe.send("stop")
        process.join(5)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
