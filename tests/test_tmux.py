"""--tmux for real: one pane per stream plus a summary pane, read back with capture-pane."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest
from rich.cells import cell_len

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


# --- the live screen in a real terminal (tmux panes at 200x50, 80x24 and 34x9) ------------

PROMPT = "READY$ "


def _shell_command(*args: str) -> str:
    """A parallelhue command line for a shell in a pane, with this checkout on PYTHONPATH."""
    import shlex
    import sys

    python_dir = os.path.join(os.path.dirname(__file__), "..", "python")
    env = [
        f"PYTHONPATH={python_dir}",
        f"PARALLELHUE_SOCKET_DIR={os.environ['PARALLELHUE_SOCKET_DIR']}",
    ]
    return shlex.join(["env", "-u", "TMUX", *env, sys.executable, "-m", "parallelhue", *args])


def _shell(name: str, width: int, height: int) -> str:
    """A bash in a detached pane of the given size, with a prompt we can find."""
    subprocess.run(
        ["tmux", "new-session", "-d", "-s", name, "-x", str(width), "-y", str(height),
         "env", f"PS1={PROMPT}", "TERM=xterm-256color", "bash", "--norc", "--noprofile", "-i"],
        check=True,
    )  # fmt: skip
    wait_for(name, PROMPT)
    return name


def _type(target: str, *keys: str) -> None:
    subprocess.run(["tmux", "send-keys", "-t", target, *keys], check=True)


def _wait_until(target: str, predicate: object, what: str) -> str:
    deadline = time.monotonic() + 60
    text = ""
    while time.monotonic() < deadline:
        text = capture(target)
        if callable(predicate) and predicate(text):
            return text
        time.sleep(0.1)
    raise AssertionError(f"{what} never appeared:\n{text}")


def _slow_demo(concurrency: int) -> str:
    return _shell_command(
        "demo", "--concurrency", str(concurrency), "--max-tokens", "3000", "--step-ms", "40"
    )


@pytest.mark.parametrize(
    ("width", "height", "columns", "streams"), [(200, 50, 5, 15), (80, 24, 2, 16)]
)
def test_live_grid_keeps_the_rightmost_column(
    private_tmux: str, width: int, height: int, columns: int, streams: int
) -> None:
    # Defect 2: panes filling the width exactly (5 x 40, 2 x 40) lost the last column.
    from rich.cells import cell_len

    def pane_rows(text: str) -> list[str]:
        return [row for row in text.splitlines() if row and row[0] in "┌│└┏┃┗"]

    def whole(text: str) -> bool:
        """Every pane row holds all its cells (a capture may catch a row mid-write):
        the border rows count exactly `width` cells; a text row ends with its
        pane's border (its own width is not compared: tmux and Rich count some
        glyphs differently, Devanagari and ZWJ emoji, and a stream whose tail
        shows one would keep the grid from ever looking whole)."""
        rows = pane_rows(text)
        borders = [row for row in rows if row[0] in "┌└┏┗"]
        return (
            len(rows) >= 6
            and len(borders) >= 2
            and all(cell_len(row) == width for row in borders)
            and all(row[-1] in "┐│┘┓┃┛" for row in rows)
        )

    target = _shell("grid", width, height)
    _type(target, _slow_demo(streams), "Enter")
    _wait_until(target, lambda text: "#1 VERIFYING" in text or "#1 EXACT" in text, "the grid")
    # With the defect every frame lacks the last cell: this never turns true.
    screen = _wait_until(target, whole, "a grid whose rows keep their last cell")
    for row in pane_rows(screen):
        assert row[-1] in "┐│┘┓┃┛", row
        assert row.count("┐") + row.count("┓") in (0, columns)
    assert screen.splitlines()[height - 1].startswith("streams ")  # the status line stays
    _type(target, "q")
    _wait_until(target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt")


def test_all_streams_visible_at_200x50(private_tmux: str) -> None:
    target = _shell("all", 200, 50)
    _type(target, _slow_demo(64), "Enter")
    screen = _wait_until(
        target, lambda text: len(set(re.findall(r"#(\d+) ", text))) == 64, "64 streams"
    )
    assert " hidden" not in screen
    _type(target, "q")
    _wait_until(target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt")


def test_80x24_shows_overview_lines_and_says_what_is_hidden_in_full(
    private_tmux: str,
) -> None:
    # Defect 14: at 80x24 the status line was cut without an ellipsis; issue 26, 7: it
    # wraps onto a second line now rather than cut what is hidden and why.
    target = _shell("narrow", 80, 24)
    _type(target, _slow_demo(64), "Enter")
    screen = _wait_until(target, lambda text: " hidden" in text, "the grid")
    rows = screen.splitlines()
    assert re.fullmatch(
        r"\d+ of 64 streams hidden: enlarge the terminal, move the focus or use --tmux",
        rows[22].rstrip(),
    ), rows[22]
    assert rows[23].startswith("streams ") and "keys: ↑↓←→ focus · z zoom" in rows[23]
    overview = [row for row in rows if re.match(r"^[ ▶]#\d+ +(VERIFY|EXACT) ", row)]
    assert len(overview) >= 16  # a line per stream: label, tokens/step, acceptance, tail
    _type(target, "q")
    _wait_until(target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt")


def test_typed_q_quits_with_a_partial_summary_and_never_reaches_the_shell(
    private_tmux: str,
) -> None:
    # Defect 11: no keys were handled; a `q` typed during the run landed on the prompt.
    target = _shell("keys", 80, 24)
    _type(target, _slow_demo(4), "Enter")
    _wait_until(target, lambda text: "#3 " in text, "the live grid")
    _type(target, "x", "y")  # keys the view does not use are read and dropped
    # Arrows move on the grid (issue 26, 11): 0 1 / 2 3 at 80x24, so Down Right Up is #1.
    _type(target, "Down", "Right", "Up", "z")  # zoom it: it gets the whole screen
    zoomed = _wait_until(target, lambda text: "┃#1 " in text, "the zoomed stream")
    # Its status line says how to return (issue 26, 26).
    assert "#2 " not in zoomed and "keys: Esc or z back to the grid · ↑↓←→ next stream" in zoomed
    _type(target, "q")
    after = _wait_until(
        target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt after q"
    )
    # At 80 columns the title says it in fewer words rather than wrap (issue 26, 27).
    assert "Summary (SIMULATED ENGINE) (interrupted: partial) · 4 streams · mode auto" in after
    assert "parallelhue: interrupted" in after
    last = after.rstrip("\n").splitlines()[-1]
    assert last.rstrip() == PROMPT.rstrip(), last  # nothing typed during the run reached it
    _type(target, "echo EXIT=$?", "Enter")
    assert "EXIT=130" in wait_for(target, "EXIT=")


def test_ctrl_c_prints_a_partial_summary_and_restores_the_terminal(private_tmux: str) -> None:
    # Defect 11: Ctrl-C printed no partial summary.
    target = _shell("ctrlc", 80, 24)
    _type(target, _slow_demo(2), "Enter")
    _wait_until(target, lambda text: "#1 " in text, "the live grid")
    _type(target, "C-c")
    after = _wait_until(
        target, lambda text: text.rstrip().endswith(PROMPT.rstrip()), "the prompt after Ctrl-C"
    )
    assert "(interrupted: partial)" in after and re.search(r"^#1 +\S+ +\d+", after, re.M)
    # The terminal echoes again (cbreak mode was left): typed text shows on the prompt.
    _type(target, "echo typed-back", "Enter")
    assert "typed-back" in wait_for(target, "typed-back\n")


def test_34x9_still_shows_streams_and_what_is_hidden(private_tmux: str) -> None:
    target = _shell("tiny", 34, 9)
    _type(target, _slow_demo(16), "Enter")
    screen = _wait_until(target, lambda text: "hidden" in text and "#0 " in text, "the grid")
    rows = screen.splitlines()
    # Columns, not characters: a Devanagari combining mark takes no column of its own.
    assert len(rows) <= 9 and all(cell_len(row) <= 34 for row in rows), rows
    assert re.search(r"▶?#0 +(VERIFY|EXACT)", screen)
    _type(target, "q")
    _wait_until(target, lambda text: PROMPT.rstrip() in text.splitlines()[-1], "the prompt")


def test_tmux_panes_keep_their_header_however_long_the_text(
    private_tmux: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 3: a pane printed one line more than it holds; the header scrolled away.
    code = cli.main(
        ["demo", "--concurrency", "6", "--max-tokens", "300", "--step-ms", "1", "--tmux",
         "--no-attach"]
    )  # fmt: skip
    _out, err = capsys.readouterr()
    assert code == 0, err
    session = err.split("parallelhue: tmux session ", 1)[1].split()[0]
    for index in range(6):
        # The pane is live: its header says VERIFYING until the stream's verdict is in.
        text = wait_for(f"{session}:0.{index}", f"#{index} EXACT TOKEN PROVENANCE")
        lines = text.splitlines()
        assert lines[0].startswith(f"#{index} EXACT TOKEN PROVENANCE"), lines[:2]
        assert re.match(r"\d+ tok \d+ st ", lines[1]), lines[:2]


def _sessions_attached() -> str:
    listed = subprocess.run(
        ["tmux", "list-sessions", "-F", "#{session_name} #{session_attached}"],
        capture_output=True,
        text=True,
    )
    return listed.stdout


def test_tmux_inside_tmux_says_how_to_return_and_removes_finished_sessions(
    private_tmux: str,
) -> None:
    # Defect 12: inside tmux the client was switched with no hint; sessions accumulated.
    work = _shell("work", 160, 40)
    # A client attached to "work" (drawn by a second tmux server acting as the terminal),
    # so `switch-client` has a client to switch.
    subprocess.run(
        ["tmux", "-L", "outer", "new-session", "-d", "-x", "160", "-y", "40",
         f"env -u TMUX TMUX_TMPDIR={private_tmux} tmux attach -t work"],
        check=True,
    )  # fmt: skip
    try:
        _wait_until(
            work,
            lambda _text: "work 1" in _sessions_attached(),
            "the attached client",
        )
        command = _shell_command(
            "demo", "--concurrency", "2", "--max-tokens", "20", "--step-ms", "1", "--tmux"
        ).replace("env -u TMUX ", "env ")
        _type(work, command, "Enter")
        first = _wait_until(work, lambda text: "stays for reading" in text, "the run's end")
        assert "return with `tmux switch-client -l` (prefix + L)" in first
        old = re.search(r"tmux session (parallelhue-[0-9a-f]+)", first)
        assert old is not None
        subprocess.run(["tmux", "switch-client", "-t", "work"], check=False)
        # The next run removes only sessions no client shows: wait until tmux has
        # moved the client back (under load the second run could start before).
        _wait_until(
            work,
            lambda _text: f"{old.group(1)} 0" in _sessions_attached().splitlines(),
            "the client back on work",
        )
        # And until the first run's process has exited (the prompt is back): keys typed
        # while it still runs may go to it, not to the shell.
        _wait_until(
            work,
            lambda text: text.rstrip().splitlines()[-1] == PROMPT.rstrip(),
            "the prompt after the first run",
        )
        _type(work, "clear; echo SECOND-RUN", "Enter", command, "Enter")
        second = _wait_until(
            work,
            lambda text: (
                "SECOND-RUN" in text and "stays for reading" in text.split("SECOND-RUN")[-1]
            ),
            "the second run",
        )
        assert f"removed the finished tmux session {old.group(1)}" in second
        sessions = subprocess.run(
            ["tmux", "list-sessions", "-F", "#{session_name}"],
            check=True, capture_output=True, text=True,
        ).stdout.split()  # fmt: skip
        assert old.group(1) not in sessions
        assert len([name for name in sessions if name.startswith("parallelhue-")]) == 1
    finally:
        subprocess.run(["tmux", "-L", "outer", "kill-server"], check=False, capture_output=True)
