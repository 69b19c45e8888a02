"""Every injected fault ends in the expected verdict, never in a false EXACT.

A real SimServer (with its emitters and, for datagram faults, its fault proxy)
is driven by the real client without a screen (parallelhue.headless): the
reference path, and the Rust path when built.
The last tests run the real CLI against the standalone engine with faults.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from parallelhue.headless import HeadlessResult as SessionResult
from parallelhue.headless import run_headless as run_session
from parallelhue.sim import FaultConfig, SimConfig, SimServer

ROOT = Path(__file__).resolve().parent.parent
STREAMS = 4


def _native_available() -> bool:
    try:
        from parallelhue import _native
    except ImportError:
        return False
    return hasattr(_native, "Reconciler") and hasattr(_native, "Receiver")


KINDS = ["python"] + (["rust"] if _native_available() else [])


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def run_with_faults(
    kind: str, faults: FaultConfig | None, *, max_tokens: int = 60, stop: list[str] | None = None
) -> tuple[SessionResult, SimServer]:
    socket_dir = tempfile.mkdtemp(prefix="phf", dir="/tmp")

    async def main() -> tuple[SessionResult, SimServer]:
        server = SimServer(SimConfig(step_ms=1.0, socket_dir=socket_dir, faults=faults, seed=3))
        url = await server.start()
        try:
            result = await run_session(
                url,
                num_streams=STREAMS,
                socket_dir=socket_dir,
                max_tokens=max_tokens,
                reconciler_kind=kind,
                stop=stop,
                grace=3.0,
            )
        finally:
            await server.stop()
        return result, server

    try:
        return asyncio.run(main())
    finally:
        shutil.rmtree(socket_dir, ignore_errors=True)


def verdicts(result: SessionResult) -> list[str]:
    return [verdict for verdict, _ in result.verdicts]


def test_no_fault_every_stream_exact(kind: str) -> None:
    result, _ = run_with_faults(kind, None)
    assert verdicts(result) == ["exact"] * STREAMS
    assert result.counters["gaps"] == 0
    assert result.totals["tokens"] == result.sse_tokens == STREAMS * 60


def test_no_fault_with_stop_strings_exact(kind: str) -> None:
    result, _ = run_with_faults(kind, None, max_tokens=120, stop=["。", " the", "ö"])
    assert verdicts(result) == ["exact"] * STREAMS
    assert "stop" in result.finish_reasons


# ------------------------------------------------------------------ lost frames


@pytest.mark.parametrize("fault", ["drop", "truncate", "oversize"])
def test_a_lost_frame_fails_every_unfinished_stream(kind: str, fault: str) -> None:
    faults = FaultConfig(max_per_fault=1, skip_frames=3, **{fault: 1.0})  # type: ignore[arg-type]
    result, server = run_with_faults(kind, faults)
    assert server.fault_proxy is not None
    assert server.fault_proxy.stats[fault] == 1
    assert "exact" not in verdicts(result)
    for reason in result.reasons():
        assert reason is not None
        assert re.fullmatch(r"frames lost: gap in source [0-9a-f]{16} at seq \d+", reason), reason
    if fault != "drop":
        assert result.counters["rejected_frames"] >= 1


# --------------------------------------------------------- harmless datagram faults


def test_duplicated_frames_are_discarded(kind: str) -> None:
    result, server = run_with_faults(kind, FaultConfig(duplicate=1.0))
    assert server.fault_proxy is not None and server.fault_proxy.stats["duplicate"] > 0
    assert verdicts(result) == ["exact"] * STREAMS
    assert result.counters["duplicate_frames"] == server.fault_proxy.stats["duplicate"]


def test_reordered_frames_are_put_back_in_order(kind: str) -> None:
    result, server = run_with_faults(kind, FaultConfig(reorder=0.5, seed=5))
    assert server.fault_proxy is not None and server.fault_proxy.stats["reorder"] > 0
    assert verdicts(result) == ["exact"] * STREAMS


def test_delayed_telemetry_is_waited_for(kind: str) -> None:
    result, server = run_with_faults(kind, FaultConfig(delay_ms=40.0))
    assert server.fault_proxy is not None and server.fault_proxy.stats["delay"] > 0
    assert verdicts(result) == ["exact"] * STREAMS


def test_frames_from_another_run_are_rejected(kind: str) -> None:
    result, server = run_with_faults(kind, FaultConfig(foreign_run=1.0))
    assert server.fault_proxy is not None
    injected = server.fault_proxy.stats["foreign_run"]
    assert injected > 0
    assert result.counters["rejected_frames"] == injected
    assert any(
        re.fullmatch(r"rejected frame: frame for run [0-9a-f]{32}, expected " + result.run_id, m)
        for m in result.run_messages
    )
    assert verdicts(result) == ["exact"] * STREAMS


@pytest.mark.skipif(os.geteuid() != 0, reason="sending as another uid needs root")
def test_a_sender_with_another_uid_is_ignored(kind: str) -> None:
    result, server = run_with_faults(kind, FaultConfig(other_uid=True))
    assert server.other_uid_results == {result.run_id: "sent"}
    # The forged frames would make stream 0 fail if they were admitted.
    assert verdicts(result) == ["exact"] * STREAMS
    rejected = result.receiver.get("rejected_uid", result.receiver.get("rejected_uids"))
    assert rejected == 2, result.receiver


# --------------------------------------------------------------- content faults


@pytest.mark.parametrize(
    ("fault", "pattern"),
    [
        ("sse_byte", r"byte mismatch at offset \d+ \(byte \d+\): HTTP delta vs SSE"),
        (
            "fragment_byte",
            r"byte mismatch at offset \d+ \(byte \d+\): detokenizer fragment vs HTTP delta",
        ),
        ("sse_token_id", r"token mismatch at offset \d+: detokenizer \d+, SSE \d+"),
        ("frame_token_id", r"token mismatch at offset \d+: scheduler \d+, detokenizer \d+"),
        ("reasoning", r"byte mismatch at offset 0 \(byte 0\): HTTP delta vs SSE"),
    ],
)
def test_content_faults_fail_only_the_stream_they_hit(kind: str, fault: str, pattern: str) -> None:
    faults = FaultConfig(target_stream=1, **{fault: True})  # type: ignore[arg-type]
    result, server = run_with_faults(kind, faults)
    assert server.content_faults is not None
    assert server.content_faults.fired == {fault: 1}
    status, reason = result.verdicts[1]
    assert status == "failed"
    assert reason is not None and re.fullmatch(pattern, reason), reason
    others = [v for i, v in enumerate(verdicts(result)) if i != 1]
    assert others == ["exact"] * (STREAMS - 1)


# ------------------------------------------------------------ the CLI under faults


def _cli_available() -> bool:
    try:
        import parallelhue.cli  # noqa: F401
    except ImportError:
        return False
    return True


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELHUE_")}
    env["PYTHONPATH"] = str(ROOT / "python")
    env["NO_COLOR"] = "1"
    return env


def _start_engine(socket_dir: str, fault: str | None) -> tuple[subprocess.Popen[str], str]:
    command = [
        sys.executable,
        "-m",
        "parallelhue.sim",
        "--port",
        "0",
        "--step-ms",
        "2",
        "--socket-dir",
        socket_dir,
    ]
    if fault:
        command += ["--fault", fault]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=_env())
    assert process.stderr is not None
    for _ in range(20):
        line = process.stderr.readline()
        match = re.search(r"serving (http://\S+)", line)
        if match:
            return process, match.group(1)
    process.kill()
    raise AssertionError("the simulated engine did not start")


def run_cli(mode: str, fault: str | None) -> subprocess.CompletedProcess[str]:
    socket_dir = tempfile.mkdtemp(prefix="phfc", dir="/tmp")
    os.chmod(socket_dir, 0o700)
    process, url = _start_engine(socket_dir, fault)
    try:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "parallelhue",
                "--endpoint",
                url + "/v1/chat/completions",
                "--mode",
                mode,
                "--concurrency",
                "3",
                "--max-tokens",
                "40",
                "--view",
                "plain",
                "--socket-dir",
                socket_dir,
                "--reconciler",
                "python",
                "Tell me about speculative decoding.",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env=_env(),
            check=False,
        )
    finally:
        process.terminate()
        process.wait(10)
        shutil.rmtree(socket_dir, ignore_errors=True)


cli_only = pytest.mark.skipif(not _cli_available(), reason="the CLI (parallelhue.cli) is absent")


@cli_only
def test_cli_exact_mode_passes_without_faults() -> None:
    result = run_cli("exact", None)
    assert result.returncode == 0, result.stderr
    assert "EXACT TOKEN PROVENANCE" in result.stdout


@cli_only
@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("drop:1,max-per-fault:1,skip-frames:3", r"frames lost: gap in source [0-9a-f]{16}"),
        ("sse-byte,target-stream:0", r"byte mismatch at offset \d+ \(byte \d+\): HTTP delta"),
        ("frame-token-id,target-stream:0", r"token mismatch at offset \d+: scheduler"),
    ],
)
def test_cli_exact_mode_exits_2_with_the_reason(fault: str, reason: str) -> None:
    result = run_cli("exact", fault)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert re.search(reason, result.stdout + result.stderr), (result.stdout, result.stderr)
    assert "EXACT TOKEN PROVENANCE" not in result.stdout.split("\n")[-3:]


@cli_only
def test_cli_auto_mode_downgrades_only_the_faulty_stream() -> None:
    result = run_cli("auto", "sse-byte,target-stream:1")
    assert result.returncode == 0, (result.stdout, result.stderr)
    output = result.stdout + result.stderr
    assert re.search(r"#1\b.*SSE CHUNK MODE", output), output
    assert re.search(r"#0\b.*EXACT TOKEN PROVENANCE", output), output
    assert re.search(r"byte mismatch at offset \d+", output), output
