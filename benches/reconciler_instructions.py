"""Instructions per run of the reconciler through the Python API (valgrind callgrind).

    .venv/bin/python benches/reconciler_instructions.py [--shape per_step|coalesced]

The workload of bench_reconciler.py (64 streams x 2,000 tokens). Three ways to
run it, each measured as (instructions of 3 runs - instructions of 1 run) / 2
so that interpreter start-up, imports and loading the inputs cancel out:
- `core`: every input in one `push_recorded` buffer, no `take()` (the core's
  own work plus decoding the buffer);
- `packed`: `push_recorded` per 256 inputs, `take()` after each, span runs
  appended to arrays (the Python API as the screen model uses it);
- `tuples`: `push_inputs` per 256 inputs, `drain()` after each (Python tuples).
Instruction counts do not depend on the machine's load, unlike CPU time.
"""

from __future__ import annotations

import argparse
import pickle
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


BATCH = 256


def child(mode: str, data: str, reps: int) -> None:
    from parallelhue._native import Reconciler
    from reconciler_runs import run_core, run_packed

    run_id, num_streams, buffers, inputs = pickle.loads(Path(data).read_bytes())

    def packed() -> None:
        run_packed(Reconciler, run_id, num_streams, buffers)

    def core() -> None:
        run_core(Reconciler, run_id, num_streams, buffers)

    def tuples() -> None:
        rec = Reconciler(run_id, num_streams)
        for start in range(0, len(inputs), BATCH):
            rec.push_inputs(inputs[start : start + BATCH])
            rec.drain()
        rec.finalize()
        rec.drain()

    work = {"packed": packed, "core": core, "tuples": tuples}[mode]
    for _ in range(reps):
        work()


def instructions(mode: str, data: str, reps: int) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
         sys.executable, __file__, "--child", mode, data, str(reps)],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    match = re.search(r"Collected : (\d+)", out.stderr)
    if match is None:
        raise RuntimeError(out.stderr[-500:])
    return int(match.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--shape", default="per_step", choices=("per_step", "coalesced"))
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    sys.path.insert(0, str(ROOT / "benches"))
    sys.path.insert(0, str(ROOT / "tests"))
    import bench_reconciler

    workload = bench_reconciler.make_workload(args.shape)
    with tempfile.NamedTemporaryFile(suffix=".pkl", delete=False) as handle:
        pickle.dump(
            (workload.run_id, workload.num_streams, bench_reconciler.pack(workload),
             workload.inputs), handle,
        )  # fmt: skip
        data = handle.name
    per_run = {}
    for mode in ("core", "packed", "tuples"):
        one, three = instructions(mode, data, 1), instructions(mode, data, 3)
        per_run[mode] = (three - one) / 2
        print(f"{args.shape} {mode}: {per_run[mode] / 1e6:.1f} M instructions per run", flush=True)
    Path(data).unlink()
    print(
        f"{args.shape}: packed / core {per_run['packed'] / per_run['core']:.2f}, "
        f"tuples / core {per_run['tuples'] / per_run['core']:.2f}, "
        f"tuples / packed {per_run['tuples'] / per_run['packed']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
