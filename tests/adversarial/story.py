"""The honest bases: consistent provenance, text frames and SSE for a few streams.

Each base is a small, fixed story per stream (token ids with their bytes and
roles, step by step) played the way vLLM would report it: the scheduler's
provenance per engine step, the frontend's detokenizer fragments and HTTP
deltas (incremental UTF-8 decoding: a token that ends inside a character gets
an empty fragment and the next fragment claims it with `span_back`; stop
strings hold back text and cut it), and one SSE chunk per step (or merged
chunks where the HTTP writer lagged). Every base must be EXACT in both
reconcilers; the cases lie on top of them.

The stories cover: speculative steps with accepted drafts, target corrections
and bonus tokens; multi-byte characters split over two and three tokens and
over a step boundary (a mixed span); a fragment whose first character is all
from an earlier token of another step (`日` in `日本`, what C1's `lead_len`
attributes); a stream skipping an engine step; an EOS accepted as a draft
(trimmed, finish stop); max_tokens cutting a step (trimmed, finish length); a
stop string (text_truncated, tokens_trimmed, a surplus scheduler step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import parallelhue_vllm
from parallelhue_vllm import wire

from .transcript import End, Frame, Sse, Transcript

__all__ = ["BASES", "MODEL", "PROMPT_IDS", "SOURCES", "VOCAB", "build", "chunk_id"]

MODEL = "liar-1"
CREATED = 1_700_000_000
PROMPT_IDS = [31, 32, 33, 34]
# EOS is token 1, so that JSON `true` in token_ids reads as it in Python (bool is int).
EOS = 1
SOURCES = {
    "sched": 0x5C4E_D000_0000_0001,
    "front": 0xF00D_0000_0000_0001,
    "front2": 0xF00D_0000_0000_0002,
}
_ROLE_CODES = {
    "P": wire.ROLE_PLAIN,
    "A": wire.ROLE_ACCEPTED,
    "T": wire.ROLE_TARGET,
    "B": wire.ROLE_BONUS,
}
_FINISH_NAMES = {wire.FINISH_STOP: "stop", wire.FINISH_LENGTH: "length"}

# Token id -> the bytes the tokenizer gives it. EOS decodes to nothing (a skipped
# special token).
VOCAB: dict[int, bytes] = {
    EOS: b"",
    100: b"The",
    101: b" caf",
    102: b" is",
    103: b" and",
    104: b" ok",
    105: b".",
    106: b" Bye",
    107: b"A",
    108: b" quick",
    109: b" brown",
    110: b" fox",
    111: b" jumps",
    112: b" over",
    113: b" the",
    114: b" dog",
    115: b" end",
    116: b"##",
    117: b" tail",
    118: b" more",
    201: b"\xc3",  # é = c3 a9, over two tokens
    202: b"\xa9",
    220: b"\xe6\x97\xa5\xe6",  # 日 and the first byte of 本
    221: b"\x9c\xac",  # the rest of 本
    230: b"\xf0\x9f",  # 🙂 = f0 9f 99 82, over three tokens
    231: b"\x99",
    232: b"\x82",
}


@dataclass(frozen=True)
class Step:
    """One stream's share of one engine step, as the scheduler saw it."""

    engine_step: int
    ids: tuple[int, ...]
    roles: str  # P, or accepted drafts A* then T/B (nothing when trimmed)
    finish: int = wire.FINISH_NONE
    trimmed: bool = False


@dataclass(frozen=True)
class Story:
    steps: tuple[Step, ...]
    stop: str = ""  # a stop string: the frontend ends the text before it
    # Steps the scheduler still runs after the frontend stopped on the stop string.
    surplus: tuple[Step, ...] = ()


@dataclass(frozen=True)
class Base:
    """One honest run: its stories and how the server reports them."""

    name: str
    stories: tuple[Story, ...]
    chat: bool = True
    draft_len: int = 3  # K; 0 = no speculative decoding
    # (stream, engine step): that step's SSE chunk is held and merged into the next one
    merged: frozenset[tuple[int, int]] = frozenset()
    # Streams whose text comes from a second frontend (an API-server scale-out).
    second_frontend: frozenset[int] = frozenset()
    # Send the frames of these engine steps after those of the next step (seq unchanged).
    reordered_steps: tuple[int, ...] = ()
    # Send an identical copy of the text frame of this engine step right after it.
    duplicate_text_step: int | None = None
    description: str = ""


def _story_eos() -> Story:
    """é split over two tokens, 日本 over a step boundary, 🙂 over three tokens, EOS."""
    return Story(
        (
            Step(1, (100,), "P"),
            Step(2, (101, 201, 202), "AAT"),
            Step(3, (102, 220), "AT"),
            Step(4, (221, 103, 230, 231), "AAAB"),
            Step(5, (232, 104, 105), "AAT"),
            Step(6, (106, EOS), "AA", wire.FINISH_STOP, trimmed=True),
        )
    )


def _story_length(trimmed: bool = True) -> Story:
    """Skips engine step 2 (not scheduled); max_tokens cuts (or exactly fits) the last step."""
    last = (
        Step(5, (113, 114, 105), "AAA", wire.FINISH_LENGTH, trimmed=True)
        if trimmed
        else Step(5, (113, 114, 105), "AAT", wire.FINISH_LENGTH)
    )
    return Story(
        (
            Step(1, (107,), "P"),
            Step(3, (108, 109, 110), "AAT"),
            Step(4, (111, 112), "AT"),
            last,
        )
    )


def _story_stop() -> Story:
    """Ends on the stop string `##`: the token after it is trimmed, one surplus step."""
    return Story(
        (
            Step(1, (100,), "P"),
            Step(2, (101, 201, 202), "AAT"),
            Step(3, (115, 116, 117), "AAT"),
        ),
        stop="##",
        surplus=(Step(4, (118, 105), "AT"),),
    )


def _story_plain_eos() -> Story:
    return Story(
        (
            Step(1, (100,), "P"),
            Step(2, (101,), "P"),
            Step(3, (201,), "P"),
            Step(4, (202,), "P"),
            Step(5, (EOS,), "P", wire.FINISH_STOP),
        )
    )


def _story_plain_length() -> Story:
    return Story(
        (
            Step(1, (107,), "P"),
            Step(3, (108,), "P"),
            Step(4, (109,), "P", wire.FINISH_LENGTH),
        )
    )


BASES: dict[str, Base] = {
    base.name: base
    for base in (
        Base(
            "chat",
            (_story_eos(), _story_length()),
            description="chat, K=3: split characters, a mixed span, EOS as a draft, max_tokens",
        ),
        Base(
            "completions",
            (_story_eos(), _story_length()),
            chat=False,
            description="the same stories on /v1/completions (`text`)",
        ),
        Base(
            "stop_string",
            (_story_stop(), _story_length()),
            description="a stop string: held-back text, text_truncated, tokens_trimmed, surplus",
        ),
        Base(
            "max_tokens",
            (_story_length(trimmed=True), _story_length(trimmed=False)),
            description="both streams end on max_tokens: one cut inside a step, one exact fit",
        ),
        Base(
            "no_spec",
            (_story_plain_eos(), _story_plain_length()),
            draft_len=0,
            description="no speculative decoding: K=0, one plain token per step",
        ),
        Base(
            "merged_sse",
            (_story_eos(), _story_length()),
            merged=frozenset({(0, 2), (0, 4), (1, 3)}),
            description="the HTTP writer lagged: some SSE chunks carry two steps",
        ),
        Base(
            "reordered",
            (_story_eos(), _story_length()),
            reordered_steps=(2, 4),
            duplicate_text_step=3,
            description="datagrams arrive out of order (within the window) and one twice",
        ),
        Base(
            "two_frontends",
            (_story_eos(), _story_length()),
            second_frontend=frozenset({1}),
            description="stream 1's text comes from a second API-server process",
        ),
    )
}


def chunk_id(run_id: str, stream: int, chat: bool) -> str:
    """The SSE chunk id vLLM gives a request: its prefix and the client's request id."""
    return ("chatcmpl-" if chat else "cmpl-") + wire.request_id(run_id, stream)


class _Frontend:
    """vLLM's incremental detokenizer and output processor for one stream."""

    def __init__(self, story: Story) -> None:
        self.stop = story.stop
        self.pending = b""  # bytes of tokens that end inside a character
        self.pending_tokens = 0
        self.output = ""  # the text so far (before stop-string cutting)
        self.sent = 0  # characters handed to HTTP
        self.offset = 0
        self.finished = False

    def feed(self, step: Step) -> tuple[wire.TextRecord, list[int]]:
        tokens: list[wire.TextToken] = []
        kept_ids: list[int] = []
        finish = step.finish
        truncated = False
        cut_at: int | None = None
        for token_id in step.ids:
            kept_ids.append(token_id)
            raw = VOCAB[token_id]
            if not raw:  # a skipped special token: gives nothing (give count 0)
                tokens.append(wire.TextToken(token_id, b"", 0, 0))
                continue
            lead = len(self.pending)  # bytes from the pending predecessors (C1's lead_len)
            self.pending += raw
            try:
                text = self.pending.decode("utf-8")
            except UnicodeDecodeError:
                self.pending_tokens += 1
                # Its give count (protocol 3): its bytes go to the fragment that completes them.
                tokens.append(wire.TextToken(token_id, b"", 0, len(raw)))
                continue
            tokens.append(wire.TextToken(token_id, self.pending, self.pending_tokens, lead))
            self.pending, self.pending_tokens = b"", 0
            self.output += text
            if self.stop and self.stop in self.output:
                cut_at = self.output.index(self.stop)
                break
        if cut_at is not None:
            finish = wire.FINISH_STOP
            truncated = True
            self.output = self.output[:cut_at]
        done = finish != wire.FINISH_NONE
        hold = 0 if done or not self.stop else len(self.stop) - 1
        upto = max(len(self.output) - hold, self.sent)
        delta = self.output[self.sent : upto]
        self.sent = upto
        trimmed_tokens = len(step.ids) - len(kept_ids)
        record = wire.TextRecord(
            stream=-1,  # set by the caller
            offset=self.offset,
            tokens=tokens,
            http_delta=delta.encode(),
            finished=done,
            finish_reason=finish,
            text_truncated=truncated,
            tokens_trimmed=trimmed_tokens > 0,
            trimmed_tokens=trimmed_tokens,
        )
        self.offset += len(kept_ids)
        self.finished = done
        return record, kept_ids


def _provenance(stream: int, offset: int, step: Step, draft_len: int) -> wire.ProvenanceRecord:
    roles = [_ROLE_CODES[letter] for letter in step.roles]
    return wire.ProvenanceRecord(
        stream=stream,
        offset=offset,
        token_ids=list(step.ids),
        roles=roles,
        drafts_scheduled=0 if step.roles == "P" else draft_len,
        drafts_padded=0,
        finished=step.finish != wire.FINISH_NONE,
        finish_reason=step.finish,
        trimmed=step.trimmed,
    )


def _hello(base: Base, role: int) -> wire.Hello:
    # Only the scheduler announces speculative decoding (protocol 2).
    speculative = base.draft_len > 0 and role == wire.SOURCE_SCHEDULER
    return wire.Hello(
        role=role,
        engine=wire.ENGINE_VLLM,
        role_derivation=wire.DERIVATION_DRAFT_IDS if speculative else wire.DERIVATION_NONE,
        async_scheduling=False,
        num_speculative_tokens=base.draft_len if speculative else 0,
        plugin_version=parallelhue_vllm.__version__,
        engine_version="0.32.0+cpu",
        spec_method="ngram" if speculative else "",
        verification=wire.VERIFICATION_STANDARD if speculative else wire.VERIFICATION_NONE,
    )


def _chunk(
    base: Base, run_id: str, stream: int, text: str, ids: list[int], finish: str | None
) -> dict[str, object]:
    choice: dict[str, object] = {"index": 0}
    if base.chat:
        choice["delta"] = {"content": text}
    else:
        choice["text"] = text
    choice.update({"logprobs": None, "finish_reason": finish, "token_ids": ids})
    return {
        "id": chunk_id(run_id, stream, base.chat),
        "object": "chat.completion.chunk" if base.chat else "text_completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [choice],
    }


def build(name: str, run_id: str) -> Transcript:
    """The honest transcript of base `name` for run `run_id`."""
    base = BASES[name]
    streams = len(base.stories)
    sources = {"sched": SOURCES["sched"], "front": SOURCES["front"]}
    if base.second_frontend:
        sources["front2"] = SOURCES["front2"]
    transcript = Transcript(streams=streams, chat=base.chat, sources=sources)
    actions = transcript.actions
    seqs = dict.fromkeys(sources, 0)

    def frame(source: str, kind: int, step: int, **kwargs: object) -> Frame:
        made = Frame(
            source=source,
            kind=kind,
            seq=seqs[source],
            step=step,
            timestamp_ns=1_000_000_000_000 + step * 20_000_000 + seqs[source] * 1000,
            **kwargs,  # type: ignore[arg-type]
        )
        seqs[source] += 1
        return made

    actions.append(frame("sched", wire.KIND_HELLO, 0, hello=_hello(base, wire.SOURCE_SCHEDULER)))
    for source in sources:
        if source != "sched":
            hello = _hello(base, wire.SOURCE_FRONTEND)
            actions.append(frame(source, wire.KIND_HELLO, 0, hello=hello))
    frontends = [_Frontend(story) for story in base.stories]
    offsets = [0] * streams
    held: dict[int, tuple[str, list[int]]] = {}  # stream -> merged SSE not yet sent
    for stream in range(streams):
        if base.chat:
            role_chunk: dict[str, object] = {
                "id": chunk_id(run_id, stream, True),
                "object": "chat.completion.chunk",
                "created": CREATED,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                ],
                "prompt_token_ids": PROMPT_IDS,
            }
            actions.append(Sse(stream, role_chunk))
    last_step = max(s.engine_step for story in base.stories for s in (*story.steps, *story.surplus))
    completion_tokens = [0] * streams
    deferred: list[Frame] = []
    for engine_step in range(1, last_step + 1):
        provenance: list[wire.Record] = []
        texts: dict[str, list[wire.Record]] = {}
        chunks: list[Sse] = []
        for stream, story in enumerate(base.stories):
            for step in (*story.steps, *story.surplus):
                if step.engine_step != engine_step:
                    continue
                provenance.append(_provenance(stream, offsets[stream], step, base.draft_len))
                offsets[stream] += len(step.ids)
                frontend = frontends[stream]
                if frontend.finished:
                    continue  # a surplus step: the frontend already ended the request
                record, kept = frontend.feed(step)
                record.stream = stream
                source = "front2" if stream in base.second_frontend else "front"
                texts.setdefault(source, []).append(record)
                text, ids = held.pop(stream, ("", []))
                text += record.http_delta.decode()
                ids = ids + kept
                if (stream, engine_step) in base.merged and not record.finished:
                    held[stream] = (text, ids)
                    continue
                completion_tokens[stream] += len(ids)
                finish = _FINISH_NAMES.get(record.finish_reason) if record.finished else None
                chunk = _chunk(base, run_id, stream, text, ids, finish)
                chunks.append(Sse(stream, chunk, step=engine_step))
        step_frames: list[Frame] = []
        if provenance:
            step_frames.append(
                frame("sched", wire.KIND_PROVENANCE, engine_step, records=provenance)
            )
        for source, records in texts.items():
            step_frames.append(frame(source, wire.KIND_TEXT, engine_step, records=records))
            if engine_step == base.duplicate_text_step:
                copy = step_frames[-1]
                step_frames.append(
                    Frame(
                        copy.source,
                        copy.kind,
                        copy.seq,
                        copy.step,
                        copy.timestamp_ns,
                        records=copy.records,
                    )
                )
        if engine_step in base.reordered_steps:
            deferred = step_frames
        else:
            actions.extend(step_frames)
            actions.extend(deferred)
            deferred = []
        for chunk in chunks:
            actions.append(chunk)
            if chunk.choice["finish_reason"] is not None:
                actions.extend(_ending(run_id, base, chunk.stream, completion_tokens[chunk.stream]))
    return transcript


def _ending(run_id: str, base: Base, stream: int, completion_tokens: int) -> list[Sse | End]:
    prompt_tokens = len(PROMPT_IDS)
    usage_chunk = {
        "id": chunk_id(run_id, stream, base.chat),
        "object": "chat.completion.chunk" if base.chat else "text_completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        },
    }
    return [Sse(stream, usage_chunk), Sse(stream, "[DONE]"), End(stream)]


Mutation = Callable[[Transcript], None]
