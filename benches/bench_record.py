"""What `--record` costs: process CPU of the same demo run with and without it.

    .venv/bin/python benches/bench_record.py --rounds 5 [--markdown]

Each round runs `python -m parallelhue demo --concurrency 64 --max-tokens 1500
--step-ms 0 --mode exact --view plain` twice, once with `--record FILE`, in
alternating order, and takes each process's user + system CPU from `wait4()`
(all its threads: the SIMULATED engine runs in the same process, so its CPU is
in both numbers alike). Every run must exit 0 (exact mode: all 64 streams
exact, which a lost frame would prevent). Prints one JSON line per run, then
medians and the ratio with / without. Under pytest (`make bench`) one short
round runs; its numbers are recorded, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
COMMAND = ["demo", "--concurrency", "64", "--max-tokens", "1500", "--step-ms", "0",
           "--mode", "exact", "--view", "plain"]  # fmt: skip


def one_run(record: bool, reconciler: str, max_tokens: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELHUE_")}
    env["PYTHONPATH"] = str(ROOT / "python")
    env["NO_COLOR"] = "1"
    with tempfile.TemporaryDirectory(prefix="phrec-") as scratch:
        env["PARALLELHUE_SOCKET_DIR"] = os.path.join(scratch, "s")
        path = os.path.join(scratch, "run.phr")
        args = [a if a != "1500" else str(max_tokens) for a in COMMAND]
        args += ["--reconciler", reconciler]
        if record:
            args += ["--record", path]
        started = time.monotonic()
        process = subprocess.Popen(
            [sys.executable, "-m", "parallelhue", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.monotonic() - started
        assert process.stderr is not None
        err = process.stderr.read().decode("utf-8", "replace")
        process.stderr.close()
        size = os.path.getsize(path) if record and os.path.exists(path) else None
    return {
        "record": record,
        "reconciler": reconciler,
        "exit_code": os.waitstatus_to_exitcode(status),
        "error": err.strip()[-300:],
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "user_s": usage.ru_utime,
        "sys_s": usage.ru_stime,
        "wall_s": wall,
        "peak_rss_mib": usage.ru_maxrss / 1024,
        "recording_bytes": size,
        "load_average": os.getloadavg()[0],
    }


def measure(rounds: int, reconciler: str, max_tokens: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    for i in range(rounds):
        # Alternate which goes first, so a trend in the machine's load hits both.
        order = (False, True) if i % 2 == 0 else (True, False)
        for record in order:
            run = one_run(record, reconciler, max_tokens)
            runs.append(run)
            print(json.dumps(run), flush=True)
    without = [r["cpu_s"] for r in runs if not r["record"]]
    with_ = [r["cpu_s"] for r in runs if r["record"]]
    return {
        "runs": runs,
        "n": rounds,
        "without_median_s": statistics.median(without),
        "with_median_s": statistics.median(with_),
        "ratio": statistics.median(with_) / statistics.median(without),
        "ratios_by_round": [w / o for w, o in zip(with_, without, strict=True)],
        "all_exit_0": all(r["exit_code"] == 0 for r in runs),
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "| run | --record | exit | CPU s (user + sys) | user | sys | wall s | peak RSS MiB "
        "| recording bytes | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(result["runs"]):
        lines.append(
            f"| {i + 1} | {'yes' if r['record'] else 'no'} | {r['exit_code']} | {r['cpu_s']:.2f} "
            f"| {r['user_s']:.2f} | {r['sys_s']:.2f} | {r['wall_s']:.2f} "
            f"| {r['peak_rss_mib']:.0f} | {r['recording_bytes'] or '-'} "
            f"| {r['load_average']:.1f} |"
        )
    lines.append("")
    lines.append(
        f"Median CPU without {result['without_median_s']:.2f} s, with "
        f"{result['with_median_s']:.2f} s: **{result['ratio']:.3f}x** (n = {result['n']} each; "
        "per-round ratios " + ", ".join(f"{x:.3f}" for x in result["ratios_by_round"]) + ")."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reconciler", default="rust", choices=("rust", "python"))
    parser.add_argument("--max-tokens", type=int, default=1500)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args(argv)
    print(f"# {platform.platform()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; SIMULATED engine in the client process", flush=True)  # fmt: skip
    result = measure(args.rounds, args.reconciler, args.max_tokens)
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}))
    if args.markdown:
        print(markdown(result))
    return 0 if result["all_exit_0"] else 1


def test_recording_cost(benchmark: Any) -> None:
    """`make bench`: one short round, numbers recorded in the benchmark's extra info."""
    results: list[dict[str, Any]] = []
    benchmark.pedantic(lambda: results.append(measure(1, "rust", 300)), rounds=1, iterations=1)
    result = results[-1]
    benchmark.extra_info.update({k: v for k, v in result.items() if k != "runs"})
    assert result["all_exit_0"], result["runs"]


if __name__ == "__main__":
    sys.exit(main())
