"""The HTTP side: requests carry the run's ids; each failure ends only its own stream."""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile

import pytest

from client_fakes import EVIL_TEXT, FakeServer, free_port
from parallelhue import cli, session
from test_cli import _CLEARED


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))
    # No telemetry comes from the fake server: keep the wait for it short.
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.2)


def table_rows(out: str) -> dict[int, list[str]]:
    """The summary table's stream rows: `#i LABEL tokens ...` split into their cells."""
    rows = {}
    for match in re.finditer(r"^#(\d+) +(.*)$", out, re.M):
        rows[int(match.group(1))] = match.group(2).split()
    return rows


def stream_lines(out: str) -> dict[int, str]:
    """The summary's line about each stream that failed or was downgraded, as
    `stream i: LABEL; note`, also for streams that share a grouped line
    (`streams 0-2, 5: LABEL; note`; the request id placeholder stays)."""
    lines = {}
    for match in re.finditer(r"^streams? ([0-9, -]+): (.*)$", out, re.M):
        for part in match.group(1).split(", "):
            first, _, last = part.partition("-")
            for index in range(int(first), int(last or first) + 1):
                lines[index] = f"stream {index}: {match.group(2)}"
    return lines


def write_prompts(directory: str, prompts: list[str]) -> str:
    path = os.path.join(directory, "prompts.json")
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(prompts, handle)
    return path


def test_requests_carry_run_ids_seeds_and_token_ids(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    with FakeServer() as server:
        code = cli.main(
            [
                "hi",
                "--endpoint",
                server.url + "/v1/chat/completions",
                "--concurrency",
                "3",
                "--seed",
                "10",
                "--temperature",
                "0.5",
                "--mode",
                "chunk",
                "--api-key",
                "sk-test",
            ]
        )
        requests = sorted(server.requests, key=lambda r: r["request_id"])
    out, err = capsys.readouterr()
    assert code == 0, err
    run_ids = set()
    for index, request in enumerate(requests):
        match = re.fullmatch(r"ph1_([0-9a-f]{32})_(\d+)", request["request_id"])
        assert match is not None
        run_ids.add(match.group(1))
        assert int(match.group(2)) == index
        assert request["_headers"]["x-request-id"] == request["request_id"]
        assert request["_headers"]["authorization"] == "Bearer sk-test"
        assert request["model"] == "fake-model"  # the server's only model
        assert request["return_token_ids"] is True
        assert request["stream"] is True
        assert request["stream_options"] == {"include_usage": True}
        assert request["seed"] == 10 + index
        assert request["temperature"] == 0.5
        assert request["messages"] == [{"role": "user", "content": "hi"}]
    assert len(run_ids) == 1
    assert out.count("SSE CHUNK MODE") >= 3
    assert "Hello world!" in out


def test_completions_endpoint_sends_prompt(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as server:
        code = cli.main(["hi", "--endpoint", server.url + "/v1/completions", "--mode", "chunk"])
        (request,) = server.requests
    assert code == 0
    assert request["prompt"] == "hi" and "messages" not in request


@pytest.mark.parametrize("kind", ["python", "rust"])
def test_each_failure_ends_only_its_stream(
    kind: str, tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # python: httpx's own transport and Python SSE parsing; rust: the lean
    # transport and the Rust SSE reading thread. Same messages, except where
    # the lean reader can say more (a broken chunked framing).
    if kind == "rust" and not _have_sse_parser():
        pytest.skip("make native first")
    prompts = ["ok", "error500", "error404", "html", "disconnect", "nofinish", "ok", "stall"]
    prompts.append("badchunk")
    path = write_prompts(str(tmp_path), prompts)
    with FakeServer() as server:
        code = cli.main(
            [
                "--prompt-file",
                path,
                "--endpoint",
                server.url + "/v1/chat/completions",
                "--mode",
                "auto",
                "--reconciler",
                kind,
                "--timeout",
                "1",
            ]
        )
    out, err = capsys.readouterr()
    assert code == 1
    assert err == ("parallelhue: 7 of 9 streams failed; stream 1: HTTP 500: boom red second line\n")
    lines = stream_lines(out)
    rows = table_rows(out)
    assert "error: HTTP 500: boom red second line" in lines[1]
    assert "error: HTTP 404: no such route" in lines[2]
    assert (
        "error: not an SSE stream: the server answered text/html (HTTP 200); "
        "is --endpoint a streaming completions URL?" in lines[3]
    )
    assert "error: the server closed the connection mid-stream" in lines[4]
    assert "error: the stream ended without a finish_reason (server closed it early)" in lines[5]
    assert "error: no data from the server for 1 s (raise --timeout)" in lines[7]
    if kind == "rust":
        assert (
            'error: invalid HTTP body: invalid chunk size line "zz" in a chunked body' in lines[8]
        )
    else:
        assert "error: the server closed the connection mid-stream" in lines[8]
    for healthy in (0, 6):
        assert "error" not in lines[healthy]
        assert rows[healthy][:2] == ["CHUNK", "4"]  # label, tokens
        # No telemetry reached the client: auto downgraded visibly, per stream.
        assert lines[healthy].startswith(f"stream {healthy}: SSE CHUNK MODE")
        assert "downgraded: missing telemetry: no frames received for this run" in lines[healthy]
    assert "\x1b" not in out


def test_refused_connection_is_a_stream_error(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = cli.main(
        [
            "hi",
            "--endpoint",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            "--model",
            "m",
            "--mode",
            "chunk",
            "--concurrency",
            "2",
        ]
    )
    _out, err = capsys.readouterr()
    assert code == 2  # item 10: as when model discovery meets the same refusal
    assert err == (
        f"parallelhue: 2 of 2 streams failed; stream 0: cannot connect to 127.0.0.1:{port}: "
        "connection refused (is the server running?)\n"
    )


def test_refused_model_discovery_is_a_setup_error(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    code = cli.main(
        [
            "hi",
            "--endpoint",
            f"http://127.0.0.1:{port}/v1/chat/completions",
            "--reconciler",
            "python",
        ]
    )
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        f"parallelhue: error: cannot list the server's models at "
        f"http://127.0.0.1:{port}/v1/models: connection refused (is the server running?)\n"
    )


@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_a_refused_key_exits_2_with_or_without_model(
    reconciler: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Item 10: the same cause, the same exit code, whichever request meets it first."""
    with FakeServer(models_status=401) as server:
        code = cli.main(
            ["hi", "--endpoint", server.url, "--reconciler", reconciler, "--api-key", "sk-x"]
        )
        _out, err = capsys.readouterr()
        assert code == 2
        assert err == (
            f"parallelhue: error: the server refused the API key (HTTP 401 from "
            f"{server.url}/v1/models): check --api-key or OPENAI_API_KEY\n"
        )
    with FakeServer() as server:
        server.completion_status = 401
        code = cli.main(
            ["hi", "--endpoint", server.url, "--model", "m", "--mode", "chunk",
             "--concurrency", "2", "--reconciler", reconciler, "--api-key", "sk-x"]
        )  # fmt: skip
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        "parallelhue: 2 of 2 streams failed; stream 0: HTTP 401: invalid api key "
        "(check --api-key or OPENAI_API_KEY)\n"
    )


def test_several_models_need_a_choice(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(models=["a", "b"]) as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk"]
        )
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == "parallelhue: error: the server lists 2 models (a, b): choose one with --model\n"


def test_server_text_is_sanitized(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as server:
        code = cli.main(
            ["evil", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk"]
        )
    out, _err = capsys.readouterr()
    assert code == 0
    assert EVIL_TEXT not in out
    for bad in ("\x1b", "\r", "\u202e", "\u200b", "\x9b", "\x07"):
        assert bad not in out
    assert "AB" in out and "world!" in out


def test_exact_mode_fails_closed_without_telemetry(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as server:
        code = cli.main(
            [
                "hi",
                "--endpoint",
                server.url + "/v1/chat/completions",
                "--mode",
                "exact",
                "--reconciler",
                "python",
            ]
        )
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        "parallelhue: exact mode: stream 0 is not exact: "
        "missing telemetry: no frames received for this run\n"
    )


def test_socket_is_removed_after_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--reconciler", "python"]
        )
    assert code == 0
    assert os.listdir(socket_dir) == []
    assert oct(os.stat(socket_dir).st_mode & 0o777) == "0o700"


def test_missing_native_module_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "parallelhue._native", None)
    code = cli.main(["hi", "--model", "m", "--reconciler", "rust"])
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        "parallelhue: error: the Rust reconciler is not built: run `make native`, "
        "or use --reconciler python (import of parallelhue._native halted; None in sys.modules)\n"
    )


_WITHOUT_NATIVE = """
import sys
sys.modules["parallelhue._native"] = None
from parallelhue import cli
from parallelhue.model import spans
code = cli.main(["demo", "--concurrency", "2", "--max-tokens", "20", "--view", "plain",
                 "--reconciler", "python"])
print("python tails:", spans.tail_pieces is spans.python_tail_pieces)
sys.exit(code)
"""


def test_the_python_reconciler_runs_the_whole_client_without_the_extension() -> None:
    # The documented reference path needs no compiled code: the screen model
    # falls back to its Python pane-tail reader (spans.python_tail_pieces).
    import subprocess

    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "python")
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NATIVE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "labels: EXACT TOKEN PROVENANCE 2" in lines
    assert lines[-1] == "python tails: True"


def _have_native() -> bool:
    try:
        from parallelhue._native import Receiver  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.parametrize(
    "kind",
    [
        "python",
        pytest.param(
            "rust", marks=pytest.mark.skipif(not _have_native(), reason="make native first")
        ),
    ],
)
def test_ctrl_c_cancels_streams_removes_socket_and_exits_130(kind: str) -> None:
    import signal
    import subprocess
    import time

    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "python")
    process = subprocess.Popen(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "2",
         "--max-tokens", "8000", "--step-ms", "50", "--view", "plain",
         "--reconciler", kind],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(name.endswith(".sock") for name in os.listdir(socket_dir)):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the run never bound its socket"
        time.sleep(0.05)
    time.sleep(0.3)  # let the streams start
    process.send_signal(signal.SIGINT)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert err == "parallelhue: interrupted\n"
    assert [name for name in os.listdir(socket_dir) if name.endswith(".sock")] == []


def test_exact_mode_stops_on_the_first_http_failure(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_prompts(str(tmp_path), ["error500", "ok"])
    with FakeServer() as server:
        code = cli.main(
            ["--prompt-file", path, "--endpoint", server.url + "/v1/chat/completions",
             "--mode", "exact", "--reconciler", "python"]
        )  # fmt: skip
    _out, err = capsys.readouterr()
    assert code == 2
    # Stream 1 never got its telemetry: it was cancelled because of stream 0.
    assert err == (
        "parallelhue: exact mode: stream 0 is not exact: HTTP 500: boom red second line; "
        "1 stream was cancelled because of it\n"
    )


def test_token_ids_outside_u32_end_the_stream(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import client_fakes

    original = client_fakes._delta

    def huge_ids(text: str, ids: list[int], finish: str | None = None) -> dict[str, object]:
        return original(text, [2**40 for _ in ids], finish)

    monkeypatch.setattr(client_fakes, "_delta", huge_ids)
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--reconciler", "python"]
        )
    _out, err = capsys.readouterr()
    assert code == 1
    # The same reason as the Rust readers give (reference/sse.py mirrors their extraction).
    assert err == (
        "parallelhue: 1 of 1 streams failed; stream 0: bad SSE data: invalid SSE chunk: "
        "choices[0].token_ids[0] must be an integer in 0..=4294967295\n"
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_PASSCRED is Linux-only")
def test_py_receiver_keeps_our_datagrams_and_drops_other_uids() -> None:
    import asyncio
    import socket
    import stat
    import struct

    from parallelhue.ingest.receiver import PyReceiver

    path = os.path.join(os.environ["PARALLELHUE_SOCKET_DIR"], "r.sock")

    async def go() -> tuple[list[bytes], dict[str, int], int]:
        receiver = PyReceiver(path)
        mode = stat.S_IMODE(os.stat(path).st_mode)
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(b"ours", path)
            if os.geteuid() == 0:
                # Root may claim another uid in SCM_CREDENTIALS: the forged datagram is dropped.
                creds = struct.pack("iII", os.getpid(), 65534, 65534)
                sender.sendmsg(
                    [b"forged"], [(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, creds)], 0, path
                )
        frames = receiver.take()
        stats = receiver.stats()
        receiver.close()
        return frames, stats, mode

    frames, stats, mode = asyncio.run(go())
    assert mode == 0o600
    assert frames == [b"ours"]
    if os.geteuid() == 0:
        assert stats == {
            "datagrams": 2,
            "rejected_uid": 1,
            "accepted_foreign": 0,
            "bytes": 4,
            "last_rejected_uid": 65534,
        }
    assert not os.path.exists(path)


@pytest.mark.parametrize("mode", ["chunk", "auto", "exact"])
def test_over_long_socket_dir_is_refused_before_anything_is_created(
    mode: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = tempfile.mkdtemp(prefix="phl", dir="/tmp")
    long_dir = os.path.join(base, "d" * 100, "sockets")
    code = cli.main(["hi", "--mode", mode, "--socket-dir", long_dir, "--model", "m"])
    _out, err = capsys.readouterr()
    assert code == 2
    assert err.startswith("parallelhue: error: socket path ")
    assert "the AF_UNIX limit is" in err
    assert os.listdir(base) == []  # neither the directory nor its parents were made


def _have_sse_parser() -> bool:
    try:
        from parallelhue._native import HttpStreams  # noqa: F401
    except ImportError:
        return False
    return True


SSE_KINDS = [
    "python",
    pytest.param(
        "rust", marks=pytest.mark.skipif(not _have_sse_parser(), reason="make native first")
    ),
]


@pytest.mark.parametrize("kind", SSE_KINDS)
def test_both_sse_parsers_give_the_same_text_and_end_on_bad_data(
    kind: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import client_fakes

    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk",
             "--view", "plain", "--reconciler", kind]
        )  # fmt: skip
    out, _err = capsys.readouterr()
    assert code == 0
    assert "Hello world!" in out and table_rows(out)[0][:2] == ["CHUNK", "4"]

    original = client_fakes._delta

    def broken(text: str, ids: list[int], finish: str | None = None) -> object:
        return "{not json" if text == " world" else original(text, ids, finish)

    monkeypatch.setattr(client_fakes, "_delta", broken)
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk",
             "--view", "plain", "--reconciler", kind]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("parallelhue: 1 of 1 streams failed; stream 0: bad SSE data")
    assert "not json" in err or "JSON" in err
    assert table_rows(out)[0][:2] == ["ERROR", "2"]  # "Hello" arrived; nothing after the bad event


# --- defects of issue 12 and the new request knobs -------------------------------------------


def test_401_from_the_model_list_points_at_the_api_key(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Defect 6: a 401 from /v1/models said "give --model".
    with FakeServer(models_status=401) as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk"]
        )
    _out, err = capsys.readouterr()
    assert code == 2
    assert err == (
        f"parallelhue: error: the server needs an API key (HTTP 401 from {server.url}/v1/models): "
        "give it with --api-key or OPENAI_API_KEY\n"
    )


def test_tokens_are_counted_from_usage_without_token_ids(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Defect 8: 0 tokens on a server that sends usage.completion_tokens but no token_ids.
    with FakeServer() as server:
        endpoint = server.url + "/v1/chat/completions"
        code = cli.main(["noids", "--endpoint", endpoint, "--mode", "chunk", "--view", "plain"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert "#0 SSE CHUNK MODE · 4 tok" in out
        assert re.search(r"^#0 +CHUNK +4† ", out, re.M), out
        code = cli.main(["noids", "--endpoint", endpoint, "--mode", "chunk", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(out)
    (stream,) = result["streams"]
    assert (stream["tokens"], stream["tokens_source"]) == (4, "usage")
    assert result["total"]["tokens"] == 4


@pytest.mark.timeout(300)
def test_auto_mode_without_telemetry_does_not_wait_for_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 5: against a server without the plugin the label stayed VERIFYING for the
    # whole grace period (2 s) after the last stream, and wall time and tok/s included it.
    # With a 10-minute grace period, waiting for it would hit the test's timeout.
    monkeypatch.setattr(session, "GRACE_SECONDS", 600.0)
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--concurrency", "2",
             "--view", "plain"]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("SSE CHUNK MODE · 4 tok") == 2
    assert "downgraded: missing telemetry: no frames received for this run" in out
    wall = re.search(r"^wall time ([0-9.]+) s \(first request to last SSE delta\)", out, re.M)
    assert wall is not None and float(wall.group(1)) < 60  # the generation, not a grace period


def test_nothing_connected_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    # Defect 13: every stream refused drew panes and a ten-line summary.
    port = free_port()
    code = cli.main(
        ["hi", "--endpoint", f"http://127.0.0.1:{port}/v1/chat/completions", "--model", "m",
         "--mode", "chunk", "--concurrency", "3"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err == (
        f"parallelhue: 3 of 3 streams failed; stream 0: cannot connect to 127.0.0.1:{port}: "
        "connection refused (is the server running?)\n"
    )


def test_headers_and_request_knobs_reach_the_server(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1", "--mode", "chunk", "--header",
             "X-Team: infra", "--stop", "END", "--ignore-eos", "--system", "be brief",
             "--extra-body", '{"top_p": 0.25}']
        )  # fmt: skip
        (request,) = server.requests
    assert code == 0, capsys.readouterr().err
    assert request["_headers"]["x-team"] == "infra"
    assert request["stop"] == ["END"] and request["ignore_eos"] is True
    assert request["top_p"] == 0.25
    assert request["messages"][0] == {"role": "system", "content": "be brief"}


def test_measurement_to_stdout(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 14: `--measurement -` created a file named "-".
    os.chdir(str(tmp_path))
    with FakeServer() as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk",
             "--measurement", "-"]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0, err
    assert not os.path.exists("-")
    record = json.loads(out)
    assert record["schema"] == "parallelhue-measurement/2"
    assert record["results"]["streams"][0]["tokens"] == 4
    assert (record["request"]["stop"], record["request"]["ignore_eos"]) == ([], False)
    assert "Summary" in err


def _python_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "python")
    return env


def test_dumb_terminal_gets_no_escape_sequences() -> None:
    # Defect 7: TERM=dumb got the alternate screen, cursor moves and 256 colors.
    import pty
    import subprocess

    env = _python_env()
    env["TERM"] = "dumb"
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "2", "--max-tokens",
         "20", "--step-ms", "1"],
        stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True,
    )  # fmt: skip
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        output += chunk
    os.close(leader)
    assert process.wait(timeout=60) == 0, output[-2000:]
    text = output.decode("utf-8", "replace")
    assert "EXACT TOKEN PROVENANCE" in text and "Summary" in text
    assert "\x1b" not in text


def test_closed_stdout_exits_141_with_one_line() -> None:
    # Defect 9: `parallelhue demo | head -1` exited 1 silently.
    import subprocess

    process = subprocess.Popen(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "2", "--max-tokens",
         "40", "--step-ms", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_python_env(),
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # the reader went away before the first line
    err = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141
    assert err == "parallelhue: stdout was closed (broken pipe): output stopped\n"
