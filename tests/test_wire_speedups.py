"""The C step encoders (plugin/speedups/src/encode.c) against wire.py's, the one reference encoder.

The emitter's sender thread encodes a step's rows with the C functions when
the accelerator is built (emitter.encode_rows); a server without a compiler
runs wire.py's. Both must give the same bytes for every step the hooks can
build and refuse the same unrepresentable ones, so these compare them on
random steps: multi-byte and empty fragments, tokens never decoded (beyond
n_fragments), span_backs with and without lead_lens, the unknown lead
0xFFFF, and leads on tokens whose fragment is empty (protocol 3: a record's
lead_lens are written as given for every token, whatever the fragment's length);
and, on steps the receiver can decode, that the lead_lens on the wire are the
ones the hooks gave, else 0 or LEAD_UNKNOWN (the reference decoder reads them back).
"""

from __future__ import annotations

import os
import random
import socket
import struct
import tempfile
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
from tests.test_plugin_speedups import load_speedups

from parallelhue.reference import decode_frame
from parallelhue_vllm import attribution, emitter, wire

PIECES = ["", "", "a", " the", "é", "€", "😀", "\u0301", "ing", "x" * 40, "\n", "ü€😀"]
# One record whose second token claims the first (span_back 1): lead_lens for 2 tokens.
ONE_RECORD = ([0, 0, 0, 0, 2, 2, 0], [5, 6], ["ab"], ["", "ab"], {0: [0, 1]})


def empty_text_columns() -> tuple[
    list[int], list[int], list[str], list[str], dict[int, list[int]], dict[int, list[int]]
]:
    """A text step's six columns (wire.TextStep), empty: meta, ids, texts, fragments,
    span_backs, leads."""
    return [], [], [], [], {}, {}


def random_text_step(rng: random.Random) -> tuple[Any, ...]:
    meta, ids, texts, fragments, span_backs, leads = empty_text_columns()
    for record in range(rng.randint(1, 12)):
        count = rng.choice([0, 1, 2, 4, 7, rng.randint(0, wire.MAX_TOKENS_PER_RECORD)])
        # A record may own fragments beyond its tokens (deleted after a stop
        # string): they are skipped. Flag bits wire.py does not define are ignored.
        fed = rng.randint(0, count) if rng.random() < 0.9 else count + rng.randint(1, 3)
        flags = rng.choice([0, 1, 3, 5, 7, rng.randint(0, 255), -1, 1 << 70])
        meta += [rng.randint(0, 0xFFFF), flags, rng.randint(0, 4), rng.randint(0, 0xFFFFFFFF),
                 count, fed, rng.randint(0, 0xFFFF)]  # fmt: skip
        ids += [rng.choice([0, 1, 0xFFFFFFFF, rng.randint(0, 200_000)]) for _ in range(count)]
        fragments += [rng.choice(PIECES) for _ in range(fed)]
        texts.append("".join(rng.choice(PIECES) for _ in range(rng.randint(0, 6))))
        if rng.random() < 0.5:
            span_backs[record] = [rng.choice([0, 0, 1, 2, 255]) for _ in range(count)]
            if rng.random() < 0.7:
                # Any u16, the unknown lead among them, on any token (give counts
                # on empty fragments included).
                leads[record] = [rng.choice([0, 1, 3, 0xFFFE, wire.LEAD_UNKNOWN])
                                 for _ in range(count)]  # fmt: skip
        elif rng.random() < 0.2:
            leads[record] = [7] * count  # lead_lens without span_backs: passed through (protocol 3)
    step: tuple[Any, ...] = (meta, ids, texts, fragments, span_backs)
    return (*step, leads) if rng.random() < 0.9 else step


def random_provenance_step(rng: random.Random) -> tuple[Any, ...]:
    meta: list[int] = []
    ids: list[int] = []
    roles: list[bytes] = []
    for _ in range(rng.randint(1, 12)):
        count = rng.choice([0, 1, 4, rng.randint(0, wire.MAX_TOKENS_PER_RECORD)])
        meta += [rng.randint(0, 0xFFFF), rng.choice([0, 1, 2, 3]), rng.randint(0, 4),
                 rng.randint(0, 0xFFFFFFFF), count, rng.randint(0, 0xFFFF),
                 rng.randint(0, 0xFFFF)]  # fmt: skip
        ids += [rng.randint(0, 0xFFFFFFFF) for _ in range(count)]
        roles.append(bytes(rng.randint(0, 3) for _ in range(count)))
    return meta, ids, roles


@pytest.mark.parametrize("seed", range(40))
def test_c_text_step_encoder_gives_wire_py_bytes(seed: int) -> None:
    module = load_speedups()
    rng = random.Random(seed)
    for _ in range(25):
        step = random_text_step(rng)
        expected = wire.encode_text_step(step)  # type: ignore[arg-type]
        assert module.encode_text_step(*step) == expected


@pytest.mark.parametrize("seed", range(20))
def test_c_provenance_step_encoder_gives_wire_py_bytes_on_random_steps(seed: int) -> None:
    module = load_speedups()
    rng = random.Random(seed)
    for _ in range(25):
        step = random_provenance_step(rng)
        assert module.encode_provenance_step(*step) == wire.encode_provenance_step(step)  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", range(20))
def test_c_body_encoders_give_the_join_of_wire_py_records(seed: int) -> None:
    """encode_*_body: the sender's frame body, written at once, is the records joined."""
    module = load_speedups()
    rng = random.Random(1000 + seed)
    for _ in range(25):
        text = random_text_step(rng)
        assert module.encode_text_body(*text) == b"".join(wire.encode_text_step(text))  # type: ignore[arg-type]
        provenance = random_provenance_step(rng)
        assert module.encode_provenance_body(*provenance) == b"".join(
            wire.encode_provenance_step(provenance)  # type: ignore[arg-type]
        )


def frame_args(rng: random.Random) -> tuple[bytes, int, int, int, int, int]:
    """Header fields of a frame: run id, source id, seq, step, timestamp, dropped."""
    big = [0, 1, 0xFFFFFFFF, 1 << 32, (1 << 64) - 1, rng.randint(0, (1 << 64) - 1)]
    dropped = rng.choice([0, 1, 0xFFFFFFFF, 1 << 32, 1 << 70])
    run = bytes(rng.randrange(256) for _ in range(16))
    return run, rng.choice(big), rng.choice(big), rng.choice(big), rng.choice(big), dropped


@pytest.mark.parametrize("seed", range(20))
def test_c_frame_encoders_give_wire_py_frames(seed: int) -> None:
    """encode_*_frame: the whole frame of a step's body, header fields first, as
    wire.encode_joined_frame makes it (dropped clamped to u32 as the emitter does)."""
    module = load_speedups()
    rng = random.Random(2000 + seed)
    for _ in range(25):
        head = frame_args(rng)
        header = wire.Header(*head[:5], min(head[5], 0xFFFFFFFF))
        text, provenance = random_text_step(rng), random_provenance_step(rng)
        for kind, step, encode in ((wire.KIND_TEXT, text, module.encode_text_frame),
                                   (wire.KIND_PROVENANCE, provenance,
                                    module.encode_provenance_frame)):  # fmt: skip
            records = wire.encode_rows(kind, step)
            expected = wire.encode_joined_frame(kind, header, len(records), b"".join(records))
            assert encode(*head, *step) == expected


def test_c_frame_encoders_leave_what_is_not_one_frame_to_python() -> None:
    """None, not an error, where the emitter's Python path must decide: header fields
    struct refuses, no records, more records or bytes than one frame holds."""
    module = load_speedups()
    run = bytes(range(16))
    one = ([0, 0, 0, 0, 1, 1, 0], [1], ["x"], ["a"], {})
    big_text = ([0, 0, 0, 0, 1, 1, 0] * 3, [1, 2, 3], ["x" * 30000] * 3, ["a", "b", "c"], {})
    fits = ([0, 0, 0, 0, 1, 1, 0], [1], ["x" * (wire.FRAME_RECORD_BUDGET - 16 - 9 - 1)], ["a"], {})
    over = ([0, 0, 0, 0, 1, 1, 0], [1], ["x" * (wire.FRAME_RECORD_BUDGET - 16 - 9)], ["a"], {})
    assert module.encode_text_frame(run, 1, 2, 3, 4, 0, *fits) is not None
    for head, step in [
        ((bytes(15), 1, 2, 3, 4, 0), one),
        ((bytearray(run), 1, 2, 3, 4, 0), one),
        ((run, -1, 2, 3, 4, 0), one),
        ((run, 1, 1 << 64, 3, 4, 0), one),
        ((run, 1, 2, 3, 4.0, 0), one),
        ((run, 1, 2, 3, 4, -1), one),
        ((run, 1, 2, 3, 4, 0), ([], [], [], [], {})),
        ((run, 1, 2, 3, 4, 0), big_text),
        ((run, 1, 2, 3, 4, 0), over),
    ]:
        assert module.encode_text_frame(*head, *step) is None
    assert module.encode_provenance_frame(run, 1, 2, 3, 4, 0, [], [], []) is None
    many = ([0, 0, 0, 0, 0, 0, 0] * 1025, [], [b""] * 1025)
    assert module.encode_provenance_frame(run, 1, 2, 3, 4, 0, *many) is None
    full = ([0, 0, 0, 0, 0, 0, 0] * 1024, [], [b""] * 1024)
    assert module.encode_provenance_frame(run, 1, 2, 3, 4, 0, *full) is not None
    with pytest.raises(TypeError, match=r"encode_provenance_frame\(run_id, source_id"):
        module.encode_provenance_frame(run, 1, 2, 3, 4, 0, [], [])


def test_fragments_of_every_short_length_are_copied_whole() -> None:
    """The C encoder copies fragments of up to 16 bytes with fixed-size moves that
    overlap: every length from 0 to 20 bytes, ASCII and not, lands byte for byte."""
    module = load_speedups()
    fragments = ["".join(chr(0x41 + (i + j) % 26) for j in range(n)) for i, n in
                 enumerate(range(21))] + ["é" * n for n in range(1, 9)]  # fmt: skip
    count = len(fragments)
    step = ([1, 0, 0, 5, count, count, 0], list(range(count)), ["t"], fragments, {}, {})
    expected = wire.encode_text_step(step)  # type: ignore[arg-type]
    assert module.encode_text_step(*step) == expected
    assert module.encode_text_body(*step) == b"".join(expected)


def test_a_body_larger_than_its_first_guess_grows_and_keeps_every_byte() -> None:
    """The body buffer starts at about 8 text bytes per token: long fragments and
    texts make it grow (several times here) without losing or moving a byte."""
    module = load_speedups()
    meta, ids, texts, fragments = [], [], [], []
    for record in range(40):
        meta += [record, 0, 0, record * 200, 200, 200, 0]
        ids += list(range(200))
        fragments += ["€" * 30] * 200
        texts.append("😀" * 500)
    step = (meta, ids, texts, fragments, {}, {})
    body = module.encode_text_body(*step)
    assert len(body) > 40 * (16 + 9 + 8) * 200
    assert body == b"".join(wire.encode_text_step(step))  # type: ignore[arg-type]
    assert module.encode_text_body([], [], [], [], {}) == b""
    assert module.encode_provenance_body([], [], []) == b""


def test_a_lead_on_an_empty_fragment_is_written_as_given() -> None:
    """Tokens 1 and 2 have span_back > 0 and empty fragments (one decoded as "",
    one never decoded): their lead_lens 5 and LEAD_UNKNOWN go on the wire as they are."""
    module = load_speedups()
    step = ([3, 0, 0, 10, 3, 2, 0], [7, 8, 9], ["ab"], ["ab", ""], {0: [0, 1, 2]},
            {0: [0, 5, wire.LEAD_UNKNOWN]})  # fmt: skip
    encoded = wire.encode_text_step(step)  # type: ignore[arg-type]
    entries = encoded[0][16 : 16 + 27]
    assert [entries[9 * i + 7] | entries[9 * i + 8] << 8 for i in range(3)] == [0, 5, 0xFFFF]
    assert [entries[9 * i + 4] | entries[9 * i + 5] << 8 for i in range(3)] == [2, 0, 0]
    assert module.encode_text_step(*step) == encoded


@pytest.mark.parametrize(
    ("step", "message"),
    [
        (([0, 0, 0, 0, 1, 1, 0x10000], [1], [""], ["a"], {}, {}), "field out of range"),
        (([0, 0, 0x100, 0, 1, 1, 0], [1], [""], ["a"], {}, {}), "field out of range"),
        (([0, 0, 0, 1 << 32, 1, 1, 0], [1], [""], ["a"], {}, {}), "field out of range"),
        (([-1, 0, 0, 0, 1, 1, 0], [1], [""], ["a"], {}, {}), "field out of range"),
        (([0, 0, 0, 0, 1, 1, 0], [1 << 32], [""], ["a"], {}, {}), "field out of range"),
        (([0, 0, 0, 0, 1, 1, 0], [1], [""], ["a"], {0: [256]}, {}), "field out of range"),
        (([0, 0, 0, 0, 1, 1, 0], [1], [""], ["a"], {0: [1]}, {0: [0x10000]}), "field out of range"),
        (
            ([0, 0, 0, 0, 2, 2, 0], [1, 2], [""], ["a", "b"], {0: [0, 1]}, {0: [0]}),
            "text record: lead_lens for 2 tokens needed",
        ),
        (
            ([0, 0, 0, 0, 1, 1, 0], [1], [""], ["a", "b"], {}, {}),
            "text step: 1 fragments owned, 2 given",
        ),
        (([0, 0, 0, 0, 1, 1, 0], [1], [""], ["\ud800"], {}, {}), "surrogates not allowed"),
        # Bad lead_lens of one record with span_backs.
        ((*ONE_RECORD, {0: [0, 0x10000]}), "text record field out of range"),
        ((*ONE_RECORD, {0: [0]}), "text record: lead_lens for 2 tokens needed"),
        ((*ONE_RECORD, {0: [0, 1, 2]}), "text record: lead_lens for 2 tokens needed"),
    ],
)
def test_both_text_step_encoders_refuse_the_same_steps(step: tuple[Any, ...], message: str) -> None:
    module = load_speedups()
    with pytest.raises((ValueError, UnicodeEncodeError), match=message):
        wire.encode_text_step(step)  # type: ignore[arg-type]
    with pytest.raises((ValueError, UnicodeEncodeError), match=message):
        module.encode_text_step(*step)
    with pytest.raises((ValueError, UnicodeEncodeError), match=message):
        module.encode_text_body(*step)
    with pytest.raises((ValueError, UnicodeEncodeError), match=message):
        module.encode_text_frame(bytes(16), 1, 1, 1, 1, 0, *step)


def test_the_emitter_encodes_rows_with_the_accelerator_when_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The sender thread's encoder: the C functions when loaded, wire.py's without."""
    module = load_speedups()
    calls: list[str] = []

    def spy(name: str) -> Any:
        def call(*args: Any) -> Any:
            calls.append(name)
            return getattr(module, f"encode_{name}_step")(*args)

        return call

    accelerated = SimpleNamespace(encode_text_step=spy("text"),
                                  encode_provenance_step=spy("provenance"))  # fmt: skip
    rng = random.Random(99)
    text, provenance = random_text_step(rng), random_provenance_step(rng)
    monkeypatch.setattr(emitter, "_speedups", accelerated)
    c_bytes = [emitter.encode_rows(wire.KIND_TEXT, text),  # type: ignore[arg-type]
               emitter.encode_rows(wire.KIND_PROVENANCE, provenance)]  # type: ignore[arg-type]  # fmt: skip
    assert calls == ["text", "provenance"]
    monkeypatch.setattr(emitter, "_speedups", None)
    assert [emitter.encode_rows(wire.KIND_TEXT, text),  # type: ignore[arg-type]
            emitter.encode_rows(wire.KIND_PROVENANCE, provenance)] == c_bytes  # type: ignore[arg-type]  # fmt: skip
    assert calls == ["text", "provenance"]


def spying(module: Any, calls: list[str]) -> Callable[[str], Callable[..., Any]]:
    """spy(name): the accelerator's `name`, appending the name to `calls` on each call."""

    def spy(name: str) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            calls.append(name)
            return getattr(module, name)(*args)

        return call

    return spy


def test_the_emitter_frames_a_step_with_the_c_body_and_the_same_bytes_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """emitter.encode_chunks: one C-written body per step that fits a frame; a step
    that does not (too many bytes or records) split record by record as _frame_chunks
    does; wire.py's records joined without the accelerator; the same chunks each way."""
    module = load_speedups()
    calls: list[str] = []
    spy = spying(module, calls)

    names = ("encode_text_body", "encode_provenance_body", "encode_text_step",
             "encode_provenance_step")  # fmt: skip
    accelerated = SimpleNamespace(**{name: spy(name) for name in names})
    rng = random.Random(7)
    small = [(wire.KIND_TEXT, random_text_step(rng)),
             (wire.KIND_PROVENANCE, random_provenance_step(rng))]  # fmt: skip
    big_text = ([0, 0, 0, 0, 1, 1, 0] * 3, [1, 2, 3], ["x" * 30000] * 3, ["a", "b", "c"], {})
    many = ([0, 0, 0, 0, 0, 0, 0] * 1100, [], [b""] * 1100)
    steps = [*small, (wire.KIND_TEXT, big_text), (wire.KIND_PROVENANCE, many)]
    monkeypatch.setattr(emitter, "_speedups", accelerated)
    with_c = [emitter.encode_chunks(kind, step) for kind, step in steps]  # type: ignore[arg-type]
    assert calls == [*names[:2], "encode_text_body", "encode_text_step",
                     "encode_provenance_body", "encode_provenance_step"]  # fmt: skip
    assert [[count for count, _ in chunks] for chunks in with_c] == [
        [len(small[0][1][2])], [len(small[1][1][2])], [2, 1], [1024, 76]]  # fmt: skip
    monkeypatch.setattr(emitter, "_speedups", None)
    assert [emitter.encode_chunks(kind, step) for kind, step in steps] == with_c  # type: ignore[arg-type]
    for (kind, step), chunks in zip(steps, with_c, strict=True):
        records = wire.encode_rows(kind, step)  # type: ignore[arg-type]
        assert chunks == emitter._frame_chunks(records)


def sent_frames(directory: str, items: list[tuple[Any, ...]]) -> list[bytes]:
    """The frames an emitter sends for these queued items (its sender thread's work,
    run here), as the client's socket receives them."""
    run = "00112233445566778899aabbccddeeff"
    path = os.path.join(directory, f"{run}.sock")
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind(path)
    os.chmod(path, 0o600)
    sender = emitter.Emitter(
        role=wire.SOURCE_SCHEDULER, engine=wire.ENGINE_VLLM, engine_version="test",
        plugin_version="test", spec_method="ngram", num_speculative_tokens=3,
        role_derivation=wire.DERIVATION_DRAFT_IDS, async_scheduling=False,
        socket_dir=directory,
    )  # fmt: skip
    receiver.setblocking(False)
    frames: list[bytes] = []
    try:
        for item in items:
            if item[0] == "queue drops":  # the hooks lost a step of this run
                sender._queue_drops[run] = item[1]
                continue
            sender.process((item[0], item[1], item[2], item[3], {run: item[4]}, item[5]))
            while True:  # read as a client does: the socket's buffer never fills
                try:
                    frames.append(receiver.recv(1 << 17))
                except BlockingIOError:
                    break
        return frames
    finally:
        receiver.close()
        os.unlink(path)


def test_the_sender_sends_the_same_frames_with_whole_c_frames_c_bodies_and_python(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Emitter.process: a greeted run's step that fits one frame is written whole by
    encode_*_frame; the hello, a step after queue drops, a step too large for one
    frame and a refused step take the Python path. The frames are the same bytes with
    the C frames, with the C bodies only, and with wire.py alone."""
    module = load_speedups()
    rng = random.Random(11)
    rows = emitter._ITEM_ROWS
    big_text = ([0, 0, 0, 0, 1, 1, 0] * 3, [1, 2, 3], ["x" * 30000] * 3, ["a", "b", "c"], {})
    refused = ([0, 0, 0, 0, 1, 1, 0x10000], [1], [""], ["a"], {})
    items: list[tuple[Any, ...]] = []
    for step in range(12):
        kind = wire.KIND_TEXT if step % 3 else wire.KIND_PROVENANCE
        columns = random_text_step(rng) if kind == wire.KIND_TEXT else random_provenance_step(rng)
        items.append((rows, kind, 100 + step, 10**15 + step, columns, len(columns[2])))
    items[4] = (rows, wire.KIND_TEXT, 104, 1, big_text, 3)
    items[6] = (rows, wire.KIND_TEXT, 106, 2, refused, 1)
    items.insert(9, ("queue drops", 5))
    calls: list[str] = []
    spy = spying(module, calls)

    monkeypatch.setattr(emitter.secrets, "randbits", lambda bits: 77)  # the source id
    with tempfile.TemporaryDirectory(prefix="phw", dir="/tmp") as directory:
        os.chmod(directory, 0o700)
        frame_encoders = {wire.KIND_TEXT: spy("encode_text_frame"),
                          wire.KIND_PROVENANCE: spy("encode_provenance_frame")}  # fmt: skip
        monkeypatch.setattr(emitter, "_frame_encoders", frame_encoders)
        whole = sent_frames(directory, items)
        monkeypatch.setattr(emitter, "_frame_encoders", {})
        bodies = sent_frames(directory, items)
        monkeypatch.setattr(emitter, "_speedups", None)
        python = sent_frames(directory, items)
    assert whole == bodies == python
    # The first step greets (Python path); the big step is tried, then split; the
    # refused one is refused by C; the step after the queue drops skips C.
    assert len(calls) == 10
    headers = [struct.unpack_from("<4sBBH16sQQQQII", frame) for frame in whole]
    assert [header[6] for header in headers] == list(range(len(headers)))  # seq
    assert [header[9] for header in headers if header[9]] == [1, 5]  # dropped


def test_a_joined_frame_is_the_frame_of_its_records() -> None:
    """The sender joins a step's records once (emitter._frame_chunks) and frames the body."""
    header = wire.Header(bytes(range(16)), 7, 3, 9, 123456789, 2)
    rng = random.Random(5)
    records = wire.encode_text_step(random_text_step(rng))  # type: ignore[arg-type]
    joined = wire.encode_joined_frame(wire.KIND_TEXT, header, len(records), b"".join(records))
    assert joined == wire.encode_frame(wire.KIND_TEXT, header, records)
    with pytest.raises(ValueError, match=r"0 records, a frame holds 1..=1024"):
        wire.encode_joined_frame(wire.KIND_TEXT, header, 0, b"")
    with pytest.raises(ValueError, match="frame of 65537 bytes exceeds 65536"):
        wire.encode_joined_frame(wire.KIND_TEXT, header, 1, bytes(65536 - 66 + 1))
    short = wire.Header(bytes(15), 7, 3, 9, 0, 0)
    with pytest.raises(ValueError, match="run id must be 16 raw bytes, got 15"):
        wire.encode_joined_frame(wire.KIND_TEXT, short, 1, b"x")


def test_frame_chunks_split_a_step_that_does_not_fit_one_frame() -> None:
    records = [bytes([i]) * 30000 for i in range(3)] + [b"x"] * 1100
    chunks = emitter._frame_chunks(records)
    assert [count for count, _ in chunks] == [2, 1024, 77]
    assert b"".join(body for _, body in chunks) == b"".join(records)
    assert all(len(body) <= wire.FRAME_RECORD_BUDGET for _, body in chunks)
    with pytest.raises(ValueError, match="a record of 65471 bytes, a frame holds 65470"):
        emitter._frame_chunks([bytes(65471)])


# ------------------------------------------------------------------ lead_lens
# The text step encoders with lead_lens: on decodable random steps (records with
# and without span_backs, lead_lens known, 0 and 0xFFFF, lead_len lists on
# records that have no span_backs) both give the same record bytes and so
# byte-identical frames; the entries carry the lead_lens the hooks gave, for
# every token (protocol 3: an empty fragment's give count too), and without
# them 0 or LEAD_UNKNOWN.

RUN = bytes(range(16))
DECODABLE_PIECES = ["", "", "a", " the", "日", "😀", "\ufffd", "ab c", "é"]
FLAGS = [
    (0, wire.FINISH_NONE),
    (wire.ROW_FLAG_FINISHED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED | wire.ROW_FLAG_TEXT_TRUNCATED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED | wire.ROW_FLAG_TOKENS_TRIMMED, wire.FINISH_STOP),
    (wire.ROW_FLAG_FINISHED, wire.FINISH_LENGTH),
]


def decodable_text_step(rng: random.Random) -> tuple[Any, ...]:
    """A text step as the hooks' bucket hands it over (wire.TextStep, six elements), one
    the receiver can read: fragments only for fed tokens, finish flags as the hooks set."""
    meta, ids, texts, fragments, span_backs, leads = empty_text_columns()
    for record in range(rng.randint(1, 6)):
        count = rng.randint(0, 8)
        flags, finish = rng.choice(FLAGS)
        # A finished record's last token may be a stop token the detokenizer skipped.
        fed = count - 1 if count and flags and rng.random() < 0.3 else count
        trimmed = rng.randint(1, 3) if flags & wire.ROW_FLAG_TOKENS_TRIMMED else 0
        meta += [rng.randint(0, 63), flags, finish, rng.randint(0, 5000), count, fed, trimmed]
        ids += [rng.choice([0, 7, 1000, 0xFFFFFFFF]) for _ in range(count)]
        pieces = [rng.choice(DECODABLE_PIECES) for _ in range(fed)]
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
    """The lead_lens on the wire are the hooks' where given, else the defaults."""
    module = load_speedups()
    rng = random.Random(20261201)
    seen_known = seen_unknown = 0
    for _ in range(400):
        step = decodable_text_step(rng)
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
        meta, ids, texts, fragments, span_backs, _ = decodable_text_step(rng)
        rows = (meta, ids, texts, fragments, span_backs, {})
        defaults, first = {}, 0
        for record in range(len(texts)):
            defaults[record] = attribution.record_leads(rows, record, first)
            first += meta[wire.ROW_WIDTH * record + 5]
        without = wire.encode_text_step((meta, ids, texts, fragments, span_backs))
        assert module.encode_text_step(meta, ids, texts, fragments, span_backs, defaults) == without
        assert wire.encode_text_step((*rows[:5], defaults)) == without


def test_a_lead_len_that_is_not_an_int_is_refused_by_both() -> None:
    module = load_speedups()
    with pytest.raises(TypeError, match="text record field is not an int"):
        module.encode_text_step(*ONE_RECORD, {0: [0, "1"]})
    with pytest.raises(ValueError, match="text record field out of range: required argument"):
        wire.encode_text_step((*ONE_RECORD, {0: [0, "1"]}))  # type: ignore[list-item]
