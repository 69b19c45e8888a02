"""The two reconciler runs that `reconciler_ab.py` times and
`reconciler_instructions.py` counts, in one place so both measure the same work.

Imported by their child processes, which run under another build's interpreter
(and under valgrind): standard library only, the Reconciler class passed in.
"""

from __future__ import annotations

from array import array
from typing import Any


def packed_reconciler(cls: Any, run_id: str, num_streams: int) -> Any:
    """A reconciler as the live client builds it (`ingest.py`): spans packed
    for take(); a build from before `packed_spans` gets the default."""
    try:
        return cls(run_id, num_streams, packed_spans=True)
    except TypeError:
        return cls(run_id, num_streams)


def run_packed(cls: Any, run_id: str, num_streams: int, buffers: list[bytes]) -> None:
    """`push_recorded` per buffer, `take()` after each, span runs appended to
    arrays as the screen model does."""
    rec = packed_reconciler(cls, run_id, num_streams)
    records = [array("Q") for _ in range(num_streams)]
    for buffer in buffers:
        rec.push_recorded(buffer)
        spans = rec.take()[1]
        if isinstance(spans, tuple):  # a build before 2026-12-02: (buffer, index)
            view = memoryview(spans[0])
            for stream, start, end in spans[1]:
                records[stream].frombytes(view[start:end])
        else:
            for stream, run in spans:
                records[stream].frombytes(run)
    rec.finalize()
    rec.take()


def run_core(cls: Any, run_id: str, num_streams: int, buffers: list[bytes]) -> None:
    """The core's own work: every input in one `push_recorded`, no `take()`."""
    rec = cls(run_id, num_streams)
    rec.push_recorded(b"".join(buffers))
    rec.finalize()
