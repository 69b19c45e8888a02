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

from rich.console import Console, Group
from rich.text import Text

from .state import RunModel, StreamState
from .summary import render_summary, summary_lines
from .views import GRID_MAX_PANES, banner_text, header_text, styled_text, tail_text

__all__ = ["TmuxError", "TmuxView", "pane_main"]

_POLL_SECONDS = 0.1


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


class TmuxView:
    """Writes pane snapshots; tmux panes draw them."""

    def __init__(self, model: RunModel, console: Console, *, attach: bool) -> None:
        if shutil.which("tmux") is None:
            raise TmuxError("--tmux needs tmux on PATH: install it or drop --tmux")
        self.model = model
        self.console = console
        self.attach = attach
        self.session = f"parallelhue-{secrets.token_hex(4)}"
        self.directory = tempfile.mkdtemp(prefix="parallelhue-tmux-")
        self._versions: dict[str, object] = {}
        self._attached: subprocess.Popen[bytes] | None = None
        self.refresh_interval = 0.1  # writes only the snapshots that changed

    @property
    def _shown(self) -> list[StreamState]:
        return self.model.streams[:GRID_MAX_PANES]

    def _stream_snapshot(self, stream: StreamState, done: bool) -> dict[str, Any]:
        return {
            "kind": "stream",
            "index": stream.index,
            "label": stream.label,
            "header": header_text(stream, narrow=True).plain,
            "segments": stream.segments(self.model.colorize),
            "note": stream.note,
            "no_color": self.model.no_color,
            "done": done,
        }

    def _summary_snapshot(self, done: bool) -> dict[str, Any]:
        counts = self.model.count_labels()
        return {
            "kind": "summary",
            "banner": banner_text(self.model).plain,
            "lines": summary_lines(self.model)
            if done
            else ["running: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))],
            "no_color": self.model.no_color,
            "done": done,
        }

    def _write_all(self, done: bool) -> None:
        for stream in self._shown:
            version = (
                len(stream.chunks),
                len(stream.spans),
                stream.label,
                stream.error,
                stream.steps,
                self.model.colorize,
                done,
            )
            name = f"stream-{stream.index}"
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
        self._write_all(done=False)
        names = [f"stream-{s.index}" for s in self._shown] + ["summary"]
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
        print(f"parallelhue: tmux session {self.session}", file=sys.stderr)
        if self.attach and sys.stdout.isatty():
            if os.environ.get("TMUX"):
                _tmux("switch-client", "-t", self.session)
            else:
                self._attached = subprocess.Popen(["tmux", "attach-session", "-t", self.session])
        elif self.attach:
            print(
                f"parallelhue: not a terminal; watch with: tmux attach -t {self.session}",
                file=sys.stderr,
            )

    def refresh(self) -> None:
        self._write_all(done=False)

    def final_picture(self, console: Console) -> Group:
        parts = [banner_text(self.model)]
        for stream in self.model.streams:
            parts.append(header_text(stream))
            parts.append(styled_text(stream.segments(self.model.colorize)))
        return Group(*parts)

    def abort(self) -> None:
        self._write_all(done=True)

    def stop(self) -> None:
        self._write_all(done=True)
        if self._attached is not None:
            with contextlib.suppress(KeyboardInterrupt):
                self._attached.wait()  # until the user detaches or closes the session
            self._attached = None
        self.console.print(render_summary(self.model))


# --- the pane viewer -------------------------------------------------------------


def _render_snapshot(data: dict[str, Any], console: Console, width: int, height: int) -> Group:
    if data.get("kind") == "summary":
        lines: list[Text] = [Text(str(data.get("banner", "")), "bold")]
        lines += [Text(str(line)) for line in data.get("lines", [])]
        return Group(*lines)
    colorize = not data.get("no_color", False)
    header = Text(str(data.get("header", "")), "bold", no_wrap=True, overflow="ellipsis")
    segments = [(str(text), color) for text, color in data.get("segments", [])]
    note = data.get("note")
    body_height = max(1, height - 2 - (1 if note else 0))
    text = styled_text(segments, colorize, max_chars=width * body_height * 2)
    body = tail_text(text, console, width, body_height)
    parts = [header, body]
    if note:
        parts.append(Text(str(note), "red", no_wrap=True, overflow="ellipsis"))
    return Group(*parts)


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
                console = Console(
                    width=size.columns,
                    height=size.lines,
                    force_terminal=True,
                    color_system=None if data.get("no_color") else "256",
                    highlight=False,
                    markup=False,
                    emoji=False,
                )
                with console.capture() as capture:
                    console.print(_render_snapshot(data, console, size.columns, size.lines), end="")
                sys.stdout.write("\x1b[H\x1b[2J" + capture.get())
                sys.stdout.flush()
            time.sleep(_POLL_SECONDS)
    finally:
        if name == "summary":
            shutil.rmtree(directory, ignore_errors=True)
    return 0
