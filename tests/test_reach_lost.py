"""Lost in-band telemetry never gives EXACT, and fails only its own stream (issue 28):
an end item that says frames are missing (dropped for a slow reader, the final
step's frames not in within the server's wait, the hub shutting down) or a
response that ends without its end item fails that stream with the reason,
while the other streams of the run keep their verdicts.

Both reconcilers (`push_stream_lost`, docs/PROTOCOL.md "In-band telemetry"),
both client paths against the simulated engine faulting its responses
deliberately (`--fault stream-drop:N|stream-end|stream-close`, after
`skip-frames:N` frames of each response), the real hub dropping for a buffer
too small, recordings and the CLI.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

import workloads
from parallelhue import cli
from parallelhue.ingest.record import read_recording
from parallelhue.reference import Reconciler as Reference
from parallelhue.reference.sse_body import ENDED_EARLY
from parallelhue.sim import FaultConfig, SimConfig
from parallelhue_vllm.hub import HubLimits
from test_reach_client import (
    RECONCILERS,
    SimProcess,
    clean_env,
    run_cli,
    session_against,
    sim_config,
)

__all__ = ["clean_env"]  # the autouse fixture of test_reach_client applies here too

try:
    from parallelhue._native import Reconciler as Native
except ImportError:  # pragma: no cover - CI builds it (PH_REQUIRE_NATIVE=1)
    Native = None

CLASSES = [Reference] + ([Native] if Native is not None else [])
DROPPED = "telemetry lost: {n} frames dropped by the server (the response was read too slowly)"
HUB_CLOSED = "telemetry lost: the server's telemetry hub shut down"
ARGS = ["hi", "--concurrency", "6", "--max-tokens", "60", "--mode", "exact", "--telemetry", "http"]
# auto mode: no stream is cancelled by another's failure, each gets its own verdict.
AUTO = ["hi", "--concurrency", "6", "--max-tokens", "60", "--telemetry", "http"]


# ------------------------------------------------------------------ the reconcilers


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_a_lost_stream_fails_alone_and_revokes_its_exact_verdict(cls: Any) -> None:
    workload = workloads.generate(5, num_streams=3, tokens=12, fixed_length=True)
    reconciler = cls(workload.run_id, 3)
    workloads.feed(reconciler, workload.inputs)
    assert [reconciler.verdict(s)[0] for s in range(3)] == ["exact"] * 3
    reconciler.drain()
    reconciler.push_stream_lost(1, "telemetry lost: x")
    assert [reconciler.verdict(s) for s in range(3)] == [
        ("exact", None),
        ("failed", "telemetry lost: x"),
        ("exact", None),
    ]
    assert ("failed", 1, "telemetry lost: x") in reconciler.drain()
    reconciler.finalize()
    reconciler.push_stream_lost(0, "telemetry lost: y")  # final: changes nothing
    assert reconciler.verdict(0) == ("exact", None)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_a_lost_stream_out_of_range_is_one_exact_error(cls: Any) -> None:
    reconciler = cls("ab" * 16, 2)
    with pytest.raises(ValueError) as error:
        reconciler.push_stream_lost(2, "x")
    assert str(error.value) == "stream 2 out of range 0..2"


# ------------------------------------------------------------------ against the engine


def _lossy(**faults: Any) -> SimConfig:
    return sim_config(telemetry_mode="http", faults=FaultConfig(skip_frames=8, **faults))


@pytest.mark.parametrize("reconciler", RECONCILERS)
@pytest.mark.parametrize(
    ("fault", "reason"),
    [({"stream_drop": 3}, None), ({"stream_end": True}, HUB_CLOSED)],
    ids=["drop", "end"],
)
def test_a_response_whose_telemetry_lost_frames_fails_with_the_reason(
    reconciler: str, fault: dict[str, Any], reason: str | None
) -> None:
    result, _, screen = session_against([*AUTO, "--reconciler", reconciler], _lossy(**fault))
    reasons = [(s.verdict, s.reason) for s in result.model.streams]
    for verdict, why in reasons:
        assert verdict == "failed"
        if reason is None:
            # At least the N frames of the fault, and every one after them.
            assert why is not None and why.startswith("telemetry lost: ")
            assert why.endswith(" frames dropped by the server (the response was read too slowly)")
            assert int(why.split()[2]) >= 3
        else:
            assert why == reason
    assert result.exit_code == 0  # auto: downgraded, with the reason on screen
    assert "EXACT TOKEN PROVENANCE" not in screen


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_a_response_cut_mid_telemetry_is_never_exact(reconciler: str) -> None:
    result, _, _ = session_against([*ARGS, "--reconciler", reconciler], _lossy(stream_close=True))
    assert result.exit_code == 2
    assert all(s.verdict == "failed" for s in result.model.streams)
    # The connection closed: the stream's own HTTP failure says so. Exact mode stops
    # the run at the first failure, so a stream still open then is cancelled instead.
    assert any(s.error is not None for s in result.model.streams)
    assert all(s.error is not None or s.cancelled for s in result.model.streams)


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_the_real_hub_dropping_for_a_small_buffer_is_never_exact(reconciler: str) -> None:
    """The hub's own accounting, not a fault: a claim's buffer smaller than two frames
    overflows, keeps nothing more, and its response's end item says how many."""
    result, _, _ = session_against(
        [*AUTO, "--reconciler", reconciler],
        sim_config(telemetry_mode="http", hub_limits=HubLimits(buffer_bytes=300)),
    )
    assert all(s.verdict == "failed" for s in result.model.streams)
    assert all(str(s.reason).startswith("telemetry lost: ") for s in result.model.streams)
    assert all("frames dropped by the server" in str(s.reason) for s in result.model.streams)


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_a_lossy_recording_replays_to_the_same_failures(clean_env: str, reconciler: str) -> None:
    path = os.path.join(clean_env, f"lost-{reconciler}.phr")
    result, _, _ = session_against(
        [*AUTO, "--reconciler", reconciler, "--record", path], _lossy(stream_end=True)
    )
    assert result.exit_code == 0
    recording = read_recording(path)
    lost = [e[2:] for e in recording.events if e[1] == "stream_lost"]
    assert sorted(s for s, _ in lost) == list(range(6))
    assert {why for _, why in lost} == {HUB_CLOSED}
    assert recording.footer is not None
    assert recording.footer["verdicts"][0] == ["failed", HUB_CLOSED]
    for kind in RECONCILERS:
        # replay compares its verdicts with the footer's: 0 = the same verdicts.
        code = cli.main(["replay", path, "--speed", "max", "--view", "plain", "--reconciler", kind])
        assert code == 0


def test_the_cli_against_a_lossy_server_exits_2_naming_the_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = SimProcess("--telemetry", "http", "--fault", "stream-end,skip-frames:6")
    try:
        code, err, _ = run_cli(
            capsys, sim.url, "--telemetry", "http", "--mode", "exact", "--model", "parallelhue-sim"
        )
    finally:
        sim.stop()
    assert code == 2
    assert err[-1] == f"parallelhue: exact mode: stream 0 is not exact: {HUB_CLOSED}"


def test_the_reason_for_a_response_that_ends_without_its_end_item() -> None:
    assert ENDED_EARLY == "telemetry lost: the response ended before its in-band telemetry did"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("stream-drop:-1", "fault stream-drop must be >= 0, got -1"),
        ("stream-drop:x", "fault stream-drop needs a number, got 'x'"),
    ],
)
def test_bad_stream_fault_specs_are_one_exact_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        FaultConfig.parse(spec)
    assert str(error.value) == message


def test_stream_faults_need_in_band_telemetry() -> None:
    config = SimConfig(faults=FaultConfig.parse("stream-end"), telemetry_mode="socket")
    with pytest.raises(ValueError) as error:
        config.validate()
    assert str(error.value) == (
        "stream faults act on in-band telemetry: use --telemetry http or both"
    )
