"""`lead_len` for a text token: how many leading bytes of its fragment its predecessors
gave, and (protocol 3) each predecessor's give count; the frontend's held text records.

A token that ends inside a UTF-8 character returns an empty fragment; the
token that completes the character returns the character together with its
own bytes, and the text record says so with `span_back` (how many empty
tokens before it gave bytes). `lead_len` splits that fragment: the first
`lead_len` bytes came from the `span_back` predecessors, the rest from the
carrier. The reconciler then colors per character instead of per fragment.

The split comes from the tokenizer's own bytes of each token, for the two
decoder layouts whose per-token bytes are known exactly:

- byte-level BPE (GPT-2 / Llama-3 style, decoder `ByteLevel`): each character
  of the token string stands for one byte (GPT-2's printable byte alphabet);
- byte fallback (Llama-2 / Mistral / Gemma style, decoder
  `Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", n, 0)?]`):
  `<0xNN>` is the byte NN, any other token is its text with `▁` as a space.

The bytes are then decoded as the tokenizers library decodes them (UTF-8,
each maximal ill-formed subpart replaced by U+FFFD, like Rust's
`from_utf8_lossy`), and the result must equal the detokenizer's fragment
byte for byte. Anything else — another decoder, an added token (a special one that
vLLM skips gives 0 bytes: the decode drops it before the decoder runs),
a replacement character made of bytes from both sides, a first token whose
leading space the decoder stripped, a split that breaks the protocol's
`span_back <= lead_len <= frag_len` — gives `LEAD_UNKNOWN`: the reconciler
then attributes the whole fragment to the whole group, as before. Never a
guess. One exception is known exactly: after tokenizers' "invalid prefix"
error vLLM restarts the decode stream at the carrier (byte fallback: an
emitted byte token and a held one form an invalid run), which drops the held
bytes; a fragment that is exactly what a new stream gives for the carrier
alone, and not what the group decodes to, is the carrier's own: `lead_len`
0, every give 0.

Give counts (split_gives): how many bytes of the carrier's fragment stand
for each predecessor's bytes, from the same decoding; unknown where a U+FFFD
stands for bytes of several tokens. They are known only when the carrier
arrives, so the frontend holds a stream's text records back until then
(HeldText, at the end of this file).

Cost: nothing per token; the work runs only for a fragment with
`span_back > 0`, and each token's bytes are cached per tokenizer.
"""

from __future__ import annotations

import importlib
import itertools
import json
import re
from collections.abc import Sequence
from typing import Any

from .wire import LEAD_UNKNOWN, ROW_WIDTH

KIND_BYTE_LEVEL = "byte-level"
KIND_BYTE_FALLBACK = "byte-fallback"

_TABLE_ATTR = "_parallelhue_token_bytes"
_BYTE_TOKEN = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_REPLACEMENT = "\ufffd".encode()
# Per-tokenizer cache bound: a long-running server sees a bounded vocabulary anyway.
MAX_CACHED_TOKENS = 1 << 18


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's byte <-> printable character table (the ByteLevel alphabet), inverted."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(char): byte for byte, char in zip(printable, chars, strict=True)}


_BYTE_DECODER = _gpt2_byte_decoder()


def decoder_kind(decoder_state: bytes | str | None) -> str | None:
    """Which per-token byte rule a tokenizers decoder (its JSON state) follows, or None."""
    if decoder_state is None:
        return None
    try:
        spec = json.loads(decoder_state)
    except (TypeError, ValueError):
        return None
    if not isinstance(spec, dict):
        return None
    if spec.get("type") == "ByteLevel":
        return KIND_BYTE_LEVEL
    if spec.get("type") != "Sequence":
        return None
    steps = spec.get("decoders")
    if not isinstance(steps, list):
        return None
    types = [step.get("type") if isinstance(step, dict) else None for step in steps]
    # Replace("▁", " "), ByteFallback, Fuse, then optionally one leading-space Strip.
    if types[:3] != ["Replace", "ByteFallback", "Fuse"] or len(types) > 4:
        return None
    replace = steps[0]
    if replace.get("pattern") != {"String": "\u2581"} or replace.get("content") != " ":
        return None
    if len(types) == 4:
        strip = steps[3]
        if types[3] != "Strip" or strip.get("content") != " " or strip.get("stop") != 0:
            return None
    return KIND_BYTE_FALLBACK


def token_bytes(kind: str, token: str) -> tuple[bytes, bool] | None:
    """What one token string stands for under a decoder kind: (bytes, is a `<0xNN>`
    byte token), or None when unknown."""
    if kind == KIND_BYTE_LEVEL:
        out = bytearray()
        for char in token:
            byte = _BYTE_DECODER.get(char)
            if byte is None:
                return None
            out.append(byte)
        return bytes(out), False
    if kind == KIND_BYTE_FALLBACK:
        match = _BYTE_TOKEN.fullmatch(token)
        if match is not None:
            return bytes((int(match.group(1), 16),)), True
        return token.replace("\u2581", " ").encode("utf-8"), False
    return None


TokenPart = tuple[bytes, bool]  # a token's bytes, and whether it is a <0xNN> byte token


class TokenBytes:
    """Per-token bytes of one `tokenizers.Tokenizer`, computed on first use, cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        decoder = getattr(tokenizer, "decoder", None)
        state = decoder.__getstate__() if decoder is not None else None
        self.kind = decoder_kind(state)
        # Added tokens (special or not) are not decoded by the decoder's byte rule.
        self.added: frozenset[int] = frozenset()
        # Special added tokens: a decode with skip_special_tokens drops them before the
        # decoder runs, so they give no bytes (and byte runs join across them).
        self.special: frozenset[int] = frozenset()
        if self.kind is not None:
            added = tokenizer.get_added_tokens_decoder()
            self.added = frozenset(added)
            self.special = frozenset(i for i, t in added.items() if getattr(t, "special", False))
        self.cache: dict[int, TokenPart | None] = {}

    def get(self, token_id: int) -> TokenPart | None:
        try:
            return self.cache[token_id]
        except KeyError:
            pass
        found: TokenPart | None = None
        if self.kind is not None and token_id not in self.added:
            token = self.tokenizer.id_to_token(token_id)
            if isinstance(token, str):
                found = token_bytes(self.kind, token)
        if len(self.cache) >= MAX_CACHED_TOKENS:
            self.cache.clear()
        self.cache[token_id] = found
        return found


def for_tokenizer(tokenizer: Any) -> TokenBytes:
    """The cached TokenBytes of a tokenizer (stored on the tokenizer object itself)."""
    table = getattr(tokenizer, _TABLE_ATTR, None)
    if isinstance(table, TokenBytes) and table.tokenizer is tokenizer:
        return table
    table = TokenBytes(tokenizer)
    try:
        setattr(tokenizer, _TABLE_ATTR, table)
    except (AttributeError, TypeError):
        pass  # not cacheable on this object: recomputed next time (still correct)
    return table


def _unit_end(data: bytes, start: int) -> tuple[int, bool]:
    """End of the UTF-8 unit at `start` and whether it is a valid character.

    An invalid unit is a maximal subpart of an ill-formed sequence (Unicode
    §3.9, "U+FFFD substitution of maximal subparts", what Rust's
    `from_utf8_lossy` replaces): the bytes that begin a valid sequence but do
    not finish it, or one byte that begins none.
    """
    lead = data[start]
    if lead < 0x80:
        return start + 1, True
    if 0xC2 <= lead <= 0xDF:
        need, low, high = 1, 0x80, 0xBF
    elif lead == 0xE0:
        need, low, high = 2, 0xA0, 0xBF
    elif 0xE1 <= lead <= 0xEC or 0xEE <= lead <= 0xEF:
        need, low, high = 2, 0x80, 0xBF
    elif lead == 0xED:
        need, low, high = 2, 0x80, 0x9F
    elif lead == 0xF0:
        need, low, high = 3, 0x90, 0xBF
    elif 0xF1 <= lead <= 0xF3:
        need, low, high = 3, 0x80, 0xBF
    elif lead == 0xF4:
        need, low, high = 3, 0x80, 0x8F
    else:
        return start + 1, False
    position = start + 1
    for index in range(need):
        if position >= len(data):
            return position, False
        byte = data[position]
        if not (low <= byte <= high if index == 0 else 0x80 <= byte <= 0xBF):
            return position, False
        position += 1
    return position, True


def lossy_utf8(data: bytes, boundary: int) -> tuple[bytes, int] | None:
    """`data` decoded with U+FFFD for each maximal ill-formed subpart, re-encoded,
    and the output length before input byte `boundary`; None when a U+FFFD
    stands for bytes on both sides of `boundary` (no honest split)."""
    out = bytearray()
    lead = -1
    position = 0
    while position < len(data):
        end, valid = _unit_end(data, position)
        if position == boundary:
            lead = len(out)
        elif position < boundary < end:
            if not valid:
                return None
            lead = len(out) + (boundary - position)
        out += data[position:end] if valid else _REPLACEMENT
        position = end
    if lead < 0:
        lead = len(out)
    return bytes(out), lead


# Who an output byte stands for: (first, last) token index in `parts`; first < last
# for a U+FFFD that stands for bytes of several tokens.
Owner = tuple[int, int]


def _owners_byte_level(parts: Sequence[TokenPart]) -> tuple[bytes, list[Owner]]:
    """ByteLevel decoding of the tokens' bytes (one U+FFFD per maximal ill-formed
    subpart) and who each output byte stands for."""
    data = b"".join(part[0] for part in parts)
    source: list[int] = []
    for index, part in enumerate(parts):
        source += [index] * len(part[0])
    out = bytearray()
    owners: list[Owner] = []
    position = 0
    while position < len(data):
        end, valid = _unit_end(data, position)
        if valid:
            out += data[position:end]
            owners += [(token, token) for token in source[position:end]]
        else:
            out += _REPLACEMENT
            owners += [(source[position], source[end - 1])] * len(_REPLACEMENT)
        position = end
    return bytes(out), owners


def _owners_byte_fallback(parts: Sequence[TokenPart]) -> tuple[bytes, list[Owner]]:
    """tokenizers' ByteFallback + Fuse: each run of `<0xNN>` tokens is its bytes when
    they are valid UTF-8 as a whole, else one U+FFFD per byte token (standing for
    the whole run); other tokens are their text. The output and who each output
    byte stands for."""
    out = bytearray()
    owners: list[Owner] = []
    index = 0
    while index < len(parts):
        if not parts[index][1]:
            out += parts[index][0]
            owners += [(index, index)] * len(parts[index][0])
            index += 1
            continue
        end = index
        while end < len(parts) and parts[end][1]:
            end += 1
        run = b"".join(part[0] for part in parts[index:end])
        try:
            run.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        for token in range(index, end):
            # Each U+FFFD of an invalid run exists because of the whole run (a valid
            # byte in it is replaced too): it stands for all of the run's tokens.
            piece, owner = (
                (parts[token][0], (token, token)) if valid else (_REPLACEMENT, (index, end - 1))
            )
            out += piece
            owners += [owner] * len(piece)
        index = end
    return bytes(out), owners


def split_gives(
    kind: str | None, parts: Sequence[TokenPart], fragment: bytes
) -> tuple[int, list[int]]:
    """`lead_len` of `fragment` and each predecessor's give count, from each of its
    tokens' own bytes, in order (`parts` = the span_back predecessors, then the carrier).

    A predecessor's give count is how many bytes of the fragment stand for its
    bytes. Everything is LEAD_UNKNOWN unless decoding the tokens as the
    tokenizer's decoder does gives exactly `fragment` and the protocol's bounds
    hold (`span_back <= lead_len <= frag_len`, each predecessor giving at least
    one byte). A U+FFFD that stands for bytes of two or three tokens (the
    carrier among them or not) is cut among them inside its three bytes
    (_spread): its character is then theirs together, and every other
    character its own token's. Where that is not possible (byte fallback's
    invalid runs of several byte tokens, each U+FFFD standing for the whole
    run) the run's give counts are unknown and lead_len stays known, or, when
    the carrier is in the run, everything is unknown. Known give counts of all
    predecessors add up to lead_len.
    """
    carrier = len(parts) - 1
    unknown = (LEAD_UNKNOWN, [LEAD_UNKNOWN] * max(carrier, 0))
    if carrier < 1 or any(not part[0] for part in parts[:-1]):
        return unknown
    if kind == KIND_BYTE_LEVEL:
        out, owners = _owners_byte_level(parts)
    elif kind == KIND_BYTE_FALLBACK:
        out, owners = _owners_byte_fallback(parts)
    else:
        return unknown
    if out != fragment:
        return unknown
    spread = _spread(owners)
    if spread is not None:
        # One token per output byte, in token order: the carrier's start is lead_len,
        # each predecessor gives what it owns (a U+FFFD of several tokens is cut
        # among them inside its three bytes, so the character stays theirs together).
        lead = next((at for at, token in enumerate(spread) if token == carrier), len(spread))
        spread_gives = [spread[:lead].count(token) for token in range(carrier)]
        if all(spread_gives):
            return lead, spread_gives
        return unknown  # each predecessor named by span_back gives a byte
    # The carrier's own bytes come last: lead_len is where they start.
    lead = next((at for at, (_, last) in enumerate(owners) if last == carrier), len(owners))
    if any(first != carrier for first, _ in owners[lead:]) or not carrier <= lead <= len(out):
        return unknown  # a U+FFFD of a predecessor and the carrier: no honest split
    gives = [0] * carrier
    shared: set[int] = set()
    for first, last in owners[:lead]:
        gives[first] += 1
        if first != last:
            shared.update(range(first, last + 1))
    if any(give == 0 and token not in shared for token, give in enumerate(gives)):
        return unknown  # each predecessor named by span_back gives a byte
    for token in shared:
        gives[token] = LEAD_UNKNOWN
    return lead, gives


def _spread(owners: Sequence[Owner]) -> list[int] | None:
    """One token per output byte: a character's bytes go to the token they stand
    for; the three bytes of a U+FFFD that stands for tokens a..b (two or three
    tokens: a maximal ill-formed subpart is at most three bytes) go to a, b, b or a,
    a + 1, a + 2, so that each of those tokens owns a byte inside it and the
    character comes from all of them (docs/PROTOCOL.md "Spans": a character is
    attributed to every unit that overlaps it). None when that is not in token
    order (byte fallback: every U+FFFD of an invalid run of several byte tokens
    stands for the whole run), or a U+FFFD stands for more than three tokens."""
    out: list[int] = []
    at = 0
    while at < len(owners):
        first, last = owners[at]
        if first == last:
            out.append(first)
            at += 1
            continue
        count = last - first + 1
        if count > len(_REPLACEMENT) or list(owners[at : at + len(_REPLACEMENT)]) != [
            (first, last)
        ] * len(_REPLACEMENT):
            return None
        out += [first, last, last] if count == 2 else [first, first + 1, first + 2]
        at += len(_REPLACEMENT)
    if any(a > b for a, b in itertools.pairwise(out)):
        return None
    return out


def split_lead(kind: str | None, parts: Sequence[TokenPart], fragment: bytes) -> int:
    """`lead_len` of `fragment` given each of its tokens' own bytes, in order
    (split_gives without the give counts)."""
    return split_gives(kind, parts, fragment)[0]


def lead_len(detokenizer: Any, index: int, token_id: int, span_back: int, fragment: bytes) -> int:
    """`lead_len` for the token at output index `index` of a vLLM detokenizer
    (lead_and_gives without the give counts)."""
    return lead_and_gives(detokenizer, index, token_id, span_back, fragment)[0]


def lead_and_gives(
    detokenizer: Any, index: int, token_id: int, span_back: int, fragment: bytes
) -> tuple[int, list[int]]:
    """`lead_len` for the token at output index `index` of a vLLM detokenizer, and
    the give count of each of its `span_back` predecessors (split_gives).

    `index` is the token's position among the request's output tokens (the
    text record's offset plus its position in the record); the predecessors
    are the `span_back` tokens before it in `detokenizer.output_token_ids`.
    Never raises: anything unexpected is LEAD_UNKNOWN.
    """
    unknown = (LEAD_UNKNOWN, [LEAD_UNKNOWN] * max(span_back, 0))
    try:
        if span_back <= 0 or index < span_back:
            return unknown
        tokenizer = getattr(detokenizer, "tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "id_to_token"):
            return unknown  # the slow (Python) detokenizer: no per-token bytes here
        ids = detokenizer.output_token_ids
        if index >= len(ids) or ids[index] != token_id:
            return unknown
        table = for_tokenizer(tokenizer)
        if table.kind is None:
            return unknown
        skips = getattr(detokenizer, "skip_special_tokens", True) is True
        parts: list[TokenPart] = []
        skipped: list[int] = []  # predecessors a skipped special token: they give 0
        for at, position in enumerate(range(index - span_back, index + 1)):
            if skips and position < index and ids[position] in table.special:
                skipped.append(at)
                continue
            part = table.get(ids[position])
            if part is None:
                return unknown
            parts.append(part)
        lead, gives = _split_or_reset(detokenizer, token_id, parts, table.kind, fragment)
        for at in skipped:
            gives.insert(at, 0)
        return lead, gives
    except Exception:
        return unknown


def _split_or_reset(
    detokenizer: Any, token_id: int, parts: Sequence[TokenPart], kind: str, fragment: bytes
) -> tuple[int, list[int]]:
    """split_gives of the tokens that give bytes (the carrier last), or the split of a
    fragment a decode-stream reset gave the carrier alone (_after_reset)."""
    if len(parts) == 1:  # every predecessor gave nothing
        owners = _owners_byte_level if kind == KIND_BYTE_LEVEL else _owners_byte_fallback
        return (0, []) if owners(parts)[0] == fragment else (LEAD_UNKNOWN, [])
    found = split_gives(kind, parts, fragment)
    if found[0] == LEAD_UNKNOWN and _after_reset(detokenizer, token_id, parts, kind, fragment):
        return 0, [0] * (len(parts) - 1)
    return found


def _after_reset(
    detokenizer: Any, token_id: int, parts: Sequence[TokenPart], kind: str, fragment: bytes
) -> bool:
    """The fragment is what a new decode stream gives for the carrier alone, and not
    what its predecessors and it decode to: vLLM's recovery from tokenizers' "invalid
    prefix" error (a byte-fallback run that an earlier emitted byte token turned
    invalid) restarted the stream at the carrier, so the predecessors' held bytes
    were dropped: every byte of the fragment is the carrier's own, each predecessor
    gave 0. (When the predecessors and the carrier do decode to the fragment, a
    U+FFFD may stand for bytes of both: split_gives decides that, never this.)"""
    owners = _owners_byte_level if kind == KIND_BYTE_LEVEL else _owners_byte_fallback
    if owners(parts)[0] == fragment:
        return False
    decoders = importlib.import_module("tokenizers.decoders")
    fresh = decoders.DecodeStream(
        skip_special_tokens=getattr(detokenizer, "skip_special_tokens", True)
    ).step(detokenizer.tokenizer, token_id)
    return isinstance(fresh, str) and fresh.encode() == fragment


# ------------------------------------------------------------ held text steps
# A stream's text records wait at most this many held steps for give counts.
MAX_HELD_STEPS = 16

# wire.TextStep with its lead_lens (what the frontend's bucket hands over).
TextRows = tuple[
    list[int], list[int], list[str], list[str], dict[int, list[int]], dict[int, list[int]]
]


class HeldText:
    """One run's text records that the frontend holds back, per stream.

    A token that decoded to "" gives its bytes to a later fragment; its give
    count (protocol 3) is known only when that fragment arrives (split_gives),
    usually in a later engine step. So while a stream has such tokens that no
    fragment has claimed yet ("dangling"), its text records wait here, and the
    carrier's row writes its predecessors' give counts into them. The other
    streams' records go out as usual. Only the sending is later: each record
    keeps its step (the frame's header step) and its place in the stream's
    order. At most MAX_HELD_STEPS steps wait; past that the oldest is sent as
    it is (its give counts stay LEAD_UNKNOWN).
    """

    __slots__ = ("steps", "streams")

    def __init__(self) -> None:
        self.steps: list[tuple[int, TextRows]] = []  # (frontend step, held records)
        self.streams: set[int] = set()  # the streams whose records wait

    def __bool__(self) -> bool:
        return bool(self.steps or self.streams)

    def pass_step(
        self, step: int, rows: TextRows | None, dangling: set[int]
    ) -> list[tuple[int, TextRows]]:
        """This step's rows, given the streams dangling now: the (step, rows) to send
        now, in order (a released stream's held records before its new one)."""
        out: list[tuple[int, TextRows]] = []
        released = self.streams - dangling
        if released:
            kept = []
            for held_step, held_rows in self.steps:
                going, staying = split_rows(held_rows, released)
                if going is not None:
                    out.append((held_step, going))
                if staying is not None:
                    kept.append((held_step, staying))
            self.steps = kept
        self.streams = set(dangling)
        if rows is not None:
            staying, going = split_rows(rows, dangling)
            if going is not None:
                out.append((step, going))
            if staying is not None:
                self.steps.append((step, staying))
        while len(self.steps) > MAX_HELD_STEPS:
            out.append(self.steps.pop(0))
        return out

    def release(self) -> list[tuple[int, TextRows]]:
        """Everything held, in order (the run ends)."""
        out, self.steps, self.streams = self.steps, [], set()
        return out

    def set_give(self, stream: int, offset: int, give: int) -> bool:
        """Write the give count of `stream`'s token at `offset` into the held record
        that holds it; False when no held step holds it (already sent)."""
        for _step, rows in reversed(self.steps):
            meta, texts = rows[0], rows[2]
            first_fragment = 0
            for record in range(len(texts)):
                at = ROW_WIDTH * record
                start, count, fed = meta[at + 3], meta[at + 4], meta[at + 5]
                if meta[at] == stream and start <= offset < start + count:
                    leads = rows[5].get(record)
                    if leads is None:
                        leads = rows[5][record] = record_leads(rows, record, first_fragment)
                    leads[offset - start] = give
                    return True
                first_fragment += fed
        return False


def split_rows(rows: TextRows, streams: set[int]) -> tuple[TextRows | None, TextRows | None]:
    """A text step's records of `streams` and the others, each in order (None: none)."""
    meta, ids, texts, fragments, span_backs, leads = rows
    parts: tuple[TextRows, TextRows] = (([], [], [], [], {}, {}), ([], [], [], [], {}, {}))
    first_id = first_fragment = 0
    for record, text in enumerate(texts):
        at = ROW_WIDTH * record
        row = meta[at : at + ROW_WIDTH]
        count, fed = row[4], row[5]
        part = parts[0] if row[0] in streams else parts[1]
        index = len(part[2])
        part[0].extend(row)
        part[1].extend(ids[first_id : first_id + count])
        part[2].append(text)
        part[3].extend(fragments[first_fragment : first_fragment + fed])
        if record in span_backs:
            part[4][index] = span_backs[record]
        if record in leads:
            part[5][index] = leads[record]
        first_id += count
        first_fragment += fed
    inside, outside = parts
    return (inside if inside[2] else None), (outside if outside[2] else None)


def record_leads(rows: TextRows, record: int, first_fragment: int) -> list[int]:
    """A record's lead_len column before anything is known: 0 for a fragment
    without span_back (nothing to split), LEAD_UNKNOWN otherwise."""
    meta, fragments, span_backs = rows[0], rows[3], rows[4]
    at = ROW_WIDTH * record
    count, fed = meta[at + 4], meta[at + 5]
    backs = span_backs.get(record)
    return [
        0
        if position < fed
        and fragments[first_fragment + position]
        and not (backs is not None and backs[position])
        else LEAD_UNKNOWN
        for position in range(count)
    ]
