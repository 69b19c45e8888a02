"""Instructions of the grid's pane tails (StreamState.tail_segments), for callgrind.

64 streams of the simulated engine's multilingual text cut into spans of 1-4
tokens (2-12 bytes, on character boundaries) with steps and roles, 3,000 spans
each; every call asks for a grid pane's budget (220x70, 64 panes) in both color
rules, as a redraw does. Run it twice under callgrind, with N calls per stream
and with 0, and divide the difference by the calls:

    valgrind --tool=callgrind --callgrind-out-file=/dev/null python tail_cost.py 20

With `--clean` the tails are read once and the calls measured are the panes'
`clean_pieces` of each (its printable check and the dropping of empty pieces).
"""

import random
import sys

from parallelhue.model.state import StreamState
from parallelhue.screen.grid import grid_plan
from parallelhue.screen.lines import clean_pieces
from parallelhue.sim.vocab import CORPUS

STREAMS = 64
SPANS = 3000


def make_stream(index: int, rng: random.Random) -> StreamState:
    stream = StreamState(index=index, mode="exact")
    position = rng.randrange(len(CORPUS))
    data = bytearray()
    for k in range(SPANS):
        piece = CORPUS[position : position + rng.randrange(1, 5)] or CORPUS[:3]
        position = (position + len(piece)) % len(CORPUS)
        data += piece.encode()
        stream.span_records.extend((len(data), k // 2 | rng.randrange(4) << 32))
    stream.sse_utf8 += data
    return stream


def main() -> None:
    args = [arg for arg in sys.argv[1:] if arg != "--clean"]
    calls = int(args[0]) if args else 20
    rng = random.Random(20261202)
    streams = [make_stream(i, rng) for i in range(STREAMS)]
    plan = grid_plan(STREAMS, 220, 67, 0)
    budget = max(1, plan.pane_width - 2) * max(1, plan.pane_height - 4) * 2
    pieces = 0
    if "--clean" in sys.argv:
        tails = [
            stream.tail_segments(True, budget, rule)
            for stream in streams
            for rule in ("step", "role")
        ]
        for _ in range(calls):
            for tail in tails:
                pieces += len(clean_pieces(tail))
        print(f"budget {budget} chars, {calls * len(tails)} clean_pieces calls, {pieces} pieces")
        return
    for _ in range(calls):
        for stream in streams:
            pieces += len(stream.tail_segments(True, budget, "step"))
            pieces += len(stream.tail_segments(True, budget, "role"))
    print(f"budget {budget} chars, {calls * STREAMS * 2} calls, {pieces} pieces")


if __name__ == "__main__":
    main()
