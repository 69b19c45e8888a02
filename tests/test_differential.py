"""Differential tests: the Rust reconciler against the pure-Python reference.

The same workload (tests/workloads.py), unmutated and with one fault injected,
is fed to `parallelhue._native.Reconciler` and `parallelhue.reference.Reconciler`;
events, statistics, totals, counters, sources and verdicts must be identical.
Unmutated workloads must end all-exact with the generator's truth; a mutated
workload must never give an exact verdict to a stream the fault affected.
Two more properties reach the corner rules: "chaotic" input sequences (mostly
consistent content with random faults: wrong roles, second sources, span_back,
overruns, notices, gaps, drops, garbage), and byte-corrupted frames decoded by
both decoders (same meaning or the same error message).

Examples per property: env PH_HYPOTHESIS_EXAMPLES (default 2000); derandomized
when CI is set. Skipped only when the native module is not built, unless
PH_REQUIRE_NATIVE=1 (CI), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import test_reference
import workloads
from parallelhue.reference import FrameError, decode_to_dict
from parallelhue.reference import Reconciler as ReferenceReconciler
from parallelhue_vllm import wire


def _native_reconciler() -> tuple[Any, str]:
    try:
        from parallelhue import _native  # type: ignore[attr-defined]
    except ImportError as error:
        return None, f"parallelhue._native is not built ({error}); run `make native`"
    native = getattr(_native, "Reconciler", None)
    if native is None:
        return None, "parallelhue._native has no Reconciler yet; run `make native`"
    return native, ""


NativeReconciler, SKIP_REASON = _native_reconciler()
if NativeReconciler is None and os.environ.get("PH_REQUIRE_NATIVE") == "1":
    raise RuntimeError(f"PH_REQUIRE_NATIVE=1 but {SKIP_REASON}")
pytestmark = pytest.mark.skipif(NativeReconciler is None, reason=SKIP_REASON)

PROPERTY = workloads.property_settings()
# Small examples keep 2,000 of them per property within seconds.
SMALL = {"num_streams": (1, 3), "tokens": (1, 30), "k": (0, 4)}


def _describe(item: tuple[Any, ...]) -> str:
    if item[0] == "frame":
        return f"frame {item[1].hex()}"
    return repr(item)


def _assert_same(what: str, reference: Any, native: Any, context: str) -> None:
    assert native == reference, (
        f"{what} diverge {context}\n  reference: {reference!r}\n  native:    {native!r}"
    )


def _snapshot(rec: Any, streams: int) -> dict[str, Any]:
    return {
        "verdicts": [rec.verdict(i) for i in range(streams)],
        "stats": [rec.stream_stats(i) for i in range(streams)],
        "totals": rec.totals(),
        "counters": rec.counters(),
        "sources": rec.sources(),
    }


def run_both(workload: workloads.Workload, batch: bool = False) -> tuple[Any, Any]:
    """Feed both reconcilers; compare events after every input (or at the end when batching).
    The reference's events are kept in `run_both.events` for the caller."""
    reference = ReferenceReconciler(workload.run_id, workload.num_streams)
    native = NativeReconciler(workload.run_id, workload.num_streams)
    label = f"(seed {workload.seed}, mutation {workload.mutation})"
    events: list[Any] = []
    if batch:
        workloads.feed(reference, workload.inputs)
        workloads.feed(native, workload.inputs, batch_frames=True)
        events += reference.drain()
        _assert_same("events", events, native.drain(), f"after all inputs {label}")
    else:
        for position, item in enumerate(workload.inputs):
            workloads.feed(reference, [item])
            workloads.feed(native, [item])
            drained = reference.drain()
            events += drained
            _assert_same(
                "events",
                drained,
                native.drain(),
                f"after input {position} {label}: {_describe(item)}",
            )
    reference.finalize()
    native.finalize()
    drained = reference.drain()
    events += drained
    _assert_same("events", drained, native.drain(), f"after finalize {label}")
    LAST_EVENTS[:] = events
    for key, ref_value in _snapshot(reference, workload.num_streams).items():
        nat_value = _snapshot(native, workload.num_streams)[key]
        _assert_same(key, ref_value, nat_value, label)
    return reference, native


LAST_EVENTS: list[Any] = []  # the reference's events of the last run_both


@PROPERTY
@given(workload=workloads.workloads(**SMALL), batch=st.booleans())
def test_unmutated_workloads_agree_and_are_exact(workload: workloads.Workload, batch: bool) -> None:
    reference, _ = run_both(workload, batch)
    assert workloads.attribution_errors(workload, LAST_EVENTS) == []
    verdicts = [reference.verdict(i) for i in range(workload.num_streams)]
    assert verdicts == [("exact", None)] * workload.num_streams
    totals = reference.totals()
    for key, expected in workload.expected_totals().items():
        assert totals[key] == expected, key
    for index, truth in enumerate(workload.truth):
        stats = reference.stream_stats(index)
        assert stats["tokens"] == truth.tokens
        assert {k: stats[k] for k in truth.role_counts()} == truth.role_counts()


@PROPERTY
@given(workload=workloads.mutated_workloads(**SMALL))
def test_mutated_workloads_agree_and_affected_streams_are_not_exact(
    workload: workloads.Workload,
) -> None:
    reference, _ = run_both(workload)
    verdicts = [reference.verdict(i)[0] for i in range(workload.num_streams)]
    if workload.benign:
        assert verdicts == ["exact"] * workload.num_streams, workload.mutation
    else:
        assert all(verdicts[i] != "exact" for i in workload.affected), workload.mutation


@PROPERTY
@given(
    seed=st.integers(0, 2**32 - 1),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_corrupted_frames_agree(seed: int, flips: list[tuple[int, int]], cut: int | None) -> None:
    # Byte-level corruption of one frame: both decoders must reject (or accept) alike.
    workload = workloads.generate(seed, **SMALL)
    frames = [i for i, item in enumerate(workload.inputs) if item[0] == "frame"]
    target = random.Random(seed).choice(frames)
    data = bytearray(workload.inputs[target][1])
    for position, mask in flips:
        data[position % len(data)] ^= mask
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    inputs = list(workload.inputs)
    inputs[target] = ("frame", bytes(data))
    run_both(workloads.Workload(seed, workload.run_id, workload.num_streams, inputs,
                                workload.truth, "corrupt"))  # fmt: skip


@pytest.mark.parametrize("kind", workloads.HARMFUL_MUTATIONS)
def test_each_harmful_mutation_agrees_and_fails_its_streams(kind: str) -> None:
    # Every lie of the catalog at least once, deterministically (the property above
    # picks them at random).
    applied = 0
    for seed in range(40):
        workload = workloads.mutate(workloads.generate(seed, **SMALL), seed, kind)
        if workload.mutation != kind:
            continue
        applied += 1
        reference, _ = run_both(workload)
        assert all(reference.verdict(i)[0] == "failed" for i in workload.affected), seed
    assert applied or kind == "reorder_beyond"  # that one needs long streams (below)


@pytest.mark.parametrize("kind", workloads.UNKNOWN_MUTATIONS)
def test_unknowns_keep_streams_exact_and_never_color_wrongly(kind: str) -> None:
    # An unknown (a give, a split) is never read as a value: both reconcilers agree,
    # every stream stays exact, no character shows a step or role it may not have.
    applied = uncolored = 0
    for seed in range(120):
        workload = workloads.mutate(workloads.generate(seed, **SMALL), seed, kind)
        if workload.mutation != kind:
            continue
        applied += 1
        reference, _ = run_both(workload)
        verdicts = [reference.verdict(i) for i in range(workload.num_streams)]
        assert verdicts == [("exact", None)] * workload.num_streams, seed
        assert workloads.wrongly_colored(workload, LAST_EVENTS) == [], seed
        uncolored += bool(workloads.attribution_errors(workload, LAST_EVENTS))
    assert applied >= 10 and uncolored > 0, (applied, uncolored)


@pytest.mark.parametrize("start", [0, 100, 200])
def test_reorder_beyond_the_window_agrees_and_fails_affected_streams(start: int) -> None:
    # Needs more than 64 later frames from one source: long streams, few tokens per step.
    for seed in range(start, start + 50):
        workload = workloads.mutate(
            workloads.generate(seed, num_streams=4, tokens=(150, 200), k=(0, 1)),
            seed,
            "reorder_beyond",
        )
        if workload.mutation == "reorder_beyond":
            break
    assert workload.mutation == "reorder_beyond"
    reference, _ = run_both(workload)
    assert reference.counters()["gaps"] >= 1
    assert all(reference.verdict(i)[0] != "exact" for i in workload.affected)


# ----------------------------------------------------------- chaotic inputs
# Structurally valid frames whose content is mostly consistent, with faults sprinkled
# at random: they reach the corner rules (second sources, wrong roles, span_back,
# HTTP/SSE overruns, text after finish, notices, missing hellos, gaps, drops) that
# realistic workloads rarely touch, while still producing spans and exact streams.

SCRIPT_TEXT = "ab日é😀xyz, 한국어 e\u0301 "
PARTS = ["", "a", "bc", "日", "é", "xyz", "😀", "A"]


def _script(rng: random.Random) -> list[wire.TextToken]:
    """Tokens of one stream as the detokenizer reports them (DecodeStream model)."""
    data = "".join(rng.choice(SCRIPT_TEXT) for _ in range(rng.randint(1, 12))).encode()
    tokens, pending, count, position = [], b"", 0, 0
    while position < len(data):
        piece = data[position : position + rng.randint(1, 3)]
        position += len(piece)
        pending += piece
        try:
            pending.decode()
        except UnicodeDecodeError:
            # Its give count (protocol 3): mostly its own bytes, sometimes not known.
            give = len(piece) if rng.random() < 0.8 else wire.LEAD_UNKNOWN
            tokens.append(wire.TextToken(rng.randint(1, 6), b"", 0, give))
            count += 1
            continue
        lead = len(pending) - len(piece) if count else 0
        tokens.append(wire.TextToken(rng.randint(1, 6), pending, count, lead))
        pending, count = b"", 0
    return tokens


def _roles(rng: random.Random, count: int) -> tuple[list[int], int, bool]:
    """Valid roles for a record of `count` tokens (count >= 1)."""
    if count == 1 and rng.random() < 0.3:
        return [0], 0, False
    accepted = count - 1
    if rng.random() < 0.2:
        return [1] * count, count + rng.randint(0, 1), True  # trimmed
    if accepted and rng.random() < 0.5:
        return [1] * accepted + [3], accepted, False
    return [1] * accepted + [2], accepted + rng.randint(1, 2), False


def _chaotic_provenance(
    rng: random.Random,
    faulty: Callable[[], bool],
    scripts: list[list[wire.TextToken]],
    p_pos: list[int],
) -> list[wire.Record]:
    """One provenance frame's records of chaotic_inputs (its rng draws, in its order)."""
    streams = len(scripts)
    records: list[wire.Record] = []
    for stream in rng.sample(range(streams), rng.randint(1, streams)):
        script = scripts[stream]
        offset = p_pos[stream]
        count = rng.randint(1, 3)
        if not faulty():  # past the end only as a fault
            count = min(count, len(script) - offset)
            if count <= 0:
                continue
        ids = [t.token_id for t in script[offset : offset + count]]
        ids += [rng.randint(1, 6) for _ in range(count - len(ids))]  # beyond the end
        if faulty():
            ids[rng.randrange(count)] ^= 8
        roles, drafts, trimmed = _roles(rng, count)
        if faulty():
            offset += 1
        # The scheduler finishes the request with its last token (stop), mostly.
        done = offset + count >= len(script) and (rng.random() < 0.8) != faulty()
        record = wire.ProvenanceRecord(stream, offset, ids, roles, drafts, 0, done,
                                       1 if done else 0, trimmed)  # fmt: skip
        records.append(record)
        p_pos[stream] = offset + count
    if faulty():
        records.append(wire.ProvenanceRecord(streams, 0, [1], [0], 0))  # foreign
    return records


def _chaotic_text(
    rng: random.Random,
    faulty: Callable[[], bool],
    scripts: list[list[wire.TextToken]],
    progress: tuple[list[int], list[bool], list[list[tuple[str, list[int]]]]],
) -> list[wire.Record]:
    """One text frame's records of chaotic_inputs (its rng draws, in its order)."""
    streams = len(scripts)
    t_pos, t_done, sse_queue = progress
    records: list[wire.Record] = []
    for stream in rng.sample(range(streams), rng.randint(1, streams)):
        if t_done[stream] and not faulty():
            continue
        script = scripts[stream]
        offset = t_pos[stream]
        tokens = [wire.TextToken(t.token_id, t.fragment, t.span_back, t.lead_len)
                  for t in script[offset : offset + rng.randint(1, 3)]]  # fmt: skip
        if faulty() and tokens and tokens[-1].fragment:
            tokens[-1].span_back += 1
        if faulty() and tokens and not tokens[0].fragment:
            tokens[0].lead_len = rng.choice((0, 1, 2, 7, wire.LEAD_UNKNOWN))
        if faulty() and tokens and tokens[-1].span_back:
            tokens[-1].span_back -= 1  # its first predecessor's bytes: unclaimed
            if not tokens[-1].span_back:
                tokens[-1].lead_len = 0
        finished = offset + len(tokens) >= len(script) or faulty()
        http = b"".join(t.fragment for t in tokens)
        if faulty():
            http = rng.choice(PARTS).encode()
        truncated = finished and rng.random() < 0.2
        if truncated and http:
            http = http[:-1] if http[-1] < 0x80 else b""  # a stop string cut it
        records.append(wire.TextRecord(stream, offset, tokens, http, finished,
                                       1 if finished else 0, truncated))  # fmt: skip
        t_pos[stream] = offset + len(tokens)
        t_done[stream] = t_done[stream] or finished
        sse_queue[stream].append((http.decode(), [t.token_id for t in tokens]))
    return records


def chaotic_inputs(seed: int) -> tuple[str, int, list[tuple[Any, ...]]]:
    rng = random.Random(seed)
    fault = rng.choice((0.0, 0.02, 0.1))  # per-decision fault probability
    run_id = "5a" * 16
    run_bytes = bytes.fromhex(run_id)
    streams = rng.randint(1, 3)
    scripts = [_script(rng) for _ in range(streams)]
    p_pos = [0] * streams
    t_pos = [0] * streams
    t_done = [False] * streams
    sse_queue: list[list[tuple[str, list[int]]]] = [[] for _ in range(streams)]
    sources = {0x51: 1, 0x52: 1, 0xF1: 2, 0xF2: 2}  # id -> hello role
    seqs = dict.fromkeys(sources, 0)
    steps = dict.fromkeys(sources, 0)
    ids_sent: set[int] = set()
    sse_done: set[int] = set()
    inputs: list[tuple[Any, ...]] = []
    sent: list[bytes] = []

    def faulty() -> bool:
        return rng.random() < fault

    def header(source: int) -> wire.Header:
        seq = seqs[source]
        seqs[source] += 2 if faulty() else 1
        # Each frame the next step of its source; a fault repeats one or goes back.
        steps[source] += rng.choice((0, -1)) if faulty() else 1
        step = max(steps[source], 0)
        return wire.Header(run_bytes, source, seq, step, 0, 1 if faulty() else 0)

    def chunk_id(stream: int) -> tuple[str, int, str]:
        ids_sent.add(stream)
        return ("sse_id", stream, f"chatcmpl-ph1_{run_id}_{stream}" + ("x" if faulty() else ""))

    for source, role in sources.items():
        if faulty():
            seqs[source] += 1  # its hello is never sent
            continue
        # A scheduler announces K 4 (records draft at most 4), K 0 only as a fault;
        # a frontend announces no drafts.
        k = (0 if faulty() else 4) if role == 1 else 0
        hello = wire.Hello(3 - role if faulty() else role, 2, 1 if k else 0, False, k,
                           "p", "e", "ngram" if k else "", 1 if k else 0)  # fmt: skip
        inputs.append(("frame", wire.encode_hello(header(source), hello)))

    for _ in range(rng.randint(1, 40)):
        action = rng.random()
        if action < 0.3:
            source = 0x52 if faulty() else 0x51
            records = _chaotic_provenance(rng, faulty, scripts, p_pos)
            if not records:
                continue
            data = wire.encode_records(wire.KIND_PROVENANCE, header(source), records)
        elif action < 0.6:
            source = 0xF2 if faulty() else 0xF1
            records = _chaotic_text(rng, faulty, scripts, (t_pos, t_done, sse_queue))
            if not records:
                continue
            data = wire.encode_records(wire.KIND_TEXT, header(source), records)
        elif action < 0.63:
            stream = rng.choice((0, streams, wire.ALL_STREAMS))
            notice = wire.NoticeRecord(stream, rng.randint(1, 5), rng.choice(PARTS))
            data = wire.encode_records(wire.KIND_NOTICE, header(0xF1), [notice])
        elif action < 0.66 and sent:
            data = rng.choice(sent)  # a duplicate
        elif action < 0.67:
            data = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 80)))
        else:
            stream = rng.randrange(streams)
            queue = sse_queue[stream]
            if not queue:
                if (t_done[stream] and stream not in sse_done) or faulty():
                    if stream not in ids_sent:
                        inputs.append(chunk_id(stream))
                    sse_done.add(stream)
                    inputs.append(("finish", stream, "stop"))
                continue
            if stream in sse_done and not faulty():
                continue
            merged = [queue.pop(0) for _ in range(rng.randint(1, len(queue)))]
            text = "".join(part[0] for part in merged)
            ids = [i for part in merged for i in part[1]]
            if faulty():
                text += rng.choice(PARTS)
            if faulty() and ids:
                ids[-1] ^= 8
            if stream not in ids_sent or faulty():
                inputs.append(chunk_id(stream))
            if faulty():
                inputs.append(
                    rng.choice(
                        (
                            ("sse_choice", stream, 1),
                            ("sse_usage", stream, rng.randint(0, 9), None, None),
                        )
                    )
                )
            inputs.append(("sse", stream, text, ids))
            continue
        sent.append(data)
        inputs.append(("frame", data))
    for stream in range(streams):  # the rest of the SSE, usually
        if stream in sse_done and not faulty():
            continue
        if stream not in ids_sent:
            inputs.append(chunk_id(stream))
        if sse_queue[stream] and not faulty():
            text = "".join(part[0] for part in sse_queue[stream])
            ids = [i for part in sse_queue[stream] for i in part[1]]
            inputs.append(("sse", stream, text, ids))
        if not faulty():
            inputs.append(("finish", stream, "stop"))
    return run_id, streams, inputs


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1))
def test_chaotic_inputs_agree(seed: int) -> None:
    run_id, streams, inputs = chaotic_inputs(seed)
    run_both(workloads.Workload(seed, run_id, streams, inputs, [], "chaos"))


NATIVE_DECODE = workloads.native_test_kit("decode_frame") if NativeReconciler else None


_FRAME_POOL: list[bytes] = []


def _frame_pool() -> list[bytes]:
    """Frames of 40 small workloads, generated once (the property only corrupts them)."""
    if not _FRAME_POOL:
        for seed in range(40):
            workload = workloads.generate(seed, **SMALL)
            _FRAME_POOL.extend(item[1] for item in workload.inputs if item[0] == "frame")
    return _FRAME_POOL


@pytest.mark.skipif(NATIVE_DECODE is None, reason="needs the test kit: make native")
@PROPERTY
@given(
    pick=st.integers(0, 10**6),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    cut=st.one_of(st.none(), st.integers(0, 10**6)),
)
def test_decoders_agree_on_frames(pick: int, flips: list[tuple[int, int]], cut: int | None) -> None:
    # Valid frames must decode to the same meaning; corrupted ones fail with the same message.
    pool = _frame_pool()
    corrupted = bytearray(pool[pick % len(pool)])
    for position, mask in flips:
        corrupted[position % len(corrupted)] ^= mask
    if cut is not None:
        corrupted = corrupted[: cut % (len(corrupted) + 1)]
    try:
        expected: Any = decode_to_dict(bytes(corrupted))
    except FrameError as error:
        expected = ("error", str(error))
    try:
        actual: Any = NATIVE_DECODE(bytes(corrupted))
    except ValueError as error:
        actual = ("error", str(error))
    _assert_same("decoded frames", expected, actual, f"for {bytes(corrupted).hex()}")


def test_chaotic_inputs_reach_exact_streams_and_the_new_rules() -> None:
    # The chaos must keep producing exact streams (not only failures) and hit the rules.
    exact = 0
    reasons: set[str] = set()
    full: list[str] = []
    for seed in range(400):
        run_id, streams, inputs = chaotic_inputs(seed)
        rec = ReferenceReconciler(run_id, streams)
        workloads.feed(rec, inputs)
        rec.finalize()
        for index in range(streams):
            verdict, reason = rec.verdict(index)
            exact += verdict == "exact"
            if reason:
                reasons.add(reason.split(": ", 1)[-1].split(" ")[0])
                full.append(reason)
    assert exact >= 40
    assert {"two", "SSE", "provenance", "text", "no"} <= reasons, reasons
    # Protocol 3's give-count rules.
    assert any("bytes that no fragment carries" in reason for reason in full)
    assert any("bytes, its lead_len says" in reason for reason in full)


@pytest.mark.parametrize("case", range(len(test_reference.LIES)), ids=lambda i: f"lie{i}")
def test_the_lie_table_gives_the_same_events_in_both_reconcilers(case: int) -> None:
    name, lie, reason = test_reference.LIES[case]
    runs = []
    for cls in (ReferenceReconciler, NativeReconciler):
        run = test_reference.Run(num_streams=2, cls=cls)
        lie(run)
        run.rec.finalize()
        runs.append((run.events(), _snapshot(run.rec, 2)))
    assert runs[0] == runs[1], name
    assert reason in [event[2] for event in runs[0][0] if event[0] == "failed"]


@pytest.mark.parametrize("cls", [ReferenceReconciler, NativeReconciler], ids=["python", "rust"])
def test_stop_string_metrics_with_the_engines_finish_in_that_step_are_exact(cls: Any) -> None:
    # vLLM sends the lists of a stop-string stream only when the engine finished the
    # request in the stop string's step too: then every verify step is checked.
    T, R = test_reference, wire.ROLE_ACCEPTED
    run = T.Run(num_streams=1, cls=cls)
    run.push(
        run.prov(T.prov(0, 0, [10], [wire.ROLE_PLAIN], 0)),
        run.text(T.text(0, 0, [T.tok(10, "Hi")], "Hi")),
        run.prov(T.prov(0, 1, [11, 12], [R, wire.ROLE_BONUS], 1)),
        run.text(T.text(0, 1, [T.tok(11, " a"), T.tok(12, "b")], " ab")),
        run.text(
            T.text(0, 3, [T.tok(13, "c")], "c", **T.FIN, tokens_trimmed=True, trimmed_tokens=1)
        ),
    )
    run.sse(0, "Hi", [10])
    run.sse(0, " ab", [11, 12])
    run.sse(0, "c", [13])
    run.rec.push_sse_usage(0, 4, [1, 1], [1, 1])
    run.push(run.prov(T.prov(0, 3, [13, 14], [R, wire.ROLE_BONUS], 1, **T.FIN_LENGTH)))
    run.finish(0)
    run.rec.finalize()
    assert ("exact", 0) in run.events()
    assert run.rec.stream_stats(0)["metrics_steps"] == 2


@pytest.mark.parametrize("cls", [ReferenceReconciler, NativeReconciler], ids=["python", "rust"])
def test_the_last_sequence_number_is_not_released_twice(cls: Any) -> None:
    # A source jumps to the top of the u64 sequence space (a gap), then sends seq
    # 2^64 - 1 again with other content: a duplicate that differs, not a new frame
    # (the next expected seq must not saturate at 2^64 - 1).
    top = 2**64 - 1
    run = test_reference.Run(num_streams=1, cls=cls)

    def foreign(token_id: int, seq: int) -> bytes:  # a record for a stream not in the run
        return run.prov(wire.ProvenanceRecord(3, 0, [token_id], [wire.ROLE_PLAIN], 0), seq=seq)

    run.push(*[foreign(1, seq) for seq in range(top - 64, top + 1)])
    run.push(foreign(2, top))
    events = run.events()
    assert ("run", f"source {test_reference.SCHED:016x}: seq {top} received twice with different "
            "content") in events, events  # fmt: skip
    assert run.rec.counters()["duplicate_frames"] == 1
