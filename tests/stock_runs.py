"""Runs of the shipped client against live stock servers (vLLM without the
plugin, llama-server), for the server-reported tier's live tests; and the
check of server-reported colors against the plugin's EXACT spans."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Sequence
from typing import Any

from parallelhue.cli.config import parse_run
from parallelhue.headless import HeadlessView
from parallelhue.model.reported import judge
from parallelhue.model.state import StreamState
from parallelhue.session import Session, SessionResult
from parallelhue.sim.stock import lie_lists

__all__ = ["by_byte", "compare_with_exact", "lied_about", "run_client", "summarize"]


def run_client(
    endpoint: str,
    args: Sequence[str],
    socket_dir: str,
    *,
    extra_body: dict[str, Any] | None = None,
    during: Any = None,
) -> SessionResult:
    """One headless session (the real Session: the Rust path unless --reconciler
    python); `during`: an async callable run beside it (e.g. to stall the server)."""
    argv = ["--endpoint", endpoint, "--socket-dir", socket_dir, "--view", "plain",
            "--timeout", "600", "--model", "tiny", *args]  # fmt: skip
    config = parse_run(argv, env={}, stdout_tty=False)
    session = Session(config, HeadlessView, extra_body=extra_body, grace=5.0)

    async def go() -> SessionResult:
        if during is None:
            return await session.run()
        task = asyncio.create_task(during())
        try:
            return await session.run()
        finally:
            await task

    return asyncio.run(go())


def by_byte(records: Any, size: int) -> list[tuple[int | None, int | None]]:
    """(step, role) of each byte of a stream's text from packed span records."""
    out: list[tuple[int | None, int | None]] = [(None, None)] * size
    start = 0
    words = list(records)
    for i in range(0, len(words), 2):
        end, word = words[i], words[i + 1]
        step = None if word & 0xFFFFFFFF == 0xFFFFFFFF else word & 0xFFFFFFFF
        role = None if (word >> 32) & 0xFF == 0xFF else (word >> 32) & 0xFF
        for b in range(start, min(end, size)):
            out[b] = (step, role)
        start = end
    return out


def compare_with_exact(state: StreamState) -> tuple[int, int]:
    """Every byte the server-reported steps color has the step (and role) the
    plugin's EXACT spans prove for it; returns (colored bytes, bytes)."""
    assert state.verdict == "exact", (state.index, state.reason)
    assert state.reported is not None and state.reported.fits, (state.index, state.reported)
    assert state.reported_records is not None
    size = len(state.sse_utf8)
    exact = by_byte(state.span_records, size)
    reported = by_byte(state.reported_records, size)
    colored = 0
    for b, ((step, role), (true_step, true_role)) in enumerate(zip(reported, exact, strict=True)):
        if step is not None:
            colored += 1
            assert step == true_step, (state.index, b, step, true_step)
        if role is not None:
            assert role == true_role, (state.index, b, role, true_role)
    return colored, size


def summarize(streams: Sequence[StreamState]) -> str:
    """One line for a test's output: labels, fits, unique, colored bytes."""
    fits = sum(1 for s in streams if s.reported is not None and s.reported.fits)
    unique = sum(1 for s in streams if s.reported is not None and s.reported.steps is not None)
    colored = sum(s.reported.colored_bytes for s in streams if s.reported is not None)
    total = sum(len(s.sse_utf8) for s in streams)
    labels = sorted({s.label for s in streams})
    return (
        f"{len(streams)} streams, labels {labels}, fit {fits}, one way {unique}, "
        f"colored {colored} of {total} bytes"
    )


def lied_about(state: StreamState) -> str:
    """A live stream's own chunks judged against lists that lie: one accepted draft
    moved from a listed step to the next one with room (the sums and usage stay
    right, the simulator's `reported-lie`). "refused": the lie contradicts the
    chunks. "fits": it does not (it hides where chunks hold several steps, or the
    ambiguous chunks of ngram's undrafted steps): a consistent lie, which one
    witness cannot expose (docs/CLIENT.md). "none": no draft to move."""
    honest = state.reported
    assert honest is not None and honest.fits, (state.index, honest)
    inputs = copy.deepcopy(state.reported_inputs)
    if not inputs.lists:
        return "none"
    accepted, drafted = (list(v or []) for v in inputs.lists[0])
    lie_lists(accepted, drafted)
    if (accepted, drafted) == inputs.lists[0]:
        return "none"
    inputs.lists = [(accepted, drafted)]
    lying = judge(
        inputs, completion_tokens=honest.tokens, stop_strings=False, text=bytes(state.sse_utf8)
    )
    if lying.fits:
        return "fits"
    assert lying.reason is not None and "do not fit the chunks received" in lying.reason, (
        lying.reason
    )
    return "refused"
