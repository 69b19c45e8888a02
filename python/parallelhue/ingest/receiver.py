"""The reference path's telemetry: the socket (`PyReceiver`), the HTTP stream (`PyHttpTelemetry`).

`PyReceiver` reads the run's AF_UNIX datagram socket from the asyncio loop
(no thread) and hands the frames to the session, which feeds the reference
reconciler (`--reconciler python`). The shipped path binds the socket in
Rust instead (`parallelhue._native.Receiver`, a thread that pushes frames
into the Rust reconciler under its lock, see ingest.py); both check every
datagram's `SO_PASSCRED` credentials and drop other users' datagrams, except
those of the uids named by `--accept-uid` (then the socket is 0622 for a uid
other than root, and each datagram admitted that way is counted).

`PyHttpTelemetry` is the reference path's twin of the Rust HTTP thread's
telemetry exchange (`--telemetry http`): httpx on the same loop, the
pure-Python `parallelhue_vllm.telemetry_stream.StreamDecoder`, the same end
kinds (`stream_errors.telemetry_end_message` words them).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
from collections.abc import Sequence

import httpx

from parallelhue_vllm import telemetry_stream as ts

from .streams import ConnectTarget, ExchangeEnded, error_body_text, exchange_end

__all__ = ["PyHttpTelemetry", "PyReceiver", "ReceiverError"]

RCVBUF_BYTES = 8 << 20
# One more than the protocol's largest datagram, so an oversized one is seen whole
# enough for the decoder to reject it instead of being silently cut to size.
_RECV_BYTES = 65536 + 1
_UCRED = struct.Struct("iII")  # pid, uid, gid


class ReceiverError(Exception):
    """The socket could not be bound; one line naming the fix."""


class PyReceiver:
    """A datagram socket read from the asyncio loop; other users' datagrams are dropped."""

    def __init__(
        self,
        path: str,
        loop: asyncio.AbstractEventLoop | None = None,
        accept_uids: Sequence[int] = (),
    ) -> None:
        self.path = path
        self._frames: list[bytes] = []
        self._stats = {"datagrams": 0, "rejected_uid": 0, "accepted_foreign": 0, "bytes": 0}
        self._last_rejected_uid: int | None = None
        self._uid = os.geteuid()
        self._accept = frozenset(uid for uid in accept_uids if uid != self._uid)
        # Root reaches any socket; another accepted uid needs write permission.
        mode = 0o622 if any(uid != 0 for uid in self._accept) else 0o600
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            self._passcred = sys.platform.startswith("linux")
            if self._passcred:
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            with contextlib.suppress(OSError):
                self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
            old_umask = os.umask(0o177)  # the socket is born 0600
            try:
                self._sock.bind(path)
            finally:
                os.umask(old_umask)
            os.chmod(path, mode)
            self._sock.setblocking(False)
        except OSError as error:
            self._sock.close()
            raise ReceiverError(
                f"cannot bind telemetry socket {path}: {error.strerror or error}"
            ) from None
        self._loop = loop or asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._on_readable)
        self._closed = False

    def _sender_uid(self, ancillary: list[tuple[int, int, bytes]]) -> int | None:
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                if len(data) >= _UCRED.size:
                    return int(_UCRED.unpack_from(data)[1])
        return None

    def _on_readable(self) -> None:
        cmsg_size = socket.CMSG_SPACE(_UCRED.size) if self._passcred else 0
        while True:
            try:
                data, ancillary, _flags, _addr = self._sock.recvmsg(_RECV_BYTES, cmsg_size)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            stats = self._stats
            stats["datagrams"] += 1
            if self._passcred:
                uid = self._sender_uid(ancillary)
                if uid != self._uid:
                    if uid is None or uid not in self._accept:
                        stats["rejected_uid"] += 1
                        self._last_rejected_uid = uid
                        continue
                    stats["accepted_foreign"] += 1
            stats["bytes"] += len(data)
            self._frames.append(data)

    def take(self) -> list[bytes]:
        if not self._closed:
            self._on_readable()  # whatever the kernel holds right now, too
        frames, self._frames = self._frames, []
        return frames

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)

    def stats(self) -> dict[str, int | None]:
        return {**self._stats, "last_rejected_uid": self._last_rejected_uid}


class PyHttpTelemetry:
    """The run's HTTP telemetry stream read on the event loop (`--reconciler python`).

    `run_id()` waits for the preamble (the run the server created); frames are
    kept from the first one, `take()` hands them over once `accept()` was
    called, in stream order with the losses: an int for each `dropped` item
    (frames the hub discarded), None once the stream ended. `end` says how the
    stream ended: `(kind, status, detail)` with the Rust thread's kinds, None
    while it is open.
    """

    def __init__(self, client: httpx.AsyncClient, url: str, target: ConnectTarget) -> None:
        self.url = url
        self.target = target
        self.end: tuple[str, int, str] | None = None
        self.buffer_bytes: int | None = None
        self.dropped = 0
        self.heartbeats = 0
        self._items: list[bytes | int | None] = []
        self._bytes = 0
        self._count = 0
        self._accepted = False
        self._closed = False
        self._run_id: str | None = None
        self._news = asyncio.Event()
        self._task = asyncio.create_task(self._read(client))

    async def run_id(self) -> str | None:
        """The server's run id, or None when the stream ended first (see `end`)."""
        while self._run_id is None and self.end is None and not self._closed:
            self._news.clear()
            await self._news.wait()
        return self._run_id

    def accept(self) -> None:
        self._accepted = True

    def take(self) -> list[bytes | int | None]:
        if not self._accepted:
            return []
        items, self._items = self._items, []
        return items

    def stats(self) -> dict[str, object]:
        return {
            "run_id": self._run_id,
            "frames": self._count,
            "bytes": self._bytes,
            "dropped": self.dropped,
            "heartbeats": self.heartbeats,
            "end": self.end,
        }

    def _ended(self, end: tuple[str, int, str]) -> None:
        if self.end is None:
            self.end = end
            # The client closes the stream only after the run (`close`, which is
            # not an end): whatever the server sends from now on is lost.
            self._items.append(None)
        self._news.set()

    def _item(self, item: ts.Item) -> None:
        if item.kind == "preamble":
            self._run_id = item.run_id.hex()
            self.buffer_bytes = item.buffer_bytes
        elif item.kind == "frame":
            self._items.append(item.frame)
            self._count += 1
            self._bytes += len(item.frame)
        elif item.kind == "dropped":
            self.dropped += item.frames
            self._items.append(item.frames)
        elif item.kind == "heartbeat":
            self.heartbeats += 1
        elif item.kind == "end":
            self._ended(("server_end", item.code, item.message))
        self._news.set()

    async def _read(self, client: httpx.AsyncClient) -> None:
        headers = {"Accept": ts.CONTENT_TYPE, "Accept-Encoding": "identity"}
        decoder = ts.StreamDecoder()
        try:
            async with client.stream("POST", self.url, content=b"", headers=headers) as response:
                if response.status_code >= 400:
                    text = await error_body_text(response)
                    raise ExchangeEnded("http_status", text, response.status_code)
                content_type = response.headers.get("content-type", "")
                if content_type.split(";")[0].strip().lower() != ts.CONTENT_TYPE:
                    raise ExchangeEnded("not_sse", content_type, response.status_code)
                async for chunk in response.aiter_raw():
                    for item in decoder.push(chunk):
                        self._item(item)
                    if decoder.ended:
                        return
                decoder.finish()
        except ts.StreamError as error:
            for item in error.items:
                self._item(item)
            self._ended(("stream", 0, str(error)))
        except asyncio.CancelledError:
            # The client closed it (the run is over): not an end of the stream.
            self._closed = True
            self._news.set()
            raise
        except Exception as error:
            kind, status, detail = exchange_end(error, self.target)
            self._ended((kind, status, detail))

    def close(self) -> None:
        """Stop reading (the connection closes as the task unwinds). Idempotent."""
        self._task.cancel()
