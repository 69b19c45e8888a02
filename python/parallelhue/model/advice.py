"""When the evidence is missing: the likely cause and its fix, in one line.

A stream's reason (`missing telemetry: no frames received for this run`, `SSE
chunk id does not carry the request id …`) says what the reconciler saw, not
what the user should do. `fix_line` reads what the run knows — how its
telemetry was to arrive (`TelemetrySetup`: the path, why auto chose it,
whether the server is another host, whether /metrics shows vLLM), the
reconciler's counters, the run messages and the first failure — and names the
most likely cause with its fix, short enough for an 80-column terminal
(`FIX_PREFIX` included). Every view prints it (the live status line, the
summary after every view, `--json`'s `fix`), and a replay says the same from
the recorded setup.

`explain_reason` turns "no frames received" into what happened when frames
did arrive but every one was rejected.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .sanitize import one_line

if TYPE_CHECKING:
    from .state import RunModel

__all__ = [
    "FIX_PREFIX",
    "FIX_WIDTH",
    "NO_FRAMES",
    "REJECTED_PREFIX",
    "TelemetrySetup",
    "explain_reason",
    "fix_line",
    "is_this_host",
]

# The fix line fits an 80-column terminal with its prefix.
FIX_WIDTH = 80
FIX_PREFIX = "fix: "
# The reconcilers' words (docs/PROTOCOL.md, "Verdicts"; reconcile/finalize.rs).
NO_FRAMES = "missing telemetry: no frames received for this run"
REJECTED_PREFIX = "rejected frame: "
_FOREIGN_ID = "SSE chunk id does not carry the request id"
_PD_ROUTER = "(a prefill/decode router renamed the request)"
_PROTOCOL = re.compile(r"unsupported protocol version (\d+) \(this build speaks (\d+)\)")
_FOREIGN_UID = re.compile(r"telemetry: datagrams from uid (\d+) rejected")
# The self-check of the plugin (issue 25): it names every server-side reason.
SELF_CHECK = "python -m parallelhue_vllm check"


@dataclass(frozen=True)
class TelemetrySetup:
    """How a run's telemetry was to arrive (the session knows it; a recording keeps it)."""

    path: str  # socket | http
    note: str = ""  # why auto chose it (telemetry.TelemetryPlan.note)
    remote: bool = False  # the endpoint's host is not this machine: no socket can reach us
    vllm: bool = False  # the server's /metrics has vLLM's families

    def as_json(self) -> dict[str, Any]:
        return {"path": self.path, "note": self.note, "remote": self.remote, "vllm": self.vllm}

    @classmethod
    def from_json(cls, data: object) -> TelemetrySetup | None:
        """From a recording's header (None: an older recording, or chunk mode)."""
        if not isinstance(data, Mapping) or data.get("path") not in ("socket", "http"):
            return None
        return cls(
            path=str(data["path"]),
            note=str(data.get("note") or ""),
            remote=bool(data.get("remote")),
            vllm=bool(data.get("vllm")),
        )


def is_this_host(host: str) -> bool:
    """The endpoint's host is this machine (a loopback address or its own name), where
    the telemetry socket can reach; no lookup is made."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    return name == socket.gethostname().lower()


def explain_reason(reason: str, rejected: int, first_rejection: str | None) -> str:
    """A stream's reason as the user reads it: "no frames received" when frames came
    and every one was rejected says how many, and why the first was."""
    if reason != NO_FRAMES or rejected <= 0 or first_rejection is None:
        return reason
    why = first_rejection.removeprefix(REJECTED_PREFIX)
    noun = "frame" if rejected == 1 else "frames"
    every = "it was" if rejected == 1 else "all"
    return f"missing telemetry: {rejected} {noun} received, {every} rejected: {why}"


def _protocol_fix(messages: list[str]) -> str | None:
    for message in messages:
        found = _PROTOCOL.search(message)
        if found is None:
            continue
        sent, spoken = int(found.group(1)), int(found.group(2))
        if sent < spoken:
            # Protocol N is spoken by parallelhue-vllm 0.N.
            return (
                f"server plugin too old (protocol {sent}): install parallelhue-vllm "
                f"0.{spoken} there"
            )
        return f"server plugin speaks protocol {sent}, this client {spoken}: upgrade parallelhue"
    return None


def _uid_fix(messages: list[str]) -> str | None:
    for message in messages:
        found = _FOREIGN_UID.search(message)
        if found is not None:
            uid = found.group(1)
            return f"telemetry came from uid {uid}, not yours: give --accept-uid {uid}"
    return None


def _no_frames_fix(setup: TelemetrySetup | None) -> str:
    """Nothing arrived: what the way it was to arrive says is most likely."""
    if setup is not None and setup.path == "http":
        # The server's probe said its plugin serves telemetry, and then nothing came.
        return f"vLLM's plugin sent nothing: run {SELF_CHECK} there"
    note = setup.note if setup is not None else ""
    if "PARALLELHUE_VLLM_EXACT" in note:
        return "vLLM's plugin is off: restart vLLM with PARALLELHUE_VLLM_EXACT=1"
    if "telemetry route says" in note:
        return f"vLLM's plugin is off: run {SELF_CHECK} there"
    if setup is not None and setup.remote:
        # A socket reaches only this host: a remote vLLM serves telemetry on its port.
        return "remote vLLM needs VLLM_PLUGINS=parallelhue and PARALLELHUE_VLLM_EXACT=1"
    return f"start vLLM with PARALLELHUE_VLLM_EXACT=1 ({SELF_CHECK})"


def _foreign_id_fix(mode: str, reason: str) -> str:
    """The chunks do not carry our request id: who renamed the request."""
    if reason.endswith(_PD_ROUTER):
        # vllm-router's P/D mode renames both stages and drops the ask (docs/REACH.md);
        # the decode worker itself emits every step.
        return "a P/D router hides the evidence: exact only straight to a decode worker"
    # vLLM names its chunks after the request id it is sent; this server does not
    # (llama-server, for one: its own step reports color it, where they fit).
    then = (
        "exact needs vLLM, or --mode chunk"
        if mode == "exact"
        else "colors: reported steps or chunks"
    )
    return f"not vLLM (chunk ids lack our request id): {then}"


def fix_line(model: RunModel, first_reason: str | None, rejected: int) -> str | None:
    """The likely cause of the run's missing evidence and its fix (None: nothing is
    missing, or nothing a user can fix); `first_reason` is the first stream
    failure the reconciler reported, `rejected` how many frames it rejected."""
    if model.mode == "chunk":
        return None  # chunk mode asks for no evidence
    messages = model.run_messages
    fix = _protocol_fix(messages) or _uid_fix(messages)
    if fix is None and first_reason is not None:
        if _FOREIGN_ID in first_reason:
            fix = _foreign_id_fix(model.mode, first_reason)
        elif first_reason == NO_FRAMES and rejected == 0:
            fix = _no_frames_fix(model.telemetry_setup)
    if fix is None:
        return None
    return one_line(FIX_PREFIX + fix, FIX_WIDTH)


_REQUEST_ID = re.compile(r"ph1_([0-9a-f]{32})_(\d+)")


def _general(index: int, note: str) -> str:
    """A stream's note without what only names the stream: its number and request id."""
    note = note.replace(f"stream {index}: ", "")

    def own_id(found: re.Match[str]) -> str:
        return f"ph1_{found.group(1)[:8]}…_i" if int(found.group(2)) == index else found.group(0)

    return _REQUEST_ID.sub(own_id, note)


def index_ranges(indices: list[int]) -> str:
    """`0-3, 5, 7-9` for [0, 1, 2, 3, 5, 7, 8, 9] (sorted)."""
    parts: list[str] = []
    start = previous = indices[0]
    for index in [*indices[1:], None]:
        if index is not None and index == previous + 1:
            previous = index
            continue
        parts.append(str(start) if start == previous else f"{start}-{previous}")
        if index is not None:
            start = previous = index
    return ", ".join(parts)


def grouped_notes(notes: list[tuple[int, str, str]]) -> list[str]:
    """(stream, label, note) lines grouped: streams that ended the same way share one
    line, `streams 0-19: SSE CHUNK MODE; downgraded: …`, in order of first appearance."""
    groups: dict[tuple[str, str], list[int]] = {}
    for index, label, note in notes:
        groups.setdefault((label, _general(index, note)), []).append(index)
    lines = []
    for (label, note), indices in groups.items():
        if len(indices) == 1:
            # Alone, its own number and request id read better than the placeholder.
            index = indices[0]
            original = next(n for i, _l, n in notes if i == index)
            lines.append(f"stream {index}: {label}; {original.replace(f'stream {index}: ', '')}")
        else:
            lines.append(f"streams {index_ranges(indices)}: {label}; {note}")
    return lines


# The summary lists at most this many distinct run messages (--json has them all).
SHOWN_RUN_MESSAGES = 5


def run_message_notes(messages: list[str]) -> list[str]:
    """The run messages as summary lines: each distinct one once, the first few."""
    distinct = list(dict.fromkeys(messages))
    lines = [f"run: {message}" for message in distinct[:SHOWN_RUN_MESSAGES]]
    if len(distinct) > SHOWN_RUN_MESSAGES:
        lines.append(f"run: {len(distinct) - SHOWN_RUN_MESSAGES} more messages (see --json)")
    return lines
