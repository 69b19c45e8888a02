"""--tmux: one tmux pane per stream plus a summary pane.

The run itself stays in this process (one reconciler, one socket); each pane
runs a small viewer (`python -m parallelhue _tmux-pane DIR NAME`) that redraws
a JSON snapshot this process rewrites atomically in a private 0700 directory.
No credential ever reaches a pane's command line or a snapshot. The session
outlives the run so the panes can be read; closing it (or `tmux kill-session`)
ends the viewers, and the summary viewer removes the directory.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from types import FrameType
from typing import Any

from rich.console import Console

from ..model.state import RunModel, StreamState
from .banner import banner_line
from .grid import GRID_MAX_PANES
from .lines import Line, fit, wrap
from .paint import RESET, ansi_line
from .pane import PaneData, bare_pane, header_pieces, pane_data
from .style import Theme
from .summary import summary_block
from .views import print_summary

__all__ = ["TmuxError", "TmuxView", "pane_main"]

_POLL_SECONDS = 0.1
SESSION_PREFIX = "parallelhue-"
# Set on a session once its run is over: the next --tmux run may remove it.
_DONE_OPTION = "@parallelhue_done"


class TmuxError(Exception):
    """tmux is missing or refused; one line."""


def _tmux(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", *args], check=False, capture_output=True, text=True, timeout=30)


def _write_atomic(path: str, data: dict[str, Any]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, ensure_ascii=False)
    os.replace(tmp, path)


def _pane_command(directory: str, name: str) -> str:
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # The viewer must import this same package even when it is not installed.
    return shlex.join(
        [
            "env",
            f"PYTHONPATH={package_root}",
            sys.executable,
            "-m",
            "parallelhue",
            "_tmux-pane",
            directory,
            name,
        ]
    )


def remove_finished_sessions() -> list[str]:
    """Kill the sessions of earlier runs that are over and that no client shows."""
    listed = _tmux(
        "list-sessions", "-F", f"#{{session_name}} #{{session_attached}} #{{{_DONE_OPTION}}}"
    )
    removed: list[str] = []
    if listed.returncode != 0:
        return removed
    for row in listed.stdout.splitlines():
        parts = row.split()
        if len(parts) == 3 and parts[0].startswith(SESSION_PREFIX) and parts[1] == "0":
            if parts[2] == "1" and _tmux("kill-session", "-t", parts[0]).returncode == 0:
                removed.append(parts[0])
    return removed


class TmuxView:
    """Writes pane snapshots; tmux panes draw them."""

    def __init__(self, model: RunModel, console: Console, *, attach: bool) -> None:
        if shutil.which("tmux") is None:
            raise TmuxError("--tmux needs tmux on PATH: install it or drop --tmux")
        self.model = model
        self.console = console
        self.attach = attach
        self.session = f"{SESSION_PREFIX}{secrets.token_hex(4)}"
        self.directory = tempfile.mkdtemp(prefix="parallelhue-tmux-")
        self._versions: dict[str, object] = {}
        self._attached: subprocess.Popen[bytes] | None = None
        self._switched = False
        self.refresh_interval = 0.1  # writes only the snapshots that changed

    @property
    def _shown(self) -> list[StreamState]:
        # With --requests a pane is a stream: it shows the latest request started on it.
        return self.model.shown_streams()[:GRID_MAX_PANES]

    def _stream_snapshot(self, stream: StreamState, done: bool) -> dict[str, Any]:
        data = pane_data(stream, self.model, None)
        return {
            "kind": "stream",
            "index": data.index,
            "label": data.label,
            "numbers": data.numbers,
            "body": [list(piece) for piece in data.body],
            "note": data.note,
            "requests": data.requests,
            "palette": self.model.palette,
            "no_color": self.model.no_color,
            "done": done,
        }

    def _summary_snapshot(self, done: bool) -> dict[str, Any]:
        counts = self.model.count_labels()
        if done:
            lines = summary_block(self.model, None)
        else:
            running = "running: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
            lines = [[(running, None)]]
        return {
            "kind": "summary",
            "lines": [
                [list(piece) for piece in line] for line in [banner_line(self.model, None), *lines]
            ],
            "palette": self.model.palette,
            "no_color": self.model.no_color,
            "done": done,
        }

    def _write_all(self, done: bool) -> None:
        for position, stream in enumerate(self._shown):
            version = (
                stream.index,
                len(stream.chunks),
                len(stream.spans),
                stream.label,
                stream.error,
                stream.steps,
                stream.tokens,
                self.model.colorize,
                done,
            )
            name = f"stream-{position}"
            if self._versions.get(name) != version:
                _write_atomic(
                    os.path.join(self.directory, name), self._stream_snapshot(stream, done)
                )
                self._versions[name] = version
        summary = self._summary_snapshot(done)
        if self._versions.get("summary") != summary:
            _write_atomic(os.path.join(self.directory, "summary"), summary)
            self._versions["summary"] = summary

    def start(self) -> None:
        for old in remove_finished_sessions():
            print(f"parallelhue: removed the finished tmux session {old}", file=sys.stderr)
        self._write_all(done=False)
        names = [f"stream-{position}" for position in range(len(self._shown))] + ["summary"]
        created = _tmux(
            "new-session", "-d", "-s", self.session, "-x", "220", "-y", "60",
            _pane_command(self.directory, names[0]),
        )  # fmt: skip
        if created.returncode != 0:
            shutil.rmtree(self.directory, ignore_errors=True)
            raise TmuxError(f"tmux new-session failed: {created.stderr.strip()}")
        for name in names[1:]:
            split = _tmux("split-window", "-t", self.session, _pane_command(self.directory, name))
            if split.returncode != 0:
                raise TmuxError(f"tmux split-window failed: {split.stderr.strip()}")
            _tmux("select-layout", "-t", self.session, "tiled")
        _tmux("select-layout", "-t", self.session, "tiled")
        if self.attach:
            print(f"parallelhue: tmux session {self.session}", file=sys.stderr)
        else:  # --no-attach: how to look at it
            print(
                f"parallelhue: tmux session {self.session} (watch with: tmux attach -t "
                f"{self.session})",
                file=sys.stderr,
            )
        if self.attach and sys.stdout.isatty():
            if os.environ.get("TMUX"):
                switched = _tmux("switch-client", "-t", self.session)
                self._switched = switched.returncode == 0
                if self._switched:
                    print(
                        f"parallelhue: this tmux client now shows {self.session}; return with "
                        "`tmux switch-client -l` (prefix + L)",
                        file=sys.stderr,
                    )
            else:
                self._attached = subprocess.Popen(["tmux", "attach-session", "-t", self.session])
        elif self.attach:
            print(
                f"parallelhue: not a terminal; watch with: tmux attach -t {self.session}",
                file=sys.stderr,
            )

    def refresh(self) -> None:
        self._write_all(done=False)

    def final_lines(self, width: int) -> list[Line]:
        lines: list[Line] = [banner_line(self.model, width)]
        for stream in self.model.streams:
            lines.append(fit(header_pieces(stream), width))
            data = pane_data(stream, self.model, None)
            lines.extend(wrap(data.body, width))
            if data.note:
                lines.append(fit([(data.note, "note")], width))
        return lines

    def _finish(self) -> None:
        self._write_all(done=True)
        _tmux("set-option", "-t", self.session, _DONE_OPTION, "1")

    def abort(self) -> None:
        self._finish()

    def stop(self) -> None:
        self._finish()
        if self._attached is not None:
            with contextlib.suppress(KeyboardInterrupt):
                self._attached.wait()  # until the user detaches or closes the session
            self._attached = None
        if self._switched:
            print(
                f"parallelhue: the session {self.session} stays for reading; the next --tmux "
                f"run removes it (now: `tmux kill-session -t {self.session}`)",
                file=sys.stderr,
            )
        if not self.model.nothing_received:
            print_summary(self.console, self.model)


# --- the pane viewer -------------------------------------------------------------


def _pieces(raw: object) -> Line:
    line: Line = []
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, list) and len(item) == 2 and isinstance(item[0], str):
                line.append((item[0], item[1] if isinstance(item[1], str) else None))
    return line


def snapshot_lines(data: dict[str, Any], width: int, height: int) -> list[Line]:
    """Exactly `height` lines of `width` cells for one snapshot (the pane's size)."""
    if data.get("kind") == "summary":
        raw_lines = data.get("lines", [])
        lines = [fit(_pieces(raw), width, ellipsis=False) for raw in raw_lines[:height]]
        lines.extend([(" " * width, None)] for _ in range(height - len(lines)))
        return lines
    pane = PaneData(
        index=int(data.get("index", 0)),
        label=str(data.get("label", "")),
        numbers=str(data.get("numbers", "")),
        body=tuple(_pieces(data.get("body", []))),
        note=str(data["note"]) if data.get("note") else None,
        requests=int(data["requests"]) if isinstance(data.get("requests"), int) else None,
    )
    return bare_pane(pane, width, height)


def _hangup(_signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(0)


def pane_main(args: list[str]) -> int:
    """Redraw one snapshot file whenever it or the pane size changes."""
    if len(args) != 2:
        print("usage: parallelhue _tmux-pane DIR NAME (internal)", file=sys.stderr)
        return 2
    directory, name = args
    path = os.path.join(directory, name)
    signal.signal(signal.SIGHUP, _hangup)
    signal.signal(signal.SIGTERM, _hangup)
    last: tuple[float, int, int] | None = None
    # Autowrap off and no cursor: the pane shows exactly its rows, never scrolls.
    sys.stdout.write("\x1b[?7l\x1b[?25l")
    try:
        while os.path.isdir(directory):
            try:
                mtime = os.stat(path).st_mtime
                size = os.get_terminal_size()
            except OSError:
                time.sleep(_POLL_SECONDS)
                continue
            key = (mtime, size.columns, size.lines)
            if key != last:
                last = key
                try:
                    with open(path, encoding="utf-8") as handle:
                        data = json.load(handle)
                except (OSError, ValueError):
                    continue
                palette = str(data.get("palette", "standard"))
                theme = Theme(
                    palette if palette in ("standard", "colorblind") else "standard",
                    use_color=not data.get("no_color"),
                )
                lines = snapshot_lines(data, size.columns, size.lines)
                out = [
                    f"\x1b[{row + 1};1H{ansi_line(line, theme)}{RESET}"
                    for row, line in enumerate(lines)
                ]
                sys.stdout.write("".join(out))
                sys.stdout.flush()
            time.sleep(_POLL_SECONDS)
    finally:
        if name == "summary":
            shutil.rmtree(directory, ignore_errors=True)
    return 0
