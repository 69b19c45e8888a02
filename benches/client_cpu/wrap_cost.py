"""Instructions of the grid's pane bodies (lines.wrap of the cleaned tails), for callgrind.

The tail-cost setup (tail_cost.py: 64 streams of the simulated engine's multilingual
text, 220x70 grid, both color rules); the tails are read and cleaned once, and each
call wraps one of them at the pane's inner width and body height, as a redraw does.
Run it twice under callgrind, with N rounds and with 0, and divide the difference
by the calls:

    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        python wrap_cost.py 20
"""

import random
import sys

from tail_cost import STREAMS, make_stream

from parallelhue.screen.grid import grid_plan
from parallelhue.screen.lines import clean_pieces, wrap


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    rng = random.Random(20261202)
    streams = [make_stream(i, rng) for i in range(STREAMS)]
    plan = grid_plan(STREAMS, 220, 67, 0)
    inner = max(1, plan.pane_width - 2)
    body_height = max(0, plan.pane_height - 2 - 2)
    budget = inner * max(1, plan.pane_height - 4) * 2
    bodies = [
        clean_pieces(stream.tail_segments(True, budget, rule))
        for stream in streams
        for rule in ("step", "role")
    ]
    lines = 0
    for _ in range(calls):
        for body in bodies:
            lines += len(wrap(body, inner, body_height))
    print(f"width {inner}, {body_height} lines, {calls * len(bodies)} wrap calls, {lines} lines")


if __name__ == "__main__":
    main()
