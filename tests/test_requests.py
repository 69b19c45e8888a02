"""--requests N (more requests than streams) and --request-rate R (Poisson arrivals).

The schedule is computed from the seed before the run, so the tests assert the
offsets the client computed and that no request started before its own, never
a wall-clock duration; the server side counts what it received and how many
requests it held open at once.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import math
import os
import re
import shutil
import tempfile
import time
from typing import Any

import pytest

from client_fakes import FakeServer
from parallelhue.cli import main
from parallelhue.cli.config import ConfigError, parse_run
from parallelhue.ingest.record import read_recording
from parallelhue.ingest.schedule import Dispatcher, arrival_offsets
from parallelhue.model.backend import Backend
from parallelhue.model.results import json_document
from parallelhue.model.state import RunModel, StreamState
from parallelhue.screen.grid import grid_screen
from parallelhue.screen.lines import line_text
from parallelhue.screen.status import status_line
from parallelhue.screen.views import make_console, make_view
from parallelhue.session import Session, SessionResult
from parallelhue.sim import FaultConfig, SimConfig
from test_cli import _CLEARED
from test_client_sim import run_against_sim

try:
    from parallelhue._native import Reconciler as _NativeReconciler  # noqa: F401

    HAVE_NATIVE = True
except ImportError:
    HAVE_NATIVE = False

KINDS = [
    "python",
    pytest.param("rust", marks=pytest.mark.skipif(not HAVE_NATIVE, reason="make native first")),
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> str:
    for name in (*_CLEARED, "PARALLELHUE_REQUESTS", "PARALLELHUE_REQUEST_RATE"):
        monkeypatch.delenv(name, raising=False)
    socket_dir = tempfile.mkdtemp(prefix="phq", dir="/tmp")
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", socket_dir)
    return socket_dir


# --- flags and environment ---------------------------------------------------------------


def test_requests_default_to_one_per_stream() -> None:
    config = parse_run(["hi", "--concurrency", "3"], stdout_tty=False)
    assert (config.requests, config.concurrency, len(config.prompts)) == (3, 3, 3)
    assert math.isinf(config.request_rate)


def test_requests_beyond_concurrency_fan_the_prompts_out_per_request() -> None:
    config = parse_run(["hi", "--concurrency", "2", "--requests", "7"], stdout_tty=False)
    assert (config.requests, config.concurrency, config.prompts) == (7, 2, ["hi"] * 7)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as handle:
        handle.write("a\nb\nc\n")
    # --concurrency defaults to the prompts; request i gets prompt i mod 3.
    config = parse_run(["--prompt-file", handle.name, "--requests", "7"], stdout_tty=False)
    assert (config.concurrency, config.prompts) == (3, ["a", "b", "c", "a", "b", "c", "a"])
    # Fewer requests than prompts would leave prompts unsent.
    with pytest.raises(ConfigError) as error:
        parse_run(["--prompt-file", handle.name, "--requests", "2"], stdout_tty=False)
    assert str(error.value) == (
        "--prompt-file holds 3 prompts but --requests is 2: raise --requests to 3 or leave it out"
    )
    os.unlink(handle.name)


def test_requests_without_concurrency_keep_the_default_of_one_stream() -> None:
    config = parse_run(["hi", "--requests", "5"], stdout_tty=False)
    assert (config.requests, config.concurrency) == (5, 1)


def test_environment_variables_set_requests_and_rate_and_flags_win() -> None:
    env = {"PARALLELHUE_REQUESTS": "9", "PARALLELHUE_REQUEST_RATE": "2.5"}
    config = parse_run(["hi", "--concurrency", "3"], env=env, stdout_tty=False)
    assert (config.requests, config.request_rate) == (9, 2.5)
    config = parse_run(
        ["hi", "--concurrency", "3", "--requests", "4", "--request-rate", "inf"],
        env=env,
        stdout_tty=False,
    )
    assert config.requests == 4 and math.isinf(config.request_rate)


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--requests", "0"], {},
         "--requests must be an integer from 1 to 65535, got '0'"),
        (["--requests", "65536"], {},
         "--requests must be an integer from 1 to 65535, got '65536'"),
        (["--requests", "2.5"], {},
         "--requests must be an integer from 1 to 65535, got '2.5'"),
        ([], {"PARALLELHUE_REQUESTS": "many"},
         "PARALLELHUE_REQUESTS must be an integer from 1 to 65535, got 'many'"),
        (["--concurrency", "8", "--requests", "4"], {},
         "--concurrency 8 is more than --requests 4: each stream needs a request; lower "
         "--concurrency to 4 or raise --requests"),
        (["--concurrency", "8"], {"PARALLELHUE_REQUESTS": "4"},
         "--concurrency 8 is more than PARALLELHUE_REQUESTS 4: each stream needs a request; "
         "lower --concurrency to 4 or raise PARALLELHUE_REQUESTS"),
        (["--request-rate", "0"], {},
         "--request-rate must be a number of requests per second greater than 0 to 1e+06, "
         "or inf, got '0'"),
        (["--request-rate", "-2"], {},
         "--request-rate must be a number of requests per second greater than 0 to 1e+06, "
         "or inf, got '-2'"),
        (["--request-rate", "nan"], {},
         "--request-rate must be a number of requests per second greater than 0 to 1e+06, "
         "or inf, got 'nan'"),
        (["--request-rate", "fast"], {},
         "--request-rate must be a number of requests per second greater than 0 to 1e+06, "
         "or inf, got 'fast'"),
        ([], {"PARALLELHUE_REQUEST_RATE": "2e6"},
         "PARALLELHUE_REQUEST_RATE must be a number of requests per second greater than 0 to "
         "1e+06, or inf, got '2e6'"),
    ],
)  # fmt: skip
def test_bad_requests_and_rates_are_one_exact_line(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as error:
        parse_run(["hi", *argv], env=env, stdout_tty=False)
    assert str(error.value) == message


def test_bad_requests_exit_2_with_the_line_and_no_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["hi", "--requests", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "parallelhue: error: --requests must be an integer from 1 to 65535, got '0'\n"


def test_help_names_both_flags_and_their_variables(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--requests N          [PARALLELHUE_REQUESTS]" in out
    assert "--request-rate R      [PARALLELHUE_REQUEST_RATE]" in out
    assert main(["demo", "--help"]) == 0
    assert "--requests --request-rate" in capsys.readouterr().out


# --- the schedule ------------------------------------------------------------------------


def test_arrivals_are_a_seeded_poisson_process() -> None:
    offsets = arrival_offsets(4000, 20.0, seed=7)
    assert offsets == arrival_offsets(4000, 20.0, seed=7)  # reproducible
    assert offsets != arrival_offsets(4000, 20.0, seed=8)
    assert offsets[0] == 0.0
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert all(gap > 0 for gap in gaps)
    mean = sum(gaps) / len(gaps)
    assert 0.045 < mean < 0.055  # 1/20 s; n=3999 exponential gaps: sd of the mean ~1.6%
    # Exponential gaps: the standard deviation equals the mean (a fixed interval would be 0).
    sd = math.sqrt(sum((g - mean) ** 2 for g in gaps) / len(gaps))
    assert 0.9 < sd / mean < 1.1
    assert arrival_offsets(5, math.inf, seed=7) == [0.0] * 5


def test_dispatcher_starts_in_order_never_early_and_never_beyond_concurrency() -> None:
    dispatcher = Dispatcher([0.0, 0.0, 0.0, 1.0, 1.5], concurrency=2)
    dispatcher.begin(100.0)
    assert dispatcher.due(100.0, open_streams=0) == [0, 1]  # the third waits for a stream
    assert dispatcher.wait(100.0, open_streams=2) is None  # until a stream ends
    assert dispatcher.due(100.2, open_streams=1) == [2]  # one ended: the next, late
    assert dispatcher.due(100.5, open_streams=1) == []  # request 3 arrives at 101.0
    assert dispatcher.wait(100.5, open_streams=1) == pytest.approx(0.5)
    assert dispatcher.due(101.0, open_streams=0) == [3]
    assert not dispatcher.all_started
    assert dispatcher.due(102.0, open_streams=1) == [4]
    assert dispatcher.all_started and dispatcher.due(103.0, 0) == []


# --- the screen model -----------------------------------------------------------------------


def _model(requests: int, concurrency: int) -> RunModel:
    streams = [StreamState(index=i, mode="auto", queued=True) for i in range(requests)]
    backend = Backend("generic", False, "no evidence", False)
    return RunModel(streams=streams, mode="auto", backend=backend, no_color=True,
                    concurrency=concurrency)  # fmt: skip


def test_a_stream_shows_its_latest_request_and_the_status_line_counts_them() -> None:
    model = _model(5, 2)
    assert [s.index for s in model.shown_streams()] == [0, 1]
    assert [s.label for s in model.streams] == ["QUEUED"] * 5
    model.start_stream(0, 1.0)
    model.start_stream(1, 1.0)
    model.streams[1].sse_finished = True
    model.start_stream(2, 2.0)  # takes stream 1's place, not stream 0's (still open)
    assert [s.index for s in model.shown_streams()] == [0, 2]
    assert (model.streams[2].slot, model.streams[0].slot) == (1, 0)
    assert model.request_counts() == (1, 2, 2)  # done, open, queued
    line = line_text(status_line(model, 200, 0, None))
    assert "requests 1 done · 2 open · 2 queued of 5 on 2 streams" in line
    screen = "\n".join(line_text(x) for x in grid_screen(model, 120, 30))
    assert "#0/5 " in screen and "#2/5 " in screen
    assert "#1/5 " not in screen  # finished: in the summary, no longer on screen


# --- runs ---------------------------------------------------------------------------------


class CountingServer(FakeServer):
    """FakeServer whose completions take a while, counting how many are open at once."""

    def __init__(self, hold: float = 0.04) -> None:
        super().__init__()
        self.hold = hold
        self.open = 0
        self.max_open = 0
        self.arrived: list[float] = []

    async def _complete(
        self, prompt: str, writer: asyncio.StreamWriter, request_id: str = "x"
    ) -> None:
        self.open += 1
        self.max_open = max(self.max_open, self.open)
        self.arrived.append(time.monotonic())
        try:
            await asyncio.sleep(self.hold)
            await super()._complete("ok", writer, request_id)
        finally:
            self.open -= 1


def _run(args: list[str], url: str) -> SessionResult:
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    config = parse_run([*args, "--endpoint", url + "/v1/chat/completions"], stdout_tty=False)
    session = Session(config, lambda m: make_view("plain", m, console))
    return asyncio.run(session.run())


@pytest.mark.parametrize("kind", KINDS)
def test_more_requests_than_streams_all_go_out_at_most_concurrency_at_once(kind: str) -> None:
    with CountingServer() as server:
        result = _run(
            ["hi", "--requests", "12", "--concurrency", "3", "--mode", "chunk",
             "--reconciler", kind],
            server.url,
        )  # fmt: skip
    assert result.exit_code == 0, result.message
    assert len(server.requests) == 12
    # One request id per request: each is a stream of its own for the reconciler.
    ids = [r["request_id"] for r in server.requests]
    assert sorted(int(i.rsplit("_", 1)[1]) for i in ids) == list(range(12))
    assert server.max_open == 3  # the limit held, and was reached
    streams = result.model.streams
    assert all(s.sse_finished and s.label == "SSE CHUNK MODE" for s in streams)
    assert sorted(s.slot for s in streams if s.slot is not None) == sorted([0, 1, 2] * 4)
    # Started in order, each no earlier than its arrival (all at 0 here).
    starts = [s.started_at for s in streams]
    assert all(a is not None for a in starts)
    assert starts == sorted(starts)  # type: ignore[type-var]


@pytest.mark.parametrize("kind", KINDS)
def test_request_rate_follows_the_seeded_schedule_and_never_starts_early(kind: str) -> None:
    rate, count, seed = 40.0, 24, 3
    with CountingServer(hold=0.0) as server:
        result = _run(
            ["hi", "--requests", str(count), "--concurrency", str(count), "--mode", "chunk",
             "--request-rate", str(rate), "--seed", str(seed), "--reconciler", kind],
            server.url,
        )  # fmt: skip
    assert result.exit_code == 0, result.message
    model = result.model
    assert model.dispatch_at is not None
    expected = arrival_offsets(count, rate, seed)
    scheduled = [s.scheduled_at - model.dispatch_at for s in model.streams]  # type: ignore[operator]
    assert scheduled == pytest.approx(expected, abs=1e-9)
    for state in model.streams:
        assert state.started_at is not None and state.scheduled_at is not None
        assert state.started_at >= state.scheduled_at
    # The order of magnitude of the rate, from the start times (the schedule spans
    # expected[-1] seconds; starts may only be late, by the loop's latency).
    starts = sorted(s.started_at for s in model.streams if s.started_at is not None)
    span = starts[-1] - starts[0]
    assert span >= expected[-1] - 1e-6
    measured = (count - 1) / span
    assert rate / 10 < measured <= rate * 3
    assert len(server.arrived) == count
    document = json_document(model, endpoint=None, exit_code=0, message=None)
    total = document["total"]
    assert (total["requests"], total["concurrency"], total["request_rate"]) == (count, count, rate)
    assert total["completed_requests"] == count
    arrivals = [row["arrival_s"] for row in document["streams"]]
    assert arrivals == pytest.approx(expected, abs=1e-9)
    assert all(row["wait_s"] >= 0 and row["start_s"] >= row["arrival_s"]
               for row in document["streams"])  # fmt: skip


def test_json_of_a_requests_run_matches_the_schema(
    capsys: pytest.CaptureFixture[str],
) -> None:
    jsonschema = pytest.importorskip("jsonschema")
    schema_path = os.path.join(os.path.dirname(__file__), "..", "docs", "result.schema.json")
    with open(schema_path, encoding="utf-8") as handle:
        schema = json.load(handle)
    with CountingServer(hold=0.0) as server:
        code = main(
            ["hi", "--requests", "5", "--concurrency", "2", "--mode", "chunk", "--json",
             "--endpoint", server.url + "/v1", "--view", "plain"]
        )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(out)
    jsonschema.validate(document, schema)
    assert len(document["streams"]) == 5
    assert document["total"]["requests"] == 5 and document["total"]["concurrency"] == 2
    assert document["total"]["request_rate"] is None  # inf
    assert {row["slot"] for row in document["streams"]} == {0, 1}


def _sim(socket_dir: str, **kwargs: Any) -> SimConfig:
    return SimConfig(socket_dir=socket_dir, step_ms=2.0, **kwargs)


@pytest.mark.parametrize("kind", KINDS)
def test_every_request_is_exact_through_fewer_streams(kind: str, clean_env: str) -> None:
    result, out = run_against_sim(
        ["hi", "--requests", "9", "--concurrency", "3", "--max-tokens", "16", "--mode", "exact",
         "--reconciler", kind],
        _sim(clean_env),
    )  # fmt: skip
    assert result.exit_code == 0, (result.message, out)
    assert [s.verdict for s in result.model.streams] == ["exact"] * 9
    assert "Summary (SIMULATED ENGINE: simulated numbers) · 9 requests on 3 streams" in out
    assert "requests: 9 of 9 completed on 3 streams (all due at once)" in out
    for index in range(9):
        assert f"\n#{index} EXACT TOKEN PROVENANCE" in out  # a row per request


@pytest.mark.parametrize("kind", KINDS)
def test_requests_stay_exact_when_the_engine_forgets_the_run_between_them(
    kind: str, clean_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's plugin ends a run when no request of it is left; the next request's
    frames then come from a fresh source (a new hello). One stream at a time makes
    that happen before every request."""
    import parallelhue.sim.server as sim_server

    monkeypatch.setattr(sim_server, "RUN_IDLE_SECONDS", 0.0)
    result, out = run_against_sim(
        ["hi", "--requests", "4", "--concurrency", "1", "--max-tokens", "12", "--mode", "exact",
         "--reconciler", kind],
        _sim(clean_env),
    )  # fmt: skip
    assert result.exit_code == 0, (result.message, out)
    assert [s.verdict for s in result.model.streams] == ["exact"] * 4
    assert len(result.model.sources) >= 2  # the run was forgotten and met again


@pytest.mark.parametrize("kind", KINDS)
def test_exact_mode_sends_no_further_request_after_a_failure(kind: str, clean_env: str) -> None:
    faults = FaultConfig(sse_byte=True, target_stream=0, target_offset=3)
    result, out = run_against_sim(
        ["hi", "--requests", "5", "--concurrency", "1", "--max-tokens", "16", "--mode", "exact",
         "--reconciler", kind],
        _sim(clean_env, faults=faults),
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.message is not None
    assert result.message.startswith("exact mode: stream 0 is not exact: byte mismatch")
    assert result.message.endswith("; 4 requests were cancelled because of it")
    later = result.model.streams[1:]
    assert all(s.label == "CANCELLED" for s in later)
    # The failure is known once stream 0's frames are in, which may be just after its
    # body ended: the one request that took its slot by then may have started; no
    # other can (concurrency 1, 16 tokens each).
    assert sum(s.started_at is not None for s in later) <= 1
    assert all(s.started_at is None for s in later[1:])
    # Grouped: the unsent requests (2-4, or 1-4) share one line.
    assert re.search(
        r"^streams [1-2]-4: CANCELLED; not sent: exact mode stopped the run after another "
        r"stream failed$",
        out,
        re.M,
    ), out


@pytest.mark.parametrize("kind", KINDS)
def test_a_requests_run_records_replays_and_exports_per_stream(
    kind: str, tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    record = os.path.join(str(tmp_path), "run.phr")
    html = os.path.join(str(tmp_path), "run.html")
    code = main(
        ["demo", "--requests", "6", "--concurrency", "2", "--max-tokens", "12", "--step-ms", "1",
         "--reconciler", kind, "--view", "plain", "--record", record, "--export", html]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = re.findall(r"^#(\d+) {2,}(\S+)", out, re.M)  # the summary table: a row per request
    assert rows == [(str(i), "EXACT") for i in range(6)]
    with open(html, encoding="utf-8") as handle:
        page = handle.read()
    assert "Steps over time, per stream (6 requests on 2 streams)" in page
    assert ">s0<" in page and ">s1<" in page and ">s2<" not in page
    header = read_recording(record).header
    assert (header["num_streams"], header["concurrency"]) == (6, 2)
    code = main(["replay", record, "--speed", "max", "--view", "plain", "--json",
                 "--reconciler", kind])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert [row["label"] for row in document["streams"]] == ["EXACT TOKEN PROVENANCE"] * 6
    assert (document["total"]["requests"], document["total"]["concurrency"]) == (6, 2)
    # The replay puts each request back on one of the two streams.
    assert {row["slot"] for row in document["streams"]} == {0, 1}


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux not installed")
def test_tmux_panes_are_the_streams_each_showing_its_latest_request() -> None:
    from parallelhue.screen.tmux import TmuxView, snapshot_lines

    model = _model(5, 2)
    for index in (0, 1):
        model.start_stream(index, 1.0)
    model.streams[0].sse_finished = True
    model.start_stream(2, 2.0)
    view = TmuxView(model, make_console(False, plain=True), attach=False)
    try:
        view._write_all(done=False)
        names = sorted(os.listdir(view.directory))
        assert names == ["stream-0", "stream-1", "summary"]
        with open(os.path.join(view.directory, "stream-0"), encoding="utf-8") as handle:
            snapshot = json.load(handle)
        assert (snapshot["index"], snapshot["requests"]) == (2, 5)
        assert line_text(snapshot_lines(snapshot, 30, 4)[0]).startswith("#2/5 ")
    finally:
        shutil.rmtree(view.directory, ignore_errors=True)
