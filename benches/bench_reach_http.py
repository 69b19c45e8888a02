"""Telemetry across two network hosts, side by side: in-band, the old side route, the socket.

64 streams against the SIMULATED engine at a fixed rate (default 20k step
records/s). The engine (`python -m parallelhue.sim`) runs on a server host and
the real client (`parallelhue.session.Session` headless, the Rust path) on a
client host: two network namespaces joined by a veth pair (tests/netns/netns.py;
needs root). All configurations send the SSE over that same veth pair; only
the telemetry differs:

- `inband` (issue 28): each request's frames inside its own SSE response
  (`--telemetry http` on both sides);
- `side`: the per-run subscription stream it replaced (issue 11), run from
  the tree of `--side-ref` (default: the commit before in-band telemetry),
  extracted with `git archive` and given this build's extension (a superset);
- `socket`: the engine's emitters send datagrams to the client's socket (a
  path on the shared filesystem: AF_UNIX crosses network namespaces).

Rounds rotate the configurations; each round is a fresh engine and a fresh
client process. Two kinds of round, also alternated:

- cost rounds: frames lost (the engine's emitter drops + sequence gaps the
  reconciler saw + frames the server's hub dropped for the client), streams
  exact, client CPU (user + system of the client process, all its threads)
  and server CPU (the engine process: engine, HTTP server, emitters, hub) per
  10k tokens;
- latency rounds (the client also writes `--record`, so their CPU is not
  reported): step-to-screen latency. For every step of every stream: from the
  `timestamp_ns` of the provenance frame carrying the step's record (set by
  the scheduler emitter's sender thread when it encodes the frame, just
  before sending it) to the moment the client's screen model receives the
  first span of that step (`StreamState.add_span_runs`, called when the
  session polls the Rust threads' batch: once per screen refresh). Measured
  at the views' 10 Hz refresh (0.1 s, what a user sees) and at 100 Hz
  (0.01 s, so the transport's own latency shows). Both times are
  CLOCK_MONOTONIC of the same kernel (network namespaces share it). Steps
  whose bytes all went into mixed spans (shown uncolored) have no span of
  their own and are counted, not timed.

    sudo .venv/bin/python benches/bench_reach_http.py [--rounds N] [--rate R] [--seconds S]
        [--configs inband,side,socket]

All numbers come from a SIMULATED engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "netns"))
sys.path.insert(0, str(ROOT / "benches"))

STREAMS = 64
PORT = 8000
TOKENS_PER_STEP = 2.4  # the simulated engine's mean at its default acceptance spread
_HEADER = struct.Struct("<4sBBH16sQQQQII")
_SPAN = struct.Struct("<QQ")


CONFIGS = ("inband", "side", "socket")
# The tree of the side route (set by main() when `side` is measured).
SIDE_TREE: list[str] = []


def side_tree(ref: str) -> str:
    """`ref`'s python/ and plugin/ in a temporary directory, with this build's extension."""
    tree = tempfile.mkdtemp(prefix="phside", dir="/tmp")
    os.chmod(tree, 0o755)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref, "python", "plugin"],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(["tar", "-x", "-C", tree], input=archive.stdout, check=True)
    for built in (ROOT / "python" / "parallelhue").glob("_native*.so"):
        shutil.copy(built, os.path.join(tree, "python", "parallelhue", built.name))
    return tree


def config_env(config: str) -> dict[str, str]:
    if config != "side":
        return {}
    tree = SIDE_TREE[0]
    return {"PYTHONPATH": f"{tree}/python:{tree}/plugin"}


def engine_command(
    hosts: Any, telemetry: str, socket_dir: str, rate: int, max_tokens: int
) -> list[str]:
    telemetry = "socket" if telemetry == "socket" else "http"
    step_ms = STREAMS / rate * 1000.0
    return hosts.command(
        hosts.server, sys.executable, "-m", "parallelhue.sim", "--host", hosts.server_ip,
        "--port", str(PORT), "--socket-dir", socket_dir, "--telemetry", telemetry,
        "--step-ms", f"{step_ms:.6f}", "--max-model-len", str(max_tokens + 4096),
        "--min-batch", str(STREAMS),
    )  # fmt: skip


def engine_stats(hosts: Any, url: str) -> dict[str, Any]:
    import httpx

    return dict(hosts.call(hosts.client, lambda: httpx.get(url + "/sim/stats", timeout=10).json()))


def process_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def engine_pid(hosts: Any) -> int:
    """The engine's python process inside the server host (`ip netns exec` execs into it)."""
    done = subprocess.run(["ip", "netns", "pids", hosts.server], capture_output=True, text=True)
    pids = [int(p) for p in done.stdout.split()]
    assert len(pids) == 1, pids
    return pids[0]


# --- the client process -----------------------------------------------------------------


def client_main(
    url: str, telemetry: str, socket_dir: str, max_tokens: int, record: str, poll: float
) -> None:
    """The real client without a screen on the client host; prints one JSON report."""
    telemetry = "socket" if telemetry == "socket" else "http"
    from parallelhue import headless
    from parallelhue.headless import run_headless
    from parallelhue.model.spans import NO_STEP
    from parallelhue.model.state import StreamState

    # The session polls the Rust threads once per refresh of its view.
    headless.HeadlessView.__init__.__defaults__ = (poll,)

    first_span: dict[tuple[int, int], float] = {}
    original = StreamState.add_span_runs
    if record:

        def timed(self: StreamState, records: bytes | memoryview) -> None:
            now = time.monotonic()
            for _end, word in _SPAN.iter_unpack(records):
                step = word & NO_STEP
                if step != NO_STEP:
                    first_span.setdefault((self.index, step), now)
            original(self, records)

        StreamState.add_span_runs = timed  # type: ignore[method-assign]
    before = resource.getrusage(resource.RUSAGE_SELF)
    result = asyncio.run(
        run_headless(
            url, num_streams=STREAMS, socket_dir=socket_dir, max_tokens=max_tokens,
            reconciler_kind="rust", grace=10.0, mode="auto", timeout=300.0,
            prompt="Tell me about speculative decoding.", telemetry=telemetry,
            record=record or None,
        )
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_SELF)
    report: dict[str, Any] = {
        "exact_streams": sum(1 for verdict, _ in result.verdicts if verdict == "exact"),
        "failures": sorted(
            {
                e or r or ""
                for (_, r), e in zip(result.verdicts, result.errors, strict=True)
                if e or r
            }
        )[:3],
        "tokens": result.sse_tokens,
        "counters": dict(result.counters),
        "telemetry_state": {k: v for k, v in dict(result.receiver).items() if k != "end"},
        "cpu_seconds": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "elapsed": result.elapsed,
        "line": result.model.telemetry,
    }
    if record:
        report["latency"] = latencies(record, first_span)
    print(json.dumps(report))


def latencies(record: str, first_span: dict[tuple[int, int], float]) -> dict[str, Any]:
    """Step-to-screen latencies (see the module doc) from the run's recording."""
    from parallelhue.ingest.record import read_recording
    from parallelhue.reference import decode_frame
    from parallelhue_vllm.wire import KIND_PROVENANCE

    frames = []
    for event in read_recording(record).events:
        if event[1] != "frame":
            continue
        data = bytes(event[2])
        _m, _v, kind, _f, _run, source, seq, _step, ts, _d, _len = _HEADER.unpack_from(data)
        if kind == KIND_PROVENANCE:
            frames.append((source, seq, ts, data))
    frames.sort()
    sent: dict[tuple[int, int], float] = {}
    ordinal: dict[int, int] = {}
    for _source, _seq, ts, data in frames:
        for rec in decode_frame(data).records:
            stream = int(rec.stream)  # type: ignore[attr-defined]
            k = ordinal.get(stream, 0)
            ordinal[stream] = k + 1
            sent[(stream, k)] = ts / 1e9
    samples = sorted(first_span[key] - t for key, t in sent.items() if key in first_span)
    untimed = sum(1 for key in sent if key not in first_span)
    if not samples:
        return {"n": 0, "untimed": untimed}
    return {
        "n": len(samples),
        "untimed": untimed,
        "p50_ms": 1000 * samples[len(samples) // 2],
        "p99_ms": 1000 * samples[min(len(samples) - 1, int(len(samples) * 0.99))],
        "max_ms": 1000 * samples[-1],
        "min_ms": 1000 * samples[0],
    }


# --- one round --------------------------------------------------------------------------


def one_round(
    hosts: Any, telemetry: str, rate: int, seconds: float, latency: bool, poll: float
) -> dict[str, Any]:
    max_tokens = max(64, int(rate / STREAMS * seconds * TOKENS_PER_STEP))
    work = tempfile.mkdtemp(prefix="phbr", dir="/tmp")
    os.chmod(work, 0o755)
    socket_dir = os.path.join(work, "s")
    record = os.path.join(work, "run.phr") if latency else ""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": work,
           "PARALLELHUE_HUB_DIR": os.path.join(work, "hub"), **config_env(telemetry)}  # fmt: skip
    engine = subprocess.Popen(
        engine_command(hosts, telemetry, socket_dir, rate, max_tokens),
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://{hosts.server_ip}:{PORT}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                before = engine_stats(hosts, url)
                break
            except Exception:
                assert engine.poll() is None and time.monotonic() < deadline, "engine did not start"
                time.sleep(0.1)
        pid = engine_pid(hosts)
        cpu_before = process_cpu(pid)
        load = os.getloadavg()[0]
        done = subprocess.run(
            hosts.command(
                hosts.client, sys.executable, str(Path(__file__).resolve()), "--client", url,
                "--telemetry", telemetry, "--socket-dir", socket_dir,
                "--max-tokens", str(max_tokens), "--record", record, "--poll", str(poll),
            ),
            env={**env, "PARALLELHUE_SOCKET_DIR": socket_dir}, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"client failed: {done.stderr[-2000:]}")
        client = json.loads(done.stdout.strip().splitlines()[-1])
        after = engine_stats(hosts, url)
        cpu_after = process_cpu(pid)
    finally:
        engine.terminate()
        try:
            engine.wait(10)
        except subprocess.TimeoutExpired:
            engine.kill()
        shutil.rmtree(work, ignore_errors=True)
    sim_telemetry = after["telemetry"]
    emitter_dropped = sum(int(sim_telemetry[s]["dropped"]) for s in ("scheduler", "frontend"))
    counters = client["counters"]
    hub_dropped = int(client["telemetry_state"].get("dropped", 0) or 0)
    tokens = int(client["tokens"])
    full_records = int(after["full_batch_records"]) - int(before["full_batch_records"])
    full_seconds = float(after["full_batch_seconds"]) - float(before["full_batch_seconds"])
    return {
        "telemetry": telemetry,
        "kind": f"latency@{poll:g}s" if latency else "cost",
        "achieved_records_per_s": full_records / full_seconds if full_seconds else 0.0,
        "step_records": int(after["step_records"]) - int(before["step_records"]),
        # In-band losses are each stream's own verdict (counted in exact_streams).
        "frames_lost": emitter_dropped + int(counters.get("gaps", 0)) + hub_dropped,
        "lost_parts": (emitter_dropped, int(counters.get("gaps", 0)), hub_dropped),
        "exact_streams": client["exact_streams"],
        "failures": client["failures"],
        "tokens": tokens,
        "client_cpu_per_10k": client["cpu_seconds"] * 10_000 / tokens if tokens else None,
        "server_cpu_per_10k": (cpu_after - cpu_before) * 10_000 / tokens if tokens else None,
        "latency": client.get("latency"),
        "load": load,
        "line": client["line"],
    }


def versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "kernel": platform.release(),
        "cpus": str(os.cpu_count()),
        "max_dgram_qlen": Path("/proc/sys/net/unix/max_dgram_qlen").read_text().strip(),
    }


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def summarize(rows: list[dict[str, Any]]) -> str:
    """One line per configuration: medians over rounds, losses and exactness over all rounds."""
    head = (
        "| telemetry | rounds | achieved step rec/s | frames lost | exact streams (worst) "
        "| client CPU s / 10k tok | server CPU s / 10k tok | step-to-screen p50 / p99 ms at "
        "10 Hz | at 100 Hz | steps timed (untimed) |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    out = []
    for telemetry in dict.fromkeys(r["telemetry"] for r in rows):
        mine = [r for r in rows if r["telemetry"] == telemetry]
        cost = [r for r in mine if r["kind"] == "cost"]

        def lat(kind: str, key: str, of: list[dict[str, Any]] = mine) -> float:
            return _median([r["latency"][key] for r in of if r["kind"] == kind and r["latency"]])

        timed = sum(r["latency"]["n"] for r in mine if r["latency"])
        untimed = sum(r["latency"]["untimed"] for r in mine if r["latency"])
        out.append(
            f"| {telemetry} | {len(mine)} | "
            f"{_median([r['achieved_records_per_s'] for r in mine]):,.0f} | "
            f"{sum(r['frames_lost'] for r in mine)} | "
            f"{min(r['exact_streams'] for r in mine)}/{STREAMS} | "
            f"{_median([r['client_cpu_per_10k'] for r in cost]):.3f} | "
            f"{_median([r['server_cpu_per_10k'] for r in cost]):.3f} | "
            f"{lat('latency@0.1s', 'p50_ms'):.1f} / {lat('latency@0.1s', 'p99_ms'):.1f} | "
            f"{lat('latency@0.01s', 'p50_ms'):.1f} / {lat('latency@0.01s', 'p99_ms'):.1f} | "
            f"{timed:,} ({untimed:,}) |"
        )
    return head + "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration and kind")
    parser.add_argument("--rate", type=int, default=20_000, help="step records/s (default 20000)")
    parser.add_argument("--seconds", type=float, default=6.0, help="nominal generation time")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="inband,side,socket")
    parser.add_argument("--side-ref", default="310c3d1", help="the tree of the side route")
    parser.add_argument("--client", help=argparse.SUPPRESS)
    parser.add_argument("--telemetry", help=argparse.SUPPRESS)
    parser.add_argument("--socket-dir", help=argparse.SUPPRESS)
    parser.add_argument("--max-tokens", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--record", default="", help=argparse.SUPPRESS)
    parser.add_argument("--poll", type=float, default=0.1, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.client:
        client_main(
            args.client, args.telemetry, args.socket_dir, args.max_tokens, args.record, args.poll
        )
        return 0
    from netns import Hosts, require_root

    why = require_root()
    if why is not None:
        print(f"bench_reach_http: skipped: {why}", file=sys.stderr)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    unknown = [c for c in configs if c not in CONFIGS]
    if unknown:
        print(f"bench_reach_http: unknown config {unknown[0]!r}: use {','.join(CONFIGS)}")
        return 2
    print(f"# SIMULATED engine, {STREAMS} streams, {args.rate} step records/s")
    print(f"# {json.dumps(versions())}")
    if "side" in configs:
        SIDE_TREE.append(side_tree(args.side_ref))
    rows = []
    try:
        with Hosts() as hosts:
            for i in range(args.rounds):
                for latency, poll in ((False, 0.1), (True, 0.1), (True, 0.01)):
                    order = configs[i % len(configs) :] + configs[: i % len(configs)]
                    for telemetry in order:
                        row = one_round(hosts, telemetry, args.rate, args.seconds, latency, poll)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        for tree in SIDE_TREE:
            shutil.rmtree(tree, ignore_errors=True)
    print(summarize(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
