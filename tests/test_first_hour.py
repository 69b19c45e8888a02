"""Issue 26's smaller items, each checked where it can fail: the tested stream range
(16), what the docs tell a newcomer (17-20, 32), the demo (21, 33), the output
files' confirmations (24) and the tmux hint (25)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from client_fakes import FakeServer
from parallelhue import cli, session
from parallelhue.cli.demo import DEMO_MAX_TOKENS, DEMO_STEP_MS, parse_demo
from parallelhue.sim import SimConfig
from test_cli import _CLEARED
from test_client_sim import run_against_sim

ROOT = Path(__file__).resolve().parent.parent


def _doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> str:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    directory = tempfile.mkdtemp(prefix="ph1h", dir="/tmp")
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", directory)
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.2)
    return directory


def test_256_streams_are_exact(clean_env: str) -> None:
    """Item 16: the top of the tested range the README states."""
    result, _out = run_against_sim(
        ["hi", "--concurrency", "256", "--max-tokens", "16", "--mode", "exact"],
        SimConfig(socket_dir=clean_env, step_ms=0.0),
    )
    assert result.exit_code == 0, result.message
    assert [s.verdict for s in result.model.streams] == ["exact"] * 256
    readme = _doc("README.md")
    assert "tested from 1 to 256 streams" in readme
    assert "1 to 64 concurrent" not in readme


def test_the_readme_says_what_a_server_needs() -> None:
    """Items 17 and 19: the remote paragraph names both switches; the releases."""
    readme = " ".join(_doc("README.md").split())
    assert "start it with `VLLM_PLUGINS=parallelhue PARALLELHUE_VLLM_EXACT=1`" in readme
    assert "Supported vLLM releases: 0.26.0 to 0.34.0" in readme


def test_plugin_md_says_one_thing_about_vllm_plugins() -> None:
    """Item 18: VLLM_PLUGINS is the list vLLM loads; it does not only 'limit'."""
    plugin = " ".join(_doc("docs/PLUGIN.md").split())
    assert "limits vLLM to this plugin" not in plugin
    assert "`VLLM_PLUGINS` is vLLM's list of the plugins it loads." in plugin
    assert "no endpoint plugin (no telemetry over HTTP)" in plugin


def test_the_plugin_wheel_is_what_the_docs_call_it(tmp_path: Path) -> None:
    """Item 20: the docs call the plugin wheel pure Python; the wheel built from
    plugin/ must then be py3-none-any and carry no shared object (the C
    accelerator is a wheel of its own, plugin/speedups)."""
    docs = " ".join(_doc("docs/PLUGIN.md").split())
    assert "`py3-none-any` wheel" in docs
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
         "-w", str(tmp_path), str(ROOT / "plugin")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    shutil.rmtree(ROOT / "plugin" / "build", ignore_errors=True)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("parallelhue_vllm-*.whl")
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert not [n for n in archive.namelist() if n.endswith((".so", ".pyd", ".c"))]


def test_client_md_describes_the_request_body_once() -> None:
    """Item 32: the stale repeated paragraph is gone."""
    client = _doc("docs/CLIENT.md")
    assert client.count("Each stream's body") == 1
    assert "`run_id` is `secrets.token_hex(16)`" in client


def test_the_demo_lasts_long_enough_to_watch() -> None:
    """Item 21: about 15 s by default (256 tokens, a step every 80 ms; measured
    14.0 s of generation on the 2-core VM), and `make demo` rebuilds nothing when
    nothing changed (the extension is a file target on the Rust sources)."""
    demo = parse_demo([], env={}, stdout_tty=False)
    assert (demo.step_ms, demo.run.max_tokens) == (DEMO_STEP_MS, DEMO_MAX_TOKENS) == (80.0, 256)
    makefile = _doc("Makefile")
    assert re.search(r"^demo: native\n\t\$\(PY\) -m parallelhue demo\n", makefile, re.M)
    assert re.search(r"^native: \$\(VENV\)/\.native \$\(VENV\)/\.speedups$", makefile, re.M)
    assert "$(VENV)/.speedups: $(VENV)/.deps $(SPEEDUPS_SOURCES)" in makefile
    assert "$(VENV)/.native: $(VENV)/.deps $(RUST_SOURCES)" in makefile


def test_demo_help_is_readable_and_self_contained(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 33: sections, lines that fit, the fault names in it, no doc outside the wheel."""
    assert cli.main(["demo", "--help"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATOR.md" not in text
    assert "the simulated engine:" in text and "the run (as in parallelhue --help):" in text
    assert max(len(line) for line in text.splitlines()) <= 90
    for fault in ("drop", "sse-byte", "target-stream", "delay"):
        assert re.search(rf"\b{fault}\b", text), fault


def test_output_files_are_confirmed_and_a_replaced_one_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 24."""
    record, export = str(tmp_path / "run.phr"), str(tmp_path / "run.html")
    args = ["hi", "--mode", "chunk", "--view", "plain", "--record", record, "--export", export]
    with FakeServer() as server:
        assert cli.main([*args, "--endpoint", server.url]) == 0
        first = capsys.readouterr().err
        assert cli.main([*args, "--endpoint", server.url]) == 0
        second = capsys.readouterr().err
    assert f"parallelhue: recording written to {record}\n" in first
    assert f"parallelhue: picture written to {export}\n" in first
    assert f"parallelhue: recording written to {record} (replaced the file that was there)" in (
        second
    )
    assert f"parallelhue: picture written to {export} (replaced the file that was there)" in second
    assert (
        cli.main(["replay", record, "--speed", "max", "--view", "plain", "--export", export]) == 0
    )
    replayed = capsys.readouterr().err
    assert f"parallelhue: picture written to {export} (replaced the file that was there)" in (
        replayed
    )


@pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux (.ci/apt-packages has it)")
def test_tmux_no_attach_says_how_to_watch(tmp_path: Path) -> None:
    """Item 25."""
    env = {**os.environ, "TMUX_TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "2", "--max-tokens", "8",
         "--step-ms", "1", "--tmux", "--no-attach"],
        capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        assert result.returncode == 0, result.stderr
        found = re.search(
            r"^parallelhue: tmux session (parallelhue-[0-9a-f]+) \(watch with: tmux attach -t "
            r"(parallelhue-[0-9a-f]+)\)$",
            result.stderr,
            re.M,
        )
        assert found is not None, result.stderr
        assert found.group(1) == found.group(2)
    finally:
        subprocess.run(["tmux", "kill-server"], env=env, check=False, capture_output=True)


def test_help_says_what_record_writes(capsys: pytest.CaptureFixture[str]) -> None:
    """Item 15: format 3 (binary items), not gzip'd JSON lines."""
    assert cli.main(["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "JSON lines" not in text
    assert "recording format 3 (gzip'd binary items)" in text


def test_make_demo_runs_the_demo_and_nothing_else_when_nothing_changed() -> None:
    """Items 21 and 31: after a build (make py-test builds first), `make demo` would
    rebuild nothing and run no pip: its dry run is the demo alone."""
    if shutil.which("make") is None or not (ROOT / ".venv" / ".native").exists():
        pytest.skip("needs make and a tree built by make native")
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    dry = subprocess.run(
        ["make", "--no-print-directory", "-n", "demo"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout == ".venv/bin/python -m parallelhue demo\n", (
        f"make demo would run more than the demo (a Rust file newer than the build? "
        f"run make native): {dry.stdout}"
    )
