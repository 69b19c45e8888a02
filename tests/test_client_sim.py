"""The client against the embedded simulated engine: modes, verdicts, reconcilers, outputs."""

from __future__ import annotations

import asyncio
import io
import os
import re
import tempfile

import pytest

from parallelhue.cli.config import parse_run
from parallelhue.screen.summary import summary_lines
from parallelhue.screen.views import make_console, make_view
from parallelhue.session import Session, SessionResult
from parallelhue.sim import FaultConfig, SimConfig, SimServer
from test_cli import _CLEARED

try:
    from parallelhue._native import Reconciler as _NativeReconciler  # noqa: F401

    HAVE_NATIVE = True
except ImportError:
    HAVE_NATIVE = False


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> str:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    socket_dir = tempfile.mkdtemp(prefix="phc", dir="/tmp")
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", socket_dir)
    return socket_dir


def run_against_sim(args: list[str], sim: SimConfig) -> tuple[SessionResult, str]:
    """One session against a fresh simulated engine; returns the result and plain output."""
    console = make_console(False, plain=True)
    console.file = io.StringIO()

    async def go() -> SessionResult:
        server = SimServer(sim)
        url = await server.start()
        try:
            config = parse_run(
                [*args, "--endpoint", url + "/v1/chat/completions"], stdout_tty=False
            )
            session = Session(config, lambda m: make_view("plain", m, console), simulated=True)
            return await session.run()
        finally:
            await server.stop()

    result = asyncio.run(go())
    return result, console.file.getvalue()


def summary_table(out: str) -> dict[str, dict[str, str]]:
    """The summary table (plain, natural width) as {"#i" or "total": {column: cell}}."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("stream label "))
    headers = ["stream", "label", *re.split(r"\s{2,}", lines[start].strip())[1:]]
    table = {}
    for line in lines[start + 1 :]:
        if not re.match(r"^(#\d+|total) ", line):
            break
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] == "total":
            cells.insert(1, "")
        elif " " in cells[0]:
            cells[0:1] = cells[0].split(" ", 1)
        table[cells[0]] = dict(zip(headers, cells, strict=False))  # total: no finish
    return table


def sim_config(**kwargs: object) -> SimConfig:
    return SimConfig(socket_dir=os.environ["PARALLELHUE_SOCKET_DIR"], step_ms=2.0, **kwargs)  # type: ignore[arg-type]


KINDS = [
    "python",
    pytest.param("rust", marks=pytest.mark.skipif(not HAVE_NATIVE, reason="make native first")),
]


@pytest.mark.parametrize("kind", KINDS)
def test_auto_mode_upgrades_every_stream_to_exact(kind: str) -> None:
    result, out = run_against_sim(
        ["hi", "--concurrency", "4", "--max-tokens", "24", "--reconciler", kind],
        sim_config(),
    )
    assert result.exit_code == 0, out
    assert [s.verdict for s in result.model.streams] == ["exact"] * 4
    assert "SIMULATED ENGINE" in out
    assert out.count("#0 EXACT TOKEN PROVENANCE") == 1
    totals = result.model.totals
    assert totals["tokens"] == sum(s.sse_tokens for s in result.model.streams)
    role_sum = totals["accepted"] + totals["target"] + totals["bonus"] + totals["plain"]
    assert role_sum == totals["tokens"]
    target = totals["target"] + totals["plain"]  # plain tokens come from the target model
    expected = (
        f"total: [accepted draft={totals['accepted']} tokens; target={target} tokens; "
        f"bonus={totals['bonus']} tokens; mixed spans={totals['mixed_spans']}] "
        f"(target includes {totals['plain']} plain tokens from steps without drafts)"
    )
    assert expected in out
    # The printed role counts add up to the confirmed tokens, per stream and in total.
    role_re = re.compile(
        r"\[accepted draft=(\d+) tokens; target=(\d+) tokens; bonus=(\d+) tokens; "
        r"mixed spans=\d+\] \(target includes (\d+) plain tokens from steps without drafts\)"
    )
    table = summary_table(out)
    for state in result.model.streams:
        row = table[f"#{state.index}"]
        accepted, shown_target, bonus = map(int, row["draft/target/bonus"].split("/"))
        assert accepted + shown_target + bonus == state.stats["tokens"] == state.sse_tokens
        assert state.stats["plain"] <= shown_target
        assert int(row["tokens"]) == state.sse_tokens
    total_match = role_re.search(expected)
    assert total_match is not None
    assert sum(int(g) for g in total_match.groups()[:3]) == totals["tokens"]
    assert result.model.backend.simulated
    assert "plugin hello: simulated engine" in result.model.backend.evidence


@pytest.mark.parametrize("kind", KINDS)
def test_exact_mode_fails_closed_on_lost_frames(kind: str) -> None:
    faults = FaultConfig(drop=1.0, skip_frames=2, max_per_fault=1)
    result, _out = run_against_sim(
        ["hi", "--concurrency", "2", "--max-tokens", "40", "--mode", "exact",
         "--reconciler", kind],
        sim_config(faults=faults),
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.message is not None
    assert re.fullmatch(
        r"exact mode: stream \d is not exact: frames lost: (gap in source [0-9a-f]{16} at seq \d+"
        r"|source [0-9a-f]{16} dropped \d+ frames before seq \d+)",
        result.message,
    ), result.message


@pytest.mark.parametrize("kind", KINDS)
def test_auto_mode_downgrades_only_the_broken_stream(kind: str) -> None:
    faults = FaultConfig(sse_byte=True, target_stream=1, target_offset=3)
    result, out = run_against_sim(
        ["hi", "--concurrency", "3", "--max-tokens", "24", "--reconciler", kind],
        sim_config(faults=faults),
    )
    verdicts = [s.verdict for s in result.model.streams]
    assert verdicts == ["exact", "failed", "exact"]
    broken = result.model.streams[1]
    assert broken.label == "SSE CHUNK MODE"
    assert broken.reason is not None and broken.reason.startswith("byte mismatch at offset")
    assert f"downgraded: {broken.reason}" in out
    assert result.exit_code == 0


def test_chunk_mode_ignores_telemetry() -> None:
    result, out = run_against_sim(
        ["hi", "--concurrency", "2", "--max-tokens", "16", "--mode", "chunk"], sim_config()
    )
    assert result.exit_code == 0
    assert all(s.label == "SSE CHUNK MODE" for s in result.model.streams)
    assert result.model.totals == {}
    assert "steps and roles: not measured (chunk mode ignores telemetry)" in out


@pytest.mark.skipif(not HAVE_NATIVE, reason="parallelhue._native not built (make native)")
def test_rust_and_python_reconcilers_agree() -> None:
    outputs = {}
    for kind in ("python", "rust"):
        result, _out = run_against_sim(
            ["hi", "--concurrency", "4", "--max-tokens", "32", "--seed", "5", "--mode", "exact",
             "--reconciler", kind],
            sim_config(seed=3),
        )  # fmt: skip
        assert result.exit_code == 0
        outputs[kind] = (
            [(s.verdict, s.spans, s.stats) for s in result.model.streams],
            result.model.totals,
        )
    assert outputs["python"] == outputs["rust"]


def test_summary_lines_come_from_frames_not_wall_time() -> None:
    result, _out = run_against_sim(
        ["hi", "--concurrency", "2", "--max-tokens", "16", "--reconciler", "python"],
        sim_config(acceptance=1.0),
    )
    lines = summary_lines(result.model)
    totals = result.model.totals
    # Full acceptance: every scheduled real draft was accepted.
    drafted = totals["drafts_scheduled"] - totals["drafts_padded"]
    assert totals["accepted"] == drafted > 0
    assert summary_table("\n".join(lines))["total"]["accept"] == "100.0%"
