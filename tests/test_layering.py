"""The screen model stays below the HTTP client (issue 10, D4).

Each module is imported alone in a fresh interpreter, and the client's own
modules it pulls in are compared with the exact list its layer allows: the
screen model (model/: state and what it builds on) and the screen (screen/:
the renderables, painters, style, views) must never reach the transports
(ingest/), the session, the fetchers or their libraries. A new import that
crosses the line fails here with the module that brought it.

Then the rooms, read from the source: each package (model/, reference/, sim/,
screen/, ingest/, the session) imports only the rooms below it
(`ROOMS_BELOW`), and no module imports itself back through others (no import
circle).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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
    "parallelhue.model.labels",
    "parallelhue.model.reported",
    "parallelhue.model.spans",
    "parallelhue.model.state",
)
_LABELS = (*_ROOT, "parallelhue.model.labels")
_STYLE = (*_LABELS, "parallelhue.screen", "parallelhue.screen.style")
_LINES = (*_STATE, "parallelhue.screen", "parallelhue.screen.cells", "parallelhue.screen.lines")
_CHROME = (*_LINES, "parallelhue.screen.chrome")
_PANE = (*_LINES, "parallelhue.screen.pane")
_FOCUS = ("parallelhue", "parallelhue.screen", "parallelhue.screen.focus")
_STATUS = (*_CHROME, *_FOCUS, "parallelhue.screen.status")
_BANNER = (*_CHROME, "parallelhue.screen.banner")
_LEGEND = (*_CHROME, "parallelhue.screen.legend")
_OVERVIEW = (*_PANE, "parallelhue.screen.overview")
_GRID = (*_STATUS, *_BANNER, *_LEGEND, *_OVERVIEW, "parallelhue.screen.grid")
_STREAM = (*_STATUS, *_BANNER, *_LEGEND, *_PANE, "parallelhue.screen.stream")
_PLAIN = (*_BANNER, *_PANE, "parallelhue.screen.plain")
_PAINT = (*_LINES, *_STYLE, "parallelhue.screen.paint")
_RESULTS = (*_STATE, "parallelhue.model.endpoint", "parallelhue.model.results")
_SUMMARY = (*_PAINT, *_RESULTS, "parallelhue.screen.summary")
_SETTINGS = ("parallelhue", "parallelhue.cli", "parallelhue.cli.settings")
EXPECTED: dict[str, tuple[str, ...]] = {
    "parallelhue.model.shapes": (*_ROOT, "parallelhue.model.shapes"),
    "parallelhue.model.sanitize": (*_ROOT, "parallelhue.model.sanitize"),
    "parallelhue.model.labels": _LABELS,
    "parallelhue.screen.style": _STYLE,
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


# --- the rooms, read from the source (every import, function-level ones too) ---

_PACKAGE = os.path.join(PYTHON_DIR, "parallelhue")

# room -> the rooms its modules may import ("parallelhue" itself: __version__).
# The screen model (model/) is at the bottom; the pure-Python reference
# reconciler (reference/) reads only its key lists there; the screen and the
# network side (ingest/) sit on the model, never on each other; the session
# joins them; cli/ and headless.py are the top. cli.settings, the validated
# settings (plain data), is read below the top and imports only the model.
ROOMS_BELOW: dict[str, frozenset[str]] = {
    "model": frozenset({"model", "_native"}),
    "reference": frozenset({"reference", "model"}),
    "sim": frozenset({"sim"}),
    "screen": frozenset({"screen", "model", "cli.settings"}),
    "cli.settings": frozenset({"model"}),
    "ingest": frozenset({"ingest", "model", "reference", "_native", "cli.settings"}),
    "session": frozenset({"session", "ingest", "model", "screen", "cli.settings"}),
}
_TOP = frozenset({"cli", "headless", "__main__", "_native", "parallelhue"})


def _client_modules() -> dict[str, str]:
    """Every module of the client: its name -> its file."""
    found = {}
    for folder, _dirs, files in os.walk(_PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                parts = os.path.relpath(path, PYTHON_DIR)[: -len(".py")].split(os.sep)
                if parts[-1] == "__init__":
                    parts.pop()
                found[".".join(parts)] = path
    return found


def _imports(module: str, path: str, modules: Mapping[str, str], *, top_level: bool) -> set[str]:
    """The client modules `module` imports (`top_level`: only as its body runs; else
    every import, in functions and under TYPE_CHECKING too)."""
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    nodes = tree.body if top_level else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                if f"{base}.{alias.name}" in modules:
                    found.add(f"{base}.{alias.name}")
                elif base in modules:
                    found.add(base)
    return found


def _room(module: str) -> str:
    if module == "parallelhue.cli.settings":
        return "cli.settings"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "parallelhue"


def _crossings(modules: Mapping[str, str]) -> list[str]:
    crossing = []
    for name, path in sorted(modules.items()):
        room = _room(name)
        if room in _TOP:
            continue
        # A new room gets its rule in ROOMS_BELOW (or is a top: anything goes there).
        allowed = ROOMS_BELOW.get(room, frozenset()) | {"parallelhue", room}
        for target in sorted(_imports(name, path, modules, top_level=False)):
            if _room(target) not in allowed:
                crossing.append(f"{name} imports {target}")
    return crossing


def _circles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                circles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return circles


def test_each_room_imports_only_the_rooms_below_it() -> None:
    modules = _client_modules()
    assert {_room(name) for name in modules} <= set(ROOMS_BELOW) | _TOP
    assert _crossings(modules) == []


def test_a_model_module_reaching_up_is_a_crossing(tmp_path: Path) -> None:
    # Both kinds the rule must see: a relative import at the top, one inside a function.
    fake = tmp_path / "fake.py"
    fake.write_text("from ..screen.views import View\n\ndef f():\n    from ..ingest import feed\n")
    modules = {**_client_modules(), "parallelhue.model.fake": str(fake)}
    assert _crossings(modules) == [
        "parallelhue.model.fake imports parallelhue.ingest.feed",
        "parallelhue.model.fake imports parallelhue.screen.views",
    ]


def test_no_import_circle_among_the_clients_modules() -> None:
    modules = _client_modules()
    graph = {name: _imports(name, path, modules, top_level=True) for name, path in modules.items()}
    assert _circles(graph) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c", "a"]]
