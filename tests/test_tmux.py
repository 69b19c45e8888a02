"""--tmux for real: one pane per stream plus a summary pane, read back with capture-pane."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

from client_fakes import FakeServer
from parallelhue import cli
from test_cli import _CLEARED

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")


@pytest.fixture
def private_tmux(monkeypatch: pytest.MonkeyPatch) -> str:
    """A tmux server of our own (TMUX_TMPDIR), never the user's."""
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TMUX", raising=False)
    tmux_dir = tempfile.mkdtemp(prefix="pht", dir="/tmp")
    monkeypatch.setenv("TMUX_TMPDIR", tmux_dir)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))
    yield tmux_dir
    subprocess.run(["tmux", "kill-server"], check=False, capture_output=True)
    shutil.rmtree(tmux_dir, ignore_errors=True)


def capture(target: str) -> str:
    result = subprocess.run(
        ["tmux", "capture-pane", "-p", "-J", "-t", target],
        check=True,
        capture_output=True,
        text=True,
    )
    return result.stdout


def wait_for(target: str, needle: str) -> str:
    """Poll a pane until it shows `needle` (a bound on waiting, not a timing assertion)."""
    deadline = time.monotonic() + 30
    text = ""
    while time.monotonic() < deadline:
        text = capture(target)
        if needle in text:
            return text
        time.sleep(0.1)
    return text


def test_one_pane_per_stream_and_a_summary_pane(
    private_tmux: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk",
             "--concurrency", "3", "--tmux", "--no-attach"]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    session = err.split("parallelhue: tmux session ", 1)[1].split()[0]
    panes = subprocess.run(
        ["tmux", "list-panes", "-t", session, "-F", "#{pane_index}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    assert len(panes) == 4  # three streams and the summary
    for index in range(3):
        text = wait_for(f"{session}:0.{index}", "Hello world!")
        assert f"#{index} SSE CHUNK MODE" in text
        assert "Hello world!" in text
        assert "4 tok" in text
    summary = wait_for(f"{session}:0.3", "3 streams · mode chunk")
    assert re.search(r"^total +12 ", summary, re.M), summary
    assert re.search(r"^#2 +CHUNK +4 ", summary, re.M), summary
    # The summary is also printed to the launching terminal.
    assert re.search(r"^total +12 ", out, re.M), out
    # No pane command carries secrets or the endpoint: only the snapshot directory.
    commands = subprocess.run(
        ["tmux", "list-panes", "-t", session, "-F", "#{pane_start_command}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert server.url not in commands
    assert os.environ["PARALLELHUE_SOCKET_DIR"] not in commands


def test_attach_from_a_terminal_then_summary_after_detach(
    private_tmux: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import shlex
    import sys

    python_dir = os.path.join(os.path.dirname(__file__), "..", "python")
    with FakeServer() as server:
        command = shlex.join(
            ["env", "-u", "TMUX", f"PYTHONPATH={python_dir}",
             f"PARALLELHUE_SOCKET_DIR={os.environ['PARALLELHUE_SOCKET_DIR']}",
             sys.executable, "-m", "parallelhue", "hi",
             "--endpoint", server.url + "/v1/chat/completions",
             "--mode", "chunk", "--concurrency", "2", "--tmux"]
        )  # fmt: skip
        # The outer pane is a real terminal: the client attaches to its new session there.
        subprocess.run(
            ["tmux", "new-session", "-d", "-s", "outer", "-x", "160", "-y", "50",
             f"{command}; echo EXIT=$?; sleep 600"],
            check=True,
        )  # fmt: skip
        wait_for("outer", "#1 SSE CHUNK MODE")
        # The panes draw independently: wait for the other one too.
        outer = wait_for("outer", "#0 SSE CHUNK MODE")
        assert "#0 SSE CHUNK MODE" in outer and "Hello world!" in outer
        sessions = subprocess.run(
            ["tmux", "list-sessions", "-F", "#{session_name}"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        (inner,) = [name for name in sessions if name.startswith("parallelhue-")]
        wait_for(f"{inner}:0.2", "2 streams · mode chunk")
        subprocess.run(["tmux", "kill-session", "-t", inner], check=True)
        after = wait_for("outer", "EXIT=")
    assert "EXIT=0" in after
    assert re.search(r"^total +8 ", after, re.M), after
