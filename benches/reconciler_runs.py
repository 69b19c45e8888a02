"""The two reconciler runs that `reconciler_ab.py` times and
`reconciler_instructions.py` counts, in one place so both measure the same work.

Imported by their child processes, which run under another build's interpreter
(and under valgrind): standard library only, the Reconciler class passed in.
"""

from __future__ import annotations

import sys
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
    """`push_recorded` per buffer, `take()` after each, its spans appended to
    each stream's records as the screen model has them (`ingest.py`)."""
    rec = packed_reconciler(cls, run_id, num_streams)
    take = _taker(rec, num_streams)
    for buffer in buffers:
        rec.push_recorded(buffer)
        take()
    rec.finalize()
    take()


def _taker(rec: Any, num_streams: int) -> Any:
    """One `take()` with its spans applied, for this build's API: since
    2026-12-02 (late) take(span_records) appends them in Rust; builds before
    gave one bytes per stream, or one buffer with a (stream, start, end) index,
    for array('Q').frombytes."""
    native = sys.modules[type(rec).__module__]
    span_records = getattr(native, "SpanRecords", None)
    if span_records is not None:
        stores = [span_records() for _ in range(num_streams)]
        return lambda: rec.take(stores)
    records = [array("Q") for _ in range(num_streams)]

    def take() -> None:
        spans = rec.take()[1]
        if isinstance(spans, tuple):
            view = memoryview(spans[0])
            for stream, start, end in spans[1]:
                records[stream].frombytes(view[start:end])
        else:
            for stream, run in spans:
                records[stream].frombytes(run)

    return take


def run_core(cls: Any, run_id: str, num_streams: int, buffers: list[bytes]) -> None:
    """The core's own work: every input in one `push_recorded`, no `take()`."""
    rec = cls(run_id, num_streams)
    rec.push_recorded(b"".join(buffers))
    rec.finalize()
