"""What the user types: the `parallelhue` command (command.py), its flags (config.py), the
settings they validate into (settings.py), `demo` and `replay`.

`main` loads the command only when called: the settings are read below the screen
(views.py reads `dumb_terminal`), and importing them must not load the session and
the HTTP client with it (tests/test_layering.py).
"""

from __future__ import annotations

from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """The `parallelhue` command (pyproject's script, `python -m parallelhue`)."""
    from .command import main as run

    return run(argv)
