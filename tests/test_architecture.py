"""docs/ARCHITECTURE.md and docs/CLIENT.md name only files and folders that exist.

A newcomer finds their room from that page, so a path it names that a move
or a rename left behind fails here. Read from the page: every repository
path (`rust/core/src/sse/`, `docs/PROTOCOL.md`, ...), and every backticked
file name or partial path (`hub.py`, `sse/events.rs`), which must be the end
of some file's path in the tree.
"""

from __future__ import annotations

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ("docs/ARCHITECTURE.md", "docs/CLIENT.md")

# A path from the repository's root, in backticks or in the text.
_ROOTED = re.compile(r"(?<![\w./~-])((?:docs|rust|python|plugin|tests|benches)/[\w./-]*[\w/])")
# A backticked file name or partial path: ends in one of the tree's extensions.
_NAMED = re.compile(r"`([\w./-]+\.(?:py|pyi|rs|c|h|md|json|sh|toml))`")
_ROOTS = ("docs/", "rust/", "python/", "plugin/", "tests/", "benches/")
_SKIP_DIRS = {".git", ".venv", "target", "node_modules", "__pycache__", "dist"}


def _tree() -> tuple[set[str], set[str]]:
    files, folders = set(), set()
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info")]
        rel = os.path.relpath(folder, ROOT)
        if rel != ".":
            folders.add(rel.replace(os.sep, "/"))
        for name in names:
            files.add(os.path.join(rel, name).replace(os.sep, "/").removeprefix("./"))
    return files, folders


def named_paths(text: str) -> tuple[set[str], set[str]]:
    """(paths from the root, file names and partial paths) that `text` names."""
    rooted = {match.rstrip(".") for match in _ROOTED.findall(text)}
    named = {name for name in _NAMED.findall(text) if not name.startswith(_ROOTS)}
    return rooted, named


def missing(text: str, files: set[str], folders: set[str]) -> list[str]:
    rooted, named = named_paths(text)
    gone = [p for p in rooted if p.rstrip("/") not in files | folders]
    gone += [n for n in named if not any(f == n or f.endswith("/" + n) for f in files)]
    return sorted(gone)


@pytest.mark.parametrize("doc", DOCS)
def test_every_path_the_page_names_exists(doc: str) -> None:
    with open(os.path.join(ROOT, doc), encoding="utf-8") as handle:
        text = handle.read()
    files, folders = _tree()
    rooted, named = named_paths(text)
    assert rooted and named, "the reader found no path: its patterns no longer fit the page"
    assert missing(text, files, folders) == []


def test_a_path_left_behind_by_a_move_is_found() -> None:
    files, folders = _tree()
    text = (
        "The screen lives in `python/parallelhue/screen/` (`lines.py`, `screen/pane.py`);"
        " the SSE reader was rust/core/src/sse_stream.rs, the layout `panes.py`, and"
        " docs/PROTOCOL.md says why."
    )
    assert missing(text, files, folders) == ["panes.py", "rust/core/src/sse_stream.rs"]
