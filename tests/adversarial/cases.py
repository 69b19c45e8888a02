"""The catalog: one lie per case, on top of an honest base (story.py).

Each case names the field it lies about, which witnesses lie (`scheduler`:
provenance frames and the scheduler's hello; `frontend`: text frames and its
hello; `sse`: the body the client reads; `sender`: the datagram layer both
sources share), the expectation, the rule that must catch it and, where the
rules define it, the exact reason. Expectations:

- `fail`: the listed streams must not be EXACT (auto: label and verdict; exact
  mode: exit 2 and the one-line message naming the stream and its reason),
  and every other stream stays EXACT in auto mode;
- `exact`: an honest control (or a lie that must change nothing, such as a
  notice for a stream of no one's run): every stream EXACT, exit 0;
- `claim`: a field PROTOCOL.md treats as the sender's own claim, never as
  evidence: the lie changes no verdict, and the lying value appears on screen
  only where it is attributed to the plugin's hello (or not at all);
- `limit`: witnesses lying consistently where no other witness can see it
  (what EXACT does not prove, PROTOCOL.md): EXACT, and documented there;
- `uncolored`: a value honest vLLM may send that leaves an attribution open
  (an unknown, PROTOCOL.md "Unknown values"): EXACT, and exactly the listed
  characters are shown without a step, never with one the evidence does not
  prove.

`xfail` marks a lie that the client on main still lets through (or reports
wrongly); it is strict, so the mark must go when the rule lands.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from parallelhue_vllm import wire

from .story import BASES, EOS, SOURCES, build
from .transcript import AwaitVerdict, Frame, Offsets, Sse, Transcript, set_field

__all__ = ["CASES", "COMBOS", "Case", "case_by_id"]

Mutation = Callable[[Transcript], None]

RECONCILERS = ("rust", "python")
MODES = ("auto", "exact")
COMBOS = tuple(f"{r}-{m}" for r in RECONCILERS for m in MODES)
PY = ("python-auto", "python-exact")
RUST = ("rust-auto", "rust-exact")
EXACT_MODE = ("rust-exact", "python-exact")

SCHED = f"{SOURCES['sched']:016x}"
FRONT = f"{SOURCES['front']:016x}"
FORGED_SOURCE = 0x0BAD_0BAD_0BAD_0BAD


@dataclass(frozen=True)
class Case:
    id: str
    field: str  # "header.seq", "sse.token_ids", ... (CASES.md groups by it)
    lie: str  # what the lying server says, in one line
    witnesses: str  # who lies: scheduler, frontend, sse, sender, or a "+" of them
    mutate: Mutation | None = None  # None: the honest base itself
    base: str = "chat"
    expect: str = "fail"  # fail | exact | claim | limit
    streams: tuple[int, ...] = (0,)  # the streams that must not be EXACT
    # The exact reason per failing stream (as shown: the reconciler's reason, or the
    # stream's HTTP error); {sched} {front} are the sources' ids in hex.
    # Several reasons where the arrival order of two witnesses decides which rule fires.
    reasons: dict[int, str | tuple[str, ...]] = field(default_factory=dict)
    rule: str = ""  # which rule catches it (PROTOCOL.md's wording)
    xfail: str | None = None  # "issue 9: ..." while main lets the lie through
    xfail_in: tuple[str, ...] = COMBOS  # where the xfail applies
    shown: tuple[str, ...] = ()  # claim: the lying values (attributed if shown at all)
    # uncolored: per stream, the characters shown without a step (mixed), in order.
    uncolored: dict[int, str] = field(default_factory=dict)

    def reason(self, stream: int) -> tuple[str, ...]:
        """The reasons the stream may fail with (empty: not pinned; a trailing … is a prefix)."""
        texts = self.reasons.get(stream, ())
        if isinstance(texts, str):
            texts = (texts,)
        ids = {"sched": SCHED, "front": FRONT, "forged": f"{FORGED_SOURCE:016x}"}
        return tuple(text.format(**ids) for text in texts)

    def transcript(self, run_id: str) -> Transcript:
        transcript = build(self.base, run_id)
        if self.mutate is not None:
            self.mutate(transcript)
        return transcript


# --- small helpers for the mutations ------------------------------------------------


def _edit(frame: Frame, offset: int, size: int, value: int) -> None:
    frame.edits.append(set_field(offset, size, value))


def _replace_bytes(frame: Frame, offset: int, raw: bytes) -> None:
    frame.edits.append(lambda data: data[:offset] + raw + data[offset + len(raw) :])


def _step_frame(t: Transcript, source: str, step: int) -> Frame:
    (frame,) = [f for f in t.frames(source) if f.step == step and f.kind != wire.KIND_HELLO]
    return frame


def _notice(t: Transcript, source: str, stream: int, code: int, message: str) -> Frame:
    return Frame(
        source=source,
        kind=wire.KIND_NOTICE,
        seq=0,  # set by insert_frame
        step=0,
        timestamp_ns=1_000_000_000_000,
        records=[wire.NoticeRecord(stream, code, message)],
    )


def _set_text(event: Sse, chat: bool, text: str) -> None:
    choice = event.choice
    if chat:
        choice["delta"]["content"] = text
    else:
        choice["text"] = text


def _get_text(event: Sse, chat: bool) -> str:
    choice = event.choice
    return str(choice["delta"]["content"] if chat else choice["text"])


def _raw_ids(t: Transcript, stream: int, index: int, ids_json: str) -> None:
    """Replace a content chunk's token_ids by raw JSON (what json.dumps would not write)."""
    event = t.sse(stream, index)
    assert isinstance(event.data, dict)
    marker = "__IDS__"
    event.choice["token_ids"] = marker
    text = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    event.data = text.replace(f'"{marker}"', ids_json)


def _swap_role(record: wire.ProvenanceRecord, letters: str) -> None:
    codes = {"P": 0, "A": 1, "T": 2, "B": 3}
    record.roles = [codes[c] for c in letters]


# --- the mutations ---------------------------------------------------------------------
# Stream 0 of the chat base: 6 engine steps, 15 tokens, text "The café is日本 and🙂 ok. Bye"
# (bytes: "The" 0-3, " caf" 3-7, "é" 7-9, " is" 9-12, "日本" 12-18, " and" 18-22,
# "🙂" 22-26, " ok" 26-29, "." 29-30, " Bye" 30-34). Stream 1 skips step 2 and ends at
# step 5 on max_tokens (9 tokens). Frames of step 2 hold stream 0's record only.


def _header_magic(t: Transcript) -> None:
    _replace_bytes(_step_frame(t, "sched", 3), Offsets.MAGIC, b"PHUX")


def _header_version(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 3), Offsets.VERSION, 1, wire.PROTOCOL_VERSION + 1)


def _header_kind_unknown(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 3), Offsets.KIND, 1, 9)


def _header_kind_other_body(t: Transcript) -> None:
    # A provenance body sent under kind "text": the layouts differ, so it cannot decode.
    _edit(_step_frame(t, "sched", 2), Offsets.KIND, 1, wire.KIND_TEXT)


def _header_kind_role(t: Transcript) -> None:
    # The frontend sends a provenance frame (a scheduler's kind) for stream 0.
    record = wire.ProvenanceRecord(0, 15, [104], [wire.ROLE_TARGET], 3)
    frame = Frame("front", wire.KIND_PROVENANCE, 0, 2, 1_000_000_000_000, records=[record])
    t.insert_frame(frame, before=_step_frame(t, "front", 2))


def _header_flags(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 3), Offsets.FLAGS, 2, 1)


def _header_run_id(t: Transcript) -> None:
    _step_frame(t, "sched", 3).run_id = "ab" * 16


def _header_source_id(t: Transcript) -> None:
    _step_frame(t, "sched", 3).source_id = FORGED_SOURCE


def _header_source_zero(t: Transcript) -> None:
    _step_frame(t, "sched", 3).source_id = 0


def _header_seq_swapped(t: Transcript) -> None:
    three, four = _step_frame(t, "sched", 3), _step_frame(t, "sched", 4)
    three.seq, four.seq = four.seq, three.seq


def _header_seq_duplicate_differs(t: Transcript) -> None:
    # After the real frame of step 3, a second frame with the same seq but other ids.
    real = _step_frame(t, "sched", 3)
    records = [
        wire.ProvenanceRecord(r.stream, r.offset, [7777] * len(r.token_ids), list(r.roles), 3)
        for r in real.records
        if isinstance(r, wire.ProvenanceRecord)
    ]
    copy = Frame("sched", wire.KIND_PROVENANCE, real.seq, 3, real.timestamp_ns, records=records)
    t.insert_after(real, copy)


def _header_seq_gap(t: Transcript) -> None:
    for frame in t.frames("sched"):
        if frame.step >= 3:
            frame.seq += 1


def _header_seq_hello_late(t: Transcript) -> None:
    hello, first = t.hello_frame("sched"), _step_frame(t, "sched", 1)
    hello.seq, first.seq = first.seq, hello.seq


def _header_step_backwards(t: Transcript) -> None:
    _step_frame(t, "sched", 4).step = 2


def _header_step_repeats(t: Transcript) -> None:
    _step_frame(t, "sched", 4).step = 3


def _header_step_split(t: Transcript) -> None:
    # Engine step 2 (stream 0: 101 201 202, roles AAT) sent as two records in two frames
    # with the same step number: AA (trimmed) then T.
    frame = _step_frame(t, "sched", 2)
    (record,) = frame.records
    assert isinstance(record, wire.ProvenanceRecord)
    second = wire.ProvenanceRecord(0, record.offset + 2, record.token_ids[2:], [2], 3)
    record.token_ids, record.roles, record.trimmed = record.token_ids[:2], [1, 1], True
    extra = Frame("sched", wire.KIND_PROVENANCE, 0, 2, frame.timestamp_ns + 1, records=[second])
    t.insert_frame(extra, before=_step_frame(t, "sched", 3))


def _header_text_step_backwards(t: Transcript) -> None:
    _step_frame(t, "front", 4).step = 1


def _header_timestamp(t: Transcript) -> None:
    for frame in t.frames("sched"):
        frame.timestamp_ns = 2**64 - 1 - frame.seq * 10**9  # runs backwards from the top


def _header_dropped(t: Transcript) -> None:
    _step_frame(t, "sched", 3).dropped = 1


def _header_body_len(t: Transcript) -> None:
    frame = _step_frame(t, "sched", 3)
    frame.edits.append(lambda data: data[:60] + (len(data) - 63).to_bytes(4, "little") + data[64:])


# hello


def _hello_role_frontend(t: Transcript) -> None:
    hello = t.hello("sched")
    hello.role = wire.SOURCE_FRONTEND
    # A frontend hello carries no speculative fields (protocol 2): drop them too.
    hello.num_speculative_tokens, hello.spec_method = 0, ""
    hello.role_derivation, hello.verification = wire.DERIVATION_NONE, wire.VERIFICATION_NONE


def _hello_front_role_scheduler(t: Transcript) -> None:
    t.hello("front").role = wire.SOURCE_SCHEDULER


def _hello_role_unknown(t: Transcript) -> None:
    _edit(t.hello_frame("sched"), Offsets.HELLO_ROLE, 1, 7)


def _hello_engine_simulated(t: Transcript) -> None:
    for name in ("sched", "front"):
        t.hello(name).engine = wire.ENGINE_SIMULATED


def _hello_engine_unknown(t: Transcript) -> None:
    _edit(t.hello_frame("sched"), Offsets.HELLO_ENGINE, 1, 9)


def _hello_derivation_counts(t: Transcript) -> None:
    # Only the scheduler's hello has speculative fields (protocol 2); counts goes
    # with async scheduling.
    hello = t.hello("sched")
    hello.role_derivation, hello.async_scheduling = wire.DERIVATION_COUNTS, True


def _hello_derivation_none(t: Transcript) -> None:
    t.hello("sched").role_derivation = wire.DERIVATION_NONE


def _hello_async(t: Transcript) -> None:
    # Async scheduling goes with roles derived from counts (protocol 2).
    hello = t.hello("sched")
    hello.async_scheduling, hello.role_derivation = True, wire.DERIVATION_COUNTS


def _hello_async_invalid(t: Transcript) -> None:
    _edit(t.hello_frame("sched"), Offsets.HELLO_ASYNC, 1, 2)


def _hello_k_smaller(t: Transcript) -> None:
    t.hello("sched").num_speculative_tokens = 2


def _hello_k_huge(t: Transcript) -> None:
    # K = 65535 and every step ending on a target schedules that many drafts: the
    # per-position statistics of each stream grow to 65535 entries.
    t.hello("sched").num_speculative_tokens = 0xFFFF
    for stream in (0, 1):
        for index in range(8):
            try:
                record = t.prov(stream, index)
            except IndexError:
                break
            if record.roles[-1] == wire.ROLE_TARGET:
                record.drafts_scheduled = 0xFFFF


def _hello_no_spec(t: Transcript) -> None:
    # A consistent "no speculative decoding" hello beside records with drafts and roles.
    hello = t.hello("sched")
    hello.num_speculative_tokens = 0
    hello.spec_method = ""
    hello.role_derivation = wire.DERIVATION_NONE
    hello.verification = wire.VERIFICATION_NONE


def _hello_verification_unknown(t: Transcript) -> None:
    _edit(t.hello_frame("sched"), Offsets.HELLO_VERIFICATION, 2, 9)


def _hello_plugin_version(t: Transcript) -> None:
    for name in ("sched", "front"):
        t.hello(name).plugin_version = "9.9.9-liar"


def _hello_engine_version(t: Transcript) -> None:
    for name in ("sched", "front"):
        t.hello(name).engine_version = "0.99.0-liar"


def _hello_method(t: Transcript) -> None:
    t.hello("sched").spec_method = "eagle3"


def _hello_method_empty(t: Transcript) -> None:
    t.hello("sched").spec_method = ""


def _hello_bad_utf8(t: Transcript) -> None:
    hello = t.hello("sched")
    hello.engine_version = "0.32.0+cpu"
    offset = Offsets.HELLO_VERIFICATION + 2 + 1 + len(hello.plugin_version.encode()) + 1
    _replace_bytes(t.hello_frame("sched"), offset, b"\xff")


def _hello_frontend_disagrees(t: Transcript) -> None:
    front = t.hello("front")
    front.num_speculative_tokens = 5
    front.spec_method = "eagle3"


def _hello_repeated(t: Transcript) -> None:
    # A second hello from the scheduler, now saying K=7 (rejected, but the first one stays).
    hello = t.hello("sched")
    again = wire.Hello(
        hello.role,
        hello.engine,
        hello.role_derivation,
        hello.async_scheduling,
        7,
        hello.plugin_version,
        hello.engine_version,
        "eagle3",
        hello.verification,
    )
    frame = Frame("sched", wire.KIND_HELLO, 0, 3, 1_000_000_000_000, hello=again)
    t.insert_frame(frame, before=_step_frame(t, "sched", 3))


# provenance


def _prov_stream_foreign(t: Transcript) -> None:
    t.prov(0, 2).stream = 5


def _prov_stream_other(t: Transcript) -> None:
    t.prov(0, 1).stream = 1  # step 2 holds stream 0 only


def _prov_record_count(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 2), Offsets.BODY, 2, 0)


def _prov_finished_early(t: Transcript) -> None:
    record = t.prov(0, 2)
    record.finished, record.finish_reason = True, wire.FINISH_LENGTH


def _prov_never_finished(t: Transcript) -> None:
    record = t.prov(0, -1)
    record.finished, record.finish_reason = False, wire.FINISH_NONE


def _prov_trimmed_middle(t: Transcript) -> None:
    t.prov(0, 2).trimmed = True


def _prov_trimmed_dropped(t: Transcript) -> None:
    t.prov(0, -1).trimmed = False


def _prov_flags_unknown(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 2), Offsets.REC_FLAGS, 1, 0x10)


def _prov_finish_length(t: Transcript) -> None:
    t.prov(0, -1).finish_reason = wire.FINISH_LENGTH


def _prov_finish_abort(t: Transcript) -> None:
    t.prov(0, -1).finish_reason = wire.FINISH_ABORT


def _prov_finish_error(t: Transcript) -> None:
    t.prov(0, -1).finish_reason = wire.FINISH_ERROR


def _prov_finish_unknown(t: Transcript) -> None:
    t.prov(0, -1).finish_reason = 9


def _prov_offset(t: Transcript) -> None:
    t.prov(0, 2).offset += 1


def _prov_n_tokens_raw(t: Transcript) -> None:
    _edit(_step_frame(t, "sched", 2), Offsets.REC_COUNT, 2, 4)


def _prov_n_tokens_short(t: Transcript) -> None:
    record = t.prov(0, 2)  # 102 220, AT -> 102 alone, T
    record.token_ids, record.roles = record.token_ids[:1], [wire.ROLE_TARGET]


def _prov_drafts_above_k(t: Transcript) -> None:
    t.prov(0, 2).drafts_scheduled = 4


def _prov_drafts_lowered(t: Transcript) -> None:
    t.prov(0, 2).drafts_scheduled = 2  # AT is still valid with 2 drafts


def _prov_padded_all(t: Transcript) -> None:
    t.prov(0, 1).drafts_padded = 3  # 2 accepted of 0 real drafts


def _prov_padded_above(t: Transcript) -> None:
    t.prov(0, 1).drafts_padded = 4


def _prov_token_id(t: Transcript) -> None:
    t.prov(0, 2).token_ids[1] = 999


def _prov_role_unknown(t: Transcript) -> None:
    t.prov(0, 1).roles[0] = 7


def _prov_role_sequence(t: Transcript) -> None:
    _swap_role(t.prov(0, 1), "ATA")


def _prov_roles_relabelled(t: Transcript) -> None:
    # The first (prefill) token claimed as the correction of a rejected draft.
    record = t.prov(0, 0)
    record.drafts_scheduled = 1
    _swap_role(record, "T")


# text


def _text_stream_foreign(t: Transcript) -> None:
    t.text(0, 2).stream = 5


def _text_not_finished(t: Transcript) -> None:
    record = t.text(0, -1)
    record.finished, record.finish_reason = False, wire.FINISH_NONE


def _text_finished_early(t: Transcript) -> None:
    record = t.text(0, 2)
    record.finished, record.finish_reason = True, wire.FINISH_STOP


def _surplus_step(t: Transcript, stream: int, token: int) -> None:
    """A scheduler step after the stream's end: tokens the SSE never delivers."""
    last_record = t.prov(stream, -1)
    end = last_record.offset + len(last_record.token_ids)
    last = t.prov_frame(stream, -1)
    record = wire.ProvenanceRecord(stream, end, [token], [wire.ROLE_TARGET], 3)
    frame = Frame("sched", wire.KIND_PROVENANCE, 0, last.step + 1, last.timestamp_ns + 1)
    frame.records = [record]
    t.insert_frame(frame, before=t.text_frame(stream, -1))


def _text_truncated_without_stop(t: Transcript) -> None:
    # The flag alone, on an EOS finish whose HTTP text is whole, and one surplus token.
    t.text(0, -1).text_truncated = True
    _surplus_step(t, 0, 104)


def _text_truncated_length(t: Transcript) -> None:
    # max_tokens finish (stream 1) with the flag, HTTP text whole, one surplus token.
    t.text(1, -1).text_truncated = True
    _surplus_step(t, 1, 104)


def _text_trimmed_more(t: Transcript) -> None:
    t.text(0, -1).trimmed_tokens = 3  # the scheduler produced 1 token after the stop


def _text_trimmed_without_flag(t: Transcript) -> None:
    t.text(0, -1).tokens_trimmed = False


def _text_trimmed_flag_unfinished(t: Transcript) -> None:
    t.text(0, 1).tokens_trimmed = True


def _text_finish_length(t: Transcript) -> None:
    t.text(0, -1).finish_reason = wire.FINISH_LENGTH


def _text_stop_finish_length(t: Transcript) -> None:
    t.text(0, -1).finish_reason = wire.FINISH_LENGTH


def _text_offset(t: Transcript) -> None:
    t.text(0, 3).offset += 1


def _text_n_tokens_raw(t: Transcript) -> None:
    _edit(_step_frame(t, "front", 2), Offsets.REC_COUNT, 2, 2)


def _text_n_tokens_short(t: Transcript) -> None:
    record = t.text(0, 2)  # 102 " is", 220 (held) -> 102 alone
    record.tokens = record.tokens[:1]


def _text_http_len(t: Transcript) -> None:
    _edit(_step_frame(t, "front", 2), Offsets.TEXT_HTTP_LEN, 4, 3)


def _text_token_id(t: Transcript) -> None:
    t.text(0, 2).tokens[1].token_id = 999


def _text_frag_len_invalid(t: Transcript) -> None:
    # Step 2: " caf" (4) "" (0) "é" (2): frag_len 4 -> 5 and 2 -> 1 cuts é in two.
    frame = _step_frame(t, "front", 2)
    _edit(frame, Offsets.text_token(0) + 4, 2, 5)
    _edit(frame, Offsets.text_token(2) + 4, 2, 1)


def _text_frag_len_moved(t: Transcript) -> None:
    # Step 5: "🙂" " ok" "." -> "🙂" " o" "k.": 'k' now from the target, not a draft.
    record = t.text(0, 4)
    record.tokens[1].fragment, record.tokens[2].fragment = b" o", b"k."


def _text_span_back_more(t: Transcript) -> None:
    t.text(0, 4).tokens[0].span_back = 3


def _text_span_back_less(t: Transcript) -> None:
    token = t.text(0, 4).tokens[0]
    token.span_back, token.lead_len = 0, 0  # 🙂's first bytes (step 4) now unclaimed


def _text_give_sum(t: Transcript) -> None:
    t.text(0, 2).tokens[1].lead_len = 5  # 220 gave 4 bytes to 日本 (its lead_len 4)


def _text_give_unclaimed(t: Transcript) -> None:
    # 🙂 claims only 231 (1 byte): 230's 2 bytes are in no fragment's claim.
    token = t.text(0, 4).tokens[0]
    token.span_back, token.lead_len = 1, 2


def _text_give_split_moved(t: Transcript) -> None:
    # 220 says it gave 3 bytes (日), 221's lead_len 3: 本 looks like step 3's own.
    t.text(0, 2).tokens[1].lead_len = 3
    t.text(0, 3).tokens[0].lead_len = 3


def _text_give_at_finish(t: Transcript) -> None:
    t.text(0, 5).tokens[1].lead_len = 3  # EOS, the last token, "gives" 3 bytes


def _text_span_back_empty(t: Transcript) -> None:
    t.text(0, 1).tokens[1].span_back = 1


def _text_fragment_byte(t: Transcript) -> None:
    t.text(0, 1).tokens[0].fragment = b" cAf"


def _text_fragment_invalid(t: Transcript) -> None:
    t.text(0, 1).tokens[0].fragment = b" ca\xff"


def _text_http_byte(t: Transcript) -> None:
    t.text(0, 1).http_delta = " cAfé".encode()


def _text_http_and_sse_byte(t: Transcript) -> None:
    t.text(0, 1).http_delta = " cAfé".encode()
    _set_text(t.sse(0, 1), t.chat, " cAfé")


def _text_http_short(t: Transcript) -> None:
    # The last fragment (" Bye") never reaches HTTP nor SSE, and nothing was truncated.
    t.text(0, -1).http_delta = b""
    _set_text(t.sse(0, -1), t.chat, "")


def _text_http_long(t: Transcript) -> None:
    t.text(0, -1).http_delta += b"!"
    _set_text(t.sse(0, -1), t.chat, _get_text(t.sse(0, -1), t.chat) + "!")


def _text_http_invalid(t: Transcript) -> None:
    t.text(0, 1).http_delta = b" caf\xc3"


# notice


def _notice_stream(t: Transcript) -> None:
    notice = _notice(t, "sched", 0, wire.NOTICE_HOOK_ERROR, "hook failed: telemetry off")
    t.insert_frame(notice, before=_step_frame(t, "sched", 4))


def _notice_all(t: Transcript) -> None:
    notice = _notice(t, "front", wire.ALL_STREAMS, wire.NOTICE_UNSUPPORTED, "vLLM 9.9")
    t.insert_frame(notice, before=_step_frame(t, "front", 2))


def _notice_foreign(t: Transcript) -> None:
    notice = _notice(t, "sched", 7, wire.NOTICE_OTHER, "stream 7 of this run: no such stream")
    t.insert_frame(notice, before=_step_frame(t, "sched", 4))


def _notice_code_unknown(t: Transcript) -> None:
    notice = _notice(t, "sched", 0, 99, "code from the future")
    t.insert_frame(notice, before=_step_frame(t, "sched", 4))


def _notice_message_hostile(t: Transcript) -> None:
    notice = _notice(t, "sched", 0, wire.NOTICE_OTHER, "line one\n\x1b[2Jline two\x07")
    t.insert_frame(notice, before=_step_frame(t, "sched", 4))


def _notice_message_invalid(t: Transcript) -> None:
    notice = _notice(t, "sched", 0, wire.NOTICE_OTHER, "abc")
    t.insert_frame(notice, before=_step_frame(t, "sched", 4))
    _replace_bytes(notice, Offsets.NOTICE_LEN + 2, b"\xff")


def _notice_after_verdict(t: Transcript) -> None:
    # Stream 1 ends at step 5; once the client shows its verdict, a notice for it.
    step6 = _step_frame(t, "sched", 6)
    notice = _notice(t, "sched", 1, wire.NOTICE_HOOK_ERROR, "late: hook failed for stream 1")
    t.insert_frame(notice, before=step6)
    t.insert_before(notice, AwaitVerdict(1))


def _lost_after_verdict(t: Transcript) -> None:
    # The late notice of notice.after_verdict is lost on the way (its seq stays unused):
    # only the gap it leaves tells of it; the scheduler's later frames wait behind it.
    _notice_after_verdict(t)
    (notice,) = [f for f in t.frames("sched") if f.kind == wire.KIND_NOTICE]
    t.remove(notice)


def _dropped_after_verdict(t: Transcript) -> None:
    step6 = _step_frame(t, "sched", 6)
    step6.dropped = 1
    t.insert_before(step6, AwaitVerdict(1))


# SSE


def _sse_id_changed(t: Transcript) -> None:
    event = t.sse(0, 2)
    assert isinstance(event.data, dict)
    event.data["id"] = "chatcmpl-ph1_" + "cd" * 16 + "_0"


def _sse_id_other_stream(t: Transcript) -> None:
    for event in t.sse_events(0):
        if isinstance(event.data, dict):
            event.data["id"] = event.data["id"][:-1] + "1"


def _sse_index_one(t: Transcript) -> None:
    for event in t.sse_events(0):
        if isinstance(event.data, dict) and event.data["choices"]:
            event.choice["index"] = 1


def _sse_second_choice(t: Transcript) -> None:
    for event in t.sse_events(0):
        if event.is_content:
            assert isinstance(event.data, dict)
            other = dict(event.choice)
            other["index"] = 1
            other["delta"] = {"content": "other"}
            other["token_ids"] = [118]
            event.data["choices"].append(other)


def _sse_second_choice_chunks(t: Transcript) -> None:
    # n=2 style: after each chunk of choice 0, a chunk of choice 1 (text, no token ids).
    for event in [e for e in t.sse_events(0) if e.is_content]:
        assert isinstance(event.data, dict)
        data = dict(event.data)
        data["choices"] = [{"index": 1, "delta": {"content": "zz"}, "finish_reason": None}]
        t.insert_after(event, Sse(0, data))


def _sse_content_byte(t: Transcript) -> None:
    _set_text(t.sse(0, 1), t.chat, " cAfé")


def _sse_content_extra(t: Transcript) -> None:
    _set_text(t.sse(0, -1), t.chat, " Bye!")


def _sse_content_null(t: Transcript) -> None:
    t.sse(0, 1).choice["delta"]["content"] = None


def _sse_lone_surrogate(t: Transcript) -> None:
    event = t.sse(0, 1)
    assert isinstance(event.data, dict)
    text = json.dumps(event.data, ensure_ascii=False, separators=(",", ":"))
    event.data = text.replace(" café", " caf\\ud800é")


def _ids(index: int, json_ids: str) -> Mutation:
    return lambda t: _raw_ids(t, 0, index, json_ids)


def _sse_ids_missing(t: Transcript) -> None:
    del t.sse(0, 2).choice["token_ids"]


def _sse_ids_shifted(t: Transcript) -> None:
    # Chunk 1 carries step 3's first id too; the bytes stay where they were.
    one, two = t.sse(0, 1), t.sse(0, 2)
    one.choice["token_ids"] = one.choice["token_ids"] + two.choice["token_ids"][:1]
    two.choice["token_ids"] = two.choice["token_ids"][1:]


def _sse_finish(value: str) -> Mutation:
    def mutate(t: Transcript) -> None:
        t.sse(0, -1).choice["finish_reason"] = value

    return mutate


def _sse_finish_missing(t: Transcript) -> None:
    t.sse(0, -1).choice["finish_reason"] = None


def _sse_finish_early(t: Transcript) -> None:
    t.sse(0, 2).choice["finish_reason"] = "stop"


def _sse_usage_more(t: Transcript) -> None:
    t.usage(0)["completion_tokens"] += 1


def _sse_usage_string(t: Transcript) -> None:
    t.usage(0)["completion_tokens"] = "15"


def _sse_usage_total(t: Transcript) -> None:
    t.usage(0)["total_tokens"] += 5


def _sse_usage_absent(t: Transcript) -> None:
    usage = t.usage(0)
    for event in t.sse_events(0):
        if isinstance(event.data, dict) and event.data.get("usage") is usage:
            t.remove(event)


def _honest_metrics(t: Transcript) -> dict[int, dict[str, list[int]]]:
    """What vLLM's per-request metrics (`--per-request-spec-decode-metrics detailed`)
    say for each stream of the transcript as it is now: one entry per verify step (a
    record with scheduled drafts), accepted drafts and real (unpadded) drafts."""
    lists = {}
    for stream in range(t.streams):
        records = [
            r
            for f in t.frames(kind=wire.KIND_PROVENANCE)
            for r in f.records
            if isinstance(r, wire.ProvenanceRecord) and r.stream == stream and r.drafts_scheduled
        ]
        lists[stream] = {
            "per_step_accepted": [r.roles.count(wire.ROLE_ACCEPTED) for r in records],
            "per_step_drafted": [r.drafts_scheduled - r.drafts_padded for r in records],
        }
    return lists


def _put_metrics(t: Transcript, lists: dict[int, dict[str, list[int]]]) -> None:
    for stream, spec in lists.items():
        t.usage_chunk(stream)["metrics"] = {"speculative_decoding": spec}


def _sse_metrics(t: Transcript) -> None:
    _put_metrics(t, _honest_metrics(t))


def _sse_metrics_edit(edit: Callable[[dict[str, list[int]]], None]) -> Mutation:
    def mutate(t: Transcript) -> None:
        lists = _honest_metrics(t)
        edit(lists[0])
        _put_metrics(t, lists)

    return mutate


def _one_more_drafted(spec: dict[str, list[int]]) -> None:
    spec["per_step_drafted"][0] += 1


def _one_fewer_accepted(spec: dict[str, list[int]]) -> None:
    spec["per_step_accepted"][1] -= 1


def _last_step_missing(spec: dict[str, list[int]]) -> None:
    spec["per_step_accepted"].pop()
    spec["per_step_drafted"].pop()


def _drafted_missing(spec: dict[str, list[int]]) -> None:
    del spec["per_step_drafted"]


def _first_step_one_fewer_accepted(spec: dict[str, list[int]]) -> None:
    spec["per_step_accepted"][0] -= 1


def _only_first_step(spec: dict[str, list[int]]) -> None:
    del spec["per_step_accepted"][1:], spec["per_step_drafted"][1:]


def _relabelled_beside_metrics(t: Transcript) -> None:
    # vLLM's own counters, taken before the scheduler's frames lie about roles.
    lists = _honest_metrics(t)
    _prov_roles_relabelled(t)
    _put_metrics(t, lists)


def _metrics_consistent(t: Transcript) -> None:
    # The same relabelling, with vLLM's counters forged to match.
    _prov_roles_relabelled(t)
    _put_metrics(t, _honest_metrics(t))


# --- issue 24: evidence is monotone, an unknown is not a zero, one reading of bytes ---


def _usage_event(t: Transcript, stream: int) -> Sse:
    (event,) = [e for e in t.sse_events(stream) if isinstance(e.data, dict)
                and e.data is t.usage_chunk(stream)]  # fmt: skip
    return event


def _restate_usage(t: Transcript, edit: Callable[[dict[str, Any]], None]) -> None:
    """A second usage chunk for stream 0 after its first, a copy changed by `edit`."""
    first = _usage_event(t, 0)
    assert isinstance(first.data, dict)
    copy = json.loads(json.dumps(first.data))
    edit(copy)
    t.insert_after(first, Sse(0, copy))


def _metrics_then_none(t: Transcript) -> None:
    # Finding 1: lists that contradict the records, then a usage chunk without them.
    _sse_metrics_edit(_one_fewer_accepted)(t)
    _restate_usage(t, lambda chunk: chunk.pop("metrics"))


def _metrics_then_forged(t: Transcript) -> None:
    # The same, and the second usage chunk's lists forged to agree with the records.
    honest = _honest_metrics(t)[0]
    _sse_metrics_edit(_one_fewer_accepted)(t)
    _restate_usage(t, lambda chunk: chunk.update(metrics={"speculative_decoding": honest}))


def _usage_corrected(t: Transcript) -> None:
    t.usage(0)["completion_tokens"] += 1
    _restate_usage(t, lambda chunk: chunk["usage"].update(completion_tokens=15))


def _usage_prompt_restated(t: Transcript) -> None:
    _restate_usage(t, lambda chunk: chunk["usage"].update(prompt_tokens=5, total_tokens=20))


def _finish_restated(t: Transcript) -> None:
    # The finish chunk says length (the detokenizer: stop), a later chunk says stop.
    last = t.sse(0, -1)
    last.choice["finish_reason"] = "length"
    again = json.loads(json.dumps(last.data))
    again["choices"][0].update(delta={"content": ""}, token_ids=[], finish_reason="stop")
    t.insert_after(last, Sse(0, again))


def _continuous_usage(t: Transcript) -> None:
    # vLLM's `continuous_usage_stats`: every chunk carries the running count.
    for stream in range(t.streams):
        count = 0
        for event in t.sse_events(stream):
            if not isinstance(event.data, dict) or "usage" in event.data:
                continue
            if event.data.get("choices"):
                count += len(event.choice.get("token_ids") or [])
            event.data["usage"] = {"prompt_tokens": 4, "completion_tokens": count,
                                   "total_tokens": 4 + count}  # fmt: skip


def _smile_unclaimed_unknown(t: Transcript) -> None:
    # Finding 2: 🙂's carrier (232, step 5) claims no predecessor, and 230/231 (step 4)
    # say their gives are unknown: 🙂 may hold their bytes, so it must not be step 5's.
    _text_span_back_less(t)
    for frame in t.frames(kind=wire.KIND_TEXT):
        for record in frame.records:
            if isinstance(record, wire.TextRecord) and record.stream == 0:
                for token in record.tokens:
                    if token.token_id in (230, 231):
                        token.lead_len = wire.LEAD_UNKNOWN


def _nihon_split_unknown(t: Transcript) -> None:
    # 日本's lead_len and 220's give unknown (as for a special token): one mixed span.
    t.text(0, 2).tokens[1].lead_len = wire.LEAD_UNKNOWN
    t.text(0, 3).tokens[0].lead_len = wire.LEAD_UNKNOWN


def _ok_token(t: Transcript) -> tuple[wire.TextRecord, wire.TextToken, Sse]:
    """Stream 0's ' ok' (104): its text record, token and SSE chunk."""
    for frame in t.frames(kind=wire.KIND_TEXT):
        for record in frame.records:
            if isinstance(record, wire.TextRecord) and record.stream == 0:
                for token in record.tokens:
                    if token.token_id == 104:
                        (event,) = [e for e in t.sse_events(0)
                                    if e.is_content and 104 in e.choice["token_ids"]]  # fmt: skip
                        return record, token, event
    raise AssertionError("no ' ok' token")


def _sse_raw_invalid(t: Transcript) -> None:
    # Finding 3: fragment and HTTP delta hold ' o\ufffd'; the SSE line holds ' o' + 0xff.
    record, token, event = _ok_token(t)
    token.fragment = " o\ufffd".encode()
    record.http_delta = record.http_delta.replace(b" ok", token.fragment)
    _set_text(event, t.chat, _get_text(event, t.chat).replace(" ok", " o\ufffd"))
    event.raw = event.encode().replace("\ufffd".encode(), b"\xff")


def _sse_raw_surrogate(t: Transcript) -> None:
    # An encoded surrogate (CESU-8) where the other witnesses hold U+FFFD.
    _sse_raw_invalid(t)
    _, _, event = _ok_token(t)
    assert event.raw is not None
    event.raw = event.raw.replace(b"\xff", b"\xed\xa0\x80")


def _sse_comment_invalid(t: Transcript) -> None:
    t.insert_before(t.sse(0, 2), Sse(0, raw=b": keep\xe9alive\n\n"))


def _sse_split_reads(t: Transcript) -> None:
    # CRLF line ends, a BOM first, every content chunk written in two pieces cut
    # inside a character (or in its middle): the readers see the bytes split.
    for stream in range(t.streams):
        events = t.sse_events(stream)
        for number, event in enumerate(events):
            data = event.encode().replace(b"\n", b"\r\n")
            if number == 0:
                data = b"\xef\xbb\xbf" + data
            multi = [i for i, byte in enumerate(data) if byte >= 0xC0]
            cut = multi[0] + 1 if multi else len(data) // 2
            event.raw = data[:cut]
            t.insert_after(event, Sse(stream, raw=data[cut:]))


def _sse_done_early(t: Transcript) -> None:
    done = t.done(0)
    t.remove(done)
    t.insert_before(t.sse(0, -1), done)


def _sse_done_missing(t: Transcript) -> None:
    t.remove(t.done(0))


def _sse_after_done(t: Transcript) -> None:
    done = t.done(0)
    extra = Sse(0, {"choices": [{"index": 0, "delta": {"content": "ZZTOP"}, "token_ids": [118]}]})
    t.insert_after(done, extra)


def _sse_typed_event(t: Transcript) -> None:
    event = t.sse(0, 2)
    event.raw = b"event: delta\n" + event.encode()


def _sse_keepalive(t: Transcript) -> None:
    for stream in range(t.streams):
        for event in [e for e in t.sse_events(stream) if e.is_content]:
            t.insert_before(event, Sse(stream, raw=b": keep-alive\n\nretry: 1000\nid: 42\n\n"))
            ping = b'event: ping\ndata: {"type":"ping"}\n\n'
            t.insert_after(event, Sse(stream, raw=ping))


def _sse_multiline(t: Transcript) -> None:
    event = t.sse(0, 1)
    text = event.encode().decode()
    assert text.startswith("data: {")
    event.raw = text.replace('"choices":', '\ndata: "choices":', 1).encode()


# whole streams


def _vacuous(t: Transcript) -> None:
    # Stream 0: no provenance at all, one finished text record without tokens, and an
    # SSE body whose only chunk has no text and no token ids.
    for frame in [*t.frames(kind=wire.KIND_PROVENANCE), *t.frames(kind=wire.KIND_TEXT)]:
        frame.records = [r for r in frame.records if r.stream != 0]
        if not frame.records:
            t.remove_frame(frame)
    empty = wire.TextRecord(0, 0, [], b"", finished=True, finish_reason=wire.FINISH_STOP)
    t.text_frame(1, -1).records.append(empty)
    chunks = [e for e in t.sse_events(0) if e.is_content]
    for event in chunks[:-1]:
        t.remove(event)
    _set_text(chunks[-1], t.chat, "")
    chunks[-1].choice["token_ids"] = []
    t.usage(0)["completion_tokens"] = 0
    t.usage(0)["total_tokens"] = 4


def _stream1_token(t: Transcript) -> None:
    # Stream 0 is still streaming when stream 1 fails (its last chunk waits for that).
    t.prov(1, 1).token_ids[0] = 999
    t.insert_before(t.sse(0, -1), AwaitVerdict(1))


# combined


def _both_ids(t: Transcript) -> None:
    t.prov(0, 2).token_ids[1] = 999
    t.text(0, 2).tokens[1].token_id = 999


def _all_ids(t: Transcript) -> None:
    _both_ids(t)
    t.sse(0, 2).choice["token_ids"][1] = 999


def _text_and_sse_bytes(t: Transcript) -> None:
    record = t.text(0, 1)
    record.tokens[0].fragment = b" cAf"
    record.http_delta = " cAfé".encode()
    _set_text(t.sse(0, 1), t.chat, " cAfé")


def _frontend_sse_extra_token(t: Transcript) -> None:
    record = t.text(0, -1)
    record.tokens.append(wire.TextToken(104, b" ok", 0))
    record.http_delta += b" ok"
    event = t.sse(0, -1)
    _set_text(event, t.chat, _get_text(event, t.chat) + " ok")
    event.choice["token_ids"].append(104)
    t.usage(0)["completion_tokens"] += 1
    t.usage(0)["total_tokens"] += 1


def _boundary_shift_frontend(t: Transcript) -> None:
    # " ok" (step 5) and "." moved into step 6's record: fragments and HTTP deltas agree
    # with each other, the SSE chunks still carry them in step 5's chunk.
    five, six = t.text(0, 4), t.text(0, 5)
    five.tokens[1].fragment, five.tokens[2].fragment = b"", b""
    five.http_delta = "🙂".encode()
    six.tokens[0].fragment = b" ok. Bye"
    six.tokens[0].span_back = 2
    six.tokens[0].lead_len = 4  # " ok." from the two tokens before it
    five.tokens[1].lead_len, five.tokens[2].lead_len = 3, 1  # their give counts
    six.http_delta = b" ok. Bye"


def _boundary_shift_all(t: Transcript) -> None:
    _boundary_shift_frontend(t)
    _set_text(t.sse(0, 4), t.chat, "🙂")
    _set_text(t.sse(0, 5), t.chat, " ok. Bye")


def _second_scheduler(t: Transcript) -> None:
    t.sources["sched2"] = FORGED_SOURCE
    hello = t.hello("sched")
    copy = wire.Hello(
        hello.role,
        hello.engine,
        hello.role_derivation,
        hello.async_scheduling,
        hello.num_speculative_tokens,
        hello.plugin_version,
        hello.engine_version,
        hello.spec_method,
        hello.verification,
    )
    first = _step_frame(t, "sched", 3)
    t.insert_before(first, Frame("sched2", wire.KIND_HELLO, 0, 0, 1, hello=copy))
    record = t.prov(0, 2)
    again = wire.ProvenanceRecord(
        0, record.offset, list(record.token_ids), list(record.roles), record.drafts_scheduled
    )
    t.insert_before(first, Frame("sched2", wire.KIND_PROVENANCE, 1, 3, 2, records=[again]))


assert EOS == 1, "sse.token_ids.true relies on EOS being token 1"


# --- the catalog -------------------------------------------------------------------------

_C = Case
I9 = "issue 9: "
GAP3 = "frames lost: gap in source {sched} at seq 3"
GAP_FRONT2 = "frames lost: gap in source {front} at seq 2"
GAP_FRONT3 = "frames lost: gap in source {front} at seq 3"
BOTH_GAP3 = {0: GAP3, 1: GAP3}
NOT_INT = "an id that is not an integer is bad SSE data (both SSE paths)"
OUT_OF_RANGE = "an id outside u32 is bad SSE data (both SSE paths)"
PY_OTHER_MESSAGE = I9 + "--reconciler python reports it differently (invalid SSE data: token id …)"
NO_FINISH = "the stream ended without a finish_reason (server closed it early)"
GAP_FRONT0 = "frames lost: gap in source {front} at seq 0"
GAP_SCHED0 = "frames lost: gap in source {sched} at seq 0"
GAP_SCHED2 = "frames lost: gap in source {sched} at seq 2"
GAP_SCHED6 = "frames lost: gap in source {sched} at seq 6"
DUP3 = "source {sched}: seq 3 received twice with different content"
SECOND_HELLO = "source {sched}: a second hello that differs from its first"
INSIDE_RECORD = "stream 0: an SSE chunk ends at offset 13 (byte 30), inside a text record"
OTHER_CHOICE = "stream 0: SSE chunk with a choice other than the single choice 0 (index 1)"
NO_REQUEST_ID = "stream 0: SSE chunk id does not carry the request id ph1_…"


def after_last(witness: str, offset: int) -> str:
    return (
        f"stream 0: {witness} token at offset {offset} after the scheduler's last step "
        f"ended at offset {offset}"
    )


def above_k(stream: int, scheduled: int, offset: int, k: int) -> str:
    return (
        f"stream {stream}: {scheduled} drafts scheduled at offset {offset}, "
        f"the scheduler's hello says K {k}"
    )


def finish_pair(scheduler: str, detokenizer: str) -> str:
    return (
        f"stream 0: the scheduler finished the request with '{scheduler}', "
        f"the detokenizer with '{detokenizer}'"
    )


def metrics_disagree(step: int, vllm: str, offset: int, scheduler: str) -> str:
    return (
        f"stream 0: vLLM's per-request metrics disagree at verify step {step}: {vllm} "
        f"drafted, the scheduler's step at offset {offset} says {scheduler}"
    )


def metrics_steps(listed: int, sent: int) -> str:
    return (
        f"stream 0: vLLM's per-request metrics list {listed} verify steps, the scheduler "
        f"sent {sent} steps with drafts"
    )


def bad_id(position: int) -> str:
    return (
        f"bad SSE data: invalid SSE chunk: choices[0].token_ids[{position}] must be an "
        "integer in 0..=4294967295"
    )


CASES: list[Case] = [
    # ---------------------------------------------------------------- honest controls
    *[
        _C(
            f"honest.{name}",
            "control",
            f"honest base: {base.description}",
            "none",
            base=name,
            expect="exact",
        )
        for name, base in BASES.items()
    ],
    _C(
        "honest.sse_keepalive",
        "sse.comment_lines",
        "comments, retry/id fields and `event: ping` events between the chunks",
        "none",
        _sse_keepalive,
        expect="exact",
    ),
    _C(
        "honest.sse_multiline_data",
        "sse.data_lines",
        "one chunk's JSON spread over two `data:` lines (joined with a newline)",
        "none",
        _sse_multiline,
        expect="exact",
    ),
    _C(
        "honest.sse_no_done",
        "sse.done",
        "the body ends after the usage chunk without `[DONE]`",
        "none",
        _sse_done_missing,
        expect="exact",
    ),
    _C(
        "honest.sse_no_usage",
        "sse.usage",
        "no usage chunk (it is optional)",
        "none",
        _sse_usage_absent,
        expect="exact",
    ),
    _C(
        "honest.sse_metrics",
        "sse.metrics.per_step_accepted",
        "vLLM's per-request metrics in both usage chunks, matching the scheduler's records",
        "none",
        _sse_metrics,
        expect="exact",
    ),
    _C(
        "honest.notice_foreign_stream",
        "notice.stream",
        "a notice for stream 7 of a 2-stream run (no such stream): counted, nothing fails",
        "scheduler",
        _notice_foreign,
        expect="exact",
    ),
    # ---------------------------------------------------------------- header
    _C(
        "header.magic",
        "header.magic",
        "scheduler frame of step 3 starts with PHUX",
        "scheduler",
        _header_magic,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: bad magic -> rejected; the source's sequence has a gap",
    ),
    _C(
        "header.version",
        "header.version",
        "scheduler frame of step 3 carries the next protocol version",
        "scheduler",
        _header_version,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: unsupported protocol version -> rejected; gap",
    ),
    _C(
        "header.kind.unknown",
        "header.kind",
        "scheduler frame of step 3 has kind 9",
        "scheduler",
        _header_kind_unknown,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: unknown frame kind -> rejected; gap",
    ),
    _C(
        "header.kind.other_body",
        "header.kind",
        "a provenance body sent under kind text",
        "scheduler",
        _header_kind_other_body,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: the body does not parse as the kind -> rejected; gap",
    ),
    _C(
        "header.kind.role",
        "header.kind",
        "the frontend sends a provenance frame",
        "frontend",
        _header_kind_role,
        streams=(0, 1),
        reasons={
            0: "source {front}: provenance frame from a frontend source",
            1: "source {front}: provenance frame from a frontend source",
        },
        rule="admission 4: a source sends only its role's kind (run-level failure)",
    ),
    _C(
        "header.flags",
        "header.flags",
        "scheduler frame of step 3 has header flags 1",
        "scheduler",
        _header_flags,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: reserved header flags set -> rejected; gap",
    ),
    _C(
        "header.run_id",
        "header.run_id",
        "scheduler frame of step 3 names another run",
        "scheduler",
        _header_run_id,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="admission 2: frame for another run -> rejected; gap",
    ),
    _C(
        "header.source_id.other",
        "header.source_id",
        "scheduler frame of step 3 carries another source id (no hello from it)",
        "scheduler",
        _header_source_id,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="admission 3: the real source has a gap; the forged one never says hello",
    ),
    _C(
        "header.source_id.zero",
        "header.source_id",
        "scheduler frame of step 3 has source id 0",
        "scheduler",
        _header_source_zero,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: source id 0 is reserved -> rejected; gap",
    ),
    _C(
        "header.seq.swapped",
        "header.seq",
        "the scheduler frames of steps 3 and 4 swap their seq numbers",
        "scheduler",
        _header_seq_swapped,
        streams=(0, 1),
        reasons={
            0: "provenance offset 6 for stream 0, expected 4",
            1: "provenance offset 4 for stream 1, expected 1",
        },
        rule="per stream: provenance records are contiguous",
    ),
    _C(
        "header.seq.duplicate_differs",
        "header.seq",
        "a second frame with the seq of step 3 and other token ids",
        "scheduler",
        _header_seq_duplicate_differs,
        streams=(0, 1),
        reasons={0: DUP3, 1: DUP3},
        rule="issue 9 #3: a duplicate must be byte-identical, or the run fails",
    ),
    _C(
        "header.seq.gap",
        "header.seq",
        "the scheduler skips seq 3 (no frame is missing)",
        "scheduler",
        _header_seq_gap,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="admission 3/finalize 1: a gap in a source's sequence",
    ),
    _C(
        "header.seq.hello_late",
        "header.seq",
        "the scheduler's hello has seq 1 and its first provenance frame seq 0",
        "scheduler",
        _header_seq_hello_late,
        streams=(0, 1),
        reasons={
            0: "source {sched}: provenance frame before its hello",
            1: "source {sched}: provenance frame before its hello",
        },
        rule="admission 4: the first released frame must be the hello",
    ),
    _C(
        "header.step.backwards",
        "header.step",
        "the scheduler frame of step 4 says step 2",
        "scheduler",
        _header_step_backwards,
        streams=(0, 1),
        reasons={
            0: "stream 0: provenance step 2 before step 3",
            1: "stream 1: provenance step 2 before step 3",
        },
        rule="issue 9 #1: steps strictly increase per stream and source",
    ),
    _C(
        "header.step.repeats",
        "header.step",
        "the scheduler frame of step 4 says step 3 again",
        "scheduler",
        _header_step_repeats,
        streams=(0, 1),
        reasons={
            0: "stream 0: two provenance records in step 3",
            1: "stream 1: two provenance records in step 3",
        },
        rule="issue 9 #1: steps strictly increase per stream and source",
    ),
    _C(
        "header.step.split",
        "header.step",
        "engine step 2 sent as two records (AA trimmed, T) in two frames of step 2",
        "scheduler",
        _header_step_split,
        streams=(0,),
        reasons={0: (after_last("SSE", 3), after_last("text", 3))},
        rule="issue 9 #1: step identity is the engine's step number",
    ),
    _C(
        "header.step.text_backwards",
        "header.step",
        "the frontend frame of step 4 says step 1",
        "frontend",
        _header_text_step_backwards,
        streams=(0, 1),
        reasons={
            0: "stream 0: text step 1 before step 3",
            1: "stream 1: text step 1 before step 3",
        },
        rule="issue 9 #1 (frontend side): output-processor steps increase per source",
    ),
    _C(
        "header.timestamp_ns",
        "header.timestamp_ns",
        "scheduler timestamps start at 2^64-1 and run backwards",
        "scheduler",
        _header_timestamp,
        expect="claim",
        rule="carries no evidence (sender's clock)",
    ),
    _C(
        "header.dropped",
        "header.dropped",
        "scheduler frame of step 3 reports 1 dropped frame",
        "scheduler",
        _header_dropped,
        streams=(0, 1),
        reasons={
            0: "frames lost: source {sched} dropped 1 frames before seq 3",
            1: "frames lost: source {sched} dropped 1 frames before seq 3",
        },
        rule="admission 5: dropped > 0 fails every stream not yet complete",
    ),
    _C(
        "header.dropped.after_verdict",
        "header.dropped",
        "once stream 1 shows EXACT, the next scheduler frame reports 1 dropped frame",
        "scheduler",
        _dropped_after_verdict,
        streams=(0, 1),
        reasons={
            0: "frames lost: source {sched} dropped 1 frames before seq 6",
            1: "frames lost: source {sched} dropped 1 frames before seq 6",
        },
        rule="issue 9 #9: evidence before finalize() revokes a verdict (a lost frame may "
        "have been a notice for any stream)",
    ),
    _C(
        "header.seq.lost_after_verdict",
        "header.seq",
        "once stream 1 shows EXACT, a scheduler frame (its late notice) is lost; later "
        "frames wait behind the gap until finalize()",
        "sender",
        _lost_after_verdict,
        streams=(0, 1),
        reasons={0: GAP_SCHED6, 1: GAP_SCHED6},
        rule="a gap still open at finalize() is a frame loss: it revokes exact verdicts too",
    ),
    _C(
        "header.body_len",
        "header.body_len",
        "scheduler frame of step 3 claims one body byte more",
        "scheduler",
        _header_body_len,
        streams=(0, 1),
        reasons=BOTH_GAP3,
        rule="decoder: body length mismatch -> rejected; gap",
    ),
    # ---------------------------------------------------------------- hello
    _C(
        "hello.role.frontend",
        "hello.role",
        "the scheduler's hello says frontend",
        "scheduler",
        _hello_role_frontend,
        streams=(0, 1),
        reasons={
            0: "source {sched}: provenance frame from a frontend source",
            1: "source {sched}: provenance frame from a frontend source",
        },
        rule="admission 4: a source sends only its role's kind",
    ),
    _C(
        "hello.role.scheduler",
        "hello.role",
        "the frontend's hello says scheduler",
        "frontend",
        _hello_front_role_scheduler,
        streams=(0, 1),
        reasons={
            0: "source {front}: text frame from a scheduler source",
            1: "source {front}: text frame from a scheduler source",
        },
        rule="admission 4: a source sends only its role's kind",
    ),
    _C(
        "hello.role.unknown",
        "hello.role",
        "the scheduler's hello has role 7",
        "scheduler",
        _hello_role_unknown,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: unknown role -> rejected; the source never starts",
    ),
    _C(
        "hello.engine.simulated",
        "hello.engine",
        "both hellos say simulated engine",
        "scheduler+frontend",
        _hello_engine_simulated,
        expect="claim",
        rule="the sender's claim: shown as the plugin hello's statement",
        shown=("simulated engine",),
    ),
    _C(
        "hello.engine.unknown",
        "hello.engine",
        "the scheduler's hello has engine 9",
        "scheduler",
        _hello_engine_unknown,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: unknown engine -> rejected; the source never starts",
    ),
    _C(
        "hello.role_derivation.counts",
        "hello.role_derivation",
        "both hellos say roles were derived from counts only",
        "scheduler+frontend",
        _hello_derivation_counts,
        expect="claim",
        rule="the sender's claim about its own derivation",
        shown=("roles from counts only",),
    ),
    _C(
        "hello.role_derivation.none",
        "hello.role_derivation",
        "the scheduler's hello says derivation none beside method ngram, K=3",
        "scheduler",
        _hello_derivation_none,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: inconsistent speculative fields -> rejected",
    ),
    _C(
        "hello.async_scheduling",
        "hello.async_scheduling",
        "both hellos say async scheduling",
        "scheduler+frontend",
        _hello_async,
        expect="claim",
        rule="the sender's claim",
    ),
    _C(
        "hello.async_scheduling.invalid",
        "hello.async_scheduling",
        "the scheduler's hello has async_scheduling 2",
        "scheduler",
        _hello_async_invalid,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: invalid async_scheduling -> rejected",
    ),
    _C(
        "hello.num_speculative_tokens.smaller",
        "hello.num_speculative_tokens",
        "both hellos say K=2; records schedule 3 drafts",
        "scheduler+frontend",
        _hello_k_smaller,
        streams=(0, 1),
        reasons={0: above_k(0, 3, 1, 2), 1: above_k(1, 3, 1, 2)},
        rule="issue 9 #4: drafts_scheduled <= the hello's K",
    ),
    _C(
        "hello.num_speculative_tokens.beyond_record",
        "hello.num_speculative_tokens",
        "the scheduler's hello says K=65535 and its target steps schedule 65535 drafts",
        "scheduler",
        _hello_k_huge,
        streams=(0, 1),
        reasons={0: GAP_SCHED0, 1: GAP_SCHED0},
        rule="decoder: K <= 255 (a step of K + 1 tokens must fit one record; bounds the "
        "per-position statistics)",
    ),
    _C(
        "hello.num_speculative_tokens.zero",
        "hello.num_speculative_tokens",
        "consistent 'no speculative decoding' hellos beside records with accepted drafts",
        "scheduler+frontend",
        _hello_no_spec,
        streams=(0, 1),
        reasons={0: above_k(0, 3, 1, 0), 1: above_k(1, 3, 1, 0)},
        rule="issue 9 #4: roles other than plain need a speculative hello",
    ),
    _C(
        "hello.verification",
        "hello.verification",
        "the scheduler's hello has verification 9",
        "scheduler",
        _hello_verification_unknown,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: unknown verification -> rejected",
    ),
    _C(
        "hello.plugin_version",
        "hello.plugin_version",
        "both hellos claim plugin 9.9.9-liar",
        "scheduler+frontend",
        _hello_plugin_version,
        expect="claim",
        rule="the sender's claim",
        shown=("9.9.9-liar",),
    ),
    _C(
        "hello.engine_version",
        "hello.engine_version",
        "both hellos claim vLLM 0.99.0-liar",
        "scheduler+frontend",
        _hello_engine_version,
        expect="claim",
        rule="the sender's claim",
        shown=("0.99.0-liar",),
    ),
    _C(
        "hello.spec_method",
        "hello.spec_method",
        "both hellos claim eagle3 (the records are the same)",
        "scheduler+frontend",
        _hello_method,
        expect="claim",
        rule="the sender's claim",
        shown=("eagle3",),
    ),
    _C(
        "hello.spec_method.empty",
        "hello.spec_method",
        "the scheduler's hello has no method beside K=3",
        "scheduler",
        _hello_method_empty,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: inconsistent speculative fields -> rejected",
    ),
    _C(
        "hello.engine_version.invalid_utf8",
        "hello.engine_version",
        "the scheduler's engine_version is not UTF-8",
        "scheduler",
        _hello_bad_utf8,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 0",
            1: "frames lost: gap in source {sched} at seq 0",
        },
        rule="decoder: invalid UTF-8 in hello -> rejected",
    ),
    _C(
        "hello.frontend_disagrees",
        "hello.num_speculative_tokens",
        "the frontend's hello says eagle3 K=5, the scheduler's ngram K=3",
        "frontend",
        _hello_frontend_disagrees,
        streams=(0, 1),
        reasons={0: GAP_FRONT0, 1: GAP_FRONT0},
        rule="the hellos of one engine agree on method and K",
    ),
    _C(
        "hello.repeated_differs",
        "hello.num_speculative_tokens",
        "a second scheduler hello mid-run says eagle3 K=7",
        "scheduler",
        _hello_repeated,
        streams=(0, 1),
        reasons={0: SECOND_HELLO, 1: SECOND_HELLO},
        rule="a source that contradicts its own hello cannot be trusted",
    ),
    # ---------------------------------------------------------------- provenance
    _C(
        "provenance.stream.foreign",
        "provenance.stream",
        "stream 0's record of step 3 is labelled stream 5 (of a 2-stream run)",
        "scheduler",
        _prov_stream_foreign,
        reasons={0: "provenance offset 6 for stream 0, expected 4"},
        rule="per stream: provenance records are contiguous",
    ),
    _C(
        "provenance.stream.other",
        "provenance.stream",
        "stream 0's record of step 2 is labelled stream 1",
        "scheduler",
        _prov_stream_other,
        streams=(0, 1),
        reasons={
            0: "provenance offset 4 for stream 0, expected 1",
            1: "provenance offset 1 for stream 1, expected 4",
        },
        rule="per stream: provenance records are contiguous",
    ),
    _C(
        "provenance.record_count",
        "provenance.record_count",
        "the scheduler frame of step 2 says 0 records",
        "scheduler",
        _prov_record_count,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: record count out of range -> rejected; gap",
    ),
    _C(
        "provenance.flags.finished_early",
        "provenance.flags.finished",
        "stream 0's record of step 3 says finished (length); records follow",
        "scheduler",
        _prov_finished_early,
        reasons={
            0: (
                after_last("SSE", 6),
                after_last("text", 6),
                "stream 0: provenance at offset 6 after the scheduler finished the request",
            )
        },
        rule="issue 9 #2: no provenance after a finished record",
    ),
    _C(
        "provenance.flags.never_finished",
        "provenance.flags.finished",
        "stream 0's last record is not finished (finish_reason 0); the text finishes",
        "scheduler",
        _prov_never_finished,
        reasons={0: "missing telemetry: the scheduler did not finish the request at offset 15"},
        rule="issue 9 #2: the scheduler's finish agrees with the text's",
    ),
    _C(
        "provenance.flags.trimmed_middle",
        "provenance.flags.trimmed",
        "stream 0's record of step 3 (AT, not the last) says trimmed",
        "scheduler",
        _prov_trimmed_middle,
        reasons={
            0: (
                after_last("SSE", 6),
                after_last("text", 6),
                "stream 0: provenance at offset 6 after a trimmed step",
            )
        },
        rule="issue 9 #2: trimmed only on the record that ends the request",
    ),
    _C(
        "provenance.flags.trimmed_missing",
        "provenance.flags.trimmed",
        "stream 0's last record (AA, EOS accepted) drops its trimmed flag",
        "scheduler",
        _prov_trimmed_dropped,
        reasons={0: "missing telemetry: no provenance for offset 13"},
        rule="decoder: an untrimmed record ends on T or B -> rejected",
    ),
    _C(
        "provenance.flags.unknown",
        "provenance.flags",
        "stream 0's record of step 2 sets flag bit 4",
        "scheduler",
        _prov_flags_unknown,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: invalid flags -> rejected",
    ),
    _C(
        "provenance.finish_reason.length",
        "provenance.finish_reason",
        "stream 0's scheduler says length; text and SSE say stop",
        "scheduler",
        _prov_finish_length,
        reasons={0: finish_pair("length", "stop")},
        rule="issue 9 #2: finish reasons agree across provenance, text and SSE",
    ),
    _C(
        "provenance.finish_reason.abort",
        "provenance.finish_reason",
        "stream 0's scheduler says abort",
        "scheduler",
        _prov_finish_abort,
        reasons={0: finish_pair("abort", "stop")},
        rule="issue 9 #2: finish reasons agree",
    ),
    _C(
        "provenance.finish_reason.error",
        "provenance.finish_reason",
        "stream 0's scheduler says error",
        "scheduler",
        _prov_finish_error,
        reasons={0: finish_pair("error", "stop")},
        rule="issue 9 #2: finish reasons agree (an errored request is never exact)",
    ),
    _C(
        "provenance.finish_reason.unknown",
        "provenance.finish_reason",
        "stream 0's scheduler says finish reason 9",
        "scheduler",
        _prov_finish_unknown,
        reasons={0: "missing telemetry: no provenance for offset 13"},
        rule="decoder: finish reason out of range -> rejected",
    ),
    _C(
        "provenance.offset",
        "provenance.offset",
        "stream 0's record of step 3 starts one token late",
        "scheduler",
        _prov_offset,
        reasons={0: "provenance offset 5 for stream 0, expected 4"},
        rule="per stream: provenance records are contiguous",
    ),
    _C(
        "provenance.n_tokens.raw",
        "provenance.n_tokens",
        "stream 0's record of step 2 says 4 tokens (3 follow)",
        "scheduler",
        _prov_n_tokens_raw,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: the body does not parse -> rejected; gap",
    ),
    _C(
        "provenance.n_tokens.short",
        "provenance.n_tokens",
        "stream 0's record of step 3 leaves out its last token (and role)",
        "scheduler",
        _prov_n_tokens_short,
        reasons={0: "provenance offset 6 for stream 0, expected 5"},
        rule="per stream: provenance records are contiguous",
    ),
    _C(
        "provenance.drafts_scheduled.above_k",
        "provenance.drafts_scheduled",
        "stream 0's record of step 3 schedules 4 drafts (K=3)",
        "scheduler",
        _prov_drafts_above_k,
        reasons={0: above_k(0, 4, 4, 3)},
        rule="issue 9 #4: drafts_scheduled <= K",
    ),
    _C(
        "provenance.drafts_scheduled.lowered",
        "provenance.drafts_scheduled",
        "stream 0's record of step 3 says 2 drafts instead of 3 (AT stays valid)",
        "scheduler",
        _prov_drafts_lowered,
        expect="limit",
        rule="the engine's own statement; only vLLM's per-request metrics can contradict it",
    ),
    _C(
        "provenance.drafts_padded.all",
        "provenance.drafts_padded",
        "stream 0's record of step 2: 3 of 3 drafts padded, yet 2 accepted",
        "scheduler",
        _prov_padded_all,
        streams=(0, 1),
        reasons={0: GAP_SCHED2, 1: GAP_SCHED2},
        rule="issue 9 #7: accepted <= drafts_scheduled - drafts_padded",
    ),
    _C(
        "provenance.drafts_padded.above",
        "provenance.drafts_padded",
        "stream 0's record of step 2: 4 padded of 3 scheduled",
        "scheduler",
        _prov_padded_above,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: padded drafts exceed scheduled -> rejected",
    ),
    _C(
        "provenance.token_ids",
        "provenance.token_ids",
        "stream 0's scheduler says 999 at offset 5 (text and SSE: 220)",
        "scheduler",
        _prov_token_id,
        reasons={0: "token mismatch at offset 5: scheduler 999, detokenizer 220"},
        rule="per stream: scheduler and detokenizer ids agree",
    ),
    _C(
        "provenance.roles.unknown",
        "provenance.roles",
        "stream 0's record of step 2 has role 7",
        "scheduler",
        _prov_role_unknown,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: unknown role -> rejected",
    ),
    _C(
        "provenance.roles.sequence",
        "provenance.roles",
        "stream 0's record of step 2 has roles ATA",
        "scheduler",
        _prov_role_sequence,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 2",
            1: "frames lost: gap in source {sched} at seq 2",
        },
        rule="decoder: invalid role sequence -> rejected",
    ),
    _C(
        "provenance.roles.relabelled",
        "provenance.roles",
        "stream 0's first (prefill) token claimed as the target after 1 rejected draft",
        "scheduler",
        _prov_roles_relabelled,
        expect="limit",
        rule="roles are the engine's own statement; only per-request metrics contradict",
    ),
    # ---------------------------------------------------------------- text
    _C(
        "text.stream.foreign",
        "text.stream",
        "stream 0's text record of step 3 is labelled stream 5",
        "frontend",
        _text_stream_foreign,
        reasons={0: "text offset 6 for stream 0, expected 4"},
        rule="per stream: text records are contiguous",
    ),
    _C(
        "text.flags.not_finished",
        "text.flags.finished",
        "stream 0's last text record is not finished",
        "frontend",
        _text_not_finished,
        reasons={0: "missing telemetry: text not finished at offset 15"},
        rule="finalize 6: the text must finish",
    ),
    _C(
        "text.flags.finished_early",
        "text.flags.finished",
        "stream 0's text record of step 3 says finished (stop)",
        "frontend",
        _text_finished_early,
        reasons={
            0: (
                "stream 0: provenance beyond the end of the request at offset 6",
                "stream 0: SSE text extends beyond the HTTP text at byte 12",
                "stream 0: SSE token at offset 6 after the detokenizer finished at offset 6",
            )
        },
        rule="per stream: provenance beyond the end / SSE beyond HTTP or T's end (whichever "
        "arrives first)",
    ),
    _C(
        "text.flags.text_truncated.eos",
        "text.flags.text_truncated",
        "EOS finish with text_truncated, whole HTTP text, and one surplus scheduler token",
        "scheduler+frontend",
        _text_truncated_without_stop,
        reasons={0: "stream 0: provenance at offset 15 after the scheduler finished the request"},
        rule="issue 9 #5: text_truncated needs a stop finish and HTTP text shorter than "
        "the fragments",
    ),
    _C(
        "text.flags.text_truncated.length",
        "text.flags.text_truncated",
        "max_tokens finish (stream 1) with text_truncated and one surplus token",
        "scheduler+frontend",
        _text_truncated_length,
        # The decoder refuses the text frame (stop-string flags beside finish length):
        # stream 0's open record of that frame is lost with it.
        streams=(1, 0),
        reasons={
            1: "stream 1: provenance at offset 9 after the scheduler finished the request",
            0: "frames lost: gap in source {front} at seq 5",
        },
        rule="issue 9 #5: text_truncated needs a stop finish",
    ),
    _C(
        "text.trimmed_tokens.more",
        "text.trimmed_tokens",
        "stop-string finish claims 3 trimmed tokens; the scheduler made 1 after the stop",
        "frontend",
        _text_trimmed_more,
        base="stop_string",
        reasons={
            0: "stream 0: the text ends at offset 6 with 3 trimmed tokens, the scheduler's "
            "step holding offset 5 ends at offset 7"
        },
        rule="trimmed tokens are the scheduler's tokens after the text's end in that step",
    ),
    _C(
        "text.flags.tokens_trimmed_missing",
        "text.flags.tokens_trimmed",
        "stop-string finish with trimmed_tokens 1 but no tokens_trimmed flag",
        "frontend",
        _text_trimmed_without_flag,
        base="stop_string",
        streams=(0, 1),
        reasons={0: GAP_FRONT3, 1: GAP_FRONT3},
        rule="decoder: trimmed_tokens without the flag -> rejected; gap",
    ),
    _C(
        "text.flags.tokens_trimmed_unfinished",
        "text.flags.tokens_trimmed",
        "an unfinished text record (step 2) says tokens_trimmed",
        "frontend",
        _text_trimmed_flag_unfinished,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: tokens_trimmed requires finished -> rejected; gap",
    ),
    _C(
        "text.finish_reason.length",
        "text.finish_reason",
        "stream 0's text says length; scheduler and SSE say stop",
        "frontend",
        _text_finish_length,
        reasons={0: finish_pair("stop", "length")},
        rule="issue 9 #2: finish reasons agree",
    ),
    _C(
        "text.finish_reason.stop_string_length",
        "text.finish_reason",
        "stop-string finish (text_truncated) reported as length",
        "frontend",
        _text_stop_finish_length,
        base="stop_string",
        streams=(0, 1),
        reasons={0: GAP_FRONT3, 1: GAP_FRONT3},
        rule="issue 9 #2/#5: finish reasons agree; text_truncated needs stop",
    ),
    _C(
        "text.offset",
        "text.offset",
        "stream 0's text record of step 4 starts one token late",
        "frontend",
        _text_offset,
        reasons={0: "text offset 7 for stream 0, expected 6"},
        rule="per stream: text records are contiguous",
    ),
    _C(
        "text.n_tokens.raw",
        "text.n_tokens",
        "stream 0's text record of step 2 says 2 tokens (3 follow)",
        "frontend",
        _text_n_tokens_raw,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: the body does not parse -> rejected; gap",
    ),
    _C(
        "text.n_tokens.short",
        "text.n_tokens",
        "stream 0's text record of step 3 leaves out its held token",
        "frontend",
        _text_n_tokens_short,
        reasons={0: "text offset 6 for stream 0, expected 5"},
        rule="per stream: text records are contiguous",
    ),
    _C(
        "text.http_len",
        "text.http_len",
        "stream 0's text record of step 2 says http_len 3 (6 bytes follow)",
        "frontend",
        _text_http_len,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: trailing bytes -> rejected; gap",
    ),
    _C(
        "text.token_id",
        "text.token_id",
        "stream 0's detokenizer says 999 at offset 5",
        "frontend",
        _text_token_id,
        reasons={0: "token mismatch at offset 5: scheduler 220, detokenizer 999"},
        rule="per stream: ids agree across witnesses",
    ),
    _C(
        "text.frag_len.invalid",
        "text.frag_len",
        "step 2's frag_len 4->5 and 2->1: é cut in two",
        "frontend",
        _text_frag_len_invalid,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: a fragment is not UTF-8 -> rejected; gap",
    ),
    _C(
        "text.frag_len.moved",
        "text.frag_len",
        "step 5's ' ok' '.' re-cut as ' o' 'k.' ('k' from the target, not a draft)",
        "frontend",
        _text_frag_len_moved,
        expect="limit",
        rule="a token's bytes are the detokenizer's statement (no tokenizer in the client)",
    ),
    _C(
        "text.span_back.more",
        "text.span_back",
        "🙂's fragment claims 3 earlier tokens (2 are pending)",
        "frontend",
        _text_span_back_more,
        reasons={0: "stream 0: span_back 3 at offset 10 exceeds 2 pending tokens"},
        rule="per stream: span_back <= pending empty tokens",
    ),
    _C(
        "text.span_back.less",
        "text.span_back",
        "🙂's fragment claims no earlier tokens (its first bytes came in step 4)",
        "frontend",
        _text_span_back_less,
        reasons={0: "stream 0: token at offset 8 gave 2 bytes that no fragment carries"},
        rule="protocol 3: an unclaimed empty token must give 0 bytes (a skipped special token)",
    ),
    _C(
        "text.lead_len.give_sum",
        "text.lead_len",
        "220 (step 2) says it gave 5 bytes to 日本, whose lead_len is 4",
        "frontend",
        _text_give_sum,
        reasons={0: "stream 0: the 1 tokens before offset 6 give 5 bytes, its lead_len says 4"},
        rule="protocol 3: the predecessors' give counts add up to the carrier's lead_len",
    ),
    _C(
        "text.lead_len.give_unclaimed",
        "text.lead_len",
        "🙂 claims one predecessor (231) with lead_len 2; 230 still says it gave 2 bytes",
        "frontend",
        _text_give_unclaimed,
        reasons={0: "stream 0: token at offset 8 gave 2 bytes that no fragment carries"},
        rule="protocol 3: a give no fragment's span_back claims is a contradiction",
    ),
    _C(
        "text.lead_len.split_moved",
        "text.lead_len",
        "220 gives 3 bytes and 日本's lead_len is 3: 本 (really mixed) shows as step 3's",
        "frontend",
        _text_give_split_moved,
        expect="limit",
        rule="the byte split inside a fragment (give counts, lead_len) is the detokenizer's "
        "statement: a consistent re-split cannot be caught",
    ),
    _C(
        "text.lead_len.give_at_finish",
        "text.lead_len",
        "the last token (EOS, nothing after it) says it gave 3 bytes",
        "frontend",
        _text_give_at_finish,
        expect="claim",
        rule="no evidence: bytes held back when the request ends are dropped (the sender "
        "cannot know at that step); nothing shown depends on them",
    ),
    _C(
        "text.span_back.empty_fragment",
        "text.span_back",
        "an empty fragment (201, step 2) claims span_back 1",
        "frontend",
        _text_span_back_empty,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: span_back on an empty fragment -> rejected; gap",
    ),
    _C(
        "text.fragments.byte",
        "text.fragments",
        "the fragment ' caf' says ' cAf' (HTTP and SSE honest)",
        "frontend",
        _text_fragment_byte,
        reasons={0: "byte mismatch at offset 1 (byte 5): detokenizer fragment vs HTTP delta"},
        rule="per stream: fragment bytes equal HTTP bytes",
    ),
    _C(
        "text.fragments.invalid_utf8",
        "text.fragments",
        "the fragment ' caf' ends in 0xff",
        "frontend",
        _text_fragment_invalid,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: invalid UTF-8 in a fragment -> rejected; gap",
    ),
    _C(
        "text.http_delta.byte",
        "text.http_delta",
        "step 2's HTTP delta says ' cAfé' (fragment and SSE honest)",
        "frontend",
        _text_http_byte,
        reasons={0: "byte mismatch at offset 1 (byte 5): detokenizer fragment vs HTTP delta"},
        rule="per stream: fragment bytes equal HTTP bytes",
    ),
    _C(
        "text.http_delta.byte_with_sse",
        "text.http_delta",
        "step 2's HTTP delta and SSE both say ' cAfé' (fragment honest)",
        "frontend+sse",
        _text_http_and_sse_byte,
        reasons={0: "byte mismatch at offset 1 (byte 5): detokenizer fragment vs HTTP delta"},
        rule="per stream: fragment bytes equal HTTP bytes",
    ),
    _C(
        "text.http_delta.short",
        "text.http_delta",
        "the last fragment ' Bye' never reaches HTTP nor SSE; nothing was truncated",
        "frontend+sse",
        _text_http_short,
        reasons={
            0: "stream 0: the HTTP text is shorter than the fragments (30 of 34 bytes) "
            "without text_truncated"
        },
        rule="without text_truncated the finished HTTP text equals the fragments",
    ),
    _C(
        "text.http_delta.long",
        "text.http_delta",
        "the last HTTP delta and SSE chunk end in an extra '!'",
        "frontend+sse",
        _text_http_long,
        reasons={0: "stream 0: HTTP text extends beyond the detokenized fragments at byte 34"},
        rule="per stream: H never extends beyond F",
    ),
    _C(
        "text.http_delta.invalid_utf8",
        "text.http_delta",
        "step 2's HTTP delta ends inside a character",
        "frontend",
        _text_http_invalid,
        streams=(0, 1),
        reasons={0: GAP_FRONT2, 1: GAP_FRONT2},
        rule="decoder: invalid UTF-8 in the http delta -> rejected; gap",
    ),
    # ---------------------------------------------------------------- notice
    _C(
        "notice.stream",
        "notice.stream",
        "a hook-error notice for stream 0 mid-run",
        "scheduler",
        _notice_stream,
        reasons={0: "not exact: hook failed: telemetry off (notice 3 from source {sched})"},
        rule="per stream: a notice fails its stream",
    ),
    _C(
        "notice.stream.all",
        "notice.stream",
        "an unsupported-engine notice for every stream (0xFFFF) from the frontend",
        "frontend",
        _notice_all,
        streams=(0, 1),
        reasons={
            0: "not exact: vLLM 9.9 (notice 4 from source {front})",
            1: "not exact: vLLM 9.9 (notice 4 from source {front})",
        },
        rule="per stream: a notice for 0xFFFF fails every stream",
    ),
    _C(
        "notice.code",
        "notice.code",
        "a notice with code 99 for stream 0",
        "scheduler",
        _notice_code_unknown,
        reasons={0: "not exact: code from the future (notice 99 from source {sched})"},
        rule="notices may carry any code; each fails its stream",
    ),
    _C(
        "notice.message.hostile",
        "notice.message",
        "a notice whose message holds a newline, ESC[2J and BEL",
        "scheduler",
        _notice_message_hostile,
        reasons={0: "not exact: line one\n\x1b[2Jline two\x07 (notice 5 from source {sched})"},
        rule="per stream: a notice fails its stream; the screen shows it sanitized",
    ),
    _C(
        "notice.message.invalid_utf8",
        "notice.message",
        "a notice whose message is not UTF-8",
        "scheduler",
        _notice_message_invalid,
        streams=(0, 1),
        reasons={
            0: "frames lost: gap in source {sched} at seq 4",
            1: "frames lost: gap in source {sched} at seq 4",
        },
        rule="decoder: invalid UTF-8 notice -> rejected; gap",
    ),
    _C(
        "notice.after_verdict",
        "notice.timing",
        "once stream 1 shows EXACT, a hook-error notice for stream 1 (before finalize)",
        "scheduler",
        _notice_after_verdict,
        streams=(1,),
        reasons={1: "not exact: late: hook failed for stream 1 (notice 3 from source {sched})"},
        rule="issue 9 #9: a notice before finalize() revokes the verdict",
    ),
    # ---------------------------------------------------------------- SSE
    _C(
        "sse.id.changed",
        "sse.id",
        "one chunk of stream 0 carries another run's request id",
        "sse",
        _sse_id_changed,
        reasons={0: NO_REQUEST_ID},
        rule="issue 9 #10: the chunk id carries this stream's request id",
    ),
    _C(
        "sse.id.other_stream",
        "sse.id",
        "every chunk of stream 0 names stream 1's request",
        "sse",
        _sse_id_other_stream,
        reasons={0: NO_REQUEST_ID},
        rule="issue 9 #10: the chunk id carries this stream's request id",
    ),
    _C(
        "sse.choices.index",
        "sse.choices.index",
        "every choice of stream 0 has index 1",
        "sse",
        _sse_index_one,
        reasons={0: (NO_FINISH, OTHER_CHOICE)},
        rule="issue 9 #6: only choice 0 is this stream's text",
    ),
    _C(
        "sse.choices.second",
        "sse.choices",
        "every content chunk of stream 0 carries a second choice (index 1)",
        "sse",
        _sse_second_choice,
        reasons={0: OTHER_CHOICE},
        rule="issue 9 #6: a second choice means n > 1: not exact",
    ),
    _C(
        "sse.choices.second_chunks",
        "sse.choices",
        "after each chunk of choice 0, a chunk of choice 1 with text 'zz'",
        "sse",
        _sse_second_choice_chunks,
        reasons={0: OTHER_CHOICE},
        rule="issue 9 #6: choice 1's text never mixes into stream 0",
    ),
    _C(
        "sse.delta.content.byte",
        "sse.delta.content",
        "stream 0's SSE says ' cAfé' (text frames honest)",
        "sse",
        _sse_content_byte,
        reasons={0: "byte mismatch at offset 1 (byte 5): HTTP delta vs SSE"},
        rule="per stream: HTTP bytes equal SSE bytes",
    ),
    _C(
        "sse.text.byte",
        "sse.text",
        "completions: stream 0's `text` says ' cAfé'",
        "sse",
        _sse_content_byte,
        base="completions",
        reasons={0: "byte mismatch at offset 1 (byte 5): HTTP delta vs SSE"},
        rule="per stream: HTTP bytes equal SSE bytes",
    ),
    _C(
        "sse.delta.content.extra",
        "sse.delta.content",
        "stream 0's last SSE chunk ends in an extra '!'",
        "sse",
        _sse_content_extra,
        reasons={0: "stream 0: SSE text extends beyond the HTTP text at byte 34"},
        rule="per stream: S never extends beyond H once the text finished",
    ),
    _C(
        "sse.delta.content.null",
        "sse.delta.content",
        "stream 0's chunk of step 2 has content null (its token ids stay)",
        "sse",
        _sse_content_null,
        reasons={0: "byte mismatch at offset 1 (byte 4): HTTP delta vs SSE"},
        rule="per stream: HTTP bytes equal SSE bytes",
    ),
    _C(
        "sse.delta.content.lone_surrogate",
        "sse.delta.content",
        "stream 0's chunk of step 2 holds a lone surrogate \\ud800",
        "sse",
        _sse_lone_surrogate,
        reasons={0: "bad SSE data: …"},
        rule="issue 9 fault: a stream's bad input fails that stream, the others go on",
    ),
    *[
        _C(
            f"sse.token_ids.{name}",
            "sse.token_ids",
            f"stream 0's chunk of step {step} has token_ids {ids}",
            "sse",
            _ids(step - 1, ids),
            reasons={0: bad_id(position)},
            rule=rule,
            xfail=xfail,
            xfail_in=PY,
        )
        for name, step, ids, position, rule, xfail in (
            # The reference reader rejects ids that are not integers (issue 10's
            # one Python body reader); the range is push_sse's (its own message).
            ("string", 3, '[102,220,"x"]', 2, NOT_INT, None),
            ("null", 3, "[102,220,null]", 2, NOT_INT, None),
            ("float", 3, "[102,220,1.5]", 2, NOT_INT, None),
            (
                "true",
                6,
                "[106,true]",
                1,
                "JSON true is not an integer (Python's bool is one)",
                None,
            ),
            ("negative", 3, "[102,220,-5]", 2, OUT_OF_RANGE, None),
            ("huge", 3, "[102,220,4294967296]", 2, OUT_OF_RANGE, None),
            (
                "string_digits",
                3,
                '[102,"220"]',
                1,
                NOT_INT,
                None,
            ),
        )
    ],
    _C(
        "sse.token_ids.missing",
        "sse.token_ids",
        "stream 0's chunk of step 3 has no token_ids",
        "sse",
        _sse_ids_missing,
        reasons={
            0: (
                "token mismatch at offset 4: detokenizer 102, SSE 221",
                # The usage chunk can come before step 3's text frame.
                "stream 0: usage.completion_tokens 15, but the SSE carried 13 tokens",
            )
        },
        rule="per stream: detokenizer and SSE ids agree (offsets counted in arrival order)",
    ),
    _C(
        "sse.token_ids.shifted",
        "sse.token_ids",
        "step 3's first id moves into step 2's chunk (bytes stay)",
        "sse",
        _sse_ids_shifted,
        reasons={0: "stream 0: an SSE chunk ends at offset 5 (byte 9), inside a text record"},
        rule="each SSE chunk carries whole steps: its ids and bytes end on one text "
        "record boundary",
    ),
    _C(
        "sse.finish_reason.length",
        "sse.finish_reason",
        "stream 0's SSE says length; scheduler and text say stop",
        "sse",
        _sse_finish("length"),
        reasons={0: "stream 0: SSE finish_reason 'length', the detokenizer finished with 'stop'"},
        rule="issue 9 #2: finish reasons agree across provenance, text and SSE",
    ),
    _C(
        "sse.finish_reason.bogus",
        "sse.finish_reason",
        "stream 0's SSE finish_reason is 'content_filter'",
        "sse",
        _sse_finish("content_filter"),
        reasons={
            0: "stream 0: SSE finish_reason 'content_filter', the detokenizer finished with 'stop'"
        },
        rule="issue 9 #2: finish reasons agree",
    ),
    _C(
        "sse.finish_reason.missing",
        "sse.finish_reason",
        "stream 0 never sends a finish_reason",
        "sse",
        _sse_finish_missing,
        reasons={0: NO_FINISH},
        rule="the SSE reader: a body without finish_reason failed",
    ),
    _C(
        "sse.finish_reason.early",
        "sse.finish_reason",
        "stream 0's chunk of step 3 already says stop; content follows",
        "sse",
        _sse_finish_early,
        reasons={
            0: "bad SSE data: invalid SSE chunk: choice 0 has content after its finish_reason"
        },
        rule="no content after a choice's finish_reason",
    ),
    _C(
        "sse.usage.completion_tokens",
        "sse.usage.completion_tokens",
        "stream 0's usage says 16 completion tokens (15 were sent)",
        "sse",
        _sse_usage_more,
        reasons={0: "stream 0: usage.completion_tokens 16, but the SSE carried 15 tokens"},
        rule="issue 9 #10: usage.completion_tokens equals the confirmed tokens",
    ),
    _C(
        "sse.usage.completion_tokens.string",
        "sse.usage.completion_tokens",
        'stream 0\'s usage says completion_tokens "15"',
        "sse",
        _sse_usage_string,
        reasons={
            0: "bad SSE data: invalid SSE chunk: usage.completion_tokens must be a "
            "non-negative integer"
        },
        rule="a malformed usage is bad SSE data (both SSE paths)",
    ),
    _C(
        "sse.usage.total_tokens",
        "sse.usage.total_tokens",
        "stream 0's usage total is prompt + completion + 5",
        "sse",
        _sse_usage_total,
        expect="claim",
        rule="carries no evidence about this stream's tokens",
    ),
    _C(
        "sse.metrics.drafted",
        "sse.metrics.per_step_drafted",
        "stream 0's per-request metrics say one draft more at the first verify step",
        "sse",
        _sse_metrics_edit(_one_more_drafted),
        reasons={0: metrics_disagree(0, "2 accepted of 4", 1, "2 of 3")},
        rule="the fourth witness: vLLM's drafted count per verify step = scheduled - padded",
    ),
    _C(
        "sse.metrics.accepted",
        "sse.metrics.per_step_accepted",
        "stream 0's per-request metrics say one accepted draft fewer at the second verify step",
        "sse",
        _sse_metrics_edit(_one_fewer_accepted),
        reasons={0: metrics_disagree(1, "0 accepted of 3", 4, "1 of 3")},
        rule="the fourth witness: vLLM's accepted count per verify step = the accepted roles",
    ),
    _C(
        "sse.metrics.steps",
        "sse.metrics.per_step_accepted",
        "stream 0's per-request metrics leave out the last verify step",
        "sse",
        _sse_metrics_edit(_last_step_missing),
        reasons={0: metrics_steps(4, 5)},
        rule="the fourth witness: one entry per scheduler step with drafts",
    ),
    _C(
        "sse.metrics.one_list",
        "sse.metrics.per_step_drafted",
        "stream 0's per-request metrics have per_step_accepted only",
        "sse",
        _sse_metrics_edit(_drafted_missing),
        reasons={
            0: "stream 0: vLLM's per-request metrics carry per_step_accepted without "
            "per_step_drafted"
        },
        rule="the fourth witness: both lists or neither",
    ),
    # -------------------------------------------------- issue 24: monotone evidence
    _C(
        "sse.metrics.contradict_then_absent",
        "sse.metrics.per_step_accepted",
        "stream 0's first usage chunk lists one accepted draft fewer; a second has no lists",
        "sse",
        _metrics_then_none,
        reasons={0: metrics_disagree(1, "0 accepted of 3", 4, "1 of 3")},
        rule="evidence is monotone: a usage chunk without the lists says nothing about them",
    ),
    _C(
        "sse.metrics.contradict_then_forged",
        "sse.metrics.per_step_accepted",
        "stream 0's first usage chunk lists one accepted draft fewer; a second lists the truth",
        "sse",
        _metrics_then_forged,
        reasons={
            0: (
                metrics_disagree(1, "0 accepted of 3", 4, "1 of 3"),
                "stream 0: vLLM's per-request metrics differ between two usage chunks",
            )
        },
        rule="evidence is monotone: the first lists are kept, a different restatement fails",
    ),
    # ---------------------------- issue 24 #6: the fourth witness after a stop string
    _C(
        "sse.metrics.stop_string.accepted",
        "sse.metrics.per_step_accepted",
        "stream 0 ends on a stop string; its per-request metrics say one accepted draft "
        "fewer at the first verify step (before the stop string's step)",
        "sse",
        _sse_metrics_edit(_first_step_one_fewer_accepted),
        base="stop_string",
        reasons={0: metrics_disagree(0, "1 accepted of 3", 1, "2 of 3")},
        rule="the fourth witness checks a stop-string stream up to the step holding its "
        "last token, without the scheduler's finish",
    ),
    _C(
        "sse.metrics.stop_string.steps",
        "sse.metrics.per_step_accepted",
        "stream 0 ends on a stop string; its per-request metrics list 1 verify step, the "
        "scheduler's records 2 up to the stop string's step",
        "sse",
        _sse_metrics_edit(_only_first_step),
        base="stop_string",
        reasons={
            0: "stream 0: vLLM's per-request metrics list 1 verify steps, the scheduler sent "
            "2 steps with drafts up to the stop string"
        },
        rule="the fourth witness: one entry per scheduler step with drafts, up to the stop "
        "string's step",
    ),
    _C(
        "sse.metrics.stop_string.unfinished",
        "sse.metrics.per_step_accepted",
        "stream 0 ends on a stop string; per-request metrics matching every record arrive, "
        "yet the scheduler never finished the request",
        "sse",
        _sse_metrics,
        base="stop_string",
        reasons={0: "missing telemetry: the scheduler did not finish the request at offset 9"},
        rule="vLLM sends the lists only with the engine's finish: with lists, exactness "
        "needs the scheduler's finish",
    ),
    _C(
        "sse.usage.completion_tokens.corrected",
        "sse.usage.completion_tokens",
        "stream 0's usage says 16 completion tokens, a second usage chunk says 15",
        "sse",
        _usage_corrected,
        reasons={0: "stream 0: usage.completion_tokens 16, but the SSE carried 15 tokens"},
        rule="evidence is monotone: each usage count is checked when it arrives",
    ),
    _C(
        "sse.usage.prompt_tokens.restated",
        "sse.usage.prompt_tokens",
        "a second usage chunk of stream 0 says 5 prompt tokens (the first: 4)",
        "sse",
        _usage_prompt_restated,
        reasons={0: "bad SSE data: invalid SSE chunk: usage.prompt_tokens 5 after 4"},
        rule="evidence is monotone: a restatement that differs is refused",
    ),
    _C(
        "sse.finish_reason.restated",
        "sse.finish_reason",
        "stream 0's finish chunk says length; an empty chunk after it says stop",
        "sse",
        _finish_restated,
        reasons={
            0: "bad SSE data: invalid SSE chunk: choice 0's finish_reason 'stop' after 'length'"
        },
        rule="evidence is monotone: a finish_reason is never replaced",
    ),
    _C(
        "honest.sse_continuous_usage",
        "sse.usage.completion_tokens",
        "every chunk carries vLLM's running usage (continuous_usage_stats), then the final one",
        "none",
        _continuous_usage,
        expect="exact",
    ),
    # ------------------------------------------------- issue 24: unknown is not zero
    _C(
        "text.span_back.less_unknown",
        "text.span_back",
        "🙂's carrier claims no earlier tokens; 230 and 231 (step 4) say their gives are unknown",
        "frontend",
        _smile_unclaimed_unknown,
        expect="uncolored",
        uncolored={0: "本🙂"},
        rule="an unknown give may be any number: 🙂 may hold step 4's bytes, never step 5's alone",
    ),
    _C(
        "text.lead_len.unknown",
        "text.lead_len",
        "日本's lead_len and 220's give are unknown (0xFFFF)",
        "frontend",
        _nihon_split_unknown,
        expect="uncolored",
        uncolored={0: "日本🙂"},
        rule="an unknown split: the fragment is attributed to all its tokens",
    ),
    # ----------------------------------------------- issue 24: one reading of bytes
    _C(
        "sse.bytes.invalid_utf8",
        "sse.bytes",
        "fragment and HTTP delta hold ' o\ufffd'; stream 0's SSE line holds ' o' and a raw 0xff",
        "frontend+sse",
        _sse_raw_invalid,
        reasons={0: "bad SSE data: invalid UTF-8 in SSE line …"},
        rule="one reading of bytes: a line that is not UTF-8 is refused, never read as U+FFFD",
    ),
    _C(
        "sse.bytes.encoded_surrogate",
        "sse.bytes",
        "the same, with the SSE line holding an encoded surrogate (ed a0 80)",
        "frontend+sse",
        _sse_raw_surrogate,
        reasons={0: "bad SSE data: invalid UTF-8 in SSE line …"},
        rule="one reading of bytes: strict UTF-8 (no surrogates, no overlong forms)",
    ),
    _C(
        "sse.bytes.comment",
        "sse.bytes",
        "a comment line of stream 0 holds a raw Latin-1 byte",
        "sse",
        _sse_comment_invalid,
        reasons={0: "bad SSE data: invalid UTF-8 in SSE line …"},
        rule="one reading of bytes: every line must be UTF-8, comments too",
    ),
    _C(
        "honest.sse_split_reads",
        "sse.bytes",
        "a BOM first, CRLF line ends, every event written in two pieces cut inside a character",
        "none",
        _sse_split_reads,
        expect="exact",
    ),
    _C(
        "sse.done.early",
        "sse.done",
        "stream 0's [DONE] comes before its last chunk",
        "sse",
        _sse_done_early,
        reasons={0: NO_FINISH},
        rule="the SSE reader stops at [DONE]; a stream without finish_reason failed",
    ),
    _C(
        "sse.done.content_after",
        "sse.done",
        "a content chunk 'ZZTOP' after stream 0's [DONE]",
        "sse",
        _sse_after_done,
        expect="claim",
        rule="nothing after [DONE] is read, shown or counted",
        shown=("ZZTOP",),
    ),
    _C(
        "sse.event.typed",
        "sse.event",
        "stream 0's chunk of step 3 is sent as `event: delta`",
        "sse",
        _sse_typed_event,
        reasons={
            0: (
                "token mismatch at offset 4: detokenizer 102, SSE 221",
                "stream 0: usage.completion_tokens 15, but the SSE carried 13 tokens",
            )
        },
        rule="an event with its own type is not a completion chunk: its text is missing",
    ),
    # ---------------------------------------------------------------- whole streams
    _C(
        "stream.vacuous",
        "stream",
        "stream 0 has no tokens anywhere and no scheduler record",
        "scheduler+frontend+sse",
        _vacuous,
        reasons={0: "missing telemetry: the scheduler did not finish the request at offset 0"},
        rule="issue 9 #8: a stream with no tokens and no scheduler source is not exact",
    ),
    _C(
        "stream.blame",
        "stream",
        "stream 1's scheduler says 999 at offset 1; stream 0 is honest",
        "scheduler",
        _stream1_token,
        streams=(1,),
        reasons={1: "token mismatch at offset 1: scheduler 999, detokenizer 108"},
        rule="exact mode names the stream that failed first, with its own reason",
    ),
    # ---------------------------------------------------------------- combined lies
    _C(
        "combined.sched_front_ids",
        "provenance.token_ids",
        "scheduler and detokenizer both say 999 at offset 5 (SSE: 220)",
        "scheduler+frontend",
        _both_ids,
        reasons={0: "token mismatch at offset 5: detokenizer 999, SSE 220"},
        rule="per stream: detokenizer and SSE ids agree",
    ),
    _C(
        "combined.all_ids",
        "provenance.token_ids",
        "scheduler, detokenizer and SSE all say 999 at offset 5; the bytes stay",
        "scheduler+frontend+sse",
        _all_ids,
        expect="limit",
        rule="ids vs bytes needs the tokenizer: a consistent lie of all witnesses",
    ),
    _C(
        "combined.text_sse_bytes",
        "text.fragments",
        "fragment, HTTP delta and SSE all say ' cAfé'",
        "frontend+sse",
        _text_and_sse_bytes,
        expect="limit",
        rule="bytes vs ids needs the tokenizer: the scheduler sees no bytes",
    ),
    _C(
        "combined.frontend_sse_extra_token",
        "text.n_tokens",
        "detokenizer and SSE (and usage) add a token the scheduler never made",
        "frontend+sse",
        _frontend_sse_extra_token,
        reasons={
            0: (
                "stream 0: text token at offset 15 after the scheduler's last step ended "
                "at offset 15",
                "stream 0: SSE token at offset 15 after the scheduler's last step ended "
                "at offset 15",
                "missing telemetry: no provenance for offset 15",
            )
        },
        rule="per stream: no text token beyond the scheduler's finished last step",
    ),
    _C(
        "combined.boundary_shift",
        "text.fragments",
        "' ok.' moved from step 5's text record into step 6's; SSE chunks unchanged",
        "frontend",
        _boundary_shift_frontend,
        reasons={0: INSIDE_RECORD},
        rule="each SSE chunk carries whole steps: its ids and bytes end on one text "
        "record boundary",
    ),
    _C(
        "combined.boundary_shift_sse",
        "text.fragments",
        "' ok.' moved into step 6 in the text records and the SSE chunks alike",
        "frontend+sse",
        _boundary_shift_all,
        expect="limit",
        rule="which token produced which bytes is the detokenizer's statement",
    ),
    _C(
        "combined.roles_beside_metrics",
        "provenance.roles",
        "the relabelled prefill token (provenance.roles.relabelled) beside vLLM's own "
        "per-request metrics",
        "scheduler",
        _relabelled_beside_metrics,
        reasons={0: metrics_steps(5, 6)},
        rule="the fourth witness contradicts the roles: one entry per step with drafts",
    ),
    _C(
        "combined.roles_and_metrics",
        "provenance.roles",
        "the relabelled prefill token, and per-request metrics forged to match it",
        "scheduler+sse",
        _metrics_consistent,
        expect="limit",
        rule="roles and vLLM's counters come from one engine: a consistent lie of both",
    ),
    _C(
        "combined.second_scheduler",
        "header.source_id",
        "a second scheduler source (own hello) repeats stream 0's record of step 3",
        "scheduler",
        _second_scheduler,
        reasons={0: "stream 0: provenance from a second source {forged}"},
        rule="per stream: provenance from one scheduler source",
    ),
]


def case_by_id(case_id: str) -> Case:
    (found,) = [c for c in CASES if c.id == case_id]
    return found
