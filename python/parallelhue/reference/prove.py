"""Proving bytes and emitting spans (the Rust core's `reconcile/prove.rs`)."""

from __future__ import annotations

from parallelhue.reference.state import (
    TOKEN_ROLE_NAMES,
    ReconcilerState,
    _add_lists,
    _Fragment,
    _Piece,
    _Stream,
)
from parallelhue_vllm.wire import LEAD_UNKNOWN, ROLE_ACCEPTED


class ProveRules(ReconcilerState):
    """Settles confirmed provenance steps, proves bytes and emits the span events."""

    def _progress(self, state: _Stream) -> None:
        """After any new evidence: settle records, prove fragments, maybe declare exact."""
        self._settle(state)
        if state.verdict != "pending":
            return  # an exact stream: only late surplus records settle
        self._prove(state)
        self._chunk_rule(state)
        if self._is_exact(state):
            state.verdict = "exact"
            self._events.append(("exact", state.index))

    def _settle(self, state: _Stream) -> None:
        confirmed_end = state.confirmed_end
        surplus_from = state.surplus_from
        while state.settled_steps < len(state.p_steps):
            step = state.p_steps[state.settled_steps]
            end = step.offset + len(step.roles)
            boundary = end if surplus_from is None else min(end, surplus_from)
            if confirmed_end < boundary:
                return  # some token is neither confirmed nor surplus yet
            stats = state.stats
            confirmed = 0
            for position, role in enumerate(step.roles):
                name = TOKEN_ROLE_NAMES[role]
                if step.offset + position < confirmed_end:
                    confirmed += 1
                    stats[name] += 1
                else:
                    stats["surplus_tokens"] += 1
                    stats[f"surplus_{name}"] += 1
            stats["tokens"] += confirmed
            if confirmed:
                stats["steps"] += 1
            stats["hist"][confirmed] = stats["hist"].get(confirmed, 0) + 1
            stats["drafts_scheduled"] += step.drafts_scheduled
            stats["drafts_padded"] += step.drafts_padded
            drafts = step.drafts_scheduled - step.drafts_padded
            accepted = sum(
                1
                for position, role in enumerate(step.roles)
                if role == ROLE_ACCEPTED and step.offset + position < confirmed_end
            )
            _add_lists(stats["drafts_by_pos"], [1] * drafts)
            _add_lists(stats["accepted_by_pos"], [1] * accepted + [0] * (drafts - accepted))
            state.settled_steps += 1

    def _prove(self, state: _Stream) -> None:
        confirmed_end = state.confirmed_end
        http, sse, fragment_bytes = state.http_bytes, state.sse_bytes, state.fragment_bytes
        http_final = state.t_finished and state.t_truncated  # H ends inside the fragments
        while state.proven_fragments < len(state.fragments):
            fragment = state.fragments[state.proven_fragments]
            if confirmed_end <= fragment.offset:
                return  # its tokens (the carrier and its span_back predecessors) not confirmed
            if http_final and fragment.start >= len(http):
                state.proven_fragments += 1  # cut by the stop string: not output
                continue
            end = min(fragment.end, len(http)) if http_final else fragment.end
            if len(http) < end or len(sse) < end:
                return
            for position in range(fragment.start, end):
                if fragment_bytes[position] != http[position]:
                    raise self._fail(
                        state,
                        f"byte mismatch at offset {fragment.offset} (byte {position}): "
                        "detokenizer fragment vs HTTP delta",
                    )
            for position in range(fragment.start, end):
                if http[position] != sse[position]:
                    raise self._fail(
                        state,
                        f"byte mismatch at offset {fragment.offset} (byte {position}): "
                        "HTTP delta vs SSE",
                    )
            state.proven_fragments += 1
            state.proven_bytes = end
            for piece in self._pieces(state, fragment, end - fragment.start):
                self._emit_span(state, fragment.start, piece)

    def _chunk_rule(self, state: _Stream) -> None:
        """Each SSE chunk carries whole steps: it ends where a text record ends (several
        records when the HTTP writer merged steps). A chunk is held against the first
        text record that ends at or after it once that record's tokens are confirmed and
        its bytes proven, so a token or byte mismatch inside it is reported first."""
        confirmed_end = state.confirmed_end
        while state.q_ends:
            q, b = state.q_ends[0]
            while state.t_ends and state.t_ends[0] < (q, b):
                state.t_ends.popleft()
            if not state.t_ends:
                return
            t, h = state.t_ends[0]
            if t > confirmed_end or h > state.proven_bytes:
                return
            if (t, h) != (q, b):
                raise self._fail(
                    state,
                    f"stream {state.index}: an SSE chunk ends at offset {q} (byte {b}), "
                    "inside a text record",
                )
            state.t_ends.popleft()
            state.q_ends.popleft()

    @staticmethod
    def _shared(values: list[int]) -> int | None:
        """The value every element has, else None."""
        return values[0] if values and len(set(values)) == 1 else None

    def _pieces(self, state: _Stream, fragment: _Fragment, available: int) -> list[_Piece]:
        """A proven fragment's characters in runs attributed alike ("Spans"). The
        fragment's bytes are owned by units (token ranges): with every give count
        known, each predecessor its gives and the carrier the rest; with only
        lead_len known, the predecessors together the first lead_len bytes and the
        carrier the rest; else all its tokens the whole fragment. A character's
        tokens are those of the units overlapping it, first to last. Only the first
        `available` bytes are output. Every character's tokens start at the
        fragment's reach (an unclaimed token of unknown give may have given any of
        them)."""
        carrier, first = fragment.offset, fragment.offset - fragment.span_back
        size = fragment.end - fragment.start
        # (first token, token count, byte start, byte end) per unit, in order.
        units: list[tuple[int, int, int, int]]
        if fragment.span_back == 0 or fragment.lead_len == LEAD_UNKNOWN:
            units = [(first, fragment.span_back + 1, 0, size)]
        elif fragment.gives is not None:
            units, at = [], 0
            for index, give in enumerate(fragment.gives):
                units.append((first + index, 1, at, at + give))
                at += give
            units.append((carrier, 1, at, size))
        else:
            lead = fragment.lead_len
            units = [(first, fragment.span_back, 0, lead), (carrier, 1, lead, size)]
        data = state.fragment_bytes[fragment.start : fragment.end]
        pieces: list[_Piece] = []
        position = 0
        while position < available:
            end = position + 1  # the end of this character
            while end < size and data[end] & 0xC0 == 0x80:
                end += 1
            # A unit overlaps [position, end) (an empty unit: lies strictly inside it).
            owners = [u for u in units if u[2] < end and u[3] > position]
            low = fragment.reach if fragment.reach < first else owners[0][0]
            high = owners[-1][0] + owners[-1][1]
            end = min(end, available)
            last = pieces[-1] if pieces else None
            if last is not None and (last.first, last.count) == (low, high - low):
                last.end = end
            else:
                group = range(low, high)
                step = self._shared([state.p_ordinals[o] for o in group])
                role = self._shared([state.p_roles[o] for o in group])
                pieces.append(_Piece(position, end, step, role, low, high - low))
            position = end
        return pieces

    def _emit_span(self, state: _Stream, fragment_start: int, piece: _Piece) -> None:
        start = fragment_start + piece.start
        text = bytes(state.fragment_bytes[start : fragment_start + piece.end]).decode("utf-8")
        state.stats["bytes"] += piece.end - piece.start
        if piece.step is None:
            state.stats["mixed_spans"] += 1
        previous = self._events[-1] if len(self._events) > self._input_start else None
        if (
            piece.step is not None
            and previous is not None
            and previous[0] == "span"
            and previous[1] == state.index
            and previous[4] == piece.step
            and previous[7] == piece.role
            and previous[2] + len(previous[3].encode("utf-8")) == start
        ):
            # The same step and role, contiguous, proven by the same input: one span.
            merged_first = previous[5]
            self._events[-1] = (
                "span",
                state.index,
                previous[2],
                previous[3] + text,
                piece.step,
                merged_first,
                piece.first + piece.count - merged_first,
                piece.role,
            )
            return
        self._events.append(
            ("span", state.index, start, text, piece.step, piece.first, piece.count, piece.role)
        )

    def _is_exact(self, state: _Stream) -> bool:
        text_end = len(state.t_ids)
        # Not vacuously, and with the request's end proven: the scheduler's finish, or
        # a stop string's trimmed tokens checked against the scheduler's step.
        end_proven = state.trim_checked if state.t_stop_string else state.p_finished is not None
        metrics_proven = state.metrics_checked or not self._has_metrics(state)
        return (
            state.sse_finished
            and state.t_finished
            and text_end > 0
            and end_proven
            and metrics_proven
            and len(state.q_ids) == text_end
            and len(state.p_ids) >= text_end
            and len(state.sse_bytes) == len(state.http_bytes)
            and state.proven_bytes >= len(state.sse_bytes)
            and not state.q_ends
            and state.settled_steps == len(state.p_steps)
        )
