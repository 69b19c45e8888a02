"""tests/netns/netns.py leaves nothing behind: not when a test fails inside the hosts,
and not when the test process itself is killed (the next `Hosts()` removes what it
left). Root only, like every namespace test; CI runs as root."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from netns import Hosts, require_root

pytestmark = pytest.mark.skipif(bool(require_root()), reason=require_root() or "")


def namespaces() -> set[str]:
    done = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in done.stdout.splitlines() if line.strip()}


def links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie of ours counts as gone.
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


class Boom(Exception):
    pass


def test_a_failure_inside_the_hosts_removes_namespaces_veths_and_processes() -> None:
    sleeper: subprocess.Popen[bytes] | None = None
    names: tuple[str, str] = ("", "")
    with pytest.raises(Boom):
        with Hosts() as hosts:
            names = (hosts.server, hosts.client)
            assert set(names) <= namespaces()
            sleeper = subprocess.Popen(hosts.command(hosts.server, "sleep", "300"))
            time.sleep(0.2)
            raise Boom
    assert sleeper is not None
    sleeper.wait(10)
    assert not set(names) & namespaces()
    tag = names[0].removeprefix("phs")
    assert f"phvs{tag}"[:15] not in links() and f"phvc{tag}"[:15] not in links()


def test_hosts_of_a_killed_test_process_are_removed_by_the_next() -> None:
    code = (
        f"import sys, time; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
        "from netns import Hosts; h = Hosts(); "
        "import subprocess; subprocess.Popen(h.command(h.server, 'sleep', '300')); "
        "print(h.server, h.client, flush=True); time.sleep(300)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    server, client = child.stdout.readline().split()
    inside: list[int] = []
    for _ in range(100):  # the child's `sleep` enters the namespace shortly after it prints
        done = subprocess.run(["ip", "netns", "pids", server], capture_output=True, text=True)
        inside = [int(p) for p in done.stdout.split()]
        if inside:
            break
        time.sleep(0.1)
    assert inside and {server, client} <= namespaces()
    child.send_signal(signal.SIGKILL)  # no atexit, no cleanup
    child.wait(10)
    assert {server, client} <= namespaces()
    with Hosts():
        assert not {server, client} & namespaces()
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in inside) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in inside)
