"""`push_inputs` (one call for a batch of inputs) against one-by-one feeding.

For both reconcilers (the Rust one and the pure-Python reference), feeding a
workload (tests/workloads.py, unmutated or with one fault) through
`push_inputs` in random chunks must give the same events, statistics, totals,
counters, sources and verdicts as feeding it with push_frame/push_sse/
finish_sse one input at a time. A bad item in the middle of a batch raises the
single call's ValueError (same message on both sides) after the items before
it were applied, and none after it.

Examples per property: env PH_HYPOTHESIS_EXAMPLES (default 2000); derandomized
when CI is set. The native half is skipped when the module is not built, unless
PH_REQUIRE_NATIVE=1 (CI).
"""

from __future__ import annotations

import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import workloads
from parallelhue.reference import Reconciler as ReferenceReconciler

try:
    from parallelhue._native import Reconciler as NativeReconciler  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - depends on `make native`
    NativeReconciler = None
if NativeReconciler is None and os.environ.get("PH_REQUIRE_NATIVE") == "1":
    raise RuntimeError("PH_REQUIRE_NATIVE=1 but parallelhue._native is not built")

PROPERTY = workloads.property_settings()
SMALL = {"num_streams": (1, 3), "tokens": (1, 16), "k": (0, 4)}

# Both reconcilers run on every example (one workload generation for both).
CLASSES: list[Any] = [ReferenceReconciler] + ([NativeReconciler] if NativeReconciler else [])

# Items that no single call accepts, each with a stand-in for the stream count.
BAD_SHAPES = [
    lambda n: ("sse", n, "x", [1]),  # stream out of range
    lambda n: ("finish", n + 7, "stop"),
    lambda n: ("sse_id", n, "chatcmpl-x"),
    lambda n: ("sse_choice", n, 1),
    lambda n: ("sse_usage", n, 1, None, None),
    lambda n: ("sse", 0, "x", [1, 2**32]),  # token id out of range
    lambda n: ("sse", 0, "", [-1]),
    lambda n: ("sse_choice", 0, -1),  # index out of range
    lambda n: ("sse_choice", 0, 2**32),
    lambda n: ("sse_usage", 0, -1, None, None),  # completion_tokens out of range
    lambda n: ("sse_usage", 0, 2**64, None, None),
    lambda n: ("sse_usage", 0, 3, [1, 2**32], None),  # per-step count out of range
    lambda n: ("sse_usage", 0, None, None, [-1]),
    lambda n: ("frame",),  # wrong arity
    lambda n: ("finish", 0),  # the version-1 shape
    lambda n: ("sse_usage", 0, 1, None),
    lambda n: ("sse_id", 0),
    lambda n: ("text", 0),  # unknown kind
    lambda n: [],
    lambda n: ["finish", 0, None],  # not a tuple
    lambda n: (1, 0),
]
# The arity of each kind: an item of this shape raises the single call's error.
ARITY = {"sse": 4, "sse_id": 3, "sse_choice": 3, "sse_usage": 5, "finish": 3}


def _state(rec: Any, streams: int) -> dict[str, Any]:
    return {
        "events": rec.drain(),
        "verdicts": [rec.verdict(i) for i in range(streams)],
        "stats": [rec.stream_stats(i) for i in range(streams)],
        "totals": rec.totals(),
        "counters": rec.counters(),
        "sources": rec.sources(),
    }


def _one_by_one(cls: Any, workload: workloads.Workload, inputs: list[Any]) -> Any:
    rec = cls(workload.run_id, workload.num_streams)
    workloads.feed(rec, inputs)
    return rec


def _chunks(inputs: list[Any], sizes: list[int]) -> list[list[Any]]:
    out, start = [], 0
    for size in sizes:
        if start >= len(inputs):
            break
        out.append(inputs[start : start + size])
        start += size
    out.append(inputs[start:])
    return out


def _error(action: Any) -> str:
    with pytest.raises(ValueError) as info:
        action()
    return str(info.value)


@PROPERTY
@given(
    workload=st.one_of(workloads.workloads(**SMALL), workloads.mutated_workloads(**SMALL)),
    sizes=st.lists(st.integers(1, 40), max_size=8),
    finalize=st.booleans(),
)
def test_push_inputs_equals_one_by_one(
    workload: workloads.Workload, sizes: list[int], finalize: bool
) -> None:
    for cls in CLASSES:
        _check_equal(cls, workload, sizes, finalize)


def _check_equal(cls: Any, workload: workloads.Workload, sizes: list[int], finalize: bool) -> None:
    expected = _one_by_one(cls, workload, workload.inputs)
    batched = cls(workload.run_id, workload.num_streams)
    events: list[Any] = []
    for chunk in _chunks(workload.inputs, sizes):
        batched.push_inputs(chunk)
        events += batched.drain()
    if finalize:
        expected.finalize()
        batched.finalize()
    want = _state(expected, workload.num_streams)
    got = _state(batched, workload.num_streams)
    got["events"] = events + got["events"]
    assert got == want, f"{cls.__module__}: seed {workload.seed}, mutation {workload.mutation}"


@PROPERTY
@given(
    workload=st.one_of(workloads.workloads(**SMALL), workloads.mutated_workloads(**SMALL)),
    where=st.floats(0.0, 1.0),
    shape=st.integers(0, len(BAD_SHAPES) - 1),
)
def test_bad_item_raises_after_earlier_items(
    workload: workloads.Workload, where: float, shape: int
) -> None:
    messages = {_check_bad(cls, workload, where, shape) for cls in CLASSES}
    assert len(messages) == 1, messages


def _check_bad(cls: Any, workload: workloads.Workload, where: float, shape: int) -> str:
    inputs = workload.inputs
    cut = int(where * len(inputs))
    bad = BAD_SHAPES[shape](workload.num_streams)
    batched = cls(workload.run_id, workload.num_streams)
    message = _error(lambda: batched.push_inputs([*inputs[:cut], bad, *inputs[cut:]]))
    expected = _one_by_one(cls, workload, inputs[:cut])
    if isinstance(bad, tuple) and bad and ARITY.get(bad[0]) == len(bad):
        # The single call raises the same message.
        assert message == _error(lambda: workloads.feed(expected, [bad]))
    else:
        assert message.startswith(f"invalid input {bad!r}: expected "), message
    assert _state(batched, workload.num_streams) == _state(expected, workload.num_streams)
    return message


@pytest.mark.skipif(NativeReconciler is None, reason="make native")
@pytest.mark.parametrize("shape", range(len(BAD_SHAPES)))
def test_bad_item_messages_agree(shape: int) -> None:
    run_id = "0" * 32
    bad = BAD_SHAPES[shape](2)
    messages = [
        _error(lambda c=cls: c(run_id, 2).push_inputs([bad]))
        for cls in (
            ReferenceReconciler,
            NativeReconciler,
        )
    ]
    assert messages[0] == messages[1]


@pytest.mark.parametrize("cls", CLASSES)
def test_push_inputs_accepts_an_empty_batch_and_bytes_likes(cls: Any) -> None:
    workload = workloads.generate(7, num_streams=2, tokens=12)
    rec = cls(workload.run_id, workload.num_streams)
    rec.push_inputs([])
    inputs = [
        (k, bytearray(i[1]), *i[2:]) if k == "frame" else i
        for i in workload.inputs
        for k in (i[0],)
    ]
    rec.push_inputs(inputs)
    expected = _one_by_one(cls, workload, workload.inputs)
    assert _state(rec, 2) == _state(expected, 2)


@pytest.mark.parametrize("cls", CLASSES)
@pytest.mark.parametrize(
    "bad",
    [
        ("finish", 0, 1),  # a finish reason that is not a string
        ("sse_id", 0, 5),  # a chunk id that is not a string
        ("sse_choice", 0, "0"),
        ("sse_usage", 0, "3", None, None),
        ("sse_usage", 0, None, [1, "2"], None),
    ],
)
def test_arguments_of_the_wrong_type_raise_type_error(cls: Any, bad: tuple[Any, ...]) -> None:
    rec = cls("0" * 32, 1)
    with pytest.raises(TypeError):
        rec.push_inputs([bad])
    rec.finalize()
    assert rec.verdict(0) == ("failed", "missing telemetry: no frames received for this run")
