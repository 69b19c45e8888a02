"""A lying OpenAI-compatible server: plays one `Transcript` per run, to the letter.

One long-lived server (its own asyncio loop in a thread) serves many runs, each
registered under its run id before the client starts. When every stream of a
run has connected (the client's requests carry `ph1_<run>_<i>`, in the body
and as `X-Request-Id`, as with vLLM), the run's transcript is played in order:
frames go as datagrams to the client's socket `<socket_dir>/<run_id>.sock`
(exactly where the plugin sends them), SSE events to each stream's chunked
body. The HTTP layer is the simulated engine's (`parallelhue.sim.http`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
from dataclasses import dataclass, field

from parallelhue.sim.http import HttpError, HttpRequest, HttpResponder, serve_connection
from parallelhue_vllm import paths, wire

from .story import MODEL
from .transcript import AwaitVerdict, End, Frame, Pause, Sse, Transcript

__all__ = ["LyingServer"]

# How long a run waits for all its streams to connect before it plays anyway.
CONNECT_WAIT_SECONDS = 10.0


@dataclass
class _Run:
    transcript: Transcript
    socket_path: str
    run_id: str
    bodies: dict[int, HttpResponder] = field(default_factory=dict)
    ended: set[int] = field(default_factory=set)
    all_connected: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    player: asyncio.Task[None] | None = None
    # Set by the harness when the client shows a verdict for the stream.
    verdicts: dict[int, threading.Event] = field(default_factory=dict)
    sent_frames: int = 0
    send_errors: list[str] = field(default_factory=list)


class LyingServer:
    """`with LyingServer() as server: server.register(run_id, transcript, socket_dir)`."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self._runs: dict[str, _Run] = {}
        self.port = 0

    def __enter__(self) -> LyingServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(timeout=10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def endpoint(self, chat: bool) -> str:
        return self.url + ("/v1/chat/completions" if chat else "/v1/completions")

    def register(
        self, run_id: str, transcript: Transcript, socket_dir: str
    ) -> dict[int, threading.Event]:
        """Play `transcript` for the run `run_id` whose client binds in `socket_dir`.

        Returns one event per stream for the caller to set once the client shows
        that stream's verdict (`AwaitVerdict` waits for it).
        """
        verdicts = {stream: threading.Event() for stream in range(transcript.streams)}

        async def add() -> None:
            path = paths.socket_path(socket_dir, run_id)
            self._runs[run_id] = _Run(transcript, path, run_id, verdicts=verdicts)

        asyncio.run_coroutine_threadsafe(add(), self.loop).result(timeout=10)
        return verdicts

    def forget(self, run_id: str) -> dict[str, object]:
        """Drop a finished run; returns what its player did (for failure messages)."""

        async def pop() -> dict[str, object]:
            run = self._runs.pop(run_id, None)
            if run is None:
                return {}
            if run.player is not None and not run.player.done():
                run.player.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await run.player
            return {"sent_frames": run.sent_frames, "send_errors": list(run.send_errors)}

        return asyncio.run_coroutine_threadsafe(pop(), self.loop).result(timeout=10)

    # --- HTTP ------------------------------------------------------------------------

    async def _start(self) -> None:
        self._server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _stop(self) -> None:
        for run in list(self._runs.values()):
            if run.player is not None:
                run.player.cancel()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _on_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(asyncio.CancelledError):
            await serve_connection(reader, writer, self._route)

    async def _route(self, request: HttpRequest, responder: HttpResponder) -> None:
        path = request.path.rstrip("/")
        if request.method == "GET" and path == "/v1/models":
            body = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
            await responder.send(200, json.dumps(body).encode())
            return
        if request.method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._generate(request, responder)
            return
        raise HttpError(404, f"no route {request.path}")

    async def _generate(self, request: HttpRequest, responder: HttpResponder) -> None:
        body = json.loads(request.body)
        request_id = request.headers.get("x-request-id") or str(body.get("request_id", ""))
        parsed = wire.parse_request_id(request_id)
        run = self._runs.get(parsed[0]) if parsed is not None else None
        if parsed is None or run is None:
            raise HttpError(404, f"no transcript for request {request_id!r}")
        stream = parsed[1]
        await responder.start_stream("text/event-stream", chunked=True)
        await responder.writer.drain()
        run.bodies[stream] = responder
        if len(run.bodies) == run.transcript.streams:
            run.all_connected.set()
        if run.player is None:
            run.player = asyncio.create_task(self._play(run))
        # The connection stays open until the transcript ended this body.
        while stream not in run.ended and not run.done.is_set():
            await asyncio.sleep(0.01)

    # --- playing a transcript --------------------------------------------------------

    async def _play(self, run: _Run) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(run.all_connected.wait(), CONNECT_WAIT_SECONDS)
        transcript = run.transcript
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            for action in transcript.actions:
                if isinstance(action, Frame):
                    self._send(run, sock, action)
                elif isinstance(action, Sse):
                    await self._write(run, action.stream, action.encode())
                elif isinstance(action, Pause):
                    await asyncio.sleep(action.seconds)
                elif isinstance(action, AwaitVerdict):
                    await self._await_verdict(run, action)
                elif isinstance(action, End):
                    await self._end(run, action.stream)
            for stream in range(transcript.streams):
                await self._end(run, stream)
        finally:
            sock.close()
            run.done.set()

    async def _await_verdict(self, run: _Run, action: AwaitVerdict) -> None:
        seen = run.verdicts[action.stream]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + action.timeout
        while not seen.is_set():
            if loop.time() > deadline:
                run.send_errors.append(f"no verdict for stream {action.stream} to wait for")
                return
            await asyncio.sleep(0.005)

    def _send(self, run: _Run, sock: socket.socket, frame: Frame) -> None:
        data = frame.encode(run.run_id, run.transcript.sources[frame.source])
        try:
            sock.sendto(data, run.socket_path)
            run.sent_frames += 1
        except OSError as error:  # the client closed its socket (exact mode stopped)
            run.send_errors.append(f"{type(error).__name__}: {error}")

    async def _write(self, run: _Run, stream: int, data: bytes) -> None:
        body = run.bodies.get(stream)
        if body is None or stream in run.ended:
            return
        try:
            body.write(data)
            await body.writer.drain()
        except (ConnectionError, RuntimeError):
            run.ended.add(stream)

    async def _end(self, run: _Run, stream: int) -> None:
        body = run.bodies.get(stream)
        if body is None or stream in run.ended:
            return
        run.ended.add(stream)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await body.end_stream()
