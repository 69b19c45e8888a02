"""The screen model stays below the HTTP client (issue 10, D4).

Each module is imported alone in a fresh interpreter, and the client's own
modules it pulls in are compared with the exact list its layer allows: the
screen model (model/: state and what it builds on) and the screen (screen/:
the renderables, painters, style, views) must never reach the transports
(ingest/), the session, the fetchers or their libraries. A new import that
crosses the line fails here with the module that brought it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")

# Libraries of the network side: the HTTP client, its stack, the /metrics parser.
NETWORK_LIBRARIES = ("httpx", "httpcore", "h11", "anyio", "prometheus_client")

# module -> every parallelhue module importing it loads (itself included)
# The room packages (model/, screen/, cli/) load with their modules; their
# __init__ files import nothing.
_ROOT = ("parallelhue", "parallelhue.model")
_MODEL = (
    *_ROOT,
    "parallelhue.model.backend",
    "parallelhue.model.sanitize",
    "parallelhue.model.shapes",
)
# The extension is compiled and imports no Python module; the screen model uses
# its pane-tail reader (_native.tail_pieces) when it is built, else its own
# (test_the_screen_model_imports_without_the_extension). The network libraries
# stay out (the second assertion below).
_NATIVE = ("parallelhue._native",) if importlib.util.find_spec("parallelhue._native") else ()
# advice.py (the fix line) and reported.py (server-reported steps, judged from what
# the readers extracted) sit in the screen model: they read the run, no network.
_STATE = (
    *_MODEL,
    *_NATIVE,
    "parallelhue.model.advice",
    "parallelhue.model.reported",
    "parallelhue.model.state",
    "parallelhue.screen",
    "parallelhue.screen.style",
)
_LINES = (*_STATE, "parallelhue.screen.cells", "parallelhue.screen.lines")
_CHROME = (*_LINES, "parallelhue.screen.chrome")
_PANE = (*_LINES, "parallelhue.screen.pane")
_FOCUS = ("parallelhue", "parallelhue.screen", "parallelhue.screen.focus")
_STATUS = (*_CHROME, *_FOCUS, "parallelhue.screen.pane", "parallelhue.screen.status")
_BANNER = (*_CHROME, "parallelhue.screen.banner")
_LEGEND = (*_CHROME, "parallelhue.screen.legend")
_OVERVIEW = (*_PANE, "parallelhue.screen.overview")
_GRID = (*_STATUS, *_BANNER, *_LEGEND, *_OVERVIEW, "parallelhue.screen.grid")
_STREAM = (*_STATUS, *_BANNER, *_LEGEND, "parallelhue.screen.stream")
_PLAIN = (*_BANNER, *_PANE, "parallelhue.screen.plain")
_PAINT = (*_LINES, "parallelhue.screen.paint")
_RESULTS = (*_STATE, "parallelhue.model.endpoint", "parallelhue.model.results")
_SUMMARY = (*_PAINT, *_PANE, *_RESULTS, "parallelhue.screen.summary")
_SETTINGS = ("parallelhue", "parallelhue.cli", "parallelhue.cli.settings")
EXPECTED: dict[str, tuple[str, ...]] = {
    "parallelhue.model.shapes": (*_ROOT, "parallelhue.model.shapes"),
    "parallelhue.model.sanitize": (*_ROOT, "parallelhue.model.sanitize"),
    "parallelhue.screen.style": ("parallelhue", "parallelhue.screen", "parallelhue.screen.style"),
    "parallelhue.screen.cells": ("parallelhue", "parallelhue.screen", "parallelhue.screen.cells"),
    "parallelhue.cli.settings": _SETTINGS,
    "parallelhue.screen.keys": (*_SETTINGS, "parallelhue.screen", "parallelhue.screen.keys"),
    "parallelhue.model.backend": _MODEL,
    "parallelhue.model.reported": (*_ROOT, "parallelhue.model.reported"),
    "parallelhue.model.state": _STATE,
    "parallelhue.screen.lines": _LINES,
    "parallelhue.screen.chrome": _CHROME,
    "parallelhue.screen.banner": _BANNER,
    "parallelhue.screen.legend": _LEGEND,
    "parallelhue.screen.focus": _FOCUS,
    "parallelhue.screen.status": _STATUS,
    "parallelhue.screen.pane": _PANE,
    "parallelhue.screen.overview": _OVERVIEW,
    "parallelhue.screen.grid": _GRID,
    "parallelhue.screen.stream": _STREAM,
    "parallelhue.screen.plain": _PLAIN,
    "parallelhue.screen.paint": _PAINT,
    "parallelhue.model.results": _RESULTS,
    "parallelhue.screen.summary": _SUMMARY,
    "parallelhue.screen.export": (*_SUMMARY, "parallelhue.screen.export"),
    "parallelhue.screen.measurement": (*_SUMMARY, *_SETTINGS, "parallelhue.screen.measurement"),
    "parallelhue.screen.views": (
        *_GRID,
        *_STREAM,
        *_PLAIN,
        *_SUMMARY,
        *_SETTINGS,
        "parallelhue.screen.keys",
        "parallelhue.screen.views",
    ),
}

_PROBE = """
import importlib, json, sys
for name in sys.argv[2:]:
    sys.modules[name] = None  # blocked: its import raises ImportError
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(name for name, value in sys.modules.items() if value is not None)))
"""


def _imported(module: str, *blocked: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, module, *blocked],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout)
    return loaded


@pytest.mark.parametrize("module", sorted(EXPECTED))
def test_screen_side_imports_nothing_of_the_network(module: str) -> None:
    loaded = _imported(module)
    ours = sorted(name for name in loaded if name.split(".")[0] == "parallelhue")
    assert ours == sorted(set(EXPECTED[module]))
    network = sorted({name.split(".")[0] for name in loaded} & set(NETWORK_LIBRARIES))
    assert network == []


def test_the_screen_model_imports_without_the_extension() -> None:
    # The documented --reconciler python path runs with no compiled code.
    loaded = _imported("parallelhue.model.state", "parallelhue._native")
    ours = sorted(name for name in loaded if name.split(".")[0] == "parallelhue")
    assert ours == sorted(name for name in _STATE if name != "parallelhue._native")


def test_the_fetcher_is_where_httpx_comes_in() -> None:
    # The check above can fail: metrics.py, the /metrics scraper, does load httpx
    # and the Prometheus parser, and the type it fills lives in shapes.py.
    loaded = set(_imported("parallelhue.ingest.metrics"))
    assert {"httpx", "prometheus_client", "parallelhue.model.shapes"} <= loaded
    from parallelhue.ingest.metrics import MetricsSnapshot as Fetched
    from parallelhue.model.shapes import MetricsSnapshot

    assert Fetched is MetricsSnapshot
