"""Lost HTTP telemetry never gives EXACT (issue 11): a `dropped` item (frames the
server's hub discarded for a slow client) and a telemetry stream that ends before
the run (an end item, or a connection lost without one) fail every stream that
has no verdict yet, with the reason saying so, while the run message says how
many frames were lost.

Both reconcilers (`push_lost`, docs/PROTOCOL.md "Lost telemetry"), both client
paths (the Rust HTTP thread, `--reconciler python`'s `PyHttpTelemetry`) against
the simulated engine whose route loses frames deliberately (`--fault
stream-drop:N|stream-end|stream-close`, after `skip-frames:N` frames), the real
hub dropping for a buffer too small, recordings and the CLI.
"""

from __future__ import annotations

import os
import random
from dataclasses import replace
from typing import Any

import pytest

import workloads
from parallelhue import cli
from parallelhue.ingest.record import read_recording
from parallelhue.reference import Reconciler as Reference
from parallelhue.sim import FaultConfig, SimConfig
from parallelhue.sim.stream_faults import END_MESSAGE
from parallelhue_vllm import wire
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
DROPPED = "telemetry lost: {n} frames dropped by the server"
ENDED = "telemetry lost: the telemetry stream ended before the run"
ARGS = ["hi", "--concurrency", "6", "--max-tokens", "60", "--mode", "exact", "--telemetry", "http"]


def _feed(reconciler: Any, inputs: list[tuple[Any, ...]]) -> None:
    for item in inputs:
        if item[0] == "lost":
            reconciler.push_lost(item[1])
        else:
            workloads.feed(reconciler, [item])


def _verdicts(reconciler: Any, n: int) -> list[tuple[str, str | None]]:
    return [reconciler.verdict(s) for s in range(n)]


# ------------------------------------------------------------------ the reconcilers


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_lost_telemetry_fails_every_stream_without_a_final_verdict(cls: Any) -> None:
    work = workloads.generate(11, num_streams=3, tokens=12, k=3, fixed_length=True, jitter=0.0)
    finish = {item[1]: item for item in work.inputs if item[0] == "finish"}
    # Everything of stream 0, then the loss, then the rest: stream 0 is exact before it.
    first = [item for item in work.inputs if item[0] != "finish"]
    r = cls(work.run_id, 3)
    _feed(r, first)
    _feed(r, [finish[0]])
    assert r.verdict(0) == ("exact", None)
    r.push_lost(0)  # nothing lost: nothing changes
    assert _verdicts(r, 3) == [("exact", None)] + [("pending", None)] * 2
    r.push_lost(4)
    # An exact verdict is not final before finalize(): a lost frame may have been a
    # notice for stream 0 too (docs/PROTOCOL.md, "Lost telemetry", "Finality").
    assert _verdicts(r, 3) == [("failed", DROPPED.format(n=4))] * 3
    events = r.drain()
    assert [e for e in events if e[0] == "failed"] == [
        ("failed", s, DROPPED.format(n=4)) for s in range(3)
    ]
    # Later evidence changes nothing: the streams stay failed with the first reason.
    _feed(r, [finish[1], finish[2]])
    r.push_lost(None)
    r.finalize()
    assert _verdicts(r, 3) == [("failed", DROPPED.format(n=4))] * 3


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_a_loss_after_finalize_changes_nothing(cls: Any) -> None:
    work = workloads.generate(14, num_streams=2, tokens=10, k=2, fixed_length=True, jitter=0.0)
    r = cls(work.run_id, 2)
    _feed(r, work.inputs)
    r.finalize()
    assert _verdicts(r, 2) == [("exact", None)] * 2
    r.push_lost(3)
    r.push_lost(None)
    assert _verdicts(r, 2) == [("exact", None)] * 2


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_a_stream_that_ends_early_gives_its_own_reason(cls: Any) -> None:
    work = workloads.generate(12, num_streams=2, tokens=10, k=2, fixed_length=True, jitter=0.0)
    r = cls(work.run_id, 2)
    _feed(r, [item for item in work.inputs if item[0] != "finish"])
    r.push_lost(None)
    _feed(r, [item for item in work.inputs if item[0] == "finish"])
    r.finalize()
    assert _verdicts(r, 2) == [("failed", ENDED)] * 2


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
def test_a_lost_notice_would_have_hidden_a_failure(cls: Any) -> None:
    """The case that makes the `dropped` item evidence: frames lost at the end of
    a source leave no sequence gap, and a lost frame may be the one that fails a
    stream (here a notice). Without the item the stream would be EXACT."""
    work = workloads.generate(13, num_streams=2, tokens=10, k=2, fixed_length=True, jitter=0.0)
    frames = [workloads.decode_frame(item[1]) for item in work.inputs if item[0] == "frame"]
    last = max((f.header for f in frames if f.kind == wire.KIND_TEXT), key=lambda h: h.seq)
    notice = wire.encode_records(
        wire.KIND_NOTICE,
        replace(last, seq=last.seq + 1, dropped=0),
        [wire.NoticeRecord(0, wire.NOTICE_HOOK_ERROR, "detokenizer hook failed")],
    )
    body = [item for item in work.inputs if item[0] != "finish"]
    finish = [item for item in work.inputs if item[0] == "finish"]
    # Delivered, the notice fails stream 0.
    told = cls(work.run_id, 2)
    _feed(told, [*body, ("frame", notice), *finish])
    assert told.verdict(0)[0] == "failed" and "detokenizer hook failed" in str(told.verdict(0)[1])
    # Lost without a word: no gap shows it, and stream 0 comes out EXACT.
    silent = cls(work.run_id, 2)
    _feed(silent, [*body, *finish])
    assert silent.verdict(0) == ("exact", None)
    # Lost and said by the hub's dropped item: not exact, and the reason says why.
    said = cls(work.run_id, 2)
    _feed(said, [*body, ("lost", 1), *finish])
    assert _verdicts(said, 2) == [("failed", DROPPED.format(n=1))] * 2


@pytest.mark.skipif(Native is None, reason="needs the native extension (make native)")
@pytest.mark.parametrize("seed", range(12))
def test_both_reconcilers_agree_on_lost_telemetry(seed: int) -> None:
    rng = random.Random(seed)
    work = workloads.generate(100 + seed, num_streams=(2, 5), tokens=(4, 30))
    inputs: list[tuple[Any, ...]] = list(work.inputs)
    for _ in range(rng.randint(1, 2)):
        lost = rng.choice([None, 0, 1, rng.randint(2, 1000)])
        inputs.insert(rng.randint(0, len(inputs)), ("lost", lost))
    runs = []
    for cls in (Reference, Native):
        r = cls(work.run_id, work.num_streams)
        events = []
        for item in inputs:
            _feed(r, [item])
            events += r.drain()
        r.finalize()
        events += r.drain()
        runs.append((events, _verdicts(r, work.num_streams)))
    assert runs[0] == runs[1]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__module__)
@pytest.mark.parametrize("bad", [-1, 2**64, True, "3", 1.5])
def test_a_bad_lost_count_is_one_exact_error(cls: Any, bad: object) -> None:
    r = cls("ab" * 16, 1)
    with pytest.raises(ValueError) as error:
        r.push_lost(bad)
    assert str(error.value) == f"lost frame count {bad} out of range 0..=18446744073709551615"
    assert r.verdict(0) == ("pending", None)


# --------------------------------------------------------------- the client, end to end


def _lossy(**faults: Any) -> SimConfig:
    return sim_config(telemetry_mode="http", faults=FaultConfig(skip_frames=8, **faults))


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_frames_the_server_dropped_fail_the_open_streams_and_the_run_says_how_many(
    reconciler: str,
) -> None:
    result, _, screen = session_against([*ARGS, "--reconciler", reconciler], _lossy(stream_drop=3))
    reasons = [(s.verdict, s.reason) for s in result.model.streams]
    assert reasons == [("failed", DROPPED.format(n=3))] * 6
    assert result.exit_code == 2
    assert result.message == f"exact mode: stream 0 is not exact: {DROPPED.format(n=3)}"
    line = (
        "telemetry: 3 frames dropped by the server (the client read too slowly; "
        "buffer 4194304 bytes)"
    )
    assert result.model.run_messages == [line]
    assert "EXACT" not in screen.replace("NOT EXACT", "")


@pytest.mark.parametrize("reconciler", RECONCILERS)
@pytest.mark.parametrize(
    ("fault", "messages"),
    [
        (
            "stream_end",
            {"telemetry stream: the server ended it (code 3): " + END_MESSAGE},
        ),
        (
            "stream_close",
            {
                # The two readers word a connection cut after a whole item differently.
                "telemetry stream: connection closed without an end item",
                "telemetry stream: the server closed the connection mid-stream",
            },
        ),
    ],
)
def test_a_telemetry_stream_that_ends_mid_run_fails_the_open_streams(
    reconciler: str, fault: str, messages: set[str]
) -> None:
    result, _, _ = session_against([*ARGS, "--reconciler", reconciler], _lossy(**{fault: True}))
    assert [(s.verdict, s.reason) for s in result.model.streams] == [("failed", ENDED)] * 6
    assert result.message == f"exact mode: stream 0 is not exact: {ENDED}"
    assert len(result.model.run_messages) == 1 and result.model.run_messages[0] in messages


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_the_real_hub_dropping_for_a_small_buffer_is_never_exact(reconciler: str) -> None:
    """The hub's own accounting, not a fault: a buffer smaller than a step's text
    frame of 6 streams (up to ~440 bytes, plus 101 bytes of accounting) discards
    at least those frames."""
    limits = HubLimits(buffer_bytes=420)
    result, session, _ = session_against(
        [*ARGS, "--reconciler", reconciler],
        sim_config(telemetry_mode="http", hub_limits=limits),
    )
    stats = session.path.receiver_stats() if session.path is not None else {}
    dropped = int(stats["dropped"])  # type: ignore[call-overload]
    assert dropped > 0
    assert all(s.verdict == "failed" for s in result.model.streams)
    assert all(str(s.reason).startswith("telemetry lost: ") for s in result.model.streams)
    assert result.model.run_messages[0].startswith("telemetry: ")
    assert (
        " frames dropped by the server (the client read too slowly; buffer 420 bytes)"
        in (result.model.run_messages[-1])
    )


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_a_lossy_recording_replays_to_the_same_failures(clean_env: str, reconciler: str) -> None:
    path = os.path.join(clean_env, f"lost-{reconciler}.phr")
    result, _, _ = session_against(
        [*ARGS, "--reconciler", reconciler, "--record", path], _lossy(stream_drop=2)
    )
    assert result.exit_code == 2
    recording = read_recording(path)
    lost = [e[2] for e in recording.events if e[1] == "lost"]
    assert lost[0] == 2
    assert recording.footer is not None
    assert recording.footer["verdicts"][0] == ["failed", DROPPED.format(n=2)]
    for kind in RECONCILERS:
        # replay compares its verdicts with the footer's: 2 = exact mode, not exact, same verdicts.
        code = cli.main(["replay", path, "--speed", "max", "--view", "plain", "--reconciler", kind])
        assert code == 2


def test_the_cli_against_a_lossy_server_exits_2_naming_the_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = SimProcess("--telemetry", "http", "--fault", "stream-drop:5,skip-frames:6")
    try:
        code, err, _ = run_cli(
            capsys, sim.url, "--telemetry", "http", "--mode", "exact", "--model", "parallelhue-sim"
        )
    finally:
        sim.stop()
    assert code == 2
    assert err[-1] == f"parallelhue: exact mode: stream 0 is not exact: {DROPPED.format(n=5)}"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "stream-drop:-1",
            "fault stream-drop must be >= 0, got -1",
        ),
        ("stream-drop:x", "fault stream-drop needs a number, got 'x'"),
    ],
)
def test_bad_stream_fault_specs_are_one_exact_line(spec: str, message: str) -> None:
    with pytest.raises(ValueError) as error:
        FaultConfig.parse(spec)
    assert str(error.value) == message


def test_stream_faults_need_the_http_route() -> None:
    config = SimConfig(faults=FaultConfig.parse("stream-end"), telemetry_mode="socket")
    with pytest.raises(ValueError) as error:
        config.validate()
    assert str(error.value) == (
        "stream faults act on the HTTP telemetry route: use --telemetry http or both"
    )
