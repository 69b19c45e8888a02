"""The telemetry route (POST /v1/parallelhue/runs, GET|HEAD /v1/parallelhue) served by the
SIMULATED engine through the plugin's own hub and route code, exercised with a plain HTTP
client on a socket: API keys, run isolation, malformed / oversized / slow requests, slow,
vanished and malicious subscribers, and HTTP frames equal to the socket's."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import reach_client as rc
from parallelhue.reference import decode_frame
from parallelhue.reference.reconciler import Reconciler
from parallelhue.sim import SimConfig, SimServer
from parallelhue.sim import __main__ as sim_main
from parallelhue.sim import http as sim_http
from parallelhue.sim import server as sim_server
from parallelhue_vllm import paths
from parallelhue_vllm.hub import HubLimits

KEY = "test-key-7f3a"
MODEL = "parallelhue-sim"


class SimThread:
    """A SimServer on its own event loop in a thread, so the test can use blocking sockets."""

    def __init__(self, config: SimConfig) -> None:
        self.loop = asyncio.new_event_loop()
        self.server = SimServer(config)
        started = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.url = self.loop.run_until_complete(self.server.start())
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def hub_stats(self) -> dict[str, int]:
        assert self.server.hub is not None
        return self.server.hub.stats()

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(20)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture
def dirs() -> Iterator[tuple[str, str]]:
    """A socket directory and a hub base directory, short enough for sun_path."""
    root = tempfile.mkdtemp(prefix="phr", dir="/tmp")
    os.chmod(root, 0o700)
    sockets = os.path.join(root, "s")
    os.mkdir(sockets, 0o700)
    yield sockets, os.path.join(root, "h")
    shutil.rmtree(root, ignore_errors=True)


def start(dirs: tuple[str, str], **overrides: Any) -> SimThread:
    settings: dict[str, Any] = {
        "step_ms": 2,
        "socket_dir": dirs[0],
        "hub_dir": dirs[1],
        "telemetry_mode": "http",
        "api_keys": (KEY,),
    }
    settings.update(overrides)
    return SimThread(SimConfig(**settings))


@pytest.fixture
def sim(dirs: tuple[str, str]) -> Iterator[SimThread]:
    server = start(dirs, telemetry_mode="both")
    yield server
    server.stop()


def bodies(n: int, max_tokens: int = 40) -> list[dict[str, Any]]:
    return [
        {
            "model": MODEL,
            "stream": True,
            "max_tokens": max_tokens,
            "return_token_ids": True,
            "messages": [{"role": "user", "content": f"prompt {i}"}],
        }
        for i in range(n)
    ]


def wait_for(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.01)


def sent_everything(over_socket: list[bytes], server: Any, quiet: float = 0.3) -> int:
    """The run's frame count once the hub has taken (accepted or dropped) as many frames as
    reached the socket and none arrived for `quiet` seconds."""
    deadline = time.monotonic() + 10.0
    seen, since = -1, time.monotonic()
    while True:
        stats = server.hub_stats()
        count = len(over_socket)
        if count != seen:
            seen, since = count, time.monotonic()
        elif stats["accepted"] + stats["dropped"] == count and time.monotonic() - since >= quiet:
            return count
        assert time.monotonic() < deadline, (count, stats)
        time.sleep(0.01)


def socket_frames(sock_dir: str, run: str) -> tuple[socket.socket, list[bytes]]:
    """Bind the client's socket for `run` and collect what arrives there, in a thread."""
    path = paths.socket_path(sock_dir, run)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    os.chmod(path, 0o600)
    sock.settimeout(0.2)
    got: list[bytes] = []

    def loop() -> None:
        while True:
            try:
                got.append(sock.recv(1 << 17))
            except TimeoutError:
                continue
            except OSError:
                return

    threading.Thread(target=loop, daemon=True).start()
    return sock, got


# ------------------------------------------------------------------ probe and API key
def test_probe_answers_get_and_head_and_describes_the_hub(sim: SimThread) -> None:
    got = rc.request(sim.url, "GET", rc.PROBE_PATH, api_key=KEY)
    assert got.status == 200
    body = got.json()
    assert (body["object"], body["engine"], body["exact"], body["reason"]) == (
        "parallelhue.telemetry",
        "simulated",
        True,
        None,
    )
    assert (body["stream_version"], body["create_run"]) == (1, "/v1/parallelhue/runs")
    assert body["hub"]["buffer_bytes"] == 4 << 20 and body["hub"]["subscribers"] == 0
    head = rc.request(sim.url, "HEAD", rc.PROBE_PATH, api_key=KEY)
    assert (head.status, head.body) == (200, b"")
    assert int(head.headers["content-length"]) == len(got.body)


@pytest.mark.parametrize("key", [None, "wrong-key", KEY[:-1]])
@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", rc.PROBE_PATH), ("POST", rc.RUNS_PATH), ("POST", "/v1/chat/completions")],
)
def test_every_v1_route_needs_the_api_key(
    sim: SimThread, key: str | None, method: str, path: str
) -> None:
    got = rc.request(sim.url, method, path, api_key=key, body=b"{}")
    assert (got.status, got.body) == (401, b'{"error":"Unauthorized"}')
    assert sim.hub_stats()["subscriptions"] == 0


def test_health_needs_no_key_and_the_right_key_opens_a_run(sim: SimThread) -> None:
    assert rc.request(sim.url, "GET", "/health").status == 200
    sub = rc.Subscriber(sim.url, api_key=KEY)
    assert sub.status == 200
    assert sub.headers["content-type"] == "application/x-parallelhue-telemetry"
    assert sub.headers["cache-control"] == "no-store"
    assert len(sub.run_id) == 32
    assert sub.items[0].buffer_bytes == 4 << 20 and sub.items[0].heartbeat_ms == 2000
    sub.close()


# ------------------------------------------------------------------ the frames
def test_http_frames_equal_the_socket_frames_and_reconcile_exactly(
    sim: SimThread, dirs: tuple[str, str]
) -> None:
    sub = rc.Subscriber(sim.url, api_key=KEY)
    run = sub.run_id
    sock, over_socket = socket_frames(dirs[0], run)
    http_rec = rc.Locked(Reconciler(run, 4))
    socket_rec = Reconciler(run, 4)
    feeder = rc.feed(sub, http_rec)
    outs = rc.run_streams(sim.url, run, bodies(4), [http_rec], api_key=KEY)
    assert [o.status for o in outs] == [200] * 4
    assert rc.settle(http_rec, 4) == [("exact", None)] * 4
    wait_for(lambda: len(over_socket) == len(sub.frames))
    for frame in over_socket:
        socket_rec.push_frame(frame)
    for i, out in enumerate(outs):
        socket_rec.push_inputs(out.inputs)
        socket_rec.finish_sse(i, out.finish_reason)
    socket_rec.finalize()
    assert [socket_rec.verdict(i) for i in range(4)] == [("exact", None)] * 4
    assert sorted(sub.frames) == sorted(over_socket)
    assert http_rec.totals() == socket_rec.totals()
    sub.close()
    feeder.join(5)
    sock.close()


def test_each_subscriber_gets_its_own_run_only(sim: SimThread, dirs: tuple[str, str]) -> None:
    subs = [rc.Subscriber(sim.url, api_key=KEY) for _ in range(2)]
    assert subs[0].run_id != subs[1].run_id
    # A third run the client names itself (socket mode): never served over HTTP.
    own_run = "ab" * 16
    sock, over_socket = socket_frames(dirs[0], own_run)
    recs = [rc.Locked(Reconciler(s.run_id, 2)) for s in subs]
    feeders = [rc.feed(s, r) for s, r in zip(subs, recs, strict=True)]
    threads = [
        threading.Thread(
            target=rc.run_streams, args=(sim.url, run, bodies(2), [r]), kwargs={"api_key": KEY}
        )
        for run, r in [
            (subs[0].run_id, recs[0]),
            (subs[1].run_id, recs[1]),
            (own_run, Reconciler(own_run, 2)),
        ]
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for rec in recs:
        assert rc.settle(rec, 2) == [("exact", None)] * 2
    wait_for(lambda: len(over_socket) >= 3)
    for sub in subs:
        runs = {decode_frame(f).header.run_id.hex() for f in sub.frames}
        assert runs == {sub.run_id}
        sub.close()
    assert {decode_frame(f).header.run_id.hex() for f in over_socket} == {own_run}
    assert all(f not in subs[0].frames + subs[1].frames for f in over_socket)
    for feeder in feeders:
        feeder.join(5)
    sock.close()


# ------------------------------------------------------------------ bad requests
@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        (b"not json", 400, "request body must be empty or a JSON object"),
        (b"[1]", 400, "request body must be empty or a JSON object"),
        (b'{"run_id": "00"}', 400, "unknown field 'run_id' (known: stream_version)"),
        (b'{"stream_version": 2}', 400, "stream_version 2 is not supported (this server speaks 1)"),
        (
            b'{"stream_version": true}',
            400,
            "stream_version true is not supported (this server speaks 1)",
        ),
        (
            b"{" + b" " * 1100 + b"}",
            413,
            "request body of 1102 bytes exceeds 1024: send an empty body or {}",
        ),
    ],
)
def test_malformed_requests_get_one_line_errors(
    sim: SimThread, body: bytes, status: int, message: str
) -> None:
    got = rc.request(sim.url, "POST", rc.RUNS_PATH, api_key=KEY, body=body)
    assert got.status == status
    assert got.json()["error"]["message"] == message
    assert sim.hub_stats()["subscriptions"] == 0


def test_the_runs_route_takes_post_only(sim: SimThread) -> None:
    got = rc.request(sim.url, "GET", rc.RUNS_PATH, api_key=KEY)
    assert got.status == 405
    assert got.json()["error"]["message"] == "/v1/parallelhue/runs takes POST, not GET"


def test_a_run_id_in_the_path_is_not_a_route(sim: SimThread) -> None:
    got = rc.request(sim.url, "GET", rc.RUNS_PATH + "/" + "ab" * 16 + "/telemetry", api_key=KEY)
    assert got.status == 404


def test_an_expired_run_id_opens_nothing(dirs: tuple[str, str]) -> None:
    """A run id that was real once (its subscriber left) cannot be asked for by any
    route, and frames that still carry it reach nobody: not the next subscriber."""
    server = start(dirs)
    try:
        old = rc.Subscriber(server.url, api_key=KEY)
        expired = old.run_id
        old.close()
        wait_for(lambda: server.hub_stats()["subscribers"] == 0)
        for method, path in [
            ("GET", f"{rc.RUNS_PATH}/{expired}"),
            ("POST", f"{rc.RUNS_PATH}/{expired}"),
            ("GET", f"{rc.RUNS_PATH}/{expired}/telemetry"),
            ("POST", f"{rc.PROBE_PATH}/{expired}"),
        ]:
            got = rc.request(server.url, method, path, api_key=KEY)
            assert got.status == 404, (method, path, got.status)
        named = json.dumps({"run_id": expired}).encode()
        got = rc.request(server.url, "POST", rc.RUNS_PATH, api_key=KEY, body=named)
        assert (got.status, got.json()["error"]["message"]) == (
            400,
            "unknown field 'run_id' (known: stream_version)",
        )
        assert server.hub_stats()["subscriptions"] == 1  # only the first one ever
        fresh = rc.Subscriber(server.url, api_key=KEY)
        assert fresh.run_id != expired
        unclaimed = server.hub_stats()["unclaimed"]
        rc.run_streams(server.url, expired, bodies(2, 20), [], api_key=KEY)
        wait_for(lambda: server.hub_stats()["unclaimed"] > unclaimed)
        fresh.read_until(lambda items: any(i.kind == "heartbeat" for i in items), timeout=10)
        assert fresh.frames == [] and fresh.dropped == 0
        fresh.close()
    finally:
        server.stop()


def test_a_slow_request_gets_408_and_does_not_delay_others(
    dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim_http, "REQUEST_SECONDS", 1.0)
    server = start(dirs)
    try:
        slow = rc.Connection(server.url)
        # Headers promise 10 bytes of body; they never come.
        slow.sock.sendall(
            f"POST {rc.RUNS_PATH} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
            "Content-Length: 10\r\n\r\n{".encode()
        )
        # Meanwhile the server answers others at once.
        assert rc.request(server.url, "GET", rc.PROBE_PATH, api_key=KEY).status == 200
        sub = rc.Subscriber(server.url, api_key=KEY)
        rec = rc.Locked(Reconciler(sub.run_id, 1))
        feeder = rc.feed(sub, rec)
        rc.run_streams(server.url, sub.run_id, bodies(1), [rec], api_key=KEY)
        assert rc.settle(rec, 1) == [("exact", None)]
        slow.sock.settimeout(10)
        status, _ = slow.read_head()
        assert status == 408
        assert json.loads(slow.read_body())["error"]["message"] == "request not received within 1 s"
        slow.close()
        sub.close()
        feeder.join(5)
    finally:
        server.stop()


def test_telemetry_off_is_a_503_naming_the_flag(dirs: tuple[str, str]) -> None:
    server = start(dirs, telemetry_mode="socket")
    try:
        probe = rc.request(server.url, "GET", rc.PROBE_PATH, api_key=KEY).json()
        reason = (
            "telemetry over HTTP is off on this server: start the SIMULATED engine with "
            "--telemetry http or both"
        )
        assert (probe["exact"], probe["reason"]) == (False, reason)
        assert "hub" not in probe
        got = rc.request(server.url, "POST", rc.RUNS_PATH, api_key=KEY)
        assert (got.status, got.json()["error"]["message"]) == (503, reason)
    finally:
        server.stop()


def test_subscribers_beyond_the_limit_get_503(dirs: tuple[str, str]) -> None:
    server = start(dirs, hub_limits=HubLimits(max_subscribers=2))
    try:
        subs = [rc.Subscriber(server.url, api_key=KEY) for _ in range(2)]
        refused = rc.Subscriber(server.url, api_key=KEY)
        assert refused.status == 503
        assert json.loads(refused.error_body)["error"]["message"] == (
            "2 telemetry subscribers are connected, the most this server allows: try again later"
        )
        subs[0].close()
        wait_for(lambda: server.hub_stats()["subscribers"] == 1)
        again = rc.Subscriber(server.url, api_key=KEY)
        assert again.status == 200
        for sub in (subs[1], again):
            sub.close()
    finally:
        server.stop()


# ------------------------------------------------------------------ subscribers that misbehave
def test_a_slow_subscriber_costs_its_cap_and_sees_exactly_what_it_lost(
    dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim_server, "TELEMETRY_SNDBUF", 8 << 10)
    cap = 16 << 10
    server = start(
        dirs, telemetry_mode="both", hub_limits=HubLimits(buffer_bytes=cap), min_batch=16
    )
    try:
        sub = rc.Subscriber(server.url, api_key=KEY, rcvbuf=4096)
        sock, over_socket = socket_frames(dirs[0], sub.run_id)
        # The subscriber reads nothing while 16 streams run to the end.
        outs = rc.run_streams(server.url, sub.run_id, bodies(16, 300), [], api_key=KEY)
        assert [o.status for o in outs] == [200] * 16
        wait_for(lambda: server.hub_stats()["dropped"] > 0)
        assert server.hub_stats()["buffered_bytes"] <= cap
        # The sender may still be sending the last frames when the responses end (a count
        # read then once came out 2 short): wait until the hub has taken as many as reached
        # the socket, and nothing more arrives.
        total = sent_everything(over_socket, server)
        # Now it reads everything there is: the drop notice accounts for every missing frame.
        sub.read_until(lambda items: len(sub.frames) + sub.dropped >= total, timeout=30)
        assert sub.dropped == server.hub_stats()["dropped"] > 0
        assert len(sub.frames) + sub.dropped == total
        assert set(sub.frames) <= set(over_socket)
        http_rec = Reconciler(sub.run_id, 16)
        for frame in sub.frames:
            http_rec.push_frame(frame)
        for i, out in enumerate(outs):
            http_rec.push_inputs(out.inputs)
            http_rec.finish_sse(i, out.finish_reason)
        http_rec.finalize()
        verdicts = [http_rec.verdict(i) for i in range(16)]
        # Lost frames are never papered over: no stream is exact from the HTTP frames.
        assert all(v[0] == "failed" for v in verdicts)
        assert all(str(v[1]).startswith(("frames lost", "missing telemetry")) for v in verdicts), (
            verdicts
        )
        sub.close()
        sock.close()
    finally:
        server.stop()


def test_a_vanished_subscriber_is_released_at_once_and_the_next_run_is_exact(
    dirs: tuple[str, str],
) -> None:
    server = start(dirs)
    try:
        gone = rc.Subscriber(server.url, api_key=KEY)
        run = gone.run_id
        thread = threading.Thread(
            target=rc.run_streams,
            args=(server.url, run, bodies(4, 200), []),
            kwargs={"api_key": KEY},
        )
        thread.start()
        gone.read_until(lambda items: len(items) > 3)  # mid-run
        gone.conn.sock.shutdown(socket.SHUT_RDWR)
        gone.close()  # like a client killed mid-run
        wait_for(lambda: server.hub_stats()["subscribers"] == 0)
        assert server.hub_stats()["buffered_bytes"] == 0
        thread.join(60)
        unclaimed = server.hub_stats()["unclaimed"]
        assert unclaimed > 0  # the rest of that run's frames were discarded, not kept
        sub = rc.Subscriber(server.url, api_key=KEY)
        rec = rc.Locked(Reconciler(sub.run_id, 4))
        feeder = rc.feed(sub, rec)
        rc.run_streams(server.url, sub.run_id, bodies(4), [rec], api_key=KEY)
        assert rc.settle(rec, 4) == [("exact", None)] * 4
        sub.close()
        feeder.join(5)
    finally:
        server.stop()


def test_a_stalled_subscriber_is_cut_and_the_server_keeps_serving(
    dirs: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sim_server, "TELEMETRY_SNDBUF", 8 << 10)
    server = start(dirs, hub_limits=HubLimits(buffer_bytes=16 << 10, stall_seconds=0.5))
    try:
        stalled = rc.Subscriber(server.url, api_key=KEY, rcvbuf=4096)
        rc.run_streams(server.url, stalled.run_id, bodies(8, 300), [], api_key=KEY)
        wait_for(lambda: server.hub_stats()["cut_stalled"] == 1)
        assert server.hub_stats()["subscribers"] == 0
        assert server.hub_stats()["buffered_bytes"] == 0
        # When it reads again it finds the end of its stream, saying why.
        stalled.read_until(lambda items: stalled.decoder.ended, timeout=30)
        assert stalled.items[-1].kind == "end"
        assert stalled.items[-1].code == 2
        assert stalled.items[-1].message == (
            "the subscriber read nothing for 0.5 s; its telemetry was discarded"
        )
        stalled.close()
        sub = rc.Subscriber(server.url, api_key=KEY)
        rec = rc.Locked(Reconciler(sub.run_id, 2))
        feeder = rc.feed(sub, rec)
        rc.run_streams(server.url, sub.run_id, bodies(2), [rec], api_key=KEY)
        assert rc.settle(rec, 2) == [("exact", None)] * 2
        sub.close()
        feeder.join(5)
    finally:
        server.stop()


def test_a_subscriber_sending_junk_after_its_request_changes_nothing(dirs: tuple[str, str]) -> None:
    server = start(dirs)
    try:
        sub = rc.Subscriber(server.url, api_key=KEY)
        sub.conn.sock.sendall(b"GET /v1/parallelhue HTTP/1.1\r\n\r\n" + os.urandom(4096))
        rec = rc.Locked(Reconciler(sub.run_id, 2))
        feeder = rc.feed(sub, rec)
        rc.run_streams(server.url, sub.run_id, bodies(2), [rec], api_key=KEY)
        assert rc.settle(rec, 2) == [("exact", None)] * 2
        assert sub.error is None
        sub.close()
        feeder.join(5)
    finally:
        server.stop()


# ------------------------------------------------------------------ the standalone flags
def test_standalone_flags(capsys: pytest.CaptureFixture[str]) -> None:
    args = sim_main.build_parser().parse_args(
        ["--telemetry", "both", "--api-key", "a", "--api-key", "b"]
    )
    config = sim_main.config_from_args(args)
    assert (config.telemetry_mode, config.api_keys, config.telemetry) == ("both", ("a", "b"), True)
    default = sim_main.config_from_args(sim_main.build_parser().parse_args([]))
    assert (default.telemetry_mode, default.api_keys) == ("socket", ())
    for argv, message in [
        (
            ["--telemetry", "carrier-pigeon"],
            "argument --telemetry: invalid choice: 'carrier-pigeon'",
        ),
        (
            ["--telemetry", "http", "--no-telemetry"],
            "argument --no-telemetry: not allowed with argument --telemetry",
        ),
        (
            ["--telemetry", "http", "--fault", "drop:0.1"],
            "datagram faults act on the socket path: use --telemetry socket or both",
        ),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            sim_main.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
