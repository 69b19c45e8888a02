import io
import os
import random
import sys
import time

sys.path.insert(0, sys.argv[1])
from rich.console import Console

from parallelhue.model.backend import Backend
from parallelhue.model.state import RunModel, StreamState
from parallelhue.screen import views

random.seed(1)
streams = []
for i in range(64):
    s = StreamState(index=i, mode="exact")
    pos = 0
    for k in range(800):
        t = random.choice(["the ", "quick ", "brown ", "fox ", "jumps ", "日本 ", "é"])
        s.add_delta(t, [1, 2], 0.0)
        s.add_span(pos, t, k if k % 7 else None)
        pos += len(t.encode())
    s.stats = {
        "tokens": 1600,
        "steps": 800,
        "drafts_scheduled": 2000,
        "drafts_padded": 0,
        "accepted": 900,
    }
    streams.append(s)
model = RunModel(streams=streams, mode="exact", backend=Backend("ngram", True, "x"), no_color=False)
out = io.StringIO()
console = Console(
    file=out,
    width=220,
    height=70,
    force_terminal=True,
    color_system="256",
    highlight=False,
    markup=False,
    emoji=False,
)
v = views.GridView(model, console)
v.start()
# FRAME_N=0 vs 20 under callgrind: the difference is the frames' own instructions.
N = int(os.environ.get("FRAME_N", "20"))
# FRAME_NEW > 1: that many one-character spans per pane per frame instead of one
# "x " (the live client at 20k step records/s brings about 100 per pane per frame).
NEW = int(os.environ.get("FRAME_NEW", "1"))
t0 = time.process_time()
for frame in range(N):
    for s in streams:  # new content each frame
        if NEW == 1:
            s.add_delta("x ", [3], 0.0)
            s.add_span(s.sse_byte_count - 2, "x ", 5)
            continue
        for k in range(NEW):
            t = "日" if k % 3 == 0 else "x"
            s.add_delta(t, [3], 0.0)
            s.add_span(s.sse_byte_count - len(t.encode()), t, frame * NEW + k)
    v.refresh()
dt = (time.process_time() - t0) / max(N, 1)
v.abort()
print(f"frame {dt * 1000:.1f} ms cpu")
if len(sys.argv) > 2:
    import cProfile
    import pstats

    cProfile.run("[v.refresh() for _ in range(10)]", "/tmp/cp/frame.prof")
    pstats.Stats("/tmp/cp/frame.prof").sort_stats("tottime").print_stats(15)
