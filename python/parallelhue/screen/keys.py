"""Keys while a live view runs: read from the terminal in cbreak mode, never echoed.

The terminal goes back to exactly its previous settings when the view ends
(normally, by Ctrl-C, or by an error), and whatever was typed but not read is
discarded then (TCSAFLUSH), so a `q` typed during the run never lands on the
shell prompt afterwards. Ctrl-C keeps working (ISIG stays on).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import sys
import termios
import tty
from collections.abc import Callable
from typing import Any

from ..cli.settings import dumb_terminal

__all__ = ["KeyReader", "decode_keys"]

# Escape sequences of the keys the views use, as most terminals send them.
_SEQUENCES = {
    "\x1b[A": "up",
    "\x1b[B": "down",
    "\x1b[C": "right",
    "\x1b[D": "left",
    "\x1bOA": "up",
    "\x1bOB": "down",
    "\x1bOC": "right",
    "\x1bOD": "left",
    "\x1b[Z": "backtab",
    "\x1b[5~": "pageup",
    "\x1b[6~": "pagedown",
    "\x1b[H": "home",
    "\x1b[F": "end",
}
_SINGLE = {"\t": "tab", "\r": "enter", "\n": "enter", " ": "space", "\x7f": "backspace"}


def decode_keys(data: str) -> list[str]:
    """Key names in `data`: printable characters as themselves, the rest by name.

    An ESC that starts no known sequence is the Escape key; unknown sequences
    are skipped whole (up to their final byte) rather than read as letters.
    """
    keys: list[str] = []
    index = 0
    while index < len(data):
        char = data[index]
        if char == "\x1b":
            for sequence, name in _SEQUENCES.items():
                if data.startswith(sequence, index):
                    keys.append(name)
                    index += len(sequence)
                    break
            else:
                if index + 1 < len(data) and data[index + 1] in "[O":
                    end = index + 2
                    while end < len(data) and not ("@" <= data[end] <= "~"):
                        end += 1
                    index = end + 1
                else:
                    keys.append("escape")
                    index += 1
            continue
        if char in _SINGLE:
            keys.append(_SINGLE[char])
        elif char.isprintable():
            keys.append(char)
        index += 1
    return keys


class KeyReader:
    """Puts a terminal into cbreak mode and calls `on_key` for each key read."""

    def __init__(self, on_key: Callable[[str], None], fd: int | None = None) -> None:
        self.on_key = on_key
        self.fd = sys.stdin.fileno() if fd is None else fd
        self._saved: list[Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @staticmethod
    def available(fd: int | None = None) -> bool:
        """A terminal we can read keys from (not a pipe, not TERM=dumb)."""
        if dumb_terminal():
            return False
        try:
            return os.isatty(sys.stdin.fileno() if fd is None else fd)
        except (OSError, ValueError):
            return False

    def start(self) -> None:
        try:
            self._saved = termios.tcgetattr(self.fd)
            tty.setcbreak(self.fd, termios.TCSANOW)  # no echo, no line buffering; ISIG kept
        except (termios.error, OSError):
            self._saved = None
            return
        atexit.register(self.stop)  # a crash must not leave the terminal in cbreak mode
        try:
            self._loop = asyncio.get_running_loop()
            self._loop.add_reader(self.fd, self._read)
        except (RuntimeError, NotImplementedError, ValueError):
            self._loop = None

    def _read(self) -> None:
        try:
            data = os.read(self.fd, 1024)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._detach()
            return
        if not data:
            self._detach()
            return
        for key in decode_keys(data.decode("utf-8", "replace")):
            self.on_key(key)

    def _detach(self) -> None:
        if self._loop is not None:
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.fd)
            self._loop = None

    def stop(self) -> None:
        """Restore the terminal and drop unread input (idempotent)."""
        self._detach()
        if self._saved is not None:
            with contextlib.suppress(termios.error, OSError):
                termios.tcsetattr(self.fd, termios.TCSAFLUSH, self._saved)
            self._saved = None
            with contextlib.suppress(Exception):
                atexit.unregister(self.stop)
