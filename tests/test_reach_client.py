"""The client's side of in-band telemetry (issues 11, 28) against the SIMULATED
engine: `--telemetry auto|socket|http`, the API key errors, the screen's
telemetry line, `--record`/replay of in-band runs, servers without telemetry,
and `--accept-uid` with a sender that really runs as another uid."""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import reach_client as rc
from client_fakes import FakeServer
from parallelhue import cli
from parallelhue.cli.config import ConfigError, parse_run
from parallelhue.screen.views import make_console, make_view
from parallelhue.session import Session, SessionResult
from parallelhue.sim import SimConfig, SimServer
from test_cli import _CLEARED

REPO = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
KEY = "reach-client-key"
RECONCILERS = ["rust", "python"]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name in (*_CLEARED, "PARALLELHUE_TELEMETRY", "PARALLELHUE_ACCEPT_UIDS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("PARALLELHUE_SOCKET_OWNER_UID", raising=False)
    root = tempfile.mkdtemp(prefix="phk", dir="/tmp")
    os.chmod(root, 0o755)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", os.path.join(root, "s"))
    monkeypatch.setenv("PARALLELHUE_HUB_DIR", os.path.join(root, "h"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


def sim_config(**kwargs: Any) -> SimConfig:
    settings: dict[str, Any] = {
        "socket_dir": os.environ["PARALLELHUE_SOCKET_DIR"],
        "hub_dir": os.environ["PARALLELHUE_HUB_DIR"],
        "step_ms": 2.0,
    }
    settings.update(kwargs)
    return SimConfig(**settings)


def session_at(url: str, args: list[str]) -> tuple[SessionResult, Session, str]:
    """One Session against the server at `url`: the result, the session, the screen."""
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    argv = [*args, "--endpoint", url + "/v1/chat/completions", "--view", "plain"]
    session = Session(parse_run(argv, stdout_tty=False), lambda m: make_view("plain", m, console))
    result = asyncio.run(session.run())
    return result, session, console.file.getvalue()


def session_against(
    args: list[str], sim: SimConfig, *, record: str | None = None
) -> tuple[SessionResult, Session, str]:
    """One Session against a fresh simulated engine: the result, the session, the screen."""
    console = make_console(False, plain=True)
    console.file = io.StringIO()

    async def go() -> tuple[SessionResult, Session]:
        server = SimServer(sim)
        url = await server.start()
        try:
            argv = [*args, "--endpoint", url + "/v1/chat/completions", "--view", "plain"]
            if record is not None:
                argv += ["--record", record]
            config = parse_run(argv, stdout_tty=False)
            session = Session(config, lambda m: make_view("plain", m, console), simulated=True)
            return await session.run(), session
        finally:
            await server.stop()

    result, session = asyncio.run(go())
    return result, session, console.file.getvalue()


def exact(result: SessionResult) -> bool:
    return result.exit_code == 0 and all(s.verdict == "exact" for s in result.model.streams)


# ------------------------------------------------------------------ HTTP telemetry itself


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_http_telemetry_is_exact_with_no_socket_anywhere(reconciler: str) -> None:
    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    result, session, screen = session_against(
        [
            "hi",
            "--concurrency",
            "6",
            "--max-tokens",
            "40",
            "--mode",
            "exact",
            "--telemetry",
            "http",
            "--reconciler",
            reconciler,
        ],
        sim_config(telemetry_mode="http"),
    )
    assert exact(result), [(s.verdict, s.reason, s.error) for s in result.model.streams]
    # Nothing on this host but the URL: no socket directory was even created.
    assert not os.path.exists(socket_dir)
    run = session.run_id
    line = (
        f"telemetry: 127.0.0.1:{session.config.endpoint.split(':')[2].split('/')[0]} over plain "
        f"HTTP (loopback), no API key, in-band, run {run[:8]}…"
    )
    assert result.model.telemetry == line
    assert line in screen.splitlines()[0]
    # Each request has its own two sources (scheduler, frontend): a hello each.
    counters = result.model.counters
    assert counters["frames"] > 6 * 2 and counters["gaps"] == 0
    assert counters["duplicate_frames"] == 0 and counters["rejected_frames"] == 0


@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_the_callers_run_id_is_kept_in_band(reconciler: str) -> None:
    mine = "ab" * 16

    async def go() -> tuple[SessionResult, Session]:
        server = SimServer(sim_config(telemetry_mode="http"))
        url = await server.start()
        try:
            config = parse_run(
                [
                    "x",
                    "--endpoint",
                    url + "/v1/completions",
                    "--telemetry",
                    "http",
                    "--reconciler",
                    reconciler,
                    "--view",
                    "plain",
                    "--concurrency",
                    "2",
                ],
                stdout_tty=False,
            )
            console = make_console(False, plain=True)
            console.file = io.StringIO()
            session = Session(config, lambda m: make_view("plain", m, console), run_id=mine)
            return await session.run(), session
        finally:
            await server.stop()

    result, session = asyncio.run(go())
    assert exact(result)
    assert session.run_id == mine


def test_a_recording_over_http_replays_to_the_same_verdicts(clean_env: str) -> None:
    path = os.path.join(clean_env, "run.phr")
    result, session, _ = session_against(
        ["hi", "--concurrency", "4", "--max-tokens", "30", "--telemetry", "http"],
        sim_config(telemetry_mode="http"),
        record=path,
    )
    assert exact(result)
    from parallelhue.ingest.record import read_recording

    recording = read_recording(path)
    assert recording.header["run_id"] == session.run_id
    assert recording.header["telemetry"] == "http"
    frames = [e for e in recording.events if e[1] == "frame"]
    assert len(frames) == result.model.counters["frames"]
    for reconciler in RECONCILERS:
        argv = ["replay", path, "--speed", "max", "--view", "plain", "--reconciler", reconciler]
        code = cli.main(argv)
        assert code == 0


# ------------------------------------------------------------------------------- auto


@pytest.mark.parametrize(
    ("mode", "path", "note"),
    [
        ("both", "http", "(auto)"),
        ("http", "http", "(auto)"),
        (
            "socket",
            "socket",
            "(auto: the server's probe says: in-band telemetry is off on this "
            "server: start the SIMULATED engine with --telemetry http or both)",
        ),
    ],
)
def test_auto_takes_the_route_when_the_server_serves_it_and_says_so(
    mode: str, path: str, note: str
) -> None:
    result, session, _ = session_against(
        ["hi", "--concurrency", "3", "--max-tokens", "20", "--mode", "exact"],
        sim_config(telemetry_mode=mode),
    )
    assert exact(result)
    line = result.model.telemetry
    assert line.endswith(note), line
    if path == "http":
        assert " over plain HTTP (loopback), no API key, in-band, run " in line
        assert session.socket_path is not None and not os.path.exists(session.socket_path)
    else:
        assert (
            line
            == f"telemetry: local socket, sender uid {os.geteuid()} checked by the kernel {note}"
        )


def test_auto_without_the_route_falls_back_to_the_socket_and_says_why(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--view", "plain"]
        )
    out = capsys.readouterr().out
    assert code == 0
    first = out.splitlines()[0]
    assert first.endswith(
        f"telemetry: local socket, sender uid {os.geteuid()} checked by the kernel "
        "(auto: the server has no telemetry probe (HTTP 404))"
    ), first


# ---------------------------------------------------------------------- the API key


def run_cli(capsys: pytest.CaptureFixture[str], url: str, *args: str) -> tuple[int, list[str], str]:
    code = cli.main(["hi", "--endpoint", url + "/v1/chat/completions", "--view", "plain", *args])
    captured = capsys.readouterr()
    return code, captured.err.splitlines(), captured.out


class SimProcess:
    """`python -m parallelhue.sim` in a child process (optionally as another uid)."""

    def __init__(self, *args: str, uid: int | None = None, env: dict[str, str] | None = None):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        command = [PYTHON, "-m", "parallelhue.sim", "--port", str(self.port), "--step-ms", "2"]
        if uid is not None:
            command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *command]
        self.process = subprocess.Popen(
            [*command, *args],
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + 30
        while True:
            try:
                if rc.request(self.url, "GET", "/v1/models", api_key=KEY).status in (200, 401):
                    return
            except OSError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the simulated engine did not start: {self.stderr()}")
            time.sleep(0.05)

    def stderr(self) -> str:
        return self.process.stderr.read().decode() if self.process.stderr else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)


@pytest.fixture
def keyed_sim() -> Iterator[SimProcess]:
    sim = SimProcess("--telemetry", "http", "--api-key", KEY)
    yield sim
    sim.stop()


@pytest.mark.parametrize("telemetry", ["auto", "http"])
@pytest.mark.parametrize("key", [None, "wrong"])
def test_a_wrong_or_missing_key_is_one_line_naming_the_flag_and_exit_2(
    keyed_sim: SimProcess,
    capsys: pytest.CaptureFixture[str],
    telemetry: str,
    key: str | None,
) -> None:
    args = ["--telemetry", telemetry, "--model", "parallelhue-sim"]
    if key is not None:
        args += ["--api-key", key]
    code, err, _ = run_cli(capsys, keyed_sim.url, *args)
    if telemetry == "http":
        # No probe in-band: the requests themselves meet the refusal.
        assert (code, err) == (
            2,
            [
                "parallelhue: 1 of 1 streams failed; stream 0: HTTP 401: Unauthorized (check "
                "--api-key or OPENAI_API_KEY)"
            ],
        )
        return
    where = f"{keyed_sim.url}/v1/parallelhue"
    if key is None:
        why = f"the server needs an API key (HTTP 401 from {where}): give it with "
    else:
        why = f"the server refused the API key (HTTP 401 from {where}): check "
    assert (code, err) == (2, [f"parallelhue: error: {why}--api-key or OPENAI_API_KEY"])


def test_the_key_is_named_when_model_discovery_is_refused(
    keyed_sim: SimProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err, _ = run_cli(capsys, keyed_sim.url, "--api-key", "wrong")
    assert (code, err) == (
        2,
        [
            f"parallelhue: error: the server refused the API key (HTTP 401 from "
            f"{keyed_sim.url}/v1/models): check --api-key or OPENAI_API_KEY"
        ],
    )


@pytest.mark.parametrize("source", ["flag", "env"])
def test_the_right_key_is_exact_over_http_and_the_screen_says_it_was_sent(
    keyed_sim: SimProcess,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    source: str,
) -> None:
    args = ["--mode", "exact", "--concurrency", "4", "--max-tokens", "24"]
    if source == "flag":
        args += ["--api-key", KEY]
    else:
        monkeypatch.setenv("OPENAI_API_KEY", KEY)
    code, err, out = run_cli(capsys, keyed_sim.url, *args)
    assert (code, err) == (0, [])
    assert out.count("EXACT TOKEN PROVENANCE") >= 4
    assert (
        f"telemetry: 127.0.0.1:{keyed_sim.port} over plain HTTP (loopback), API key sent, "
        in (out.splitlines()[0])
    )


@pytest.mark.parametrize("mode", ["auto", "exact"])
def test_in_band_from_a_server_without_the_plugin_says_no_frames_came(
    capsys: pytest.CaptureFixture[str], mode: str
) -> None:
    """The responses carry no event of ours: auto downgrades each stream with the
    reason, exact exits 2 naming it (nothing new is asked of the server)."""
    with FakeServer() as server:
        code, err, out = run_cli(capsys, server.url, "--telemetry", "http", "--mode", mode)
    reason = "missing telemetry: no frames received for this run"
    if mode == "auto":
        assert (code, err) == (0, [])
        assert f"stream 0: SSE CHUNK MODE; downgraded: {reason}" in out
    else:
        assert (code, err) == (
            2,
            [f"parallelhue: exact mode: stream 0 is not exact: {reason}"],
        )


def test_in_band_from_a_server_with_telemetry_off_is_not_exact(
    capsys: pytest.CaptureFixture[str],
) -> None:
    sim = SimProcess("--telemetry", "socket")
    try:
        code, err, _ = run_cli(capsys, sim.url, "--telemetry", "http", "--mode", "exact")
    finally:
        sim.stop()
    assert (code, err) == (
        2,
        [
            "parallelhue: exact mode: stream 0 is not exact: missing telemetry: no "
            "frames received for this run"
        ],
    )


# ---------------------------------------------------- a sender of another uid (--accept-uid)

needs_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="starting the engine as uid 65534 (setpriv) needs root"
)


@pytest.fixture
def nobody_sim() -> Iterator[SimProcess]:
    """The simulated engine as uid 65534, sending to this client's (root's) socket."""
    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    sim = SimProcess(
        "--telemetry", "socket", "--socket-dir", socket_dir,
        uid=65534,
        env={"PARALLELHUE_SOCKET_OWNER_UID": str(os.geteuid()), "HOME": "/tmp"},
    )  # fmt: skip
    yield sim
    sim.stop()


@needs_root
@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_another_uid_cannot_reach_the_socket_by_default(
    nobody_sim: SimProcess, reconciler: str
) -> None:
    """The socket is 0600 in a 0700 directory: uid 65534 cannot even send."""
    result, _, screen = session_at(
        nobody_sim.url,
        [
            "hi",
            "--telemetry",
            "socket",
            "--mode",
            "exact",
            "--reconciler",
            reconciler,
            "--concurrency",
            "2",
            "--max-tokens",
            "12",
        ],
    )
    assert (result.exit_code, result.message) == (
        2,
        "exact mode: stream 0 is not exact: missing telemetry: no frames received for this run",
    )
    assert "EXACT TOKEN PROVENANCE" not in screen
    nobody_sim.stop()
    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    assert f"not sent: [Errno 13] Permission denied: '{socket_dir}/" in nobody_sim.stderr()


@needs_root
@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_another_uid_is_rejected_by_its_credentials_and_the_screen_names_it(
    nobody_sim: SimProcess, reconciler: str
) -> None:
    """Accepting some other uid opens the socket (0622): 65534's datagrams arrive and are
    dropped by the SCM_CREDENTIALS check, and the run says whose they were."""
    result, session, screen = session_at(
        nobody_sim.url,
        [
            "hi",
            "--telemetry",
            "socket",
            "--mode",
            "exact",
            "--reconciler",
            reconciler,
            "--concurrency",
            "2",
            "--max-tokens",
            "12",
            "--accept-uid",
            "4242",
        ],
    )
    assert result.exit_code == 2
    assert result.model.run_messages == [
        "telemetry: datagrams from uid 65534 rejected (not this client's uid): for a server "
        "in a container on this host use --telemetry http, or --accept-uid 65534"
    ]
    assert "EXACT TOKEN PROVENANCE" not in screen
    assert "sender uid 0 and uid 4242 accepted by --accept-uid" in screen.splitlines()[0]
    stats = session.path.receiver_stats() if session.path is not None else {}
    assert stats["rejected_uid"] > 0 and stats["last_rejected_uid"] == 65534
    assert stats["accepted_foreign"] == 0


@needs_root
@pytest.mark.parametrize("reconciler", RECONCILERS)
def test_another_uid_is_accepted_with_accept_uid_and_the_screen_names_it(
    nobody_sim: SimProcess, capsys: pytest.CaptureFixture[str], reconciler: str
) -> None:
    code, err, out = run_cli(
        capsys, nobody_sim.url, "--telemetry", "socket", "--mode", "exact",
        "--reconciler", reconciler, "--concurrency", "3", "--max-tokens", "16",
        "--accept-uid", "65534",
    )  # fmt: skip
    assert (code, err) == (0, [])
    assert out.count("EXACT TOKEN PROVENANCE") >= 3
    assert out.splitlines()[0].endswith(
        "telemetry: local socket, sender uid 0 and uid 65534 accepted by --accept-uid"
    )
    directory = os.environ["PARALLELHUE_SOCKET_DIR"]
    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o711
    # Nothing else got a way in: the socket was 0622 only for the run, and is gone.
    assert os.listdir(directory) == []


@needs_root
def test_the_sender_refuses_a_foreign_socket_without_the_owner_variable() -> None:
    """Without PARALLELHUE_SOCKET_OWNER_UID the engine (uid 65534) will not send to
    root's socket at all, even when the client accepts uid 65534."""
    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    sim = SimProcess("--telemetry", "socket", "--socket-dir", socket_dir, uid=65534)
    try:
        code = cli.main(
            [
                "hi",
                "--endpoint",
                sim.url + "/v1/chat/completions",
                "--view",
                "plain",
                "--telemetry",
                "socket",
                "--mode",
                "exact",
                "--accept-uid",
                "65534",
                "--max-tokens",
                "8",
            ]
        )
    finally:
        sim.stop()
    assert code == 2
    assert f"socket directory {socket_dir} is owned by uid 0, not 65534" in sim.stderr()


# ----------------------------------------------------------------------- flags


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--telemetry", "tcp"], {}, "--telemetry must be one of auto, socket, http, got 'tcp'"),
        ([], {"PARALLELHUE_TELEMETRY": "x"}, "PARALLELHUE_TELEMETRY must be one of auto, socket, "
         "http, got 'x'"),
        (["--accept-uid", "abc"], {}, "--accept-uid must be an integer from 0 to 4294967294, "
         "got 'abc'"),
        (["--accept-uid", str(os.geteuid())], {}, f"--accept-uid {os.geteuid()} is this client's "
         "own uid: it is always accepted"),
        (["--accept-uid", "7", "--telemetry", "http"], {}, "--accept-uid applies to the telemetry "
         "socket: not with --telemetry http"),
        ([], {"PARALLELHUE_ACCEPT_UIDS": "7,-1"}, "PARALLELHUE_ACCEPT_UIDS must be an integer "
         "from 0 to 4294967294, got '-1'"),
    ],
)  # fmt: skip
def test_bad_telemetry_flags_are_one_exact_line(
    argv: list[str], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_run(["hi", *argv], env=env, stdout_tty=False)
    assert str(caught.value) == message


def test_accepted_uids_from_flags_and_the_environment() -> None:
    flags = parse_run(["hi", "--accept-uid", "7", "--accept-uid", "9", "--accept-uid", "7"], env={})
    assert (flags.telemetry, flags.accept_uids) == ("auto", (7, 9))
    env = parse_run(
        ["hi"], env={"PARALLELHUE_ACCEPT_UIDS": " 5, 6 ", "PARALLELHUE_TELEMETRY": "socket"}
    )
    assert (env.telemetry, env.accept_uids) == ("socket", (5, 6))
    both = parse_run(["hi", "--accept-uid", "8"], env={"PARALLELHUE_ACCEPT_UIDS": "5"})
    assert both.accept_uids == (8,)  # the flag wins


@needs_root
def test_a_root_server_is_rejected_by_a_users_client_unless_accepted(
    clean_env: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The container case: the engine runs as root (root reaches any socket), the client as
    a user (65534 here): by default the credentials check drops every datagram; with
    --accept-uid 0 the run is exact and says so."""
    home = os.path.join(clean_env, "user")
    os.mkdir(home, 0o700)
    os.chown(home, 65534, 65534)
    socket_dir = os.path.join(home, "s")
    monkeypatch.setenv("PARALLELHUE_SOCKET_OWNER_UID", "65534")  # read by the engine's emitters

    def client(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PARALLELHUE_SOCKET_DIR": socket_dir, "HOME": home}
        env.pop("PARALLELHUE_SOCKET_OWNER_UID")
        return subprocess.run(
            [
                "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", PYTHON,
                "-m", "parallelhue", "hi", "--endpoint", url + "/v1/chat/completions",
                "--view", "plain", "--mode", "exact", "--telemetry", "socket",
                "--max-tokens", "12", "--concurrency", "2", *extra,
            ],
            env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    async def serve_two() -> tuple[subprocess.CompletedProcess[str], ...]:
        server = SimServer(sim_config(socket_dir=socket_dir))
        url = await server.start()
        try:
            refused = await asyncio.to_thread(client, url)
            accepted = await asyncio.to_thread(client, url, "--accept-uid", "0")
            return refused, accepted
        finally:
            await server.stop()

    refused, accepted = asyncio.run(serve_two())
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        "parallelhue: exact mode: stream 0 is not exact: missing telemetry: no frames received "
        "for this run\n"
    )
    assert "telemetry: local socket, sender uid 65534 checked by the kernel" in refused.stdout
    assert (accepted.returncode, accepted.stderr) == (0, "")
    assert accepted.stdout.count("EXACT TOKEN PROVENANCE") >= 2
    assert accepted.stdout.splitlines()[0].endswith(
        "telemetry: local socket, sender uid 65534 and uid 0 accepted by --accept-uid"
    )
    # uid 0 needs no permission bits: the directory stays 0700.
    assert stat.S_IMODE(os.stat(socket_dir).st_mode) == 0o700


def test_the_telemetry_line_for_each_path() -> None:
    from parallelhue.ingest.streams import connect_target
    from parallelhue.ingest.telemetry import TelemetryPlan, security_line

    run = "0123456789abcdef" * 2
    http = TelemetryPlan("http")
    assert security_line(http, connect_target("https://gpu-box:8443/v1/completions"), "k", run) == (
        "telemetry: gpu-box:8443 over HTTPS (certificate verified), API key sent, "
        "in-band, run 01234567…"
    )
    assert security_line(
        TelemetryPlan("http", "auto"), connect_target("https://gpu-box/v1/completions"), None, run
    ) == (
        "telemetry: gpu-box:443 over HTTPS (certificate verified), no API key, "
        "in-band, run 01234567… (auto)"
    )
    assert security_line(http, connect_target("http://[::1]:8000/v1/completions"), None, run) == (
        "telemetry: [::1]:8000 over plain HTTP (loopback), no API key, in-band, run 01234567…"
    )
    assert security_line(http, connect_target("http://10.0.0.5:8000/v1/completions"), "k", run) == (
        "telemetry: 10.0.0.5:8000 over plain HTTP: NOT encrypted, anyone on the network path can "
        "read or forge it; API key sent in clear, in-band, run 01234567…"
    )
    target = connect_target("http://127.0.0.1:8000/v1/completions")
    socket_plan = TelemetryPlan("socket", "auto: the server has no telemetry route (HTTP 404)")
    assert security_line(socket_plan, target, None, run) == (
        f"telemetry: local socket, sender uid {os.geteuid()} checked by the kernel "
        "(auto: the server has no telemetry route (HTTP 404))"
    )
    accepted = TelemetryPlan("socket", accept_uids=(0, 4242, os.geteuid()))
    others = ", ".join(str(u) for u in (0, 4242) if u != os.geteuid())
    assert security_line(accepted, target, None, run) == (
        f"telemetry: local socket, sender uid {os.geteuid()} and uid {others} accepted by "
        "--accept-uid"
    )
