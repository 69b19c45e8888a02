"""`lead_len` for a text token: how many leading bytes of its fragment its predecessors gave.

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
byte for byte. Anything else — another decoder, an added or special token,
a replacement character made of bytes from both sides, a first token whose
leading space the decoder stripped, a split that breaks the protocol's
`span_back <= lead_len <= frag_len` — gives `LEAD_UNKNOWN`: the reconciler
then attributes the whole fragment to the whole group, as before. Never a
guess.

Cost: nothing per token; the work runs only for a fragment with
`span_back > 0`, and each token's bytes are cached per tokenizer.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from .wire import LEAD_UNKNOWN

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
        if self.kind is not None:
            self.added = frozenset(tokenizer.get_added_tokens_decoder())
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


def _decode_byte_fallback(parts: Sequence[TokenPart], boundary_token: int) -> tuple[bytes, int]:
    """tokenizers' ByteFallback + Fuse: each run of `<0xNN>` tokens is its bytes when
    they are valid UTF-8 as a whole, else one U+FFFD per byte token; other tokens
    are their text. Returns the output and its length before token `boundary_token`."""
    out = bytearray()
    lead = 0
    index = 0
    while index < len(parts):
        if not parts[index][1]:
            if index == boundary_token:
                lead = len(out)
            out += parts[index][0]
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
        if index <= boundary_token < end:
            before = boundary_token - index  # byte tokens of the run before the carrier
            lead = len(out) + (before if valid else before * len(_REPLACEMENT))
        out += run if valid else _REPLACEMENT * (end - index)
        index = end
    return bytes(out), lead


def split_lead(kind: str | None, parts: Sequence[TokenPart], fragment: bytes) -> int:
    """`lead_len` of `fragment` given each of its tokens' own bytes, in order.

    `parts` = the span_back predecessors, then the carrier. LEAD_UNKNOWN unless
    decoding them as the tokenizer's decoder does gives exactly `fragment` and
    the split is unambiguous and within the protocol's bounds.
    """
    if len(parts) < 2 or any(not part[0] for part in parts[:-1]):
        return LEAD_UNKNOWN
    if kind == KIND_BYTE_LEVEL:
        raw = b"".join(part[0] for part in parts)
        decoded = lossy_utf8(raw, len(raw) - len(parts[-1][0]))
        if decoded is None:
            return LEAD_UNKNOWN
        out, lead = decoded
    elif kind == KIND_BYTE_FALLBACK:
        out, lead = _decode_byte_fallback(parts, len(parts) - 1)
    else:
        return LEAD_UNKNOWN
    if out != fragment or not len(parts) - 1 <= lead <= len(fragment):
        return LEAD_UNKNOWN
    return lead


def lead_len(detokenizer: Any, index: int, token_id: int, span_back: int, fragment: bytes) -> int:
    """`lead_len` for the token at output index `index` of a vLLM detokenizer.

    `index` is the token's position among the request's output tokens (the
    text record's offset plus its position in the record); the predecessors
    are the `span_back` tokens before it in `detokenizer.output_token_ids`.
    Never raises: anything unexpected is LEAD_UNKNOWN.
    """
    try:
        if span_back <= 0 or index < span_back:
            return LEAD_UNKNOWN
        tokenizer = getattr(detokenizer, "tokenizer", None)
        if tokenizer is None or not hasattr(tokenizer, "id_to_token"):
            return LEAD_UNKNOWN  # the slow (Python) detokenizer: no per-token bytes here
        ids = detokenizer.output_token_ids
        if index >= len(ids) or ids[index] != token_id:
            return LEAD_UNKNOWN
        table = for_tokenizer(tokenizer)
        if table.kind is None:
            return LEAD_UNKNOWN
        parts: list[TokenPart] = []
        for position in range(index - span_back, index + 1):
            part = table.get(ids[position])
            if part is None:
                return LEAD_UNKNOWN
            parts.append(part)
        return split_lead(table.kind, parts, fragment)
    except Exception:
        return LEAD_UNKNOWN
