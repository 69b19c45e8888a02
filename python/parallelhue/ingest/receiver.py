"""The reference path's telemetry socket (`PyReceiver`); in-band telemetry comes in the streams.

`PyReceiver` reads the run's AF_UNIX datagram socket from the asyncio loop
(no thread) and hands the frames to the reference path (`reference.py`), which
feeds the reference reconciler (`--reconciler python`). The shipped path binds the socket in
Rust instead (`parallelhue._native.Receiver`, a thread that pushes frames
into the Rust reconciler under its lock, see native.py); both check every
datagram's `SO_PASSCRED` credentials and drop other users' datagrams, except
those of the uids named by `--accept-uid` (then the socket is 0622 for a uid
other than root, and each datagram admitted that way is counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import struct
import sys
from collections.abc import Sequence

__all__ = ["PyReceiver", "ReceiverError"]

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
