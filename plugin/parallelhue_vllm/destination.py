"""Where an emitter sends a run's frames: the client's socket, or in-band through the hubs.

The emitter (`emitter.py`) asks `Destination.open(run_id)` once per run for a
`RunSink`. One path per run (docs/REACH.md):

- the client's `<socket_dir>/<run_id>.sock` when it exists and passes the
  checks of `paths.py`: the run's frames go there (`send()`, like a
  connected socket's), and nowhere else;
- otherwise, when this server has hubs (`hub.py`; found in the scope
  directory, rescanned at most once a second and whenever a run starts, so
  hubs that start or exit later are picked up), the run is in-band
  (`sink.inband`): each request's envelopes go to every hub
  (`send_envelopes()`), and the hub that holds the request's claim keeps them
  for its response.

With neither, `open()` raises the client socket's `SocketPathError`, exactly
as before hubs existed.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import stat
import time

from . import hub, paths

__all__ = ["Destination", "HubDirectory", "RunSink"]

log = logging.getLogger("parallelhue_vllm")

RESCAN_SECONDS = 1.0
RECHECK_SECONDS = 0.5
SNDBUF_BYTES = 1 << 20


class _HubPeer:
    """One hub socket, connected once and shared by every run of one emitter."""

    __slots__ = ("dead", "path", "slow_until", "sock", "timeout")

    def __init__(self, path: str, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self.slow_until = 0.0
        self.dead = False
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            sock.settimeout(timeout)
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        self.sock = sock

    def send(self, frame: bytes, dontwait: bool) -> bool:
        if self.dead:
            return False
        now = time.monotonic()
        try:
            if dontwait or now < self.slow_until:
                # A hub that stalled a whole timeout does not hold up the others.
                self.sock.send(frame, socket.MSG_DONTWAIT)
                return True
            deadline = now + self.timeout
            while True:
                try:
                    self.sock.send(frame)
                    return True
                except OSError as error:
                    if error.errno == errno.ENOBUFS and time.monotonic() < deadline:
                        time.sleep(0.001)
                        continue
                    raise
        except TimeoutError:
            self.slow_until = time.monotonic() + RECHECK_SECONDS
            return False
        except BlockingIOError:
            return False
        except OSError:
            # The hub's process exited (ECONNREFUSED) or its socket is gone.
            self.close()
            return False

    def close(self) -> None:
        self.dead = True
        try:
            self.sock.close()
        except OSError:  # pragma: no cover
            pass


class HubDirectory:
    """The hubs of one server (one scope directory), as seen by one emitter."""

    def __init__(self, directory: str, timeout: float) -> None:
        self.directory = directory
        self._timeout = timeout
        self._peers: dict[str, _HubPeer] = {}
        self._scanned_at = float("-inf")
        self._warned = False

    def peers(self, rescan: bool = False) -> list[_HubPeer]:
        now = time.monotonic()
        if rescan or now - self._scanned_at >= RESCAN_SECONDS:
            self._scanned_at = now
            self._scan()
        return [peer for peer in self._peers.values() if not peer.dead]

    def _scan(self) -> None:
        try:
            hub.check_private_dir(os.path.dirname(self.directory), create=False)
            hub.check_private_dir(self.directory, create=False)
            names = [
                entry.name
                for entry in os.scandir(self.directory)
                if entry.name.startswith(hub.SOCKET_PREFIX)
                and entry.name.endswith(hub.SOCKET_SUFFIX)
            ]
        except hub.HubError as error:
            if os.path.lexists(self.directory) and not self._warned:
                self._warned = True
                log.warning("parallelhue: telemetry hubs not used: %s", error)
            self._close_all()
            return
        except OSError:
            self._close_all()
            return
        found = set()
        for name in names:
            path = os.path.join(self.directory, name)
            found.add(path)
            peer = self._peers.get(path)
            if peer is not None and not peer.dead:
                continue
            if not _is_private_socket(path):
                continue
            try:
                self._peers[path] = _HubPeer(path, self._timeout)
            except OSError:
                self._peers.pop(path, None)  # a dead hub's socket: skipped until it is gone
        for path in [p for p in self._peers if p not in found]:
            self._peers.pop(path).close()

    def _close_all(self) -> None:
        for peer in self._peers.values():
            peer.close()
        self._peers.clear()

    def close(self) -> None:
        self._close_all()


def _is_private_socket(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return (
        stat.S_ISSOCK(info.st_mode)
        and info.st_uid == os.geteuid()
        and stat.S_IMODE(info.st_mode) == 0o600
    )


class RunSink:
    """One run's destinations; quacks like the connected socket the emitter used to hold."""

    def __init__(self, run_id: str, destination: Destination) -> None:
        self.run_id = run_id
        self._destination = destination
        self._client: socket.socket | None = None
        self._client_retry_at = 0.0
        self._warned = False
        self.path = ""
        self.inband = False

    def open_client(self) -> None:
        """Connect the client's socket; raises SocketPathError / OSError like the emitter did."""
        destination = self._destination
        owner = paths.socket_owner()  # a client of another uid (docs/PROTOCOL.md)
        socket_dir = paths.ensure_socket_dir(
            destination.socket_dir or paths.default_socket_dir(), create=False, owner=owner
        )
        path = paths.socket_path(socket_dir, self.run_id)
        paths.check_socket_file(path, owner)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SNDBUF_BYTES)
            sock.settimeout(destination.send_timeout)
            sock.connect(path)
        except OSError:
            sock.close()
            raise
        self._client = sock
        self.path = path

    def client_absent(self) -> bool:
        """No socket at the client's path: normal when the run is served over HTTP."""
        directory = self._destination.socket_dir or paths.default_socket_dir()
        return not os.path.lexists(os.path.join(os.path.abspath(directory), f"{self.run_id}.sock"))

    def try_client(self, warn: bool) -> None:
        """Open the client's socket if it is there now; warn once when it is there but unusable."""
        self._client_retry_at = time.monotonic() + RECHECK_SECONDS
        try:
            self.open_client()
        except (paths.SocketPathError, OSError) as error:
            if warn and not self._warned and not self.client_absent():
                self._warned = True
                log.warning(
                    "parallelhue: telemetry for run %s not sent to its socket: %s",
                    self.run_id,
                    error,
                )

    def send(self, frame: bytes, flags: int = 0) -> int:
        """To the client's socket (socket runs); raises like a socket."""
        client = self._client
        if client is None:
            if time.monotonic() >= self._client_retry_at:
                self.try_client(warn=True)
            client = self._client
            if client is None:
                raise ConnectionError(errno.ENOTCONN, "the client's telemetry socket is gone")
        try:
            return client.send(frame, flags)
        except (TimeoutError, BlockingIOError):
            raise  # the emitter's own slow-client handling applies
        except OSError as error:
            if error.errno != errno.ENOBUFS:
                self._close_client()  # the client went away or re-bound
            raise

    def send_envelopes(self, datagram: bytes) -> bool:
        """To every hub (in-band runs); True when at least one took it."""
        hubs = self._destination.hubs
        delivered = False
        if hubs is not None:
            for peer in hubs.peers():
                if peer.send(datagram, False):
                    delivered = True
        return delivered

    def _close_client(self) -> None:
        if self._client is not None:
            try:
                self._client.close()
            except OSError:  # pragma: no cover
                pass
            self._client = None
            self._client_retry_at = time.monotonic() + RECHECK_SECONDS

    def close(self) -> None:
        self._close_client()


class Destination:
    """Opens the sinks of one emitter.

    `client_sockets`: deliver to the client's socket when it is there.
    `hub_dir`: the scope directory of this server's hubs; by default the one
    named by PARALLELHUE_HUB_SCOPE (set by the plugin in every vLLM process),
    none when that is unset.
    """

    def __init__(
        self,
        socket_dir: str | None,
        send_timeout: float,
        *,
        client_sockets: bool = True,
        hub_dir: str | None = None,
        use_env_scope: bool = True,
    ) -> None:
        self.socket_dir = socket_dir
        self.send_timeout = send_timeout
        self.client_sockets = client_sockets
        if hub_dir is None and use_env_scope:
            scope = os.environ.get(hub.ENV_SCOPE, "")
            if scope:
                try:
                    hub_dir = hub.scope_dir(scope)
                except hub.HubError as error:
                    log.warning("parallelhue: telemetry hubs not used: %s", error)
        self.hubs = HubDirectory(hub_dir, send_timeout) if hub_dir else None

    def open(self, run_id: str) -> RunSink:
        """A sink for a run: its client's socket when there is one, else in-band through
        the hubs; raises the client socket's error when neither can take frames."""
        sink = RunSink(run_id, self)
        peers = self.hubs.peers(rescan=True) if self.hubs is not None else []
        if self.client_sockets:
            if not peers:
                sink.open_client()  # raises exactly as the emitter always did
                return sink
            sink.try_client(warn=True)
            if sink.path:
                return sink
        if not peers:
            raise ConnectionError(errno.ENOTCONN, "no telemetry hub is running")
        sink.inband = True
        sink.path = self.hubs.directory if self.hubs is not None else ""
        return sink

    def close(self) -> None:
        if self.hubs is not None:
            self.hubs.close()
