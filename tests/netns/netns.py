"""Two network namespaces joined by a veth pair: a server host and a client host.

`Hosts()` creates `phs<tag>` (the server, 10.231.X.1/30) and `phc<tag>` (the
client, 10.231.X.2/30) with `ip netns` (iproute2, root): each has its own
loopback and one end of the veth pair, and nothing else — no route out, no
shared port. Only these two addresses exist, inside the two namespaces; the
host's own network is never touched. `close()` (also on failure, and at exit)
kills what was started inside and deletes both namespaces, which destroys
the veth pair with them. Namespaces left by a test process that died are
removed by the next `Hosts()`.

`command(host, ...)` prefixes a command so it runs in a namespace;
`call(host, fn)` runs `fn` in a thread that joined the namespace (setns
changes only the calling thread), so a test can talk to the server host
from the client host without a subprocess.
"""

from __future__ import annotations

import atexit
import ctypes
import os
import random
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable
from typing import TypeVar

__all__ = ["Hosts", "NetnsUnavailable", "require_root"]

T = TypeVar("T")
CLONE_NEWNET = 0x40000000
_NAME = re.compile(r"ph[sc](\d+)x(\d+)$")


class NetnsUnavailable(Exception):
    """Namespaces cannot be made here; the message says why."""


def require_root() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    if shutil.which("ip") is None:
        # Never a skip: CI installs iproute2 (.ci/apt-packages).
        raise NetnsUnavailable("`ip` not found: install iproute2 (apt-get install iproute2)")
    return None


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _namespaces() -> list[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return [line.split()[0] for line in done.stdout.splitlines() if line.strip()]


def _remove_stale() -> None:
    """Namespaces of earlier test processes that died without cleaning up."""
    for name in _namespaces():
        match = _NAME.match(name)
        if match is None:
            continue
        pid = int(match.group(1))
        try:
            os.kill(pid, 0)
            continue  # its process is alive: not ours to remove
        except ProcessLookupError:
            pass
        except PermissionError:
            continue
        _kill_inside(name)
        subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _kill_inside(name: str) -> None:
    done = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True)
    for pid in done.stdout.split():
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


class Hosts:
    """A server host and a client host, joined by a veth pair (see the module doc)."""

    def __init__(self) -> None:
        _remove_stale()
        tag = f"{os.getpid()}x{random.randrange(10_000)}"
        self.server = f"phs{tag}"
        self.client = f"phc{tag}"
        subnet = random.randrange(0, 64) * 4  # a /30 inside 10.231.X.0/24
        third = random.randrange(256)
        self.server_ip = f"10.231.{third}.{subnet + 1}"
        self.client_ip = f"10.231.{third}.{subnet + 2}"
        self._closed = False
        veth_s, veth_c = f"phvs{tag}"[:15], f"phvc{tag}"[:15]
        try:
            for name in (self.server, self.client):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "add", veth_s, "type", "veth", "peer", "name", veth_c)
            _ip("link", "set", veth_s, "netns", self.server)
            _ip("link", "set", veth_c, "netns", self.client)
            _ip("-n", self.server, "addr", "add", f"{self.server_ip}/30", "dev", veth_s)
            _ip("-n", self.client, "addr", "add", f"{self.client_ip}/30", "dev", veth_c)
            _ip("-n", self.server, "link", "set", veth_s, "up")
            _ip("-n", self.client, "link", "set", veth_c, "up")
        except BaseException:
            self.close()
            # A veth made before a failure lives in the root namespace until deleted.
            subprocess.run(["ip", "link", "del", veth_s], capture_output=True)
            raise
        atexit.register(self.close)

    def __enter__(self) -> Hosts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def command(self, host: str, *argv: str) -> list[str]:
        """`argv` run inside namespace `host` (self.server or self.client)."""
        return ["ip", "netns", "exec", host, *argv]

    def call(self, host: str, fn: Callable[[], T], timeout: float = 60.0) -> T:
        """`fn()` in a thread that joined namespace `host`; its result or its exception."""
        result: list[T] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                fd = os.open(f"/run/netns/{host}", os.O_RDONLY)
                try:
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), f"setns into {host} failed")
                finally:
                    os.close(fd)
                result.append(fn())
            except BaseException as e:  # handed to the caller
                error.append(e)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"call in namespace {host} did not return in {timeout} s")
        if error:
            raise error[0]
        return result[0]

    def close(self) -> None:
        """Kill what runs inside, delete both namespaces (and so the veth pair). Idempotent."""
        if self._closed:
            return
        self._closed = True
        present = set(_namespaces())
        for name in (self.server, self.client):
            if name in present:
                _kill_inside(name)
                subprocess.run(["ip", "netns", "del", name], capture_output=True)
