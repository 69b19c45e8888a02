"""`lead_len` from the tokenizer's own per-token bytes (plugin/parallelhue_vllm/attribution.py).

Pure functions against hand-made token tables of both decoder layouts (the
`tokenizers` library is not in the project venv; tests/vllm/test_attribution_tokenizers.py
runs the same code against the real library and vLLM's real detokenizer), the
frontend hook filling `lead_len` in its text records, and both reconcilers
coloring per character from them.
"""

from __future__ import annotations

import copy
import json
import socket
import sys
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parallelhue.reference import decode_frame
from parallelhue_vllm import __version__, attribution, hooks, wire
from parallelhue_vllm.attribution import KIND_BYTE_FALLBACK, KIND_BYTE_LEVEL, split_lead
from plugin_standins import (
    RUN,
    CompletionOutput,
    FakeRequestState,
    RequestOutput,
    raw_frames,
    receiver,
    reconcilers,
)

__all__ = ["receiver"]  # the fixture, imported for pytest

UNKNOWN = wire.LEAD_UNKNOWN
REPLACEMENT = "\ufffd".encode()

# The decoder states the real tiny tokenizers report (tests/vllm/build_tiny_model.py),
# as `tokenizer.decoder.__getstate__()` returns them.
BYTE_LEVEL_STATE = (
    b'{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true}'
)
LLAMA2_STATE = json.dumps(
    {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0},
        ],
    }
).encode()
GEMMA_STATE = json.dumps(
    {
        "type": "Sequence",
        "decoders": [
            {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
            {"type": "ByteFallback"},
            {"type": "Fuse"},
        ],
    }
).encode()


def _sequence(*steps: dict[str, Any]) -> bytes:
    return json.dumps({"type": "Sequence", "decoders": list(steps)}).encode()


REPLACE = {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}


@pytest.mark.parametrize(
    ("state", "kind"),
    [
        (BYTE_LEVEL_STATE, KIND_BYTE_LEVEL),
        (LLAMA2_STATE, KIND_BYTE_FALLBACK),
        (GEMMA_STATE, KIND_BYTE_FALLBACK),
        (None, None),
        (b"not json", None),
        (b'{"type":"Metaspace","replacement":"\\u2581","prepend_scheme":"always"}', None),
        (b'{"type":"WordPiece","prefix":"##","cleanup":true}', None),
        (_sequence(REPLACE, {"type": "ByteFallback"}), None),  # no Fuse
        (_sequence({"type": "ByteFallback"}, REPLACE, {"type": "Fuse"}), None),  # order
        (
            _sequence(
                {"type": "Replace", "pattern": {"String": "_"}, "content": " "},
                {"type": "ByteFallback"},
                {"type": "Fuse"},
            ),
            None,
        ),
        (
            _sequence(
                REPLACE,
                {"type": "ByteFallback"},
                {"type": "Fuse"},
                {"type": "Strip", "content": " ", "start": 1, "stop": 1},
            ),
            None,  # a Strip at the end would cut the carrier's own bytes
        ),
        (
            _sequence(REPLACE, {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "ByteLevel"}),
            None,
        ),
    ],
)
def test_decoder_kind_is_known_only_for_the_two_exact_layouts(
    state: bytes | None, kind: str | None
) -> None:
    assert attribution.decoder_kind(state) == kind


def test_token_bytes_of_both_kinds() -> None:
    # GPT-2's byte alphabet: Ġ is a space, "ä\u00b8Ń" is 中 (e4 b8 ad), "æĹ" the first two
    # bytes of 日.
    assert attribution.token_bytes(KIND_BYTE_LEVEL, "Ġthe") == (b" the", False)
    assert attribution.token_bytes(KIND_BYTE_LEVEL, "ä\u00b8Ń") == ("中".encode(), False)
    assert attribution.token_bytes(KIND_BYTE_LEVEL, "æĹ") == (b"\xe6\x97", False)
    assert attribution.token_bytes(KIND_BYTE_LEVEL, "日") is None  # not in the alphabet
    assert attribution.token_bytes(KIND_BYTE_FALLBACK, "<0xE6>") == (b"\xe6", True)
    assert attribution.token_bytes(KIND_BYTE_FALLBACK, "<0xe6>") == (b"\xe6", True)
    assert attribution.token_bytes(KIND_BYTE_FALLBACK, "\u2581東京") == (" 東京".encode(), False)
    assert attribution.token_bytes(KIND_BYTE_FALLBACK, "<0xE6") == (b"<0xE6", False)
    assert attribution.token_bytes("other", "x") is None


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.sampled_from([0x41, 0x80, 0x9D, 0xA0, 0xB1, 0xBF, 0xC0, 0xC2, 0xE0, 0xE6, 0xED,
                         0xF0, 0xF4, 0x90, 0x9F, 0x98, 0xFF])
        | st.integers(0, 255),
        max_size=14,
    )
)  # fmt: skip
def test_lossy_decoding_matches_pythons_replace_decoder(data: list[int]) -> None:
    raw = bytes(data)
    decoded = attribution.lossy_utf8(raw, len(raw))
    assert decoded is not None
    assert decoded[0] == raw.decode("utf-8", "replace").encode("utf-8")
    assert decoded[1] == len(decoded[0])


def bl(*parts: bytes) -> list[tuple[bytes, bool]]:
    return [(part, False) for part in parts]


def bf(*parts: bytes | str) -> list[tuple[bytes, bool]]:
    """Byte-fallback parts: bytes = one <0xNN> token each byte... given as bytes; str = text."""
    out: list[tuple[bytes, bool]] = []
    for part in parts:
        if isinstance(part, bytes):
            out.append((part, True))
        else:
            out.append((part.encode(), False))
    return out


EMOJI = "😀".encode()  # f0 9f 98 80
DONG = "東".encode()  # e6 9d b1


@pytest.mark.parametrize(
    ("kind", "parts", "fragment", "lead"),
    [
        # Byte-level: 東 split after its first byte, the carrier adds "x".
        (KIND_BYTE_LEVEL, bl(DONG[:1], DONG[1:] + b"x"), "東x", 1),
        # 😀 spelled by four tokens, the last adds "A": lead 3 (= span_back).
        (KIND_BYTE_LEVEL, bl(EMOJI[:1], EMOJI[1:2], EMOJI[2:3], EMOJI[3:] + b"A"), "😀A", 3),
        # Two whole characters from the predecessor, then a split one.
        (KIND_BYTE_LEVEL, bl("日".encode() + DONG[:2], DONG[2:] + "京".encode()), "日東京", 5),
        # A dangling byte then a plain token: the "\ufffdken" (3 bytes of U+FFFD lead).
        (KIND_BYTE_LEVEL, bl(b"\xe6", b"ken"), "\ufffdken", 3),
        (KIND_BYTE_LEVEL, bl(b"\xe6\x9d", b"!"), "\ufffd!", 3),
        # Byte fallback: 東 as three <0xNN> tokens; 京 a text token after a byte run.
        (KIND_BYTE_FALLBACK, bf(DONG[:1], DONG[1:2], DONG[2:]), "東", 2),
        (KIND_BYTE_FALLBACK, bf(EMOJI[:1], EMOJI[1:2], EMOJI[2:3], EMOJI[3:]), "😀", 3),
        (KIND_BYTE_FALLBACK, bf(DONG[:1], DONG[1:2], DONG[2:], "京"), "東京", 3),
        # An invalid run: one U+FFFD per byte token (not per maximal subpart).
        (KIND_BYTE_FALLBACK, bf(b"\xe6", b"\x9d", " ken"), "\ufffd\ufffd ken", 6),
    ],
)
def test_split_lead_on_real_byte_layouts(
    kind: str, parts: list[tuple[bytes, bool]], fragment: str, lead: int
) -> None:
    assert split_lead(kind, parts, fragment.encode()) == lead


@pytest.mark.parametrize(
    ("kind", "parts", "fragment", "why"),
    [
        (KIND_BYTE_LEVEL, bl(DONG[:1], DONG[1:]), "東 ", "bytes do not add up"),
        (KIND_BYTE_LEVEL, bl(b" ", b"a"), "a", "the decoder stripped the leading space"),
        (KIND_BYTE_LEVEL, bl(b"", b"a"), "a", "a predecessor without bytes"),
        (KIND_BYTE_LEVEL, bl(b"\xe6\x9d"), "東", "no predecessor"),
        # Byte-level counts one U+FFFD for e6 9d; byte fallback would count two.
        (KIND_BYTE_LEVEL, bl(b"\xe6", b"\x9d", b" ken"), "\ufffd\ufffd ken", "another decoder"),
        (KIND_BYTE_FALLBACK, bf(b"\xe6", b"\x9d", " ken"), "\ufffd ken", "another decoder"),
        ("sentencepiece", bl(DONG[:1], DONG[1:]), "東", "unknown kind"),
    ],
)
def test_split_lead_is_unknown_rather_than_a_guess(
    kind: str, parts: list[tuple[bytes, bool]], fragment: str, why: str
) -> None:
    assert split_lead(kind, parts, fragment.encode()) == UNKNOWN, why


@pytest.mark.parametrize(
    ("kind", "parts", "fragment", "lead", "gives"),
    [
        # " the" and the first byte of 東 from one token, the rest of 東 from the next two.
        (KIND_BYTE_LEVEL, bl(b" the\xe6", b"\x9d", b"\xb1!"), " the東!", 6, [5, 1]),
        (KIND_BYTE_LEVEL, bl(DONG[:1], DONG[1:2], DONG[2:]), "東", 2, [1, 1]),
        # A U+FFFD of one predecessor's own bytes: its three bytes are its give.
        (KIND_BYTE_LEVEL, bl(b"a\xe6", b"\xe6\x9d", b"\xb1"), "a\ufffd東", 6, [4, 2]),
        # One U+FFFD for bytes of two predecessors: cut between them inside its three
        # bytes (1 and 2), so it is theirs together and "x" the first token's own.
        (KIND_BYTE_LEVEL, bl(b"\xe6", b"\x9d", b"!"), "\ufffd!", 3, [1, 2]),
        (KIND_BYTE_LEVEL, bl(b"x", b"\xe6", b"\x9d", b"!"), "x\ufffd!", 4, [1, 1, 2]),
        # ... of three predecessors: a byte each.
        (KIND_BYTE_LEVEL, bl(b"\xf0", b"\x9f", b"\x98", b"ok"), "\ufffdok", 3, [1, 1, 1]),
        # ... of a predecessor and the carrier: lead_len inside it, the carrier's own
        # characters after it.
        (KIND_BYTE_LEVEL, bl(b"\xe6", b"\x80A"), "\ufffdA", 1, [1]),
        (KIND_BYTE_LEVEL, bl(b"ab\xe6", b"\x9dcd"), "ab\ufffdcd", 3, [3]),
        (KIND_BYTE_FALLBACK, bf(EMOJI[:1], EMOJI[1:2], EMOJI[2:3], EMOJI[3:]), "😀", 3, [1, 1, 1]),
        (KIND_BYTE_FALLBACK, bf(DONG[:1], DONG[1:2], DONG[2:], "京"), "東京", 3, [1, 1, 1]),
        # Byte fallback's invalid run: one U+FFFD per byte token, each standing for the
        # whole run (a valid byte in it is replaced too): lead_len only.
        (KIND_BYTE_FALLBACK, bf(b"\xe6", b"\x9d", " ken"), "\ufffd\ufffd ken", 6, [UNKNOWN] * 2),
        (KIND_BYTE_FALLBACK, bf(b"\xbc", b"\x03", "(b"), "\ufffd\ufffd(b", 6, [UNKNOWN] * 2),
        (
            KIND_BYTE_FALLBACK,
            bf("x", b"\xbc", b"\x03", "(b"),
            "x\ufffd\ufffd(b",
            7,
            [1, UNKNOWN, UNKNOWN],
        ),
        # ... and a run that the carrier ends: no honest split.
        (KIND_BYTE_FALLBACK, bf(b"\xe6", b"A"), "\ufffd\ufffd", UNKNOWN, [UNKNOWN]),
        # Unknown split: unknown give counts.
        (KIND_BYTE_LEVEL, bl(b" ", b"a"), "a", UNKNOWN, [UNKNOWN]),
        ("sentencepiece", bl(DONG[:1], DONG[1:]), "東", UNKNOWN, [UNKNOWN]),
    ],
)
def test_split_gives_names_each_predecessors_bytes(
    kind: str, parts: list[tuple[bytes, bool]], fragment: str, lead: int, gives: list[int]
) -> None:
    assert attribution.split_gives(kind, parts, fragment.encode()) == (lead, gives)
    assert split_lead(kind, parts, fragment.encode()) == lead


@given(
    st.lists(st.binary(min_size=1, max_size=4), min_size=2, max_size=5),
    st.sampled_from([KIND_BYTE_LEVEL, KIND_BYTE_FALLBACK]),
)
@settings(max_examples=400, deadline=None)
def test_known_give_counts_add_up_and_own_their_bytes(chunks: list[bytes], kind: str) -> None:
    """For any token bytes decoded as the tokenizer would: known give counts are
    each >= 1 and, when all are known, add up to lead_len; without U+FFFD in the
    fragment each predecessor's give is exactly its own bytes."""
    if kind == KIND_BYTE_LEVEL:
        parts = [(chunk, False) for chunk in chunks]
        fragment = b"".join(chunks).decode("utf-8", "replace").encode()
    else:
        parts = [(bytes((b,)), True) for chunk in chunks for b in chunk[:1]]
        run = b"".join(part[0] for part in parts)
        try:
            fragment = run.decode("utf-8").encode()
        except UnicodeDecodeError:
            fragment = "\ufffd".encode() * len(parts)
    lead, gives = attribution.split_gives(kind, parts, fragment)
    assert len(gives) == len(parts) - 1
    if lead == UNKNOWN:
        assert gives == [UNKNOWN] * (len(parts) - 1)
        return
    assert len(parts) - 1 <= lead <= len(fragment)
    known = [give for give in gives if give != UNKNOWN]
    assert all(give >= 1 for give in known)
    if len(known) == len(gives):
        assert sum(gives) == lead
    if REPLACEMENT not in fragment:
        assert gives == [len(part[0]) for part in parts[:-1]]


# ------------------------------------------------------- a tokenizer stand-in
class FakeDecoder:
    def __init__(self, state: bytes) -> None:
        self.state = state

    def __getstate__(self) -> bytes:
        return self.state


class FakeTokenizer:
    """The `tokenizers.Tokenizer` surface attribution reads: decoder state, id_to_token,
    added tokens. Counts lookups to show the per-tokenizer cache."""

    def __init__(
        self,
        state: bytes,
        vocab: dict[int, str],
        added: tuple[int, ...] = (),
        special: tuple[int, ...] = (),
    ) -> None:
        self.decoder = FakeDecoder(state)
        self.vocab = vocab
        self.added = added + special
        self.special = special
        self.lookups = 0

    def id_to_token(self, token_id: int) -> str | None:
        self.lookups += 1
        return self.vocab.get(token_id)

    def get_added_tokens_decoder(self) -> dict[int, object]:
        return {i: SimpleNamespace(special=i in self.special) for i in self.added}


# Byte-fallback vocabulary: <0xNN> byte tokens 100+NN, text tokens below 100.
BF_VOCAB = {**{100 + b: f"<0x{b:02X}>" for b in range(256)}, 1: "\u2581a", 2: "京", 3: "</s>"}
# Byte-level vocabulary: 東's bytes e6 | 9d b1 as "æ" and "Ŀ±" plus x, and 中.
BL_VOCAB = {
    10: "æ",
    11: "Ŀ±x",
    12: "ä\u00b8Ń",
    13: "Ġthe",
    14: "</s>",
    15: "Ġtheæ",
    16: "Ŀ",
    17: "±x",
}


class FakeDetokenizer:
    def __init__(self, tokenizer: FakeTokenizer, ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.output_token_ids = ids


def test_lead_len_reads_the_detokenizers_tokens_and_caches_per_tokenizer() -> None:
    assert attribution.token_bytes(KIND_BYTE_LEVEL, "Ŀ±x") == (b"\x9d\xb1x", False)
    tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    detok = FakeDetokenizer(tokenizer, [13, 10, 11])
    assert attribution.lead_len(detok, 2, 11, 1, "東x".encode()) == 1
    lookups = tokenizer.lookups
    assert attribution.lead_len(detok, 2, 11, 1, "東x".encode()) == 1
    assert tokenizer.lookups == lookups  # cached on the tokenizer
    # The record's id must be the detokenizer's id at that index.
    assert attribution.lead_len(detok, 2, 12, 1, "東x".encode()) == UNKNOWN
    assert attribution.lead_len(detok, 0, 13, 1, b" the") == UNKNOWN  # no predecessor
    assert attribution.lead_len(detok, 5, 11, 1, "東x".encode()) == UNKNOWN  # beyond the ids
    # An added token among the group.
    detok_added = FakeDetokenizer(tokenizer, [14, 11])
    assert attribution.lead_len(detok_added, 1, 11, 1, b"\x9d\xb1x") == UNKNOWN


def test_a_skipped_special_token_among_the_predecessors_gives_nothing() -> None:
    # 日 = e6 97 a5 over <0xE6>, a special token, <0x97>, then <0xA5>: a decode with
    # skip_special_tokens drops the special token before the decoder runs (the byte
    # run joins across it), so it gives 0 and the others their bytes.
    tokenizer = FakeTokenizer(LLAMA2_STATE, {**BF_VOCAB, 4: "<|user|>"}, special=(3, 4))
    bytes_of = [100 + 0xE6, 4, 100 + 0x97, 100 + 0xA5]
    detok = FakeDetokenizer(tokenizer, bytes_of)
    assert attribution.lead_and_gives(detok, 3, 100 + 0xA5, 3, "日".encode()) == (2, [1, 0, 1])
    # Only special tokens before the carrier: the fragment is all the carrier's.
    detok = FakeDetokenizer(tokenizer, [3, 4, 1])
    assert attribution.lead_and_gives(detok, 2, 1, 2, b" a") == (0, [0, 0])
    assert attribution.lead_and_gives(detok, 2, 1, 2, b" b") == (UNKNOWN, [0, 0])
    # A detokenizer that keeps special tokens: their text is not known here.
    keeps = FakeDetokenizer(tokenizer, [3, 4, 1])
    keeps.skip_special_tokens = False  # type: ignore[attr-defined]
    assert attribution.lead_and_gives(keeps, 2, 1, 2, b" a") == (UNKNOWN, [UNKNOWN, UNKNOWN])


class FakeDecodeStream:
    """tokenizers.decoders.DecodeStream after vLLM's reset: a new stream's first step
    gives `FRESH[token_id]`."""

    FRESH: ClassVar[dict[int, str]] = {}

    def __init__(self, skip_special_tokens: bool = True) -> None:
        self.skip_special_tokens = skip_special_tokens

    def step(self, tokenizer: object, token_id: int) -> str | None:
        return self.FRESH.get(token_id)


def test_a_fragment_after_a_decode_stream_reset_is_the_carriers_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # vLLM restarts the decode stream at the carrier after tokenizers' "invalid
    # prefix" error (an emitted byte token and a held one form an invalid run): the
    # held <0x9F>'s bytes are dropped and the fragment is the carrier's own " a".
    tokenizer = FakeTokenizer(LLAMA2_STATE, BF_VOCAB)
    detok = FakeDetokenizer(tokenizer, [100 + 0x0A, 100 + 0x9F, 1])
    fragment = b" a"
    # Without the tokenizers library the reset cannot be told apart: unknown.
    monkeypatch.setitem(sys.modules, "tokenizers.decoders", None)
    assert attribution.lead_and_gives(detok, 2, 1, 1, fragment) == (UNKNOWN, [UNKNOWN])
    monkeypatch.setitem(
        sys.modules, "tokenizers.decoders", SimpleNamespace(DecodeStream=FakeDecodeStream)
    )
    monkeypatch.setattr(FakeDecodeStream, "FRESH", {1: " a"})
    assert attribution.lead_and_gives(detok, 2, 1, 1, fragment) == (0, [0])
    # The group decodes to the fragment: the ordinary split, never the reset's.
    assert attribution.lead_and_gives(detok, 2, 1, 1, "\ufffd a".encode()) == (3, [3])
    # A new stream would give something else: not a reset, unknown.
    monkeypatch.setattr(FakeDecodeStream, "FRESH", {1: "a"})
    assert attribution.lead_and_gives(detok, 2, 1, 1, fragment) == (UNKNOWN, [UNKNOWN])


def test_lead_len_is_unknown_for_unknown_tokenizers_and_never_raises() -> None:
    other = FakeTokenizer(b'{"type":"WordPiece"}', BL_VOCAB)
    assert attribution.lead_len(FakeDetokenizer(other, [10, 11]), 1, 11, 1, "東x".encode()) == (
        UNKNOWN
    )
    slow = SimpleNamespace(tokenizer=object(), output_token_ids=[10, 11])  # no id_to_token
    assert attribution.lead_len(slow, 1, 11, 1, "東x".encode()) == UNKNOWN
    assert attribution.lead_len(SimpleNamespace(), 1, 11, 1, b"x") == UNKNOWN

    class Broken(FakeTokenizer):
        def id_to_token(self, token_id: int) -> str | None:
            raise RuntimeError("boom")

    broken = Broken(BYTE_LEVEL_STATE, BL_VOCAB)
    assert attribution.lead_len(FakeDetokenizer(broken, [10, 11]), 1, 11, 1, "東x".encode()) == (
        UNKNOWN
    )


# ------------------------------------------- the frontend hook and the reconcilers
class StreamDetokenizer:
    """A detokenizer with vLLM's surface: decode_next (wrapped by the plugin) returns ""
    while the bytes so far end inside a character, else the new text."""

    def __init__(self, tokenizer: FakeTokenizer, decode_with: FakeTokenizer | None = None) -> None:
        self.tokenizer = tokenizer  # what attribution reads
        self.token_ids: list[int] = []
        self.pending = b""
        self.table = attribution.TokenBytes(decode_with or tokenizer)  # how it decodes

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids

    def decode_next(self, next_token_id: int) -> str:
        part = self.table.get(next_token_id)
        assert part is not None
        self.pending += part[0]
        try:
            text = self.pending.decode("utf-8")
        except UnicodeDecodeError:
            return ""
        self.pending = b""
        return text


def frontend_text_frames(
    receiver: socket.socket,
    tokenizer: FakeTokenizer,
    steps: list[list[int]],
    decode_with: FakeTokenizer | None = None,
    submitted: list[tuple[int, list[tuple[int, Any]]]] | None = None,
) -> list[bytes]:
    """Run the frontend hook over `steps` (token ids per engine step) of stream 0; the
    text frames it sent, in order (hello first). `submitted`: gets, after each engine
    step, (that step, the (frontend step, TextStep) pairs handed to the emitter in it)."""
    from parallelhue_vllm.adapters import _wrap_add_request, _wrap_process_outputs

    telemetry = hooks.FrontendTelemetry("0.32.0")
    request_id = f"cmpl-ph1_{RUN}_0-00000000"
    state = FakeRequestState(request_id, StreamDetokenizer(tokenizer, decode_with))
    processor = SimpleNamespace(request_states={})

    def add_request(self: Any, request: Any, *args: Any) -> None:
        self.request_states[request.request_id] = state

    _wrap_add_request(add_request, telemetry)(processor, SimpleNamespace(request_id=request_id))
    handed: list[tuple[int, Any]] = []
    if submitted is not None:
        assert telemetry.emitter is not None
        submit = telemetry.emitter.submit_rows

        def spy(kind: int, step: int, by_run: Any, records: int) -> bool:
            handed.append((step, copy.deepcopy(by_run[RUN])))
            return submit(kind, step, by_run, records)

        telemetry.emitter.submit_rows = spy  # type: ignore[method-assign]

    def process_outputs(self: Any, outputs: list[Any], *args: Any) -> None:
        # vLLM's order: the detokenizer takes the step's ids, then the output is queued.
        for out in outputs:
            detokenizer = state.detokenizer
            text = ""
            for token_id in out.new_token_ids:
                detokenizer.token_ids.append(token_id)
                text += detokenizer.decode_next(token_id)
            finish = "stop" if out.finish_reason is not None else None
            completion = CompletionOutput(0, text, list(out.new_token_ids), finish)
            state.queue.put(RequestOutput(request_id, [completion], finish is not None))
            if finish is not None:
                self.request_states.pop(out.request_id, None)

    process = _wrap_process_outputs(process_outputs, telemetry)
    for index, ids in enumerate(steps):
        last = index == len(steps) - 1
        finish = SimpleNamespace(name="STOP") if last else None
        process(processor, [SimpleNamespace(request_id=request_id, new_token_ids=list(ids),
                                            finish_reason=finish)])  # fmt: skip
        if submitted is not None:
            submitted.append((index, handed[:]))
            handed.clear()
    return raw_frames(receiver, telemetry)


def reconcile(
    cls: Any, text_frames: list[bytes], steps: list[list[int]], final_text: str
) -> list[tuple[Any, ...]]:
    """Feed a scheduler (one record per engine step: accepted drafts then a bonus)
    beside the frontend's frames."""
    rec = cls(RUN, 1)
    run = bytes.fromhex(RUN)
    source = 0x5C
    rec.push_frame(
        wire.encode_hello(
            wire.Header(run, source, 0, 0, 0),
            wire.Hello(wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_DRAFT_IDS, False,
                       3, __version__, "0.32.0", "ngram", wire.VERIFICATION_STANDARD),
        )
    )  # fmt: skip
    offset = 0
    for index, ids in enumerate(steps):
        last = index == len(steps) - 1
        drafts = len(ids) - 1
        roles = [wire.ROLE_ACCEPTED] * drafts + [wire.ROLE_BONUS if drafts else wire.ROLE_PLAIN]
        record = wire.ProvenanceRecord(0, offset, list(ids), roles, drafts, finished=last,
                                       finish_reason=wire.FINISH_STOP if last else 0)  # fmt: skip
        header = wire.Header(run, source, index + 1, index + 1, 0)
        rec.push_frame(wire.encode_records(wire.KIND_PROVENANCE, header, [record]))
        offset += len(ids)
    rec.push_frames(text_frames)
    rec.push_sse_id(0, f"cmpl-ph1_{RUN}_0")
    all_ids = [token_id for ids in steps for token_id in ids]
    rec.push_sse(0, final_text, all_ids)
    rec.finish_sse(0, "stop")
    rec.finalize()
    return list(rec.drain())


@pytest.mark.parametrize("cls", reconcilers())
@pytest.mark.parametrize(
    ("kind", "steps", "text", "spans"),
    [
        # Byte fallback: 東 as three byte tokens (one per step), then 京 and " a".
        (
            "byte-fallback",
            [[100 + 0xE6], [100 + 0x9D], [100 + 0xB1, 2], [1]],
            "東京 a",
            # 東 takes bytes of steps 0, 1, 2: uncolored; 京 is step 2's own; " a" step 3.
            [("東", None), ("京", 2), (" a", 3)],
        ),
        (
            "byte-level",
            [[10], [11, 13]],
            "東x the",
            [("東", None), ("x", 1), (" the", 1)],
        ),
    ],
)
def test_hook_sends_lead_len_and_both_reconcilers_color_per_character(
    receiver: socket.socket,
    cls: Any,
    kind: str,
    steps: list[list[int]],
    text: str,
    spans: list[tuple[str, int | None]],
) -> None:
    if kind == "byte-fallback":
        tokenizer = FakeTokenizer(LLAMA2_STATE, BF_VOCAB, added=(3,))
    else:
        tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    frames = frontend_text_frames(receiver, tokenizer, steps)
    tokens = [
        (token.token_id, token.span_back, token.lead_len)
        for frame in frames[1:]
        for record in decode_frame(frame).records
        if isinstance(record, wire.TextRecord)
        for token in record.tokens
    ]
    carriers = [(span, lead) for _, span, lead in tokens if span]
    assert carriers == ([(2, 2)] if kind == "byte-fallback" else [(1, 1)])
    events = reconcile(cls, frames, steps, text)
    shown = [(e[3], e[4]) for e in events if e[0] == "span"]
    assert shown == spans
    assert events[-1] == ("exact", 0)


@pytest.mark.parametrize("cls", reconcilers())
def test_without_lead_len_the_whole_fragment_stays_uncolored(
    receiver: socket.socket, cls: Any
) -> None:
    """The control: the same run with an unknown split (a decoder the plugin does not
    know) colors nothing of the carrier's fragment."""
    known = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    unknown = FakeTokenizer(b'{"type":"ByteLevel2"}', BL_VOCAB, added=(14,))
    assert attribution.TokenBytes(unknown).kind is None
    frames = frontend_text_frames(receiver, unknown, [[10], [11, 13]], decode_with=known)
    leads = [
        token.lead_len
        for frame in frames[1:]
        for record in decode_frame(frame).records
        if isinstance(record, wire.TextRecord)
        for token in record.tokens
        if token.span_back
    ]
    assert leads == [UNKNOWN]
    events = reconcile(cls, frames, [[10], [11, 13]], "東x the")
    assert [(e[3], e[4]) for e in events if e[0] == "span"] == [("東x", None), (" the", 1)]


# ------------------------------------------------- give counts (held text steps)
def leads_of(handed: list[tuple[int, Any]]) -> list[tuple[int, dict[int, list[int]]]]:
    return [(step, rows[5]) for step, rows in handed]


def test_the_frontend_holds_text_until_the_carrier_gives_the_give_counts(
    receiver: socket.socket,
) -> None:
    """ " the" and the first byte of 東 (token 15, engine step 0) end inside a
    character: its text step waits, as does step 1's (token 16: 9d), until the
    carrier (token 17, step 2: b1 x) arrives; then both held steps go out, in order, with
    their own step numbers, and each empty token carries its give count."""
    tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    submitted: list[tuple[int, list[tuple[int, Any]]]] = []
    steps = [[15], [16], [17], [13]]
    frames = frontend_text_frames(receiver, tokenizer, steps, submitted=submitted)
    handed = {index: leads_of(rows) for index, rows in submitted}
    assert handed[0] == [] and handed[1] == []  # held: tokens 15 and 16 are unclaimed
    # Step 2's fragment " the東x": 15 gave 5 bytes (" the" + e6), 16 gave 1 (9d), lead 6.
    assert handed[2] == [(1, {0: [5]}), (2, {0: [1]}), (3, {0: [6]})]
    assert handed[3] == [(4, {})]
    steps_sent = [decode_frame(f).header.step for f in frames[1:]]
    assert steps_sent == [1, 2, 3, 4]  # the frames keep their steps, in order


def test_give_counts_of_a_step_sent_before_its_carrier_stay_unknown(
    receiver: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past MAX_HELD_STEPS the oldest held step goes out as it is: its give counts
    stay unknown; the carrier's lead_len and the later gives are still sent."""
    monkeypatch.setattr(attribution, "MAX_HELD_STEPS", 1)
    tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    submitted: list[tuple[int, list[tuple[int, Any]]]] = []
    frontend_text_frames(receiver, tokenizer, [[15], [16], [17], [13]], submitted=submitted)
    handed = {index: leads_of(rows) for index, rows in submitted}
    assert handed[0] == []
    assert handed[1] == [(1, {})]  # sent without knowing token 15's give
    assert handed[2] == [(2, {0: [1]}), (3, {0: [6]})]


def test_a_step_whose_carrier_is_in_the_same_row_is_not_held(receiver: socket.socket) -> None:
    tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    submitted: list[tuple[int, list[tuple[int, Any]]]] = []
    frontend_text_frames(receiver, tokenizer, [[15, 16, 17], [13]], submitted=submitted)
    handed = {index: leads_of(rows) for index, rows in submitted}
    assert handed[0] == [(1, {0: [5, 1, 6]})]


def test_a_request_that_finishes_with_unclaimed_tokens_releases_its_run(
    receiver: socket.socket,
) -> None:
    tokenizer = FakeTokenizer(BYTE_LEVEL_STATE, BL_VOCAB, added=(14,))
    submitted: list[tuple[int, list[tuple[int, Any]]]] = []
    frontend_text_frames(receiver, tokenizer, [[13], [15]], submitted=submitted)
    handed = {index: leads_of(rows) for index, rows in submitted}
    assert handed[0] == [(1, {})] and [step for step, _ in handed[1]] == [2]


def text_rows(records: list[tuple[int, int, list[str]]]) -> attribution.TextRows:
    """A text step of (stream, offset, fragments) records, one token per fragment."""
    meta: list[int] = []
    ids: list[int] = []
    texts: list[str] = []
    fragments: list[str] = []
    for stream, offset, pieces in records:
        meta += [stream, 0, 0, offset, len(pieces), len(pieces), 0]
        ids += [100 + offset + i for i in range(len(pieces))]
        texts.append("".join(pieces))
        fragments += pieces
    return meta, ids, texts, fragments, {}, {}


def test_held_text_holds_only_the_dangling_streams_and_keeps_each_streams_order() -> None:
    held = attribution.HeldText()
    step1 = text_rows([(0, 0, ["a", ""]), (1, 0, ["x"])])
    sent = held.pass_step(1, step1, {0})
    assert [(step, rows[0][::7], rows[2]) for step, rows in sent] == [(1, [1], ["x"])]
    step2 = text_rows([(1, 1, ["y"]), (0, 2, [""])])
    sent = held.pass_step(2, step2, {0})
    assert [(step, rows[2]) for step, rows in sent] == [(2, ["y"])]
    assert held.set_give(0, 1, 2) and held.set_give(0, 2, 1)
    assert not held.set_give(1, 0, 1)  # stream 1's record went out already
    step3 = text_rows([(0, 3, ["日b"])])
    sent = held.pass_step(3, step3, set())
    # Stream 0's held records first, in order, each with its own step and give counts.
    assert [(step, rows[2], rows[5]) for step, rows in sent] == [
        (1, ["a"], {0: [0, 2]}),
        (2, [""], {0: [1]}),
        (3, ["日b"], {}),
    ]
    assert not held


def test_held_text_sends_the_oldest_step_past_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attribution, "MAX_HELD_STEPS", 2)
    held = attribution.HeldText()
    for step in range(1, 4):
        sent = held.pass_step(step, text_rows([(0, step - 1, [""])]), {0})
    assert [step for step, _ in sent] == [1]
    assert [step for step, _ in held.release()] == [2, 3] and not held
