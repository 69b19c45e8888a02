"""The typed boundary: the shapes of parallelhue.model.shapes are the Rust core's, key for key.

The Rust bindings export their key lists; the TypedDicts and Literal types of
`shapes.py` must list the same keys in the same order, and the dicts both
reconcilers really return must have exactly those keys.
"""

from __future__ import annotations

import socket
import tempfile
import time
from pathlib import Path
from typing import get_args

import pytest

from parallelhue.model import shapes
from parallelhue.reference import Reconciler as ReferenceReconciler
from parallelhue.reference import reconciler as reference_module
from parallelhue_vllm.wire import (
    DERIVATION_DRAFT_IDS,
    ENGINE_SIMULATED,
    SOURCE_SCHEDULER,
    VERIFICATION_STANDARD,
    Header,
    Hello,
    encode_hello,
)

native = pytest.importorskip("parallelhue._native")

RUN_ID = "0123456789abcdef0123456789abcdef"


def test_the_key_lists_are_one_definition() -> None:
    assert tuple(native.STAT_KEYS) == shapes.STAT_KEYS == tuple(shapes.StreamStats.__annotations__)
    assert tuple(native.COUNTER_KEYS) == shapes.COUNTER_KEYS
    assert tuple(native.SOURCE_KEYS) == tuple(shapes.SourceInfo.__annotations__)
    assert tuple(native.RECEIVER_KEYS) == tuple(shapes.ReceiverStats.__annotations__)
    assert tuple(native.END_KINDS) == shapes.END_KINDS == get_args(shapes.EndKind)
    # The reference builds its dicts from the same keys (not a copy).
    assert reference_module.STAT_KEYS is shapes.STAT_KEYS
    assert reference_module.COUNTER_KEYS is shapes.COUNTER_KEYS


def _hello() -> bytes:
    return encode_hello(
        Header(bytes.fromhex(RUN_ID), 7, 0, 0, 1),
        Hello(
            SOURCE_SCHEDULER,
            ENGINE_SIMULATED,
            DERIVATION_DRAFT_IDS,
            False,
            3,
            "0.1",
            "s",
            "x",
            VERIFICATION_STANDARD,
        ),
    )


@pytest.mark.parametrize("cls", [native.Reconciler, ReferenceReconciler])
def test_both_reconcilers_return_exactly_these_keys(cls: type) -> None:
    reconciler = cls(RUN_ID, 2)
    reconciler.push_frame(_hello())
    reconciler.push_sse(0, "a", [1])
    assert tuple(reconciler.stream_stats(0)) == shapes.STAT_KEYS
    assert tuple(reconciler.totals()) == shapes.STAT_KEYS
    assert tuple(reconciler.counters()) == shapes.COUNTER_KEYS
    (source,) = reconciler.sources()
    assert tuple(source) == tuple(shapes.SourceInfo.__annotations__)
    assert (source["role"], source["engine"], source["role_derivation"]) == (
        "scheduler",
        "simulated",
        "draft_ids",
    )


def test_the_receiver_returns_exactly_its_keys() -> None:
    directory = Path(tempfile.mkdtemp(prefix="pht-", dir="/tmp"))
    path = directory / "r.sock"
    reconciler = native.Reconciler(RUN_ID, 1)
    with native.Receiver(str(path), reconciler) as receiver:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
            sender.sendto(_hello(), str(path))
        deadline = time.monotonic() + 5
        while receiver.stats()["datagrams"] < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tuple(receiver.stats()) == tuple(shapes.ReceiverStats.__annotations__)
    directory.rmdir()
