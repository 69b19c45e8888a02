"""The fix line: when evidence is missing, one line naming its likely cause and the
fix, within 80 columns, in the plain view, the summary, --json and the replay."""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest

from client_fakes import FakeServer
from parallelhue import cli, session
from parallelhue.ingest.driver import RunDriver
from parallelhue.ingest.feed import Feed
from parallelhue.model.advice import (
    FIX_WIDTH,
    NO_FRAMES,
    TelemetrySetup,
    explain_reason,
    fix_line,
    grouped_notes,
    index_ranges,
    is_this_host,
    run_message_notes,
)
from parallelhue.model.backend import detect_backend
from parallelhue.model.state import RunModel, StreamState
from parallelhue.reference import Reconciler
from test_cli import _CLEARED

VECTORS = Path(__file__).parent / "vectors" / "generate.py"
# Every line fix_line can say, with the longest values its blanks take.
SELF_CHECK_LINE = "fix: start vLLM with PARALLELHUE_VLLM_EXACT=1 (python -m parallelhue_vllm check)"


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="pha", dir="/tmp"))
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.3)


def _model(mode: str = "exact", setup: TelemetrySetup | None = None) -> RunModel:
    model = RunModel([StreamState(0, mode)], mode, detect_backend("auto", [], None), True)
    model.telemetry_setup = setup
    return model


# --- the line for each cause -----------------------------------------------------------


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (None, SELF_CHECK_LINE),
        (TelemetrySetup("socket", "auto: the server has no telemetry route (HTTP 404)"),
         SELF_CHECK_LINE),
        (TelemetrySetup("socket", "", remote=True, vllm=True),
         "fix: remote vLLM needs VLLM_PLUGINS=parallelhue and PARALLELHUE_VLLM_EXACT=1"),
        (TelemetrySetup("socket", "auto: the server's telemetry route says: exact telemetry is "
                        "off on this server: PARALLELHUE_VLLM_EXACT is not 1 (restart vLLM with "
                        "PARALLELHUE_VLLM_EXACT=1)", remote=True),
         "fix: vLLM's plugin is off: restart vLLM with PARALLELHUE_VLLM_EXACT=1"),
        (TelemetrySetup("socket", "auto: the server's telemetry route says: the telemetry hub "
                        "could not start: unsafe directory"),
         "fix: vLLM's plugin is off: run python -m parallelhue_vllm check there"),
        (TelemetrySetup("http", "auto", remote=True),
         "fix: vLLM's plugin sent nothing: run python -m parallelhue_vllm check there"),
    ],
)  # fmt: skip
def test_no_frames_names_the_likely_cause(setup: TelemetrySetup | None, expected: str) -> None:
    assert fix_line(_model("auto", setup), NO_FRAMES, 0) == expected


def test_an_old_plugin_is_named_with_the_version_to_install() -> None:
    model = _model()
    model.run_messages.append(
        "rejected frame: unsupported protocol version 2 (this build speaks 3): the server's …"
    )
    assert fix_line(model, NO_FRAMES, 24) == (
        "fix: server plugin too old (protocol 2): install parallelhue-vllm 0.3 there"
    )
    model.run_messages[0] = "rejected frame: unsupported protocol version 4 (this build speaks 3)"
    assert fix_line(model, NO_FRAMES, 1) == (
        "fix: server plugin speaks protocol 4, this client 3: upgrade parallelhue"
    )


def test_frames_from_another_uid_name_accept_uid() -> None:
    model = _model()
    model.run_messages.append(
        "telemetry: datagrams from uid 4294967294 rejected (not this client's uid): for a server "
        "in a container on this host use --telemetry http, or --accept-uid 4294967294"
    )
    assert fix_line(model, NO_FRAMES, 0) == (
        "fix: telemetry came from uid 4294967294, not yours: give --accept-uid 4294967294"
    )


@pytest.mark.parametrize(
    ("mode", "then"),
    [("exact", "exact needs vLLM, or --mode chunk"), ("auto", "colors: reported steps or chunks")],
)
def test_a_server_that_ignores_request_ids_is_not_called_broken(mode: str, then: str) -> None:
    reason = "stream 0: SSE chunk id does not carry the request id ph1_" + "a" * 32 + "_0"
    assert fix_line(_model(mode), reason, 0) == (
        f"fix: not vLLM (chunk ids lack our request id): {then}"
    )


@pytest.mark.parametrize("mode", ["exact", "auto"])
def test_a_prefill_decode_router_is_named_not_called_another_server(mode: str) -> None:
    reason = (
        "stream 0: SSE chunk id does not carry the request id ph1_" + "a" * 32 + "_0"
        " (a prefill/decode router renamed the request)"
    )
    assert fix_line(_model(mode), reason, 0) == (
        "fix: a P/D router hides the evidence: exact only straight to a decode worker"
    )


def test_no_fix_line_for_chunk_mode_frames_rejected_for_other_reasons_or_other_failures() -> None:
    assert fix_line(_model("chunk"), NO_FRAMES, 0) is None
    assert fix_line(_model(), NO_FRAMES, 3) is None  # frames came: not a missing plugin
    assert fix_line(_model(), "stream 0: token mismatch at offset 3", 0) is None
    assert fix_line(_model(), None, 0) is None


def test_every_fix_line_fits_80_columns() -> None:
    """The longest value of every blank (uid, protocol numbers) in every line."""
    longest = [
        fix_line(_model("auto", setup), NO_FRAMES, 0)
        for setup in (
            None,
            TelemetrySetup("socket", "", remote=True),
            TelemetrySetup("socket", "x PARALLELHUE_VLLM_EXACT y"),
            TelemetrySetup("socket", "auto: the server's telemetry route says: z"),
            TelemetrySetup("http"),
        )
    ]
    for message in (
        "rejected frame: unsupported protocol version 254 (this build speaks 255)",
        "rejected frame: unsupported protocol version 255 (this build speaks 3)",
        "telemetry: datagrams from uid 4294967294 rejected (not …)",
    ):
        model = _model()
        model.run_messages.append(message)
        longest.append(fix_line(model, NO_FRAMES, 1))
    for mode in ("auto", "exact"):
        longest.append(fix_line(_model(mode), "SSE chunk id does not carry the request id", 0))
        pd_router = (
            "SSE chunk id does not carry the request id (a prefill/decode router renamed "
            "the request)"
        )
        longest.append(fix_line(_model(mode), pd_router, 0))
    assert all(line is not None for line in longest)
    assert max(len(line or "") for line in longest) <= FIX_WIDTH


def test_rejected_frames_are_not_no_frames() -> None:
    first = "rejected frame: unsupported protocol version 2 (this build speaks 3)"
    assert explain_reason(NO_FRAMES, 24, first) == (
        "missing telemetry: 24 frames received, all rejected: "
        "unsupported protocol version 2 (this build speaks 3)"
    )
    assert explain_reason(NO_FRAMES, 1, first) == (
        "missing telemetry: 1 frame received, it was rejected: "
        "unsupported protocol version 2 (this build speaks 3)"
    )
    assert explain_reason(NO_FRAMES, 0, None) == NO_FRAMES
    other = "missing telemetry: no provenance for offset 3"
    assert explain_reason(other, 5, first) == other


def test_this_host() -> None:
    for host in ("localhost", "127.0.0.1", "127.8.9.10", "[::1]", "::1", "a.localhost"):
        assert is_this_host(host), host
    for host in ("gpu-box", "10.0.0.2", "[fd00::2]", "example.com"):
        assert not is_this_host(host), host


# --- grouped lines ---------------------------------------------------------------------


def test_streams_that_ended_the_same_way_share_one_line() -> None:
    run = "0123456789abcdef" * 2
    notes = [
        (i, "SSE CHUNK MODE", f"downgraded: stream {i}: SSE chunk id does not carry the "
         f"request id ph1_{run}_{i}")
        for i in (0, 1, 2, 3, 5, 7, 8, 9)
    ] + [(4, "ERROR", "error: HTTP 500: boom"), (6, "ERROR", "error: HTTP 500: boom")]  # fmt: skip
    assert grouped_notes(notes) == [
        "streams 0-3, 5, 7-9: SSE CHUNK MODE; downgraded: SSE chunk id does not carry the "
        "request id ph1_01234567…_i",
        "streams 4, 6: ERROR; error: HTTP 500: boom",
    ]
    assert grouped_notes(notes[:1]) == [
        f"stream 0: SSE CHUNK MODE; downgraded: SSE chunk id does not carry the request id "
        f"ph1_{run}_0"
    ]
    assert index_ranges([4]) == "4"
    assert index_ranges([1, 2]) == "1-2"


def test_the_summary_lists_each_distinct_run_message_once() -> None:
    messages = [f"m{i}" for i in range(7)] + ["m0"]
    assert run_message_notes(messages) == [
        "run: m0", "run: m1", "run: m2", "run: m3", "run: m4", "run: 2 more messages (see --json)",
    ]  # fmt: skip


# --- where the line is printed -----------------------------------------------------------


def _old_frames(run_id: str, stream: int) -> list[bytes]:
    """A parallelhue-vllm 0.2 scheduler: its hello, then 23 provenance frames."""
    spec = importlib.util.spec_from_file_location("vector_generator", VECTORS)
    assert spec is not None and spec.loader is not None
    generator = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(generator)
    generator.RUN_ID = bytes.fromhex(run_id)
    hello = generator.raw_frame(
        generator.wire.KIND_HELLO, generator.hello_body(verification=0), seq=0, version=2
    )
    record = generator.records_body(generator.prov_record(ids=[7], roles=[0], scheduled=0))
    provenance = [
        generator.raw_frame(generator.wire.KIND_PROVENANCE, record, seq=seq, version=2)
        for seq in range(1, 24)
    ]
    return [hello, *provenance]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_an_old_plugin_fix_is_in_the_plain_view_summary_and_json(
    reconciler: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    socket_dir = tempfile.mkdtemp(prefix="pha", dir="/tmp")
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", socket_dir)
    fix = "fix: server plugin too old (protocol 2): install parallelhue-vllm 0.3 there"
    reason = (
        "missing telemetry: 24 frames received, all rejected: unsupported protocol version 2 "
        "(this build speaks 3)"
    )
    with FakeServer(frames=_old_frames, socket_dir=socket_dir) as server:
        base = ["hi", "--endpoint", server.url, "--reconciler", reconciler, "--mode", "exact"]
        code, out, err = _run([*base, "--view", "plain"], capsys)
        assert code == 2
        assert err == f"parallelhue: exact mode: stream 0 is not exact: {reason}\n"
        assert f"not exact: {reason}" in out  # the stream's own line
        assert out.rstrip().splitlines()[-1] == fix  # the summary's last line
        assert "run: rejected frame: unsupported protocol version 2 (this build speaks 3)" in out
        code, out, err = _run([*base, "--json"], capsys)
    document = json.loads(out)
    assert code == 2
    assert document["fix"] == fix
    assert document["streams"][0]["reason"] == reason
    assert document["telemetry"]["rejected_frames"] == 24
    assert fix in err  # the screen went to stderr, its summary too


@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_a_server_without_the_plugin_names_the_fix(
    reconciler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeServer() as server:
        code, out, _err = _run(
            ["hi", "--endpoint", server.url, "--reconciler", reconciler, "--view", "plain",
             "--concurrency", "3"],
            capsys,
        )  # fmt: skip
    assert code == 0
    assert out.rstrip().splitlines()[-1] == SELF_CHECK_LINE
    assert (
        "streams 0-2: SSE CHUNK MODE; downgraded: missing telemetry: no frames received for "
        "this run" in out.splitlines()
    )


def test_a_server_that_ignores_request_ids_gets_the_not_vllm_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Ollama's and llama.cpp's chunk ids: chatcmpl-<their own number>.
    with FakeServer(chunk_id="chatcmpl-123") as server:
        code, out, err = _run(["hi", "--endpoint", server.url, "--mode", "exact", "--json"], capsys)
    document = json.loads(out)
    assert code == 2
    assert document["fix"] == (
        "fix: not vLLM (chunk ids lack our request id): exact needs vLLM, or --mode chunk"
    )
    assert document["fix"] in err


def test_chunk_mode_gives_no_verdict_and_no_fix(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(chunk_id="chatcmpl-123") as server:
        code, out, _err = _run(
            ["hi", "--endpoint", server.url, "--mode", "chunk", "--json"], capsys
        )
    document = json.loads(out)
    assert code == 0
    assert document["fix"] is None
    stream = document["streams"][0]
    assert (stream["label"], stream["verdict"], stream["reason"]) == (
        "SSE CHUNK MODE", "pending", None,
    )  # fmt: skip


def test_the_live_status_line_shows_the_fix_before_any_run_message() -> None:
    from parallelhue.screen.status import status_line

    model = _model()
    model.run_messages.append("telemetry stream: the server ended it (code 1): bye")
    text = "".join(piece for piece, _ in status_line(model, 300, 0, None))
    assert "run: telemetry stream" in text
    model.fix = SELF_CHECK_LINE
    text = "".join(piece for piece, _ in status_line(model, 300, 0, None))
    assert SELF_CHECK_LINE in text and "run: telemetry stream" not in text


@pytest.mark.parametrize("metrics", [None, "# TYPE vllm:num_requests_running gauge\n"])
def test_the_replay_says_what_the_live_run_said(
    metrics: str | None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 13: the banner's backend evidence and telemetry line, and the fix line."""
    record = str(tmp_path / "run.phr")
    with FakeServer(metrics=metrics) as server:
        code, live, _ = _run(["hi", "--endpoint", server.url, "--json", "--record", record], capsys)
        assert code == 0
        code, live_plain, _ = _run(["hi", "--endpoint", server.url, "--view", "plain"], capsys)
    code, replayed, _ = _run(["replay", record, "--speed", "max", "--json"], capsys)
    assert code == 0
    code, replayed_plain, _ = _run(["replay", record, "--speed", "max", "--view", "plain"], capsys)
    live_doc: dict[str, Any] = json.loads(live)
    replay_doc: dict[str, Any] = json.loads(replayed)
    assert live_doc["fix"] == replay_doc["fix"] == SELF_CHECK_LINE
    assert replay_doc["backend"] == live_doc["backend"]
    assert live_doc["backend"]["evidence"] == (
        "no plugin hello; no /metrics"
        if metrics is None
        else "no plugin hello; /metrics has no spec-decode counters"
    )
    telemetry = "telemetry: local socket, sender uid"
    live_banner, replay_banner = live_plain.splitlines()[0], replayed_plain.splitlines()[0]
    assert telemetry in live_banner
    assert live_banner[live_banner.index(telemetry) :] in replay_banner


def test_feed_counts_rejections_in_a_replay_of_oversized_datagrams() -> None:
    """A datagram refused before decoding is a rejected frame for the reason too."""
    model = _model()
    feed = Feed(model, timeout=1.0)
    driver = RunDriver(model, feed, Reconciler("ab" * 16, 1))
    feed.run_message("rejected frame: oversized frame: 70000 bytes, limit 65536")
    driver.finalize()
    assert model.streams[0].reason == (
        "missing telemetry: 1 frame received, it was rejected: oversized frame: 70000 bytes, "
        "limit 65536"
    )
