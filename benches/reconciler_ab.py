"""Two builds of the Rust reconciler side by side, through the Python API (CPU time).

    .venv/bin/python benches/reconciler_ab.py --variant before=/tmp/perf-before/.venv/bin/python \\
        --variant after=.venv/bin/python [--shape per_step] [--rounds 5] [--reps 5]

The workload and the packed run of bench_reconciler.py (64 streams x 2,000
tokens; `push_recorded` per 256 or 2,560 inputs, `take()` after each, span
runs appended to arrays). Each round runs every variant once, in turn, in a
fresh process of that variant's interpreter (so each imports its own
`parallelhue._native`); a process times `--reps` runs with
`time.process_time` after one warm-up run. Reported: the median per
variant over all rounds, tokens/s, and the ratio to the first variant.
The same inputs (packed once, pickled) go to every variant.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(data: str, reps: int, per_buffer: int) -> None:
    from parallelhue._native import Reconciler
    from reconciler_runs import run_core, run_packed

    run_id, num_streams, buffers = pickle.loads(Path(data).read_bytes())
    step = per_buffer // 256
    joined = [b"".join(buffers[i : i + step]) for i in range(0, len(buffers), step)]

    def packed() -> None:
        run_packed(Reconciler, run_id, num_streams, joined)

    def core() -> None:
        run_core(Reconciler, run_id, num_streams, buffers)

    out = {}
    for name, work in (("packed", packed), ("core", core)):
        work()
        times = []
        for _ in range(reps):
            t0 = time.process_time()
            work()
            times.append(time.process_time() - t0)
        out[name] = times
    print(json.dumps(out))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--variant", action="append", default=[], help="name=python")
    parser.add_argument("--shape", default="per_step", choices=("per_step", "coalesced"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--per-buffer", type=int, default=256, help="inputs per push_recorded")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return 0
    sys.path.insert(0, str(ROOT / "benches"))
    sys.path.insert(0, str(ROOT / "tests"))
    import bench_reconciler

    workload = bench_reconciler.make_workload(args.shape)
    tokens = workload.total_tokens
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as handle:
        pickle.dump(
            (workload.run_id, workload.num_streams, bench_reconciler.pack(workload)), handle
        )
        data = handle.name
    variants = [v.split("=", 1) for v in args.variant]
    times: dict[str, dict[str, list[float]]] = {n: {"packed": [], "core": []} for n, _ in variants}
    loads = []
    for _ in range(args.rounds):
        for name, python in variants:
            out = subprocess.run(
                [python, __file__, "--child", data, str(args.reps), str(args.per_buffer)],
                capture_output=True, text=True, check=True,
            )  # fmt: skip
            for mode, values in json.loads(out.stdout).items():
                times[name][mode].extend(values)
            loads.append(os.getloadavg()[0])
    Path(data).unlink()
    base = variants[0][0]
    print(
        f"shape {args.shape}, {tokens:,} tokens, {args.per_buffer} inputs per buffer, "
        f"{args.rounds} rounds x {args.reps} runs per variant, "
        f"load {min(loads):.1f}-{max(loads):.1f}"
    )
    for mode in ("packed", "core"):
        ref = statistics.median(times[base][mode])
        for name, _ in variants:
            runs = times[name][mode]
            med = statistics.median(runs)
            print(
                f"{mode:6} {name:8} median {med * 1e3:6.1f} ms (n={len(runs)}), "
                f"min {min(runs) * 1e3:6.1f} ms, {tokens / med / 1e6:5.2f} M tokens/s, "
                f"{name}/{base} {med / ref:.3f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
