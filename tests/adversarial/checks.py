"""What each expectation means on the client's side, as assertions.

Kept apart from the pytest module so a failure names the case's rule and shows
the whole outcome (every stream's verdict, label, reason and error).
"""

from __future__ import annotations

from parallelhue.model.labels import LABEL_EXACT
from parallelhue.model.sanitize import one_line

from .cases import Case
from .harness import Outcome

__all__ = ["check"]

# The terminal must never receive these from a lying server (sanitize.py).
_CONTROL = ("\x1b", "\x07", "\x9b")


def _matches(said: str, reasons: tuple[str, ...]) -> bool:
    for reason in reasons:
        if reason.endswith("…") and said.startswith(reason[:-1]):
            return True
        if said == reason:
            return True
    return False


def _shown_reason(outcome: Outcome, stream: int) -> str:
    """What the client reports for a stream: its HTTP failure, else the verdict's reason."""
    state = outcome.streams[stream]
    return state.error or state.reason or ""


def check(case: Case, outcome: Outcome, mode: str) -> None:
    context = f"{case.id} ({case.rule})\n{outcome.describe()}"
    for char in _CONTROL:
        assert char not in outcome.screen, f"control character {char!r} on screen\n{context}"
    if case.expect == "fail":
        _check_fail(case, outcome, mode, context)
        return
    for index, state in enumerate(outcome.streams):
        assert state.verdict == "exact", f"stream {index} must be EXACT\n{context}"
        assert state.label == LABEL_EXACT, f"stream {index} must show EXACT\n{context}"
        # EXACT means every token the client read was confirmed by the telemetry.
        assert state.stats.get("tokens") == state.sse_tokens > 0, context
    assert (outcome.exit_code, outcome.message) == (0, None), context
    assert outcome.player.get("send_errors") == [], context
    if case.expect == "uncolored":
        shown = {index: state.uncolored for index, state in enumerate(outcome.streams)}
        for stream, chars in case.uncolored.items():
            assert shown[stream] == chars, f"uncolored {shown[stream]!r}, not {chars!r}\n{context}"
    if case.expect == "claim":
        for value in case.shown:
            for line in outcome.screen.splitlines():
                assert value not in line or "plugin hello" in line, (
                    f"{value!r} is shown as if it were evidence: {line!r}\n{context}"
                )


def _check_fail(case: Case, outcome: Outcome, mode: str, context: str) -> None:
    for stream in case.streams:
        state = outcome.streams[stream]
        assert state.verdict != "exact", f"stream {stream} must not be EXACT\n{context}"
        assert state.label != LABEL_EXACT, f"stream {stream} must not show EXACT\n{context}"
        reasons = case.reason(stream)
        if reasons and mode == "auto":
            assert _matches(_shown_reason(outcome, stream), reasons), context
    if mode == "auto":
        for index, state in enumerate(outcome.streams):
            if index not in case.streams:
                assert state.verdict == "exact", f"honest stream {index} must stay EXACT\n{context}"
        http_failed = any(s.error is not None for s in outcome.streams)
        assert outcome.exit_code == (1 if http_failed else 0), context
        return
    # exact mode fails closed: exit 2 and one line naming the stream the lie hit first.
    first = case.streams[0]
    assert outcome.exit_code == 2, context
    assert outcome.message is not None, context
    prefix = f"exact mode: stream {first} is not exact: "
    assert outcome.message.startswith(prefix), context
    reasons = case.reason(first)
    if reasons:
        # The one line may go on (e.g. how many streams were cancelled because of it).
        said = outcome.message[len(prefix) :]
        assert any(said.startswith(one_line(r.removesuffix("…"))) for r in reasons), context
