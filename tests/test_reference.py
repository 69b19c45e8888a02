"""The pure-Python reference reconciler against docs/PROTOCOL.md, rule by rule."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings

import workloads
from parallelhue.reference import Reconciler
from parallelhue_vllm import wire

RUN = "ab" * 16
OTHER_RUN = "cd" * 16
SCHED = 0x5C
FRONT = 0xF0
P, A, T, B = wire.ROLE_PLAIN, wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS
NI = "日".encode()  # e6 97 a5


class Run:
    """Builds the frames of one run, with per-source sequence numbers and steps (each
    frame is the next step of its sender: one record per stream and step), and feeds
    them. A stream's first SSE delta is preceded by its chunk id, as the readers do."""

    def __init__(
        self, num_streams: int = 1, *, k: int = 3, hellos: bool = True, cls: Any = Reconciler
    ) -> None:
        self.rec = cls(RUN, num_streams)
        self.seq = {SCHED: 0, FRONT: 0}
        self.step = {SCHED: 0, FRONT: 0}
        self.ids_sent: set[int] = set()
        self.k = k
        if hellos:
            self.push(self.hello(SCHED, wire.SOURCE_SCHEDULER))
            self.push(self.hello(FRONT, wire.SOURCE_FRONTEND))

    def header(
        self,
        source: int,
        seq: int | None,
        dropped: int = 0,
        run: str = RUN,
        step: int | None = None,
    ) -> wire.Header:
        if seq is None:
            seq = self.seq[source]
            self.seq[source] += 1
        if step is None:
            step = self.step.setdefault(source, 0)
            self.step[source] += 1
        return wire.Header(bytes.fromhex(run), source, seq, step, 0, dropped)

    def hello(self, source: int, role: int, seq: int | None = None) -> bytes:
        k = self.k if role == wire.SOURCE_SCHEDULER else 0  # a frontend announces no drafts
        method = "ngram" if k else ""
        derivation = wire.DERIVATION_DRAFT_IDS if k else wire.DERIVATION_NONE
        verification = wire.VERIFICATION_STANDARD if k else wire.VERIFICATION_NONE
        return wire.encode_hello(
            self.header(source, seq),
            wire.Hello(role, wire.ENGINE_SIMULATED, derivation, False, k, "0.2.0", "sim-1",
                       method, verification),
        )  # fmt: skip

    def prov(self, *records: wire.ProvenanceRecord, seq: int | None = None, **kw: Any) -> bytes:
        return wire.encode_records(
            wire.KIND_PROVENANCE, self.header(SCHED, seq, **kw), list(records)
        )

    def text(self, *records: wire.TextRecord, seq: int | None = None, **kw: Any) -> bytes:
        return wire.encode_records(wire.KIND_TEXT, self.header(FRONT, seq, **kw), list(records))

    def notice(self, stream: int, message: str, code: int = wire.NOTICE_OTHER) -> bytes:
        return wire.encode_records(
            wire.KIND_NOTICE,
            self.header(FRONT, None),
            [wire.NoticeRecord(stream, code, message)],
        )

    def push(self, *frames: bytes) -> None:
        for frame in frames:
            self.rec.push_frame(frame)

    def sse_id(self, stream: int) -> None:
        if stream not in self.ids_sent:
            self.ids_sent.add(stream)
            self.rec.push_sse_id(stream, chunk_id(stream))

    def sse(
        self, stream: int, text: str, ids: list[int], finish: bool = False, reason: str = "stop"
    ) -> None:
        self.sse_id(stream)
        self.rec.push_sse(stream, text, ids)
        if finish:
            self.finish(stream, reason)

    def finish(self, stream: int, reason: str | None = "stop") -> None:
        self.sse_id(stream)
        self.rec.finish_sse(stream, reason)

    def events(self) -> list[tuple[Any, ...]]:
        return self.rec.drain()


def prov(stream: int, offset: int, ids: list[int], roles: list[int], drafts: int, **kw: Any):
    return wire.ProvenanceRecord(stream, offset, ids, roles, drafts, **kw)


def tok(token_id: int, fragment: bytes | str, span_back: int = 0) -> wire.TextToken:
    raw = fragment.encode() if isinstance(fragment, str) else fragment
    return wire.TextToken(token_id, raw, span_back, wire.LEAD_UNKNOWN if span_back else 0)


def text(stream: int, offset: int, tokens: list[wire.TextToken], http: bytes | str, **kw: Any):
    raw = http.encode() if isinstance(http, str) else http
    return wire.TextRecord(stream, offset, tokens, raw, **kw)


FIN = {"finished": True, "finish_reason": wire.FINISH_STOP}


def chunk_id(stream: int) -> str:
    """The SSE chunk id vLLM gives a stream of the run (chatcmpl-<request id>)."""
    return f"chatcmpl-ph1_{RUN}_{stream}"


def simple_exact_run() -> Run:
    """Stream 0: step 0 = 'Hi' (plain), step 1 = ' a', 'b' (accepted + bonus)."""
    run = Run()
    run.push(run.prov(prov(0, 0, [10], [P], 0)), run.text(text(0, 0, [tok(10, "Hi")], "Hi")))
    run.sse(0, "Hi", [10])
    run.push(
        run.prov(prov(0, 1, [11, 12], [A, B], 1, finished=True, finish_reason=1)),
        run.text(text(0, 1, [tok(11, " a"), tok(12, "b")], " ab", **FIN)),
    )
    run.sse(0, " ab", [11, 12], finish=True)
    return run


# ------------------------------------------------------------ happy paths


def test_simple_stream_is_exact_with_one_span_per_step_role_and_input() -> None:
    run = simple_exact_run()
    # " a" and "b" come from the same step but have different roles: two spans.
    assert run.events() == [
        ("span", 0, 0, "Hi", 0, 0, 1, P),
        ("span", 0, 2, " a", 1, 1, 1, A),
        ("span", 0, 4, "b", 1, 2, 1, B),
        ("exact", 0),
    ]
    assert run.rec.verdict(0) == ("exact", None)
    stats = run.rec.stream_stats(0)
    assert stats == {
        "tokens": 3,
        "steps": 2,
        "hist": {1: 1, 2: 1},
        "drafts_scheduled": 1,
        "drafts_padded": 0,
        "plain": 1,
        "accepted": 1,
        "target": 0,
        "bonus": 1,
        "surplus_tokens": 0,
        "surplus_accepted": 0,
        "surplus_target": 0,
        "surplus_bonus": 0,
        "surplus_plain": 0,
        "mixed_spans": 0,
        "bytes": 5,
        "drafts_by_pos": [1],
        "accepted_by_pos": [1],
        "metrics_steps": 0,
    }
    assert run.rec.totals() == stats
    assert run.rec.counters() == {
        "frames": 6,
        "rejected_frames": 0,
        "duplicate_frames": 0,
        "foreign_records": 0,
        "dropped_reported": 0,
        "gaps": 0,
        "late_frames": 0,
    }


def test_multibyte_character_split_across_tokens_and_steps_is_a_mixed_span() -> None:
    run = Run()
    # Step 0 emits the first byte of 日; step 1 the other two and '!'.
    run.push(run.prov(prov(0, 0, [1], [P], 0)), run.text(text(0, 0, [tok(1, b"")], b"")))
    run.sse(0, "", [1])
    assert run.events() == []
    run.push(
        run.prov(prov(0, 1, [2, 3, 4], [A, A, B], 2, finished=True, finish_reason=1)),
        run.text(text(0, 1, [tok(2, b""), tok(3, NI, 2), tok(4, "!")], "日!", **FIN)),
    )
    assert run.events() == []  # the SSE has not delivered the character yet
    run.sse(0, "日!", [2, 3, 4], finish=True)
    assert run.events() == [
        ("span", 0, 0, "日", None, 0, 3, None),
        ("span", 0, 3, "!", 1, 3, 1, B),
        ("exact", 0),
    ]
    stats = run.rec.stream_stats(0)
    assert (stats["mixed_spans"], stats["bytes"], stats["tokens"]) == (1, 4, 4)


def test_character_within_one_step_keeps_its_step_colour() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2], [A, B], 1, finished=True, finish_reason=1)),
        run.text(text(0, 0, [tok(1, b""), tok(2, NI, 1)], NI, **FIN)),
    )
    run.sse(0, "日", [1, 2], finish=True)
    # Step 0 throughout, but an accepted draft and the bonus: no single role.
    assert run.events() == [("span", 0, 0, "日", 0, 0, 2, None), ("exact", 0)]
    assert run.rec.stream_stats(0)["mixed_spans"] == 0


def _one_text_record(run: Run, tokens: list[wire.TextToken]) -> list[Any]:
    """`tokens` as one finished text record, its HTTP text, the SSE and its finish."""
    whole = b"".join(t.fragment for t in tokens)
    run.push(run.text(text(0, 0, tokens, whole, **FIN)))
    run.sse(0, whole.decode(), [t.token_id for t in tokens], finish=True)
    return run.events()


UNKNOWN = wire.LEAD_UNKNOWN


def test_an_unclaimed_token_of_unknown_give_keeps_the_carriers_characters_uncolored() -> None:
    # Token 1 (step 0) holds bytes back and says its give is unknown; token 2 (step 1)
    # claims no predecessor. 你's bytes may be token 1's: every character of the
    # fragment may be, so it is mixed, never step 1's alone.
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.prov(prov(0, 1, [2, 3], [A, T], 2, **FIN)),
    )
    tokens = [wire.TextToken(1, b"", 0, UNKNOWN), wire.TextToken(2, "你b".encode(), 0, 0)]
    assert _one_text_record(run, [*tokens, wire.TextToken(3, b"c", 0, 0)]) == [
        ("span", 0, 0, "你b", None, 0, 2, None),
        ("span", 0, 4, "c", 1, 2, 1, T),
        ("exact", 0),
    ]
    # The unclaimed token in the carrier's step (and role): colored.
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.prov(prov(0, 1, [2, 3, 4], [A, A, T], 3, **FIN)),
    )
    tokens = [
        wire.TextToken(1, b"a", 0, 0),
        wire.TextToken(2, b"", 0, UNKNOWN),
        wire.TextToken(3, "你b".encode(), 0, 0),
        wire.TextToken(4, b"c", 0, 0),
    ]
    assert _one_text_record(run, tokens) == [
        ("span", 0, 0, "a", 0, 0, 1, P),
        ("span", 0, 1, "你b", 1, 1, 2, A),
        ("span", 0, 5, "c", 1, 3, 1, T),
        ("exact", 0),
    ]
    # Claimed predecessors with known gives, and an earlier unclaimed one of unknown
    # give: every character's tokens start at the unclaimed one.
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2], [A, T], 2)),
        run.prov(prov(0, 2, [3, 4], [A, T], 2, **FIN)),
    )
    tokens = [
        wire.TextToken(1, b"", 0, UNKNOWN),
        wire.TextToken(2, b"", 0, 1),
        wire.TextToken(3, b"xy", 1, 1),
        wire.TextToken(4, b"z", 0, 0),
    ]
    assert _one_text_record(run, tokens) == [
        ("span", 0, 0, "x", 0, 0, 2, None),
        ("span", 0, 1, "y", None, 0, 3, None),
        ("span", 0, 2, "z", 1, 3, 1, T),
        ("exact", 0),
    ]


def test_usage_chunks_that_repeat_themselves_add_nothing_and_lose_nothing() -> None:
    # vLLM's continuous usage (a running count in every chunk) and the final usage
    # chunk with the per-step lists, repeated: exact, cross-checked.
    run = Run(num_streams=2)
    honest(run, usage=[(3, [1], [1]), (3, None, None), (3, [1], [1])])
    assert run.rec.verdict(0) == ("exact", None)
    assert run.rec.stream_stats(0)["metrics_steps"] == 1


def test_sse_releases_a_character_later_than_its_first_token() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.text(text(0, 0, [tok(1, b"")], b"")),
        run.prov(prov(0, 1, [2], [P], 0, finished=True, finish_reason=1)),
        run.text(text(0, 1, [tok(2, NI, 1)], NI, **FIN)),
    )
    run.sse(0, "", [1])  # the chunk of the first token carries no text
    assert run.events() == []
    run.sse(0, "日", [2])
    assert run.events() == [("span", 0, 0, "日", None, 0, 2, P)]
    run.finish(0)
    assert run.events() == [("exact", 0)]


def test_http_holdback_delays_the_span_until_the_text_is_released() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.text(text(0, 0, [tok(1, "ab")], "a")),  # 'b' held back (stop string '</')
    )
    run.sse(0, "a", [1])
    assert run.events() == []  # the fragment 'ab' is not yet all in H
    run.push(
        run.prov(prov(0, 1, [2], [P], 0, finished=True, finish_reason=2)),
        run.text(text(0, 1, [tok(2, "c")], "bc", finished=True, finish_reason=2)),
    )
    run.sse(0, "bc", [2], finish=True, reason="length")
    assert run.events() == [
        ("span", 0, 0, "ab", 0, 0, 1, P),
        ("span", 0, 2, "c", 1, 1, 1, P),
        ("exact", 0),
    ]


def test_coalesced_sse_chunk_merging_two_steps() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.text(text(0, 0, [tok(1, "x")], "x")),
        run.prov(prov(0, 1, [2, 3], [A, T], 2, finished=True, finish_reason=1)),
        run.text(text(0, 1, [tok(2, "y"), tok(3, "z")], "yz", **FIN)),
    )
    run.sse(0, "xyz", [1, 2, 3], finish=True)
    # One chunk proves both steps: spans per step and role, never one across steps.
    assert run.events() == [
        ("span", 0, 0, "x", 0, 0, 1, P),
        ("span", 0, 1, "y", 1, 1, 1, A),
        ("span", 0, 2, "z", 1, 2, 1, T),
        ("exact", 0),
    ]
    stats = run.rec.stream_stats(0)
    assert (stats["accepted"], stats["target"], stats["plain"]) == (1, 1, 1)
    assert stats["drafts_scheduled"] == 2
    assert stats["hist"] == {1: 1, 2: 1}


def test_fragments_of_one_step_proven_by_different_inputs_stay_separate_spans() -> None:
    # The HTTP text of step 1 holds back "zw": those fragments are proven by step 2's
    # chunk, "y" by step 1's.
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2, 3], [A, A, B], 2)),
        run.text(text(0, 0, [tok(1, "y"), tok(2, "z"), tok(3, "w")], "y")),
    )
    run.sse(0, "y", [1, 2, 3])
    run.push(
        run.prov(prov(0, 3, [4], [P], 0, **FIN)),
        run.text(text(0, 3, [tok(4, "!")], "zw!", **FIN)),
    )
    run.sse(0, "zw!", [4], finish=True)
    # Merging never spans two inputs, so it cannot depend on when drain() runs.
    assert run.events() == [
        ("span", 0, 0, "y", 0, 0, 1, A),
        ("span", 0, 1, "z", 0, 1, 1, A),
        ("span", 0, 2, "w", 0, 2, 1, B),
        ("span", 0, 3, "!", 1, 3, 1, P),
        ("exact", 0),
    ]


def test_an_sse_chunk_ending_inside_a_text_record_fails_once_that_record_is_proven() -> None:
    # SSE text in pieces that do not align with the step: its bytes are proven as they
    # come, then the first chunk's end is a contradiction.
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2], [A, T], 2, **FIN)),
        run.text(text(0, 0, [tok(1, "ab"), tok(2, "cd")], "abcd", **FIN)),
    )
    run.sse(0, "a", [1])
    assert run.events() == []
    run.sse(0, "bc", [2])
    assert run.events() == [("span", 0, 0, "ab", 0, 0, 1, A)]
    run.sse(0, "d", [], finish=True)
    assert run.events() == [
        ("span", 0, 2, "cd", 0, 1, 1, T),
        ("failed", 0, "stream 0: an SSE chunk ends at offset 1 (byte 1), inside a text record"),
    ]


def test_stop_string_026_style_keeps_ids_and_truncates_text() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2], [A, B], 1)),
        run.text(text(0, 0, [tok(1, "x EN"), tok(2, "D more")], "x", **FIN, text_truncated=True)),
        run.prov(prov(0, 2, [3, 4], [A, T], 3)),  # the scheduler ran on before the abort
    )
    run.sse(0, "x", [1, 2], finish=True)
    assert run.events() == [("span", 0, 0, "x", 0, 0, 1, A), ("exact", 0)]
    stats = run.rec.stream_stats(0)
    assert (stats["tokens"], stats["steps"], stats["accepted"], stats["bonus"]) == (2, 1, 1, 1)
    assert (stats["surplus_tokens"], stats["surplus_accepted"], stats["surplus_target"]) == (
        2,
        1,
        1,
    )
    assert stats["hist"] == {2: 1, 0: 1}
    assert stats["drafts_scheduled"] == 4
    assert stats["bytes"] == 1


def test_stop_string_033_style_trims_surplus_tokens_with_extra_provenance() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1, 2, 3], [A, A, B], 2)),
        run.text(
            text(
                0, 0, [tok(1, "ok<"), tok(2, "END>")], "ok", **FIN, text_truncated=True,
                tokens_trimmed=True, trimmed_tokens=1,
            )
        ),
    )  # fmt: skip
    run.sse(0, "ok", [1, 2], finish=True)
    assert run.events() == [("span", 0, 0, "ok", 0, 0, 1, A), ("exact", 0)]
    stats = run.rec.stream_stats(0)
    assert (stats["tokens"], stats["accepted"], stats["surplus_tokens"]) == (2, 2, 1)
    assert stats["surplus_bonus"] == 1
    assert stats["hist"] == {2: 1}


def test_surplus_provenance_arriving_before_the_finishing_text() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0)),
        run.prov(prov(0, 1, [2, 3], [A, B], 1)),  # surplus, not yet known to be
        run.text(text(0, 0, [tok(1, "a.")], "a", **FIN, text_truncated=True)),
    )
    run.sse(0, "a", [1], finish=True)
    assert run.events() == [("span", 0, 0, "a", 0, 0, 1, P), ("exact", 0)]
    assert run.rec.stream_stats(0)["surplus_tokens"] == 2


def test_finished_text_record_with_no_tokens() -> None:
    run = Run()
    run.push(
        run.prov(prov(0, 0, [1], [P], 0, finished=True, finish_reason=2)),
        run.text(text(0, 0, [tok(1, "ab")], "")),
        run.text(text(0, 1, [], "ab", finished=True, finish_reason=2)),
    )
    run.sse(0, "", [1])
    run.sse(0, "ab", [], finish=True, reason="length")
    assert run.events() == [("span", 0, 0, "ab", 0, 0, 1, P), ("exact", 0)]


def test_streams_are_independent() -> None:
    run = Run(num_streams=2)
    run.push(
        run.prov(prov(0, 0, [1], [P], 0, finished=True, finish_reason=1),
                 prov(1, 0, [7], [P], 0)),
        run.text(text(0, 0, [tok(1, "a")], "a", **FIN), text(1, 0, [tok(7, "z")], "z")),
    )  # fmt: skip
    run.sse(1, "z", [7])
    run.sse(0, "a", [1], finish=True)
    assert run.events() == [
        ("span", 1, 0, "z", 0, 0, 1, P),
        ("span", 0, 0, "a", 0, 0, 1, P),
        ("exact", 0),
    ]
    assert run.rec.verdict(1) == ("pending", None)
    totals = run.rec.totals()
    assert (totals["tokens"], totals["plain"], totals["bytes"]) == (2, 2, 2)


# ------------------------------------------------------- sequence handling


def test_duplicate_frame_is_discarded_and_counted() -> None:
    run = Run()
    hello = run.hello(SCHED, wire.SOURCE_SCHEDULER, seq=0)
    frame = run.prov(prov(0, 0, [1], [P], 0))
    run.push(frame, frame)
    assert run.rec.counters()["duplicate_frames"] == 1
    assert run.events() == []
    # A byte-identical copy of the hello (seq 0, released long ago): counted only.
    first = Run(hellos=False)
    first.push(hello, hello)
    assert first.rec.counters()["duplicate_frames"] == 1
    assert first.events() == []


def test_buffered_duplicate_is_discarded() -> None:
    run = Run()
    early = run.prov(prov(0, 1, [2], [P], 0), seq=2)
    run.push(early, early)
    assert run.rec.counters()["duplicate_frames"] == 1


def test_reordering_within_the_window_gives_the_in_order_result() -> None:
    in_order = simple_exact_run()
    expected = in_order.events()
    run = Run()
    first_p = run.prov(prov(0, 0, [10], [P], 0))
    first_t = run.text(text(0, 0, [tok(10, "Hi")], "Hi"))
    second_p = run.prov(prov(0, 1, [11, 12], [A, B], 1, finished=True, finish_reason=1))
    second_t = run.text(text(0, 1, [tok(11, " a"), tok(12, "b")], " ab", **FIN))
    run.push(second_t, second_p, first_t)
    run.sse(0, "Hi", [10])
    run.sse(0, " ab", [11, 12], finish=True)
    assert run.events() == []
    run.push(first_p)
    assert run.events() == expected
    assert run.rec.stream_stats(0) == in_order.rec.stream_stats(0)


def test_gap_beyond_the_window_fails_every_stream_without_a_final_verdict() -> None:
    run = Run(num_streams=2)
    run.push(run.prov(prov(1, 0, [5], [P], 0, finished=True, finish_reason=1)))
    run.push(run.text(text(1, 0, [tok(5, "q")], "q", **FIN)))
    run.sse(1, "q", [5], finish=True)
    assert run.events()[-1] == ("exact", 1)
    run.seq[SCHED] += 1  # seq 2 is lost
    for offset in range(64):
        run.push(run.prov(prov(0, offset, [1], [P], 0)))
    assert run.events() == []
    run.push(run.prov(prov(0, 64, [1], [P], 0)))
    reason = f"frames lost: gap in source {SCHED:016x} at seq 2"
    # The complete stream is revoked too: the lost frame may have been a notice for it.
    assert run.events() == [("failed", 0, reason), ("failed", 1, reason)]
    assert run.rec.verdict(0) == ("failed", reason)
    assert run.rec.verdict(1) == ("failed", reason)
    assert run.rec.counters()["gaps"] == 1


def test_dropped_counter_fails_every_stream_without_a_final_verdict() -> None:
    run = Run(num_streams=2)
    run.push(run.prov(prov(0, 0, [1], [P], 0), dropped=3))
    reason = f"frames lost: source {SCHED:016x} dropped 3 frames before seq 1"
    assert run.events() == [("failed", 0, reason), ("failed", 1, reason)]
    assert run.rec.counters()["dropped_reported"] == 3
    # An exact stream is revoked too (a lost frame may have been a notice for it),
    # until finalize().
    run = Run(num_streams=2)
    honest(run)
    run.events()
    run.push(run.prov(prov(1, 0, [1], [P], 0), dropped=1))
    reason = f"frames lost: source {SCHED:016x} dropped 1 frames before seq 3"
    assert run.events() == [("failed", 0, reason), ("failed", 1, reason)]
    run = Run(num_streams=1)
    honest(run)
    run.rec.finalize()
    run.push(run.prov(prov(0, 3, [1], [P], 0), dropped=1))
    assert run.rec.verdict(0) == ("exact", None)


def test_a_second_hello_is_rejected_when_identical_and_a_run_failure_when_not() -> None:
    run = Run(num_streams=1)
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER))
    assert run.events() == [("run", f"rejected frame: second hello from source {SCHED:016x}")]
    run.k = 2
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER))
    message = f"source {SCHED:016x}: a second hello that differs from its first"
    assert run.events() == [("run", message), ("failed", 0, message)]


def test_notice_for_one_stream_and_for_the_whole_run() -> None:
    run = Run(num_streams=3)
    run.push(run.notice(1, "stream_interval is 4", wire.NOTICE_STREAM_INTERVAL))
    assert run.events() == [
        ("failed", 1, f"not exact: stream_interval is 4 (notice 1 from source {FRONT:016x})")
    ]
    run.push(run.notice(wire.ALL_STREAMS, "n=2", wire.NOTICE_N))
    reason = f"not exact: n=2 (notice 2 from source {FRONT:016x})"
    assert run.events() == [("failed", 0, reason), ("failed", 2, reason)]


def test_frame_of_a_foreign_run_is_rejected() -> None:
    run = Run()
    run.push(
        wire.encode_records(
            wire.KIND_NOTICE,
            run.header(SCHED, 1, run=OTHER_RUN),
            [wire.NoticeRecord(0, 1, "x")],
        )
    )
    assert run.events() == [("run", f"rejected frame: frame for run {OTHER_RUN}, expected {RUN}")]
    assert run.rec.counters()["rejected_frames"] == 1
    assert run.rec.verdict(0) == ("pending", None)


def test_undecodable_frame_is_rejected_with_the_decode_error() -> None:
    run = Run()
    run.push(b"PHUE")
    assert run.events() == [("run", "rejected frame: truncated frame: 4 bytes, header needs 64")]
    assert run.rec.counters()["rejected_frames"] == 1
    assert run.rec.counters()["frames"] == 3


def test_records_for_streams_beyond_the_run_are_foreign() -> None:
    run = Run(num_streams=1)
    run.push(run.prov(prov(1, 0, [1], [P], 0), prov(9, 0, [1], [P], 0)))
    run.push(run.notice(4, "x"))
    assert run.rec.counters()["foreign_records"] == 3
    assert run.events() == []


def test_sources_lists_each_hello() -> None:
    run = Run()
    assert run.rec.sources() == [
        {
            "source_id": SCHED,
            "role": "scheduler",
            "engine": "simulated",
            "role_derivation": "draft_ids",
            "async_scheduling": False,
            "num_speculative_tokens": 3,
            "plugin_version": "0.2.0",
            "engine_version": "sim-1",
            "spec_method": "ngram",
            "verification": "standard",
        },
        {
            "source_id": FRONT,
            "role": "frontend",
            "engine": "simulated",
            "role_derivation": "none",
            "async_scheduling": False,
            "num_speculative_tokens": 0,
            "plugin_version": "0.2.0",
            "engine_version": "sim-1",
            "spec_method": "",
            "verification": "none",
        },
    ]


def test_second_hello_is_rejected() -> None:
    run = Run()
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER))
    assert run.events() == [("run", f"rejected frame: second hello from source {SCHED:016x}")]
    assert run.rec.counters()["rejected_frames"] == 1
    assert len(run.rec.sources()) == 2


def test_kind_not_allowed_for_the_source_role_is_a_run_failure() -> None:
    run = Run(num_streams=2)
    run.push(
        wire.encode_records(
            wire.KIND_TEXT, run.header(SCHED, None), [text(0, 0, [tok(1, "a")], "a")]
        )
    )
    message = f"source {SCHED:016x}: text frame from a scheduler source"
    assert run.events() == [("run", message), ("failed", 0, message), ("failed", 1, message)]


def test_first_frame_not_a_hello_is_a_run_failure() -> None:
    run = Run(hellos=False)
    run.push(run.prov(prov(0, 0, [1], [P], 0)))
    message = f"source {SCHED:016x}: provenance frame before its hello"
    assert run.events() == [("run", message), ("failed", 0, message)]


# ------------------------------------------------------ per-stream failures


def test_scheduler_and_detokenizer_disagree() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, "a"), tok(2, "b")], "ab")))
    run.push(run.prov(prov(0, 0, [1, 3], [A, T], 2)))
    assert run.events() == [("failed", 0, "token mismatch at offset 1: scheduler 3, detokenizer 2")]


def test_detokenizer_and_sse_disagree() -> None:
    run = Run()
    run.sse(0, "ab", [1, 2])
    run.push(run.text(text(0, 0, [tok(1, "a"), tok(5, "b")], "ab")))
    assert run.events() == [("failed", 0, "token mismatch at offset 1: detokenizer 5, SSE 2")]


def test_sse_token_changed_after_text() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, "a")], "a")))
    run.sse(0, "a", [4000000000])
    assert run.events() == [
        ("failed", 0, "token mismatch at offset 0: detokenizer 1, SSE 4000000000")
    ]


def test_fragment_differs_from_http_delta() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1, 2], [A, B], 1)))
    run.push(run.text(text(0, 0, [tok(1, "ab"), tok(2, "cd")], "abcD")))
    run.sse(0, "abcD", [1, 2])
    assert run.events() == [
        ("span", 0, 0, "ab", 0, 0, 1, A),
        ("failed", 0, "byte mismatch at offset 1 (byte 3): detokenizer fragment vs HTTP delta"),
    ]


def test_http_delta_differs_from_sse() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1, 2], [A, B], 1)))
    run.push(run.text(text(0, 0, [tok(1, "ab"), tok(2, "cd")], "abcd")))
    run.sse(0, "Abcd", [1, 2])
    assert run.events() == [
        ("failed", 0, "byte mismatch at offset 0 (byte 0): HTTP delta vs SSE"),
    ]


def test_span_back_beyond_pending_tokens() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, b""), tok(2, "x"), tok(3, NI, 2)], "x日")))
    assert run.events() == [
        ("failed", 0, "stream 0: span_back 2 at offset 2 exceeds 0 pending tokens")
    ]


def test_non_contiguous_offsets() -> None:
    run = Run(num_streams=2)
    run.push(run.prov(prov(0, 1, [1], [P], 0)))
    run.push(run.text(text(1, 0, [tok(1, "a")], "a"), text(0, 2, [tok(1, "a")], "a")))
    assert run.events() == [
        ("failed", 0, "provenance offset 1 for stream 0, expected 0"),
    ]
    run2 = Run()
    run2.push(run2.text(text(0, 3, [tok(1, "a")], "a")))
    assert run2.events() == [("failed", 0, "text offset 3 for stream 0, expected 0")]


def test_second_source_for_a_stream() -> None:
    run = Run()
    other = 0x77
    run.push(run.prov(prov(0, 0, [1], [P], 0)))
    run.push(run.hello(other, wire.SOURCE_SCHEDULER, seq=0))
    run.push(
        wire.encode_records(
            wire.KIND_PROVENANCE,
            wire.Header(bytes.fromhex(RUN), other, 1, 0, 0),
            [prov(0, 1, [2], [P], 0)],
        )
    )
    assert run.events() == [
        ("failed", 0, f"stream 0: provenance from a second source {other:016x}")
    ]
    run2 = Run()
    run2.push(run2.text(text(0, 0, [tok(1, "a")], "a")))
    run2.push(run2.hello(other, wire.SOURCE_FRONTEND, seq=0))
    run2.push(
        wire.encode_records(
            wire.KIND_TEXT,
            wire.Header(bytes.fromhex(RUN), other, 1, 0, 0),
            [text(0, 1, [tok(2, "b")], "b")],
        )
    )
    assert run2.events() == [("failed", 0, f"stream 0: text from a second source {other:016x}")]


def test_text_after_finish() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, "a")], "a", **FIN)))
    run.push(run.text(text(0, 1, [tok(2, "b")], "b")))
    assert run.events() == [("failed", 0, "stream 0: text after finish")]


def test_http_text_beyond_fragments() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, "a")], "ab")))
    assert run.events() == [
        ("failed", 0, "stream 0: HTTP text extends beyond the detokenized fragments at byte 1")
    ]


def test_sse_text_beyond_http_text_once_finished() -> None:
    run = Run()
    run.sse(0, "abc", [1])  # before the text finished this is just early
    assert run.events() == []
    run.push(run.text(text(0, 0, [tok(1, "ab")], "ab", **FIN)))
    assert run.events() == [
        ("failed", 0, "stream 0: SSE text extends beyond the HTTP text at byte 2")
    ]


def test_provenance_beyond_the_end_of_the_request() -> None:
    run = Run()
    run.push(run.text(text(0, 0, [tok(1, "a")], "a", **FIN)))
    run.push(run.prov(prov(0, 0, [1, 2], [A, T], 2)))
    assert run.events() == [
        ("failed", 0, "stream 0: provenance beyond the end of the request at offset 1")
    ]
    run2 = Run()
    run2.push(run2.prov(prov(0, 0, [1, 2], [A, T], 2)))
    run2.push(run2.text(text(0, 0, [tok(1, "a")], "a", **FIN)))
    assert run2.events() == [
        ("failed", 0, "stream 0: provenance beyond the end of the request at offset 1")
    ]


def test_late_notice_before_finalize_revokes_an_exact_verdict() -> None:
    run = simple_exact_run()
    run.events()
    before = run.rec.stream_stats(0)
    run.push(run.notice(0, "late"))
    reason = f"not exact: late (notice 5 from source {FRONT:016x})"
    assert run.events() == [("failed", 0, reason)]
    assert run.rec.verdict(0) == ("failed", reason)
    assert run.rec.stream_stats(0) == before
    run.push(run.notice(0, "later"))
    assert run.events() == []  # one verdict change at most


def test_after_finalize_nothing_changes_and_late_frames_are_counted_once() -> None:
    run = simple_exact_run()
    run.events()
    run.rec.finalize()
    run.push(run.notice(0, "late"), run.notice(wire.ALL_STREAMS, "later"))
    run.sse(0, "zzz", [99], finish=True)
    message = "telemetry arrived after the verdicts were final: not used (counted in late_frames)"
    assert run.events() == [("run", message)]
    assert run.rec.verdict(0) == ("exact", None)
    counters = run.rec.counters()
    assert (counters["late_frames"], counters["frames"]) == (2, 8)


# ------------------------------------------------------------- finalize


def finalize(run: Run) -> tuple[str, str | None]:
    run.rec.finalize()
    return run.rec.verdict(0)


def test_finalize_rule_1_gap_with_buffered_frames() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1], [P], 0), seq=5))
    assert finalize(run) == ("failed", f"frames lost: gap in source {SCHED:016x} at seq 1")


def test_finalize_gap_revokes_an_exact_stream() -> None:
    # A frame lost behind an exact stream may have been its notice.
    run = Run(num_streams=1)
    honest(run)
    assert run.events()[-1] == ("exact", 0)
    run.push(run.prov(prov(0, 3, [1], [P], 0), seq=run.seq[SCHED] + 1))
    assert run.events() == []
    run.rec.finalize()
    lost = f"frames lost: gap in source {SCHED:016x} at seq 3"
    assert run.events() == [("failed", 0, lost)]
    assert run.rec.verdict(0) == ("failed", lost)


def test_finalize_rule_2_no_frames() -> None:
    run = Run(hellos=False)
    run.sse(0, "a", [1], finish=True)
    assert finalize(run) == ("failed", "missing telemetry: no frames received for this run")


def test_finalize_rule_3_sse_not_finished() -> None:
    run = Run()
    run.sse(0, "a", [1])
    assert finalize(run) == ("failed", "stream 0: SSE did not finish")


def test_finalize_rule_4_no_provenance() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1], [P], 0)))
    run.push(run.text(text(0, 0, [tok(1, "a"), tok(2, "b")], "ab", **FIN)))
    run.sse(0, "ab", [1, 2], finish=True)
    assert finalize(run) == ("failed", "missing telemetry: no provenance for offset 1")


def test_finalize_rule_5_no_text_frame() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1, 2], [A, T], 3)))
    run.push(run.text(text(0, 0, [tok(1, "a")], "a")))
    run.sse(0, "ab", [1, 2], finish=True)
    assert finalize(run) == ("failed", "missing telemetry: no text frame for offset 1")


def test_finalize_rule_6_text_not_finished() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1], [P], 0)))
    run.push(run.text(text(0, 0, [tok(1, "a")], "a")))
    run.sse(0, "a", [1], finish=True)
    assert finalize(run) == ("failed", "missing telemetry: text not finished at offset 1")


def test_finalize_rule_7_the_scheduler_did_not_finish() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1], [P], 0)))
    run.push(run.text(text(0, 0, [tok(1, "a")], "a", **FIN)))
    run.sse(0, "a", [1], finish=True)
    assert run.events() == [("span", 0, 0, "a", 0, 0, 1, P)]  # shown, but not exact
    assert finalize(run) == (
        "failed",
        "missing telemetry: the scheduler did not finish the request at offset 1",
    )


def test_finalize_rule_8_sse_text_shorter() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1], [P], 0, **FIN)))
    run.push(run.text(text(0, 0, [tok(1, "abc")], "abc", **FIN)))
    run.sse(0, "a", [1], finish=True)
    assert finalize(run) == (
        "failed",
        "stream 0: SSE text shorter than the HTTP text (1 of 3 bytes)",
    )


def test_finalize_rule_9_token_counts_differ() -> None:
    run = Run()
    run.push(run.prov(prov(0, 0, [1, 2], [A, T], 2, **FIN)))
    run.push(run.text(text(0, 0, [tok(1, "a"), tok(2, "b")], "ab", **FIN)))
    run.sse(0, "ab", [1], finish=True)
    assert finalize(run) == ("failed", "stream 0: 1 SSE tokens, 2 detokenized tokens")


def test_http_text_cut_without_text_truncated_fails_at_once() -> None:
    # The text finished without a stop string but HTTP stopped inside the fragment 'cd'.
    run = Run()
    run.push(run.prov(prov(0, 0, [1, 2], [A, B], 1)))
    run.push(run.text(text(0, 0, [tok(1, "ab"), tok(2, "cd")], "abc", **FIN)))
    assert run.events() == [
        (
            "failed",
            0,
            "stream 0: the HTTP text is shorter than the fragments (3 of 4 bytes) "
            "without text_truncated",
        )
    ]


def test_finalize_leaves_decided_streams_alone_and_is_idempotent() -> None:
    run = simple_exact_run()
    run.events()
    run.rec.finalize()
    run.rec.finalize()
    assert run.events() == []
    assert run.rec.verdict(0) == ("exact", None)


# ----------------------------------------------------------------- API


def test_api_validation_messages() -> None:
    with pytest.raises(ValueError) as caught:
        Reconciler("AB" * 16, 1)
    assert (
        str(caught.value) == f"invalid run id '{'AB' * 16}': expected 32 lowercase hex characters"
    )
    with pytest.raises(ValueError) as caught:
        Reconciler("ab", 1)
    assert str(caught.value) == "invalid run id 'ab': expected 32 lowercase hex characters"
    for count in (0, 65536):
        with pytest.raises(ValueError) as caught:
            Reconciler(RUN, count)
        assert str(caught.value) == f"num_streams {count} out of range 1..=65535"
    rec = Reconciler(RUN, 2)
    for call in (
        lambda: rec.push_sse(2, "", []),
        lambda: rec.push_sse(-1, "", []),
        lambda: rec.finish_sse(2, "stop"),
        lambda: rec.push_sse_id(2, "x"),
        lambda: rec.push_sse_choice(-1, 1),
        lambda: rec.push_sse_usage(2, None, None, None),
        lambda: rec.stream_stats(5),
        lambda: rec.verdict(2),
    ):
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value).startswith("stream ")
        assert str(caught.value).endswith(" out of range 0..2")
    for bad in (-1, 2**32):
        with pytest.raises(ValueError) as caught:
            rec.push_sse(0, "", [1, bad])
        assert str(caught.value) == f"token id {bad} out of range 0..=4294967295"
    assert rec.verdict(0) == ("pending", None)


def test_push_frames_equals_push_frame_one_by_one() -> None:
    one = simple_exact_run()
    frames = []
    builder = Run()
    builder.rec = Reconciler(RUN, 1)
    builder.seq = {SCHED: 0, FRONT: 0}
    frames = [
        builder.hello(SCHED, wire.SOURCE_SCHEDULER),
        builder.hello(FRONT, wire.SOURCE_FRONTEND),
        builder.prov(prov(0, 0, [10], [P], 0)),
        builder.text(text(0, 0, [tok(10, "Hi")], "Hi")),
        builder.prov(prov(0, 1, [11, 12], [A, B], 1, finished=True, finish_reason=1)),
        builder.text(text(0, 1, [tok(11, " a"), tok(12, "b")], " ab", **FIN)),
    ]
    batch = Reconciler(RUN, 1)
    batch.push_frames(frames)
    batch.push_sse_id(0, chunk_id(0))
    batch.push_sse(0, "Hi ab", [10, 11, 12])
    batch.finish_sse(0, "stop")
    assert batch.drain() == one.events()
    assert batch.totals() == one.rec.totals()


# ------------------------------------------------- generated workloads (oracle sanity)

SMALL = {"num_streams": (1, 3), "tokens": (1, 30), "k": (0, 4)}


@settings(max_examples=200, deadline=None)
@given(workload=workloads.workloads(**SMALL))
def test_generated_workloads_end_all_exact_with_the_generator_truth(workload: Any) -> None:
    rec = Reconciler(workload.run_id, workload.num_streams)
    workloads.feed(rec, workload.inputs)
    rec.finalize()
    assert [rec.verdict(i) for i in range(workload.num_streams)] == [
        ("exact", None)
    ] * workload.num_streams
    totals = rec.totals()
    assert {key: totals[key] for key in workload.expected_totals()} == workload.expected_totals()
    events = rec.drain()
    # Every character shown with the step and role its tokens have, never another.
    assert workloads.attribution_errors(workload, events) == []
    spans = [event for event in events if event[0] == "span"]
    for index, truth in enumerate(workload.truth):
        # The spans of a stream tile its text exactly, in order.
        pieces = [event for event in spans if event[1] == index]
        assert "".join(event[3] for event in pieces) == truth.text
        starts = [event[2] for event in pieces]
        assert starts == sorted(starts)


@settings(max_examples=200, deadline=None)
@given(workload=workloads.mutated_workloads(**SMALL))
def test_mutated_workloads_never_give_an_affected_stream_exact(workload: Any) -> None:
    rec = Reconciler(workload.run_id, workload.num_streams)
    workloads.feed(rec, workload.inputs)
    rec.finalize()
    verdicts = [rec.verdict(i)[0] for i in range(workload.num_streams)]
    if workload.benign:
        assert verdicts == ["exact"] * workload.num_streams
    else:
        assert all(verdicts[i] == "failed" for i in workload.affected)


# --------------------------------------------- lying senders (issue 9): one lie each
# Each case starts from the honest run of `honest()` and changes one thing a lying
# sender controls; the stream must fail with exactly that reason and never be exact.

FIN_LENGTH = {"finished": True, "finish_reason": wire.FINISH_LENGTH}


def honest(
    run: Run,
    *,
    p_fin: dict[str, Any] | None = None,
    t_fin: dict[str, Any] | None = None,
    second_p_step: int | None = None,
    second_t_step: int | None = None,
    sse_reason: str | None = "stop",
    sse_ids: list[int] | None = None,
    usage: Sequence[tuple[int | None, list[int] | None, list[int] | None]] = (),
) -> None:
    """Stream 0: "Hi" (plain), then " a" "b" (accepted, bonus), finished with stop;
    `usage` chunks after the last delta."""
    run.push(run.prov(prov(0, 0, [10], [P], 0)), run.text(text(0, 0, [tok(10, "Hi")], "Hi")))
    run.sse(0, "Hi", [10])
    run.push(
        run.prov(prov(0, 1, [11, 12], [A, B], 1, **(p_fin or FIN)), step=second_p_step),
        run.text(
            text(0, 1, [tok(11, " a"), tok(12, "b")], " ab", **(t_fin or FIN)), step=second_t_step
        ),
    )
    run.sse(0, " ab", [11, 12] if sse_ids is None else sse_ids)
    for count, accepted, drafted in usage:
        run.rec.push_sse_usage(0, count, accepted, drafted)
    run.finish(0, sse_reason)


def _restart(run: Run, k: int = 3) -> None:
    """Start `run` over with fresh sources: a scheduler announcing K (0: none)."""
    run.rec = type(run.rec)(RUN, 2)
    run.seq = {SCHED: 0, FRONT: 0}
    run.step = {SCHED: 0, FRONT: 0}
    run.k = k


def _frontend_hello(engine_version: str) -> bytes:
    return wire.encode_hello(
        wire.Header(bytes.fromhex(RUN), FRONT, 0, 0, 0),
        wire.Hello(wire.SOURCE_FRONTEND, wire.ENGINE_SIMULATED, 0, False, 0, "0.2.0",
                   engine_version, "", 0),
    )  # fmt: skip


def _gives(gives: list[int], span_back: int, lead: int, before: int = 0) -> Any:
    """'日' (3 bytes) split over len(gives) empty tokens and a carrier; `before` empty
    tokens with a give of 1 come first (unclaimed when span_back does not reach them)."""

    def lie(run: Run) -> None:
        empties = [wire.TextToken(20, b"", 0, 1) for _ in range(before)]
        empties += [wire.TextToken(21 + i, b"", 0, g) for i, g in enumerate(gives)]
        carrier = wire.TextToken(30, "日".encode(), span_back, lead)
        # The predecessors in earlier records (a frame each) than their carrier.
        for at in range(0, len(empties), 200):
            run.push(run.text(text(0, at, empties[at : at + 200], "")))
        run.push(run.text(text(0, len(empties), [carrier], "日", **FIN)))

    return lie


def _lie_step_repeat(run: Run) -> None:
    honest(run, second_p_step=1)  # the hello was step 0, the first record step 1


def _lie_step_back(run: Run) -> None:
    run.step[SCHED] = 5
    run.push(run.prov(prov(0, 0, [10], [P], 0)), run.text(text(0, 0, [tok(10, "Hi")], "Hi")))
    run.push(run.prov(prov(0, 1, [11, 12], [A, B], 1, **FIN), step=2))


def _lie_text_step_repeat(run: Run) -> None:
    honest(run, second_t_step=1)


def _lie_text_step_back(run: Run) -> None:
    run.step[FRONT] = 5
    run.push(run.text(text(0, 0, [tok(10, "Hi")], "Hi")))
    run.push(run.text(text(0, 1, [tok(11, " a")], " a"), step=1))


def _lie_after_finished(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [P], 0, **FIN)), run.prov(prov(0, 1, [11], [P], 0)))


def _lie_after_trimmed(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [A], 1, trimmed=True)), run.prov(prov(0, 1, [11], [P], 0)))


def _lie_text_after_scheduler_end(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [P], 0, **FIN)))
    run.push(run.text(text(0, 0, [tok(10, "H"), tok(11, "i")], "Hi", **FIN)))


def _lie_sse_after_scheduler_end(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [P], 0, **FIN)))
    run.sse(0, "Hi", [10, 11])


def _lie_finish_reasons(run: Run) -> None:
    honest(run, p_fin=FIN_LENGTH)


def _lie_text_abort(run: Run) -> None:
    honest(run, t_fin={"finished": True, "finish_reason": wire.FINISH_ABORT})


def _lie_sse_reason(run: Run) -> None:
    honest(run, sse_reason="length")


def _lie_sse_reason_null(run: Run) -> None:
    honest(run, sse_reason=None)


def _lie_sse_beyond_text(run: Run) -> None:
    honest(run, sse_ids=[11, 12, 13])


def _lie_duplicate_differs(run: Run) -> None:
    frame = run.prov(prov(0, 0, [10], [P], 0))
    forged = frame[:60] + frame[60:].replace(b"\x0a\x00\x00\x00", b"\x0b\x00\x00\x00")
    run.push(frame, forged)


def _lie_drafts_beyond_k(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [P], 0), prov(1, 0, [1, 2], [A, T], 4)))


def _lie_roles_without_speculation(run: Run) -> None:
    _restart(run, k=0)
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER), run.hello(FRONT, wire.SOURCE_FRONTEND))
    honest(run)


def _lie_hello_pair(run: Run) -> None:
    _restart(run)
    run.seq[FRONT] = 1
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER), _frontend_hello("sim-2"))
    honest(run)


def _lie_truncated_not_shorter(run: Run) -> None:
    run.push(
        run.prov(prov(0, 0, [10], [P], 0)),
        run.text(text(0, 0, [tok(10, "Hi")], "Hi", **FIN, text_truncated=True)),
    )


def _lie_stop_without_token(run: Run) -> None:
    run.push(run.text(text(0, 0, [], "", **FIN, tokens_trimmed=True)))


def _lie_trim_tie(run: Run) -> None:
    # The step kept 2 tokens after the text's end, but the text says none were trimmed.
    run.push(
        run.prov(prov(0, 0, [10, 11, 12], [A, A, B], 2)),
        run.text(text(0, 0, [tok(10, "Hi<")], "Hi", **FIN, text_truncated=True)),
    )


def _lie_choice(run: Run) -> None:
    run.sse(0, "Hi", [10])
    run.rec.push_sse_choice(0, 1)


def _lie_usage(run: Run) -> None:
    honest(run, usage=[(5, None, None)])


def _lie_usage_early(run: Run) -> None:
    run.rec.push_sse_usage(0, 3, None, None)
    honest(run)


def _lie_usage_corrected(run: Run) -> None:
    honest(run, usage=[(2, None, None), (3, None, None)])


def _lie_metrics_then_none(run: Run) -> None:
    run.rec.push_sse_usage(0, None, [0], [1])
    honest(run, usage=[(3, None, None)])


def _lie_metrics_restated(run: Run) -> None:
    run.rec.push_sse_usage(0, None, [0], [1])
    run.rec.push_sse_usage(0, None, [1], [1])
    honest(run)


def _lie_chunk_id_other_stream(run: Run) -> None:
    run.ids_sent.add(0)
    run.rec.push_sse_id(0, f"chatcmpl-ph1_{RUN}_01")


def _lie_chunk_id_of_a_pd_router(run: Run) -> None:
    # vllm-router's P/D id, as vLLM names the chunks after it; the ph1_ id only in a
    # field nobody checks.
    run.ids_sent.add(0)
    run.rec.push_sse_id(
        0,
        "chatcmpl-___prefill_addr_http://10.0.0.1:8001___decode_addr_http://10.0.0.1:8002_"
        f"9f1c2d3e-ph1_{RUN}_01",
    )


def _lie_chunk_id_changed(run: Run) -> None:
    run.sse(0, "Hi", [10])
    run.rec.push_sse_id(0, chunk_id(0) + "-other")


def _lie_no_chunk_id(run: Run) -> None:
    run.ids_sent.add(0)
    honest(run)


def _lie_sse_after_finish(run: Run) -> None:
    honest(run)
    run.rec.push_sse(0, "!", [])


def _metrics(accepted: list[int] | None, drafted: list[int] | None) -> Any:
    def lie(run: Run) -> None:
        # Before any SSE token: a count would have to be 0 (it counts the SSE tokens so far).
        run.rec.push_sse_usage(0, None, accepted, drafted)
        honest(run)

    return lie


def _lie_metrics_without_scheduler_finish(run: Run) -> None:
    # A stop-string finish: the engine never finished the request, yet metrics came.
    run.push(
        run.prov(prov(0, 0, [10], [P], 0)),
        run.text(text(0, 0, [tok(10, "Hi<")], "Hi", **FIN, text_truncated=True)),
    )
    run.sse(0, "Hi", [10])
    run.rec.push_sse_usage(0, 1, [], [])
    run.finish(0)


def _stop_string_metrics(
    accepted: list[int], drafted: list[int], *, lists_first: bool = False
) -> Any:
    """Stream 0 ends on a stop string in the step at offset 3 (its second token
    trimmed); the scheduler never finishes it. Verify steps at offsets 1 and 3, each
    one accepted draft of one. vLLM's lists arrive after the text (or, with
    `lists_first`, before the scheduler's step holding the stop string)."""

    def lie(run: Run) -> None:
        run.push(
            run.prov(prov(0, 0, [10], [P], 0)),
            run.text(text(0, 0, [tok(10, "Hi")], "Hi")),
            run.prov(prov(0, 1, [11, 12], [A, B], 1)),
            run.text(text(0, 1, [tok(11, " a"), tok(12, "b")], " ab")),
        )
        run.sse(0, "Hi", [10])
        run.sse(0, " ab", [11, 12])
        if lists_first:
            run.rec.push_sse_usage(0, None, accepted, drafted)
        run.push(
            run.text(text(0, 3, [tok(13, "c")], "c", **FIN, tokens_trimmed=True, trimmed_tokens=1)),
        )
        run.sse(0, "c", [13])
        if not lists_first:
            run.rec.push_sse_usage(0, 4, accepted, drafted)
        run.push(run.prov(prov(0, 3, [13, 14], [A, B], 1)))
        run.finish(0)

    return lie


def _lie_chunk_inside_step(run: Run) -> None:
    run.push(run.prov(prov(0, 0, [10], [P], 0)), run.text(text(0, 0, [tok(10, "Hi")], "Hi")))
    run.sse(0, "Hi a", [10])  # " a" moved from step 2's chunk into step 1's (ids stay)
    run.push(
        run.prov(prov(0, 1, [11, 12], [A, B], 1, **FIN)),
        run.text(text(0, 1, [tok(11, " a"), tok(12, "b")], " ab", **FIN)),
    )
    run.sse(0, "b", [11, 12])
    run.finish(0)


def _lie_second_hello(run: Run) -> None:
    run.k = 7
    run.push(run.hello(SCHED, wire.SOURCE_SCHEDULER))
    run.k = 3
    honest(run)


def _lie_loss_after_verdict(run: Run) -> None:
    honest(run)
    run.push(run.prov(prov(1, 0, [1], [P], 0), dropped=1))


def _lie_accepted_padded(run: Run) -> None:
    record = prov(0, 0, [10, 11], [A, T], 2, drafts_padded=2)
    run.push(run.prov(record))


S0 = "stream 0: "
LIES = [
    ("a second record of a stream in one step", _lie_step_repeat,
     f"{S0}two provenance records in step 1"),
    ("provenance steps going back", _lie_step_back, f"{S0}provenance step 2 before step 5"),
    ("a second text record in one step", _lie_text_step_repeat, f"{S0}two text records in step 1"),
    ("text steps going back", _lie_text_step_back, f"{S0}text step 1 before step 5"),
    ("provenance after a finished record", _lie_after_finished,
     f"{S0}provenance at offset 1 after the scheduler finished the request"),
    ("provenance after a trimmed record", _lie_after_trimmed,
     f"{S0}provenance at offset 1 after a trimmed step"),
    ("text beyond the scheduler's finish", _lie_text_after_scheduler_end,
     f"{S0}text token at offset 1 after the scheduler's last step ended at offset 1"),
    ("SSE beyond the scheduler's finish", _lie_sse_after_scheduler_end,
     f"{S0}SSE token at offset 1 after the scheduler's last step ended at offset 1"),
    ("scheduler and detokenizer finish reasons differ", _lie_finish_reasons,
     f"{S0}the scheduler finished the request with 'length', the detokenizer with 'stop'"),
    ("an aborted request", _lie_text_abort,
     f"{S0}the detokenizer finished the request with 'abort'"),
    ("the SSE finish_reason differs", _lie_sse_reason,
     f"{S0}SSE finish_reason 'length', the detokenizer finished with 'stop'"),
    ("no SSE finish_reason", _lie_sse_reason_null,
     f"{S0}SSE finish_reason null, the detokenizer finished with 'stop'"),
    ("SSE tokens beyond the detokenizer's finish", _lie_sse_beyond_text,
     f"{S0}SSE token at offset 3 after the scheduler's last step ended at offset 3"),
    ("a duplicate with other content", _lie_duplicate_differs,
     f"source {SCHED:016x}: seq 1 received twice with different content"),
    ("drafts beyond the hello's K", _lie_drafts_beyond_k,
     "stream 1: 4 drafts scheduled at offset 0, the scheduler's hello says K 3"),
    ("speculative roles under a hello without speculative decoding",
     _lie_roles_without_speculation,
     f"{S0}1 drafts scheduled at offset 1, the scheduler's hello says K 0"),
    ("the two hellos name different engine versions", _lie_hello_pair,
     f"{S0}the scheduler's and the frontend's hellos disagree on engine_version "
     "('sim-1' vs 'sim-2')"),
    ("text_truncated but the HTTP text is whole", _lie_truncated_not_shorter,
     f"{S0}text_truncated, but the HTTP text is not shorter than the fragments (2 of 2 bytes)"),
    ("a stop-string finish without a token", _lie_stop_without_token,
     f"{S0}a stop-string finish without any token"),
    ("trimmed tokens not matching the scheduler's step", _lie_trim_tie,
     f"{S0}the text ends at offset 1 with 0 trimmed tokens, the scheduler's step holding "
     "offset 0 ends at offset 3"),
    ("a second choice", _lie_choice,
     f"{S0}SSE chunk with a choice other than the single choice 0 (index 1)"),
    ("usage.completion_tokens", _lie_usage,
     f"{S0}usage.completion_tokens 5, but the SSE carried 3 tokens"),
    ("usage.completion_tokens before the tokens it counts", _lie_usage_early,
     f"{S0}usage.completion_tokens 3, but the SSE carried 0 tokens"),
    ("a wrong usage count, corrected by the next usage chunk", _lie_usage_corrected,
     f"{S0}usage.completion_tokens 2, but the SSE carried 3 tokens"),
    ("vLLM's metrics contradicting the records, then a usage chunk without them",
     _lie_metrics_then_none,
     f"{S0}vLLM's per-request metrics disagree at verify step 0: 0 accepted of 1 drafted, "
     "the scheduler's step at offset 1 says 1 of 1"),
    ("vLLM's metrics restated differently", _lie_metrics_restated,
     f"{S0}vLLM's per-request metrics differ between two usage chunks"),
    ("a chunk id of another stream", _lie_chunk_id_other_stream,
     f"{S0}SSE chunk id does not carry the request id ph1_{RUN}_0"),
    ("a prefill/decode router's chunk id", _lie_chunk_id_of_a_pd_router,
     f"{S0}SSE chunk id does not carry the request id ph1_{RUN}_0 (a prefill/decode router "
     "renamed the request)"),
    ("a chunk id that changes", _lie_chunk_id_changed, f"{S0}SSE chunk id changed mid-stream"),
    ("no chunk id", _lie_no_chunk_id, f"{S0}no SSE chunk id"),
    ("SSE data after the end", _lie_sse_after_finish, f"{S0}SSE data after the stream finished"),
    ("an SSE chunk ending inside a step", _lie_chunk_inside_step,
     f"{S0}an SSE chunk ends at offset 1 (byte 4), inside a text record"),
    ("give counts above the carrier's lead_len", _gives([2, 2], 2, 3),
     f"{S0}the 2 tokens before offset 2 give 4 bytes, its lead_len says 3"),
    ("give counts below the carrier's lead_len", _gives([1, 0], 2, 2),
     f"{S0}the 2 tokens before offset 2 give 1 bytes, its lead_len says 2"),
    ("known give counts above lead_len beside an unknown one", _gives([3, 0xFFFF], 2, 2),
     f"{S0}the 2 tokens before offset 2 give 3 bytes, its lead_len says 2"),
    ("a give no span_back claims", _gives([2], 1, 2, before=1),
     f"{S0}token at offset 0 gave 1 bytes that no fragment carries"),
    ("a give beyond the reach of span_back", _gives([0] * 254 + [2], 255, 2, before=1),
     f"{S0}token at offset 0 gave 1 bytes that no fragment carries"),
    ("a second hello that differs", _lie_second_hello,
     f"source {SCHED:016x}: a second hello that differs from its first"),
    ("a loss after the verdict", _lie_loss_after_verdict,
     f"frames lost: source {SCHED:016x} dropped 1 frames before seq 3"),
    ("vLLM's metrics: another drafted count", _metrics([1], [2]),
     f"{S0}vLLM's per-request metrics disagree at verify step 0: 1 accepted of 2 drafted, "
     "the scheduler's step at offset 1 says 1 of 1"),
    ("vLLM's metrics: another accepted count", _metrics([0], [1]),
     f"{S0}vLLM's per-request metrics disagree at verify step 0: 0 accepted of 1 drafted, "
     "the scheduler's step at offset 1 says 1 of 1"),
    ("vLLM's metrics: another number of steps", _metrics([1, 0], [1, 1]),
     f"{S0}vLLM's per-request metrics list 2 verify steps, the scheduler sent 1 steps with "
     "drafts"),
    ("vLLM's metrics: lists of two lengths", _metrics([1], [1, 1]),
     f"{S0}vLLM's per-request metrics list 1 accepted and 2 drafted steps"),
    ("vLLM's metrics: one list", _metrics([1], None),
     f"{S0}vLLM's per-request metrics carry per_step_accepted without per_step_drafted"),
    ("vLLM's metrics without the scheduler's finish", _lie_metrics_without_scheduler_finish,
     "missing telemetry: the scheduler did not finish the request at offset 1"),
    ("vLLM's metrics contradicting a step before the stop string's",
     _stop_string_metrics([0, 1], [1, 1]),
     f"{S0}vLLM's per-request metrics disagree at verify step 0: 0 accepted of 1 drafted, "
     "the scheduler's step at offset 1 says 1 of 1"),
    ("vLLM's metrics contradicting the stop string's step, received before it",
     _stop_string_metrics([1, 0], [1, 1], lists_first=True),
     f"{S0}vLLM's per-request metrics disagree at verify step 1: 0 accepted of 1 drafted, "
     "the scheduler's step at offset 3 says 1 of 1"),
    ("vLLM's metrics missing a step up to the stop string", _stop_string_metrics([1], [1]),
     f"{S0}vLLM's per-request metrics list 1 verify steps, the scheduler sent 2 steps with "
     "drafts up to the stop string"),
    ("vLLM's metrics matching up to the stop string, the scheduler never finishing",
     _stop_string_metrics([1, 1, 7], [1, 1, 9]),
     "missing telemetry: the scheduler did not finish the request at offset 5"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "lie", "reason"), LIES, ids=[case[0] for case in LIES])
def test_a_lying_sender_fails_the_stream_with_its_reason_and_never_exact(
    name: str, lie: Any, reason: str
) -> None:
    run = Run(num_streams=2)
    lie(run)
    run.rec.finalize()
    events = run.events()
    failures = [event for event in events if event[0] == "failed"]
    assert reason in [event[2] for event in failures], events
    stream = 1 if reason.startswith("stream 1:") else 0
    assert run.rec.verdict(stream)[0] == "failed"
    if name not in ("SSE data after the end", "a loss after the verdict"):  # these revoke
        assert ("exact", stream) not in events


def test_the_honest_run_of_the_lie_table_is_exact() -> None:
    run = Run(num_streams=2)
    honest(run)
    assert run.rec.verdict(0) == ("exact", None)
    assert run.rec.stream_stats(0)["metrics_steps"] == 0


def test_vllm_metrics_that_agree_are_counted_as_cross_checked_steps() -> None:
    run = Run(num_streams=2)
    _metrics([1], [1])(run)
    assert run.rec.verdict(0) == ("exact", None)
    assert run.rec.stream_stats(0)["metrics_steps"] == 1
    assert run.rec.totals()["metrics_steps"] == 1


def test_vllm_metrics_count_a_trimmed_steps_acceptance_before_the_cut() -> None:
    # max_tokens cut a step of 3 accepted drafts after 1: vLLM counts 3, the record 1.
    fresh = Run()
    fresh.push(
        fresh.prov(prov(0, 0, [10], [P], 0)),
        fresh.text(text(0, 0, [tok(10, "H")], "H")),
        fresh.prov(prov(0, 1, [11], [A], 3, trimmed=True, **FIN_LENGTH)),
        fresh.text(text(0, 1, [tok(11, "i")], "i", **FIN_LENGTH)),
    )
    fresh.sse(0, "Hi", [10, 11])
    fresh.rec.push_sse_usage(0, 2, [3], [3])
    fresh.finish(0, "length")
    assert fresh.rec.verdict(0) == ("exact", None)
    assert fresh.rec.stream_stats(0)["metrics_steps"] == 1


def test_an_impossible_acceptance_is_a_rejected_frame_not_a_figure() -> None:
    run = Run()
    _lie_accepted_padded(run)
    assert run.events() == [
        (
            "run",
            "rejected frame: record for stream 0: 1 accepted drafts exceed 2 scheduled minus "
            "2 padded",
        )
    ]
    assert run.rec.stream_stats(0)["accepted"] == 0


def test_a_differing_duplicate_revokes_exact_verdicts_too() -> None:
    run = Run()
    honest(run)
    assert run.rec.verdict(0) == ("exact", None)
    run.events()
    hello = run.hello(SCHED, wire.SOURCE_SCHEDULER, seq=0)  # seq 0 again, another step
    run.push(hello)
    message = f"source {SCHED:016x}: seq 0 received twice with different content"
    assert run.events() == [("run", message), ("failed", 0, message)]
    assert run.rec.counters()["duplicate_frames"] == 1


def test_a_duplicate_after_a_gap_has_nothing_to_compare_with() -> None:
    run = Run()
    run.seq[SCHED] += 1  # seq 1 is lost
    for offset in range(65):
        run.push(run.prov(prov(0, offset, [1], [P], 0)))
    assert run.rec.counters()["gaps"] == 1
    late = run.prov(prov(0, 0, [9], [P], 0), seq=1)  # the given-up seq, any content
    run.push(late)
    assert run.rec.counters()["duplicate_frames"] == 1
    assert [e for e in run.events() if e[0] == "run"] == []
