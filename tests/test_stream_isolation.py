"""One stream's failure is that stream's: the others go on, and exact mode blames
the stream that failed first (issue 9), on both paths."""

from __future__ import annotations

import json
import os
import re
import tempfile

import pytest

from client_fakes import FakeServer
from parallelhue import cli, session
from test_cli import _CLEARED
from test_client import stream_lines

try:
    from parallelhue._native import HttpStreams  # noqa: F401

    KINDS = ["python", "rust"]
except ImportError:  # pragma: no cover - depends on `make native`
    KINDS = ["python"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phi", dir="/tmp"))
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.2)


def _prompts(directory: str, prompts: list[str]) -> str:
    path = os.path.join(directory, "prompts.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(prompts, handle)
    return path


def _lines(out: str) -> dict[int, str]:
    return stream_lines(out)


# What each path says about a delta whose text is a lone surrogate: both JSON
# readers refuse it (serde_json and the reference's reading of it, in their words),
# and that ends this stream only.
SURROGATE = {
    "rust": re.compile(
        r"error: bad SSE data: invalid JSON in SSE data: unexpected end of hex escape "
        r"at line 1 column \d+$"
    ),
    "python": re.compile(
        r"error: bad SSE data: invalid JSON in SSE data: lone surrogate in a string escape$"
    ),
}


@pytest.mark.parametrize("kind", KINDS)
def test_a_stream_whose_handling_raises_fails_alone(
    kind: str, tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _prompts(str(tmp_path), ["ok", "surrogate", "ok"])
    with FakeServer() as server:
        code = cli.main(
            ["--prompt-file", path, "--endpoint", server.url + "/v1/chat/completions",
             "--mode", "chunk", "--view", "plain", "--reconciler", kind]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("parallelhue: 1 of 3 streams failed; stream 1: ")
    lines = _lines(out)
    assert SURROGATE[kind].search(lines[1]), lines[1]
    for healthy in (0, 2):
        # No failure line for it; its summary table row: CHUNK, 4 tokens.
        assert healthy not in lines
        assert re.search(rf"^#{healthy} +CHUNK +4 ", out, re.M), out
    assert "Hello world!" in out


@pytest.mark.parametrize("kind", KINDS)
def test_exact_mode_blames_the_stream_that_failed_first(
    kind: str, tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _prompts(str(tmp_path), ["ok", "ok", "error400", "ok"])
    with FakeServer() as server:
        code = cli.main(
            ["--prompt-file", path, "--endpoint", server.url + "/v1/chat/completions",
             "--mode", "exact", "--view", "plain", "--reconciler", kind]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2
    # Not "stream 0 ... missing telemetry": stream 2's own reason, and the
    # streams stopped because of it are counted as cancelled, not "not exact".
    assert err == (
        "parallelhue: exact mode: stream 2 is not exact: HTTP 400: This model's maximum "
        "context length is 8 tokens.; 3 streams were cancelled because of it\n"
    )
    lines = _lines(out)
    assert lines[2].startswith("stream 2: ERROR")
    for other in (0, 1, 3):
        assert lines[other].startswith(f"stream {other}: CANCELLED"), lines[other]
    assert "NOT EXACT" not in out
