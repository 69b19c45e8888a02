"""The text step encoders with lead_lens: _speedups.encode_text_step (C, six arguments)
against wire.encode_text_step (the one encoder, pure Python).

For random steps (records with and without span_backs, lead_lens known, 0 and
0xFFFF, lead_len lists on records that have no span_backs), both give the same
record bytes and so byte-identical frames; the entries carry the lead_lens the
hooks gave, for every token (protocol 3: an empty fragment's give count too),
and without them 0 or LEAD_UNKNOWN; both refuse the same bad columns with the
same error.
"""

from __future__ import annotations

import random
import struct
from typing import Any

import pytest

from parallelhue.reference import decode_frame
from parallelhue_vllm import attribution, wire
from test_plugin_speedups import load_speedups

RUN = bytes(range(16))
PIECES = ["", "", "a", " the", "日", "😀", "\ufffd", "ab c", "é"]
FLAGS = [
    (0, wire.FINISH_NONE),
    (wire.ROW_FLAG_FINISHED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED | wire.ROW_FLAG_TEXT_TRUNCATED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED | wire.ROW_FLAG_TOKENS_TRIMMED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED, wire.FINISH_LENGTH),
]


def random_step(rng: random.Random) -> tuple[Any, ...]:
    """A text step as the hooks' bucket hands it over (wire.TextStep, six elements)."""
    meta: list[int] = []
    ids: list[int] = []
    texts: list[str] = []
    fragments: list[str] = []
    span_backs: dict[int, list[int]] = {}
    leads: dict[int, list[int]] = {}
    for record in range(rng.randint(1, 6)):
        count = rng.randint(0, 8)
        flags, finish = rng.choice(FLAGS)
        # A finished record's last token may be a stop token the detokenizer skipped.
        fed = count - 1 if count and flags and rng.random() < 0.3 else count
        trimmed = rng.randint(1, 3) if flags & wire.ROW_FLAG_TOKENS_TRIMMED else 0
        meta += [rng.randint(0, 63), flags, finish, rng.randint(0, 5000), count, fed, trimmed]
        ids += [rng.choice([0, 7, 1000, 0xFFFFFFFF]) for _ in range(count)]
        pieces = [rng.choice(PIECES) for _ in range(fed)]
        fragments += pieces
        texts.append("".join(pieces) if rng.random() < 0.8 else "")
        if rng.random() < 0.6:
            span_backs[record] = [rng.choice([0, 0, 1, 2, 255]) for _ in range(count)]
        if rng.random() < 0.7:  # also on records without span_backs: read only with them
            leads[record] = [
                rng.choice([0, 1, 3, 0xFFFF, rng.randint(0, 0xFFFF)]) for _ in range(count)
            ]
    return meta, ids, texts, fragments, span_backs, leads


def frames(kind_records: list[bytes]) -> bytes:
    return b"".join(
        wire.encode_frame(wire.KIND_TEXT, wire.Header(RUN, 9, seq, 40 + seq, 0), [record])
        for seq, record in enumerate(kind_records)
    )


def decoded_leads(records: list[bytes]) -> list[list[tuple[int, int]]]:
    """(span_back, lead_len) of each token entry of each record, read from the bytes
    (PROTOCOL.md's text record: a 16-byte head with n_tokens at 8, then 9-byte
    entries u32 token_id, u16 frag_len, u8 span_back, u16 lead_len). Read here
    rather than by the decoder: the random columns need not make sense to it."""
    out = []
    for record in records:
        (count,) = struct.unpack_from("<H", record, 8)
        entries = [struct.unpack_from("<IHBH", record, 16 + 9 * i) for i in range(count)]
        out.append([(back, lead) for _id, _length, back, lead in entries])
    return out


def test_a_sensible_step_decodes_to_its_lead_lens() -> None:
    """The reference decoder reads the C encoder's lead_lens back (a step it accepts)."""
    module = load_speedups()
    step = (
        [3, 0, 0, 10, 3, 3, 0],
        [5, 6, 7],
        ["a日"],
        ["a", "", "日"],
        {0: [0, 0, 1]},
        {0: [0, 0, 2]},
    )
    (record,) = module.encode_text_step(*step)
    frame = decode_frame(wire.encode_frame(wire.KIND_TEXT, wire.Header(RUN, 9, 1, 1, 0), [record]))
    (text,) = frame.records
    assert isinstance(text, wire.TextRecord)
    assert [(t.fragment, t.span_back, t.lead_len) for t in text.tokens] == [
        (b"a", 0, 0), (b"", 0, 0), ("日".encode(), 1, 2),
    ]  # fmt: skip


def expected_leads(step: tuple[Any, ...], with_leads: bool) -> list[list[tuple[int, int]]]:
    """What the receiver must read (protocol 3): a record's lead_lens as the hooks gave
    them, for every token (a carrier's split, an empty fragment's give count); a
    record without them: 0 for a fragment without span_back, else LEAD_UNKNOWN."""
    meta, _ids, texts, fragments, span_backs, leads = step
    out = []
    first_fragment = 0
    for record in range(len(texts)):
        count, fed = meta[wire.ROW_WIDTH * record + 4], meta[wire.ROW_WIDTH * record + 5]
        backs = span_backs.get(record, [0] * count)
        given = leads.get(record) if with_leads else None
        pieces = fragments[first_fragment : first_fragment + fed] + [""] * (count - fed)
        out.append(
            [
                (
                    back,
                    given[i]
                    if given is not None
                    else (0 if pieces[i] and not back else wire.LEAD_UNKNOWN),
                )
                for i, back in enumerate(backs)
            ]
        )
        first_fragment += fed
    return out


def test_c_and_python_give_identical_frames_with_and_without_lead_lens() -> None:
    module = load_speedups()
    rng = random.Random(20261201)
    seen_known = seen_unknown = 0
    for _ in range(400):
        step = random_step(rng)
        for with_leads in (True, False):
            args = step if with_leads else step[:5]
            python = wire.encode_text_step(args)  # type: ignore[arg-type]
            c = module.encode_text_step(*args)
            assert c == python, (args, c, python)
            assert frames(c) == frames(python)
            leads = decoded_leads(c)
            assert leads == expected_leads(step, with_leads)
            for record in leads:
                for _back, lead in record:
                    seen_unknown += lead == wire.LEAD_UNKNOWN
                    seen_known += lead != wire.LEAD_UNKNOWN
    # The random steps did exercise both known and unknown splits.
    assert seen_known > 100 and seen_unknown > 100


def test_default_lead_lens_are_the_same_bytes_as_none() -> None:
    """attribution.record_leads (what a held record starts with) is what the encoders
    write for a record without lead_lens: 0 for a fragment without span_back, else
    unknown."""
    module = load_speedups()
    rng = random.Random(7)
    for _ in range(100):
        meta, ids, texts, fragments, span_backs, _ = random_step(rng)
        rows = (meta, ids, texts, fragments, span_backs, {})
        defaults, first = {}, 0
        for record in range(len(texts)):
            defaults[record] = attribution.record_leads(rows, record, first)
            first += meta[wire.ROW_WIDTH * record + 5]
        without = wire.encode_text_step((meta, ids, texts, fragments, span_backs))
        assert module.encode_text_step(meta, ids, texts, fragments, span_backs, defaults) == without
        assert wire.encode_text_step((*rows[:5], defaults)) == without


ONE_RECORD = ([0, 0, 0, 0, 2, 2, 0], [5, 6], ["ab"], ["", "ab"], {0: [0, 1]})


@pytest.mark.parametrize(
    ("leads", "error", "message"),
    [
        ({0: [0, 0x10000]}, ValueError, "text record field out of range"),
        ({0: [0]}, ValueError, "text record: lead_lens for 2 tokens needed"),
        ({0: [0, 1, 2]}, ValueError, "text record: lead_lens for 2 tokens needed"),
    ],
)
def test_both_refuse_the_same_bad_lead_lens(
    leads: dict[int, list[int]], error: type[Exception], message: str
) -> None:
    module = load_speedups()
    with pytest.raises(error, match=message):
        wire.encode_text_step((*ONE_RECORD, leads))
    with pytest.raises(error, match=message):
        module.encode_text_step(*ONE_RECORD, leads)


def test_a_lead_len_that_is_not_an_int_is_refused_by_both() -> None:
    module = load_speedups()
    with pytest.raises(TypeError, match="text record field is not an int"):
        module.encode_text_step(*ONE_RECORD, {0: [0, "1"]})
    with pytest.raises(ValueError, match="text record field out of range: required argument"):
        wire.encode_text_step((*ONE_RECORD, {0: [0, "1"]}))  # type: ignore[list-item]
