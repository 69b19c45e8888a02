"""A stream's span records: the extension's `SpanRecords` (what the live
path's `Reconciler.take` appends to) and `spans.PySpanRecords` (the client
without the extension) hold the same words and say the same about roles for
the same appends; `take(span_records)` refuses a wrong argument before it
takes anything."""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from typing import Any

import pytest

import workloads
from parallelhue import _native
from parallelhue.model.spans import NO_ROLE, PySpanRecords
from parallelhue.model.state import StreamState
from parallelhue.reference import Reconciler as ReferenceReconciler

SpanRecords = getattr(_native, "SpanRecords", None)
needs_native = pytest.mark.skipif(SpanRecords is None, reason="make native")
PACK_INPUTS = workloads.native_test_kit("pack_inputs") if SpanRecords else None
RUN = "0" * 32


def packed(*spans: tuple[int, int, int]) -> bytes:
    """(end, step, role) spans as take() packs them."""
    return b"".join(struct.pack("<QQ", end, step | role << 32) for end, step, role in spans)


def kinds() -> list[Any]:
    return [PySpanRecords] + ([SpanRecords] if SpanRecords is not None else [])


@needs_native
def test_the_client_without_the_extension_uses_the_extensions_values() -> None:
    # The values are declared once, in the Rust core; spans.py's fallback for a
    # client without the extension must be the same.
    code = (
        "import json, sys; sys.modules['parallelhue._native'] = None; "
        "from parallelhue.model import spans; "
        "print(json.dumps([spans.NO_STEP, spans.NO_ROLE, spans.SPAN_RECORD_BYTES]))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    native = [_native.NO_STEP, _native.NO_ROLE, _native.SPAN_RECORD_BYTES]
    assert json.loads(out.stdout) == native


@pytest.mark.parametrize("kind", kinds(), ids=lambda k: k.__name__)
def test_roles_are_seen_only_in_a_spans_second_word(kind: Any) -> None:
    records = kind()
    assert not records.has_roles and len(records) == 0
    records.frombytes(packed((2, 0, NO_ROLE)))
    # An end offset whose high bits look like a role is not a role.
    records.extend((3 << 32, 1 | NO_ROLE << 32))
    assert not records.has_roles
    assert list(records) == [2, NO_ROLE << 32, 3 << 32, 1 | NO_ROLE << 32]
    records.frombytes(packed((9, 4, 2)))
    assert records.has_roles
    assert records[-2] == 9 and records[5] == 4 | 2 << 32
    records[0] = 1
    assert records[0] == 1 and len(records) == 6


@pytest.mark.parametrize("kind", kinds(), ids=lambda k: k.__name__)
def test_a_length_that_is_not_whole_spans_is_refused(kind: Any) -> None:
    records = kind()
    with pytest.raises(ValueError) as error:
        records.frombytes(b"\0" * 24)
    assert str(error.value) == "span records come in 16-byte spans; got 24 bytes"
    assert len(records) == 0  # nothing appended
    with pytest.raises(IndexError):
        records[0]


@needs_native
def test_the_native_records_and_the_python_ones_agree() -> None:
    rng = random.Random(20261202)
    for _case in range(200):
        native, python = SpanRecords(), PySpanRecords()
        for _op in range(rng.randrange(1, 12)):
            role = rng.choice([NO_ROLE, NO_ROLE, rng.randrange(4)])
            spans = [(rng.randrange(1 << 40), rng.randrange(1 << 32), role)]
            if rng.random() < 0.5:
                data = packed(*spans)
                native.frombytes(data)
                python.frombytes(data)
            else:
                words = [spans[0][0], spans[0][1] | spans[0][2] << 32]
                native.extend(words)
                python.extend(words)
            assert native.has_roles == python.has_roles
        assert native.tolist() == python.tolist()
        assert native.tobytes() == python.tobytes()
        assert len(native) == len(python) and native[-1] == python[-1]


@needs_native
def test_take_appends_each_streams_spans_to_its_records() -> None:
    rec = _native.Reconciler(RUN, 2, packed_spans=True)
    stores = [SpanRecords(), SpanRecords()]
    texts, _events, ends = rec.take(stores)
    assert (texts, ends) == ([], []) and stores == [SpanRecords(), SpanRecords()]
    assert stores[0] == stores[1] and stores[0] != [0]


@needs_native
@pytest.mark.parametrize(
    ("argument", "error", "message"),
    [
        ([], ValueError, "take(): span_records has 0 entries; the reconciler has 2 streams"),
        (
            "ab",
            TypeError,
            "take(): span_records[0] is not a parallelhue._native.SpanRecords",
        ),
    ],
)
def test_take_refuses_wrong_records_before_taking(
    argument: Any, error: type[Exception], message: str
) -> None:
    rec = _native.Reconciler(RUN, 2, packed_spans=True)
    rec.finalize()
    with pytest.raises(error) as raised:
        rec.take(argument)
    assert str(raised.value) == message
    _texts, events, _ends = rec.take([SpanRecords(), SpanRecords()])
    assert events  # the finalize's events were still there


@needs_native
def test_a_python_records_object_is_refused_by_the_native_take() -> None:
    rec = _native.Reconciler(RUN, 1, packed_spans=True)
    with pytest.raises(TypeError) as raised:
        rec.take([PySpanRecords()])
    assert str(raised.value) == "take(): span_records[0] is not a parallelhue._native.SpanRecords"


def test_stream_state_says_roles_from_its_records() -> None:
    stream = StreamState(index=0, mode="exact")
    stream.add_delta("abcd", [1, 2], 0.0)
    stream.add_span(0, "ab", 0)  # no role: a legacy reconciler
    assert not stream.has_roles
    stream.add_span(2, "cd", 1, 3)
    assert stream.has_roles and stream.proven_bytes == 4


@needs_native
@pytest.mark.skipif(PACK_INPUTS is None, reason="needs the test kit: make native")
def test_take_gives_the_records_the_reference_spans_give() -> None:
    workload = workloads.generate(20261202, num_streams=3, tokens=120, k=5, fixed_length=True)
    native = _native.Reconciler(workload.run_id, 3, packed_spans=True)
    stores = [SpanRecords() for _ in range(3)]
    inputs = workload.inputs
    for start in range(0, len(inputs), 7):  # several takes, each with a few spans
        native.push_recorded(PACK_INPUTS(inputs[start : start + 7]))
        native.take(stores)
    native.finalize()
    native.take(stores)
    reference = ReferenceReconciler(workload.run_id, 3)
    workloads.feed(reference, inputs)
    reference.finalize()
    states = [StreamState(index=i, mode="exact") for i in range(3)]
    for event in reference.drain():
        if event[0] == "span":
            _kind, stream, byte_start, text, step, _first, _n, *role = event
            states[stream].add_span(byte_start, text, step, role[0] if role else None)
    assert all(len(s) > 20 for s in stores)  # spans were really produced
    assert [s.tolist() for s in stores] == [list(state.span_records) for state in states]
    assert [s.has_roles for s in stores] == [state.has_roles for state in states]
