"""Which tokens gave each character's bytes, from the tokenizer's own decoding (ground truth).

Runs with the vLLM venv's python (it needs `transformers`/`tokenizers` and,
for `detok`, vLLM's detokenizer); the tests call it as a subprocess with JSON
on stdin and read JSON from stdout:

    python tests/vllm/char_truth.py ranges < {"model": DIR, "streams":
        [{"ids": [...], "fragments": [[carrier index, text], ...]}, ...]}
    python tests/vllm/char_truth.py detok < {"model": DIR, "texts": [...],
        "random_sequences": N, "length": L, "seed": S}

`ranges`: for each character of each fragment, the first and last output-token
index whose bytes it holds, from window decodes only
(`tokenizer.decode(ids[a:b])`, skip_special_tokens as vLLM): never from
per-token bytes, span_back or lead_len. For a fragment ending at carrier c
and its character j, the first token is the largest a whose window
ids[a..c] still decodes to a text ending in the fragment's characters j..;
the last is the smallest b for which ids[a..b] decodes to the same text as
ids[a..c] up to and including character j. (A U+FFFD is given the shortest window that shows it;
the checks accept a U+FFFD attributed to more tokens, which is never wrong.)

`detok`: token sequences (each text encoded, plus N random ones of L token
ids, cut into steps of 1..4 tokens), vLLM's own FastIncrementalDetokenizer
fed step by step, the hooks' stream recorder recording the fragments (vLLM's
decode-stream resets included), span_back counted as the frontend hook counts
it, and `attribution.lead_and_gives` for every fragment with span_back > 0;
each known lead_len's split is checked against `ranges`, and where every give
count of a fragment is known, the characters they attribute to each token
range and their sum (= lead_len) too.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def fragment_ranges(
    decode: Any, ids: list[int], carrier: int, fragment: str
) -> list[tuple[int, int]]:
    """(first token, last token) of each character of the fragment that ends at `carrier`."""
    out = []
    low = 0
    for j in range(len(fragment)):
        tail = fragment[j:]
        first = None
        for a in range(carrier, low - 1, -1):
            if decode(ids[a : carrier + 1]).endswith(tail):
                first = a
                break
        if first is None:
            raise ValueError(f"no window of tokens ..{carrier} ends with {tail!r}")
        # Character j in the window's text, after what `first`'s earlier bytes decode to.
        window = decode(ids[first : carrier + 1])
        at = len(window) - len(tail)
        last = next(
            (
                b
                for b in range(first, carrier + 1)
                if decode(ids[first : b + 1])[: at + 1] == window[: at + 1]
            ),
            carrier,
        )
        out.append((first, last))
        low = first
    return out


def _tokenizer(model: str) -> tuple[Any, Any]:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(model)
    # A leading token that decodes to text of its own: a decoder's leading-space
    # Strip then applies to it, as vLLM's DecodeStream applies it to the prompt.
    anchor = hf.convert_tokens_to_ids("a")
    if not isinstance(anchor, int) or anchor == hf.unk_token_id:
        anchor = hf.encode("a", add_special_tokens=False)[-1]
    head = hf.decode([anchor], skip_special_tokens=True)

    def decode(ids: list[int]) -> str:
        text = hf.decode([anchor, *ids], skip_special_tokens=True)
        if not text.startswith(head):
            raise ValueError(f"decoding changed the anchor {head!r}: {text[:20]!r}")
        return str(text[len(head) :])

    return hf, decode


def ranges_main(request: dict[str, Any]) -> list[list[list[tuple[int, int]]]]:
    _, decode = _tokenizer(request["model"])
    return [
        [
            fragment_ranges(decode, stream["ids"], carrier, text)
            for carrier, text in stream["fragments"]
        ]
        for stream in request["streams"]
    ]


def pieces(fragment: str, lead: int) -> list[str]:
    """The protocol's split ("Spans"): 'p' predecessors only, 'b' both, 'c' carrier only."""
    raw = fragment.encode()
    bounds = [0]
    for char in fragment:
        bounds.append(bounds[-1] + len(char.encode()))
    out = []
    for start, end in itertools.pairwise(bounds):
        if end <= lead:
            out.append("p")
        elif start < lead < end:
            out.append("b")
        else:
            out.append("c")
    assert bounds[-1] == len(raw)
    return out


def install_recorder(hooks: Any, detok: Any, fragments: list[str]) -> Any:
    """Record each token's fragment as FrontendTelemetry._install does: a recorder in
    place of the decode stream (the C one when the hooks use it), else a per-instance
    decode_next. Returns the recorder, or None for the decode_next path."""
    if detok.spaces_between_special_tokens is True and detok.stream is not None:
        recorder = hooks.stream_recorder(detok, fragments)
        detok.stream = recorder
        return recorder
    hooks.standins._record_decode_next(detok, fragments)
    return None


def detok_main(request: dict[str, Any]) -> dict[str, Any]:
    sys.path.insert(0, str(REPO / "plugin"))
    from vllm.sampling_params import SamplingParams
    from vllm.v1.engine import detokenizer as vdetok

    from parallelhue_vllm import attribution, hooks, wire

    hf, decode = _tokenizer(request["model"])
    rng = random.Random(request["seed"])
    specials = set(hf.all_special_ids)
    vocab = [i for i in range(len(hf)) if i not in specials]

    def cut(ids: list[int]) -> list[list[int]]:
        steps, start = [], 0
        while start < len(ids):
            size = rng.randint(1, 4)
            steps.append(ids[start : start + size])
            start += size
        return steps

    prompt = hf.encode("Hello 世界", add_special_tokens=False)
    sequences = [
        {"prompt": prompt, "steps": cut(hf.encode(text, add_special_tokens=False))}
        for text in request["texts"]
    ]
    for _ in range(request["random_sequences"]):
        ids = [rng.choice(vocab) for _ in range(request["length"])]
        sequences.append({"prompt": prompt, "steps": cut(ids)})
    cls = vdetok.FastIncrementalDetokenizer
    counts = {
        "tokens": 0, "carriers": 0, "known": 0, "unknown": 0, "wrong": 0, "mismatch": 0,
        "resets": 0, "recovered": 0, "gives": 0, "gives_known": 0, "carriers_all_gives": 0,
        "gives_wrong": 0, "zero_gives": 0,
    }  # fmt: skip
    wrong: list[Any] = []
    for index, sequence in enumerate(sequences):
        params = SamplingParams(max_tokens=1024, skip_special_tokens=True)
        req = SimpleNamespace(
            request_id=f"check-{index}",
            prompt_token_ids=list(sequence["prompt"]),
            prompt_embeds=None,
            sampling_params=params,
        )
        detok = vdetok.IncrementalDetokenizer.from_new_request(hf, req)
        assert isinstance(detok, cls), type(detok)
        fragments: list[str] = []
        recorder = install_recorder(hooks, detok, fragments)
        pending = 0
        position = 0
        carriers: list[tuple[int, int, str, int]] = []  # token index, span_back, fragment, lead
        for step in sequence["steps"]:
            inner = recorder.stream if recorder is not None else None
            detok.update(list(step), False)
            if recorder is not None and recorder.stream is not inner:
                counts["recovered"] += 1  # the recorder did vLLM's stream reset itself
            if recorder is not None and detok.stream is not recorder:
                # vLLM replaced the decode stream (its "invalid prefix" recovery):
                # the hooks' recorder is gone, as it would be on a server.
                counts["resets"] += 1
                break
            assert len(fragments) == len(step), (len(fragments), step)
            for token_id, piece in zip(step, fragments, strict=True):
                if piece:
                    if pending:
                        raw = piece.encode()
                        lead, gives = attribution.lead_and_gives(
                            detok, position, token_id, pending, raw
                        )
                        carriers.append((position, pending, piece, lead, gives))
                    pending = 0
                else:
                    pending += 1
                position += 1
            fragments.clear()
        ids = [token_id for step in sequence["steps"] for token_id in step]
        counts["tokens"] += len(ids)
        for token_position, span_back, piece, lead, gives in carriers:
            counts["carriers"] += 1
            counts["gives"] += span_back
            if lead == wire.LEAD_UNKNOWN:
                counts["unknown"] += 1
                continue
            counts["known"] += 1
            try:
                ranges = fragment_ranges(decode, ids, token_position, piece)
            except ValueError:
                counts["mismatch"] += 1
                continue
            truth = [
                "p" if last < token_position else "b" if first < token_position else "c"
                for first, last in ranges
            ]
            if not all(
                said == true or (char == "\ufffd" and said == "b")
                for char, said, true in zip(piece, pieces(piece, lead), truth, strict=True)
            ):
                counts["wrong"] += 1
                wrong.append([index, token_position, span_back, piece, lead, truth])
            known = [give for give in gives if give != wire.LEAD_UNKNOWN]
            counts["gives_known"] += len(known)
            if len(known) == span_back:  # what the reconciler uses: all of them
                counts["carriers_all_gives"] += 1
                # After a decode-stream reset the predecessors gave nothing.
                counts["zero_gives"] += not any(gives)
                if sum(gives) != lead:
                    counts["gives_wrong"] += 1
                    wrong.append([index, token_position, "sum", piece, lead, gives])
                owned = give_owners(piece, token_position - span_back, gives)
                if not all(
                    said == tuple(true) or (char == "\ufffd" and covers(said, true))
                    for char, said, true in zip(piece, owned, ranges, strict=True)
                ):
                    counts["gives_wrong"] += 1
                    window = ids[token_position - span_back : token_position + 1]
                    wrong.append([index, token_position, piece, gives, ranges, window])
    return {"counts": counts, "wrong": wrong[:20]}


def covers(said: tuple[int, int], true: Any) -> bool:
    """A U+FFFD may be attributed to more tokens than the shortest window that shows
    it (it may stand for bytes of several): never wrong, only less precise."""
    return said[0] <= true[0] and true[1] <= said[1]


def give_owners(fragment: str, first: int, gives: list[int]) -> list[tuple[int, int]]:
    """(first, last) token of each character as the give counts attribute it: the
    predecessors own their gives' bytes in order, the carrier the rest; a
    character's tokens are those owning any of its bytes."""
    owner: list[int] = []
    for index, give in enumerate(gives):
        owner += [first + index] * give
    size = len(fragment.encode())
    owner += [first + len(gives)] * (size - len(owner))
    out, at = [], 0
    for char in fragment:
        width = len(char.encode())
        out.append((owner[at], owner[at + width - 1]))
        at += width
    return out


def main() -> int:
    mode = sys.argv[1] if len(sys.argv) == 2 else ""
    request = json.load(sys.stdin)
    if mode == "ranges":
        json.dump(ranges_main(request), sys.stdout)
    elif mode == "detok":
        json.dump(detok_main(request), sys.stdout)
    else:
        print("usage: char_truth.py ranges|detok < request.json", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
