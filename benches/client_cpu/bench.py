"""Client CPU per 10k tokens: real client, grid view, 220x70 pty, vs a sim engine process."""

import argparse
import fcntl
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time

# The CPU sampling and the steady-state figure are bench_load.py's.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench_load import process_cpu_seconds, steady_cpu_per_10k

ROOT_PYTHON = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")


SYSCALL_EVENTS = (
    ",".join(
        f"syscalls:sys_enter_{name}"
        for name in (
            "recvmsg",
            "recvmmsg",
            "geteuid",
            "recvfrom",
            "poll",
            "epoll_wait",
            "epoll_ctl",
            "sendto",
            "futex",
            "clock_nanosleep",
        )
    )
    + ",raw_syscalls:sys_enter,context-switches,task-clock"
)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def thread_cpu(pid):
    """{thread name: CPU seconds} of a live process."""
    out = {}
    tick = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        key = name if tid != str(pid) else "main"
        out[key] = out.get(key, 0) + (int(fields[11]) + int(fields[12])) / tick
        out[key + ".sys"] = out.get(key + ".sys", 0) + int(fields[12]) / tick
        # The scheduler's own run time in ns (stat's fields are whole clock
        # ticks, 10 ms: a thread's steady window is only a few of them).
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ran = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
        out[key + ".run"] = out.get(key + ".run", 0) + ran
        out["all.run"] = out.get("all.run", 0) + ran
        # Context switches (a wait that blocked, or a preemption): counts, not time.
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                switches = sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)
        except (OSError, ValueError, IndexError):
            continue
        out[key + ".cs"] = out.get(key + ".cs", 0) + switches
    return out


def engine_tokens(port):
    """The engine's generation token counter (its /metrics), or None."""
    try:
        with socket.create_connection(("127.0.0.1", port), 1.0) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
    except OSError:
        return None
    m = re.search(rb"^vllm:generation_tokens_total(?:\{[^}]*\})? ([0-9.e+]+)", data, re.M)
    return float(m.group(1)) if m else None


def profiler_prefix():
    """The profiler the CP_* environment asks for, wrapped around the client's command."""
    return [
        # CP_PERF=FILE: profile the client (software clock; this guest has no PMU).
        *(
            [
                "perf",
                "record",
                "-e",
                "cpu-clock",
                "-F",
                "1999",
                "-g",
                "-o",
                os.environ["CP_PERF"],
                "--",
            ]
            if os.environ.get("CP_PERF")
            else []
        ),
        # CP_PERFSTAT=FILE: count the client's syscalls by kind (receiver: recvmsg/
        # recvmmsg; HTTP thread: recvfrom; both: poll), deterministic where CPU time is not.
        *(
            ["perf", "stat", "-x", ",", "-o", os.environ["CP_PERFSTAT"], "-e", SYSCALL_EVENTS, "--"]
            if os.environ.get("CP_PERFSTAT")
            else []
        ),
        # CP_TRACE=FILE: syscalls by kind and thread (perf trace's summary).
        *(
            ["perf", "trace", "-s", "-o", os.environ["CP_TRACE"], "--"]
            if os.environ.get("CP_TRACE")
            else []
        ),
    ]


def run_client(pypath, port, sdir, max_tokens, conc, reconciler, extra):
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 70, 220, 0, 0))
    env = dict(os.environ, PYTHONPATH=pypath, TERM="xterm-256color")
    for k in list(env):
        if k.startswith("PARALLELHUE_") or k == "NO_COLOR":
            env.pop(k)
    cmd = [
        *profiler_prefix(),
        sys.executable,
        *(["-m", "cProfile", "-o", os.environ["CP_PROF"]] if os.environ.get("CP_PROF") else []),
        *(
            ["-m", "pyinstrument", "-i", "0.0005", "-r", "session", "-o", os.environ["CP_PYI"]]
            if os.environ.get("CP_PYI")
            else []
        ),
        "-m",
        "parallelhue",
        "hello benchmark prompt",
        "--endpoint",
        f"http://127.0.0.1:{port}/v1/chat/completions",
        "--socket-dir",
        sdir,
        "--concurrency",
        str(conc),
        "--max-tokens",
        str(max_tokens),
        "--view",
        os.environ.get("CP_VIEW", "grid"),
        "--mode",
        "exact",
        "--reconciler",
        reconciler,
        *extra,
    ]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()

    def drain():
        while True:
            try:
                b = os.read(master, 65536)
            except OSError:
                return
            if not b:
                return
            out.extend(b)

    th = threading.Thread(target=drain, daemon=True)
    th.start()
    samples = []
    threads = {}
    per_thread = []  # (engine tokens, {thread: CPU s}) for the steady split by thread
    stop = threading.Event()

    def sample():
        while not stop.wait(0.25):
            try:
                cpu = process_cpu_seconds(p.pid)
            except (OSError, IndexError):
                return
            tokens = engine_tokens(port)
            samples.append((cpu, tokens))
            now = thread_cpu(p.pid)
            threads.update(now)
            per_thread.append((tokens, now))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, ru = os.wait4(p.pid, 0)
    stop.set()
    sampler.join(2)
    wall = time.monotonic() - t0
    th.join(2)
    os.close(master)
    text = re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", bytes(out)).decode("utf-8", "replace")
    m = re.search(r"confirmed tokens=(\d+)", text)
    tokens = int(m.group(1)) if m else None
    return dict(
        code=os.waitstatus_to_exitcode(status),
        cpu=ru.ru_utime + ru.ru_stime,
        user=ru.ru_utime,
        sys=ru.ru_stime,
        wall=wall,
        tokens=tokens,
        rss_mib=ru.ru_maxrss / 1024,
        pty_bytes=len(out),  # everything the client wrote to its terminal
        steady_per10k=steady_cpu_per_10k(samples, conc * max_tokens),
        steady_by_thread=steady_by_thread(per_thread, conc * max_tokens),
        threads={k: round(v, 2) for k, v in threads.items()},
        tail=text[-600:] if not m else "",
    )


def steady_by_thread(per_thread, total):
    """Each thread's CPU per 10k tokens in the steady window (20-80 % of the tokens)."""
    window = [(t, c) for t, c in per_thread if t is not None and 0.2 * total <= t <= 0.8 * total]
    if len(window) < 2 or window[-1][0] <= window[0][0]:
        return None
    (t0, c0), (t1, c1) = window[0], window[-1]
    return {k: round((c1.get(k, 0) - c0.get(k, 0)) * 1e4 / (t1 - t0), 4) for k in c1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", action="append", required=True, help="name=PYTHONPATH:reconciler")
    ap.add_argument("--n", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=2000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--step-ms", type=float, default=3.2)
    a = ap.parse_args()
    rows = []
    for _i in range(a.n):
        for v in a.variant:
            name, rest = v.split("=", 1)
            pypath, rec = rest.rsplit(":", 1)
            sdir = tempfile.mkdtemp(prefix="cpb", dir="/tmp")
            port = free_port()
            sim = subprocess.Popen(
                [
                    # CP_SIMTRACE=FILE: the engine's syscalls (a telemetry send
                    # that met a full client queue is an EAGAIN error there).
                    *(
                        ["perf", "trace", "-s", "-o", os.environ["CP_SIMTRACE"], "--"]
                        if os.environ.get("CP_SIMTRACE")
                        else []
                    ),
                    sys.executable,
                    "-m",
                    "parallelhue.sim",
                    "--port",
                    str(port),
                    "--socket-dir",
                    sdir,
                    "--step-ms",
                    str(a.step_ms),
                    "--min-batch",
                    str(a.concurrency),
                ],
                # The engine is this checkout's (the same for every variant).
                env=dict(os.environ, PYTHONPATH=ROOT_PYTHON),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=bool(os.environ.get("CP_SIMTRACE")),
            )
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            load0 = os.getloadavg()[0]
            r = run_client(pypath, port, sdir, a.max_tokens, a.concurrency, rec, [])
            r["load"] = f"{load0:.1f}-{os.getloadavg()[0]:.1f}"
            if r["tokens"] is None:
                # The summary no longer prints "confirmed tokens="; the engine's
                # own counter is the run's token count (one client per engine).
                counted = engine_tokens(port)
                r["tokens"] = int(counted) if counted else None
            if os.environ.get("CP_SIMTRACE"):
                # perf trace writes its summary on SIGINT; the engine under it
                # (same process group) must get it too, or it outlives the run.
                os.killpg(sim.pid, signal.SIGINT)
            else:
                sim.terminate()
            sim.wait()
            r["name"] = name
            r["per10k"] = r["cpu"] / r["tokens"] * 1e4 if r["tokens"] else None
            r["tok_s"] = r["tokens"] / r["wall"] if r["tokens"] else None
            rows.append(r)
            print(
                json.dumps({k: (round(x, 4) if isinstance(x, float) else x) for k, x in r.items()}),
                flush=True,
            )


main()
