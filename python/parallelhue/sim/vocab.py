"""The simulated engine's byte-level vocabulary and its precomputed token cycle.

Tokens are byte strings cut from a built-in multilingual text at arbitrary
byte positions, so multi-byte characters (CJK, emoji, accented Latin,
combining marks) are split across tokens, and therefore across engine steps.
Every stream walks one fixed cycle of tokens from a start position that lies
on a character boundary; everything a token needs per step (its id, its
bytes, what an incremental detokenizer returns for it) is computed once here,
so the engine's per-token work is a few list lookups.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["CORPUS", "Vocabulary", "build_vocabulary"]

# Original text written for this simulator. Mixed scripts on purpose: 1-, 2-,
# 3- and 4-byte UTF-8 characters, emoji ZWJ sequences and combining marks.
CORPUS = (
    "The scheduler takes every waiting request, drafts a few tokens for each and "
    "asks the target model to check them all in one pass. Accepted drafts cost "
    "almost nothing; a rejected draft is replaced by the target's own choice. "
    "投機的デコーディングでは、小さなモデルが先に数トークンを書き、大きなモデルが"
    "まとめて検証します。受理されたトークンはそのまま残り、最初に外れた位置で"
    "本物のトークンに置き換えられます。"
    "推测解码让一个小模型先起草几个词元，再由目标模型一次性验证。"  # noqa: RUF001
    "被接受的草稿几乎不花时间，被拒绝的位置由目标模型给出修正。"  # noqa: RUF001
    "Café crème, naïve façade, Ångström, Smørrebrød, Dvořák, São Paulo, "
    "Đà Nẵng, Tiếng Việt có dấu, Größe, Straße, jalapeño. "
    "Combining marks: e\u0301 a\u0300 o\u0308 n\u0303 u\u0302 i\u0328. "
    "Emoji 🚀✨🎉 and families 👩\u200d💻 👨\u200d👩\u200d👧 flags 🇯🇵🇫🇷 "
    "skin tones 👍🏽 and hearts ❤\ufe0f 💚💙💛. "
    "한국어도 조금: 빠른 토큰, 느린 토큰. Ελληνικά: γρήγορα βήματα. "
    "Русский текст: шаги движка и черновики. हिन्दी: मसौदा टोकन। "
    "عربي: رموز مقبولة. "
    "When every draft of a step is accepted the target adds one bonus token for "
    "free, so a step can emit up to K plus one tokens. Some steps have no drafts "
    "at all: the first step after prefill, or when the n-gram lookup finds no "
    "match in the context. 数字も混ざる：一二三、四五六、七八九。"  # noqa: RUF001
    "Bytes split across tokens must still decode into whole characters, 文字化けなし. "
)

# Ids below this are reserved for special tokens, as real tokenizers do.
_FIRST_BYTE_ID = 3
_SEGMENT_SEED = 20261129
_MAX_TOKEN_BYTES = 6
_PASSES = 3
_WORD_ENDS = frozenset((b" ", b"\n", b"\x82"))  # 0x82 ends "。" (and a few other characters)
_WORD_STARTS = frozenset((b"\xe6", b"\xe7"))  # the lead byte of many CJK ideographs


@dataclass(frozen=True, slots=True)
class Vocabulary:
    """Token table plus the precomputed cycle every stream walks.

    `cycle_*[p]` describe the token at cycle position p: its id, its bytes,
    the bytes an incremental detokenizer returns when fed that token (empty
    when the token ends inside a character), that fragment as str,
    `span_back`, the number of immediately preceding tokens whose bytes the
    fragment also holds, and `lead_len`, how many of the fragment's first
    bytes are theirs (for a token with an empty fragment: its give count, how
    many bytes it hands to that later fragment). `starts` lists positions that
    begin a character.
    """

    token_bytes: tuple[bytes, ...]
    cycle_ids: tuple[int, ...]
    cycle_fragments: tuple[bytes, ...]
    cycle_texts: tuple[str, ...]
    cycle_span_back: tuple[int, ...]
    cycle_lead_len: tuple[int, ...]
    starts: tuple[int, ...]

    @property
    def cycle_len(self) -> int:
        return len(self.cycle_ids)

    def encode_bytes(self, data: bytes) -> list[int]:
        """Prompt tokenization: one single-byte token per byte (byte-level fallback)."""
        return [_FIRST_BYTE_ID + byte for byte in data]

    def decode(self, token_ids: list[int]) -> bytes:
        """The raw bytes of a token id sequence."""
        return b"".join(self.token_bytes[token_id] for token_id in token_ids)


def _segment(data: bytes, rng: random.Random) -> list[bytes]:
    pieces: list[bytes] = []
    position = 0
    while position < len(data):
        length = rng.randint(1, _MAX_TOKEN_BYTES)
        pieces.append(data[position : position + length])
        position += length
    return pieces


def _complete_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def build_vocabulary(corpus: str = CORPUS) -> Vocabulary:
    """Cut the corpus into byte tokens and precompute the detokenizer's output per token."""
    data = corpus.encode("utf-8")
    # The cycle is the corpus several times over, each cut differently, so the
    # same text comes back with other token boundaries.
    rng = random.Random(_SEGMENT_SEED)
    pieces: list[bytes] = []
    for _ in range(_PASSES):
        pieces.extend(_segment(data, rng))
    token_bytes: list[bytes] = [b"<s>", b"</s>", b"<pad>"]
    token_bytes.extend(bytes((value,)) for value in range(256))
    # Special tokens are never produced from content bytes, so they are not in this map.
    ids = {bytes((value,)): _FIRST_BYTE_ID + value for value in range(256)}
    cycle_ids: list[int] = []
    for piece in pieces:
        token_id = ids.get(piece)
        if token_id is None:
            token_id = len(token_bytes)
            token_bytes.append(piece)
            ids[piece] = token_id
        cycle_ids.append(token_id)

    # Incremental detokenization the way vLLM's does it: bytes are held back
    # until they end on a character boundary, then returned all at once by the
    # token that completed them.
    fragments: list[bytes] = []
    span_back: list[int] = []
    lead_len: list[int] = []
    starts: list[int] = []
    pending = b""
    pending_tokens = 0
    previous = b" "
    for position, piece in enumerate(pieces):
        # Streams start on a character boundary that also begins a word or sentence.
        if not pending and (previous in _WORD_ENDS or piece[:1] in _WORD_STARTS):
            starts.append(position)
        lead = len(pending)
        pending += piece
        previous = piece[-1:]
        if _complete_utf8(pending):
            fragments.append(pending)
            span_back.append(pending_tokens)
            lead_len.append(lead)
            pending = b""
            pending_tokens = 0
        else:
            fragments.append(b"")
            span_back.append(0)
            # An empty fragment's lead_len is its give count (protocol 3): all of its
            # bytes go into the fragment of the token that completes the character.
            lead_len.append(len(piece))
            pending_tokens += 1
    if pending:  # pragma: no cover - the corpus is valid UTF-8 and ends on a boundary
        raise AssertionError("corpus must end on a character boundary")
    return Vocabulary(
        token_bytes=tuple(token_bytes),
        cycle_ids=tuple(cycle_ids),
        cycle_fragments=tuple(fragments),
        cycle_texts=tuple(fragment.decode("utf-8") for fragment in fragments),
        cycle_span_back=tuple(span_back),
        cycle_lead_len=tuple(lead_len),
        starts=tuple(starts),
    )
