"""Which way a run's telemetry comes, and what the screen says about it.

`--telemetry` [PARALLELHUE_TELEMETRY]:
- `socket`: the local AF_UNIX socket (the predecessor's path): the kernel
  vouches for each sender's uid; `--accept-uid` admits more uids, explicitly.
- `http`: in-band, inside each request's own response (docs/PROTOCOL.md,
  "In-band telemetry"): every request carries `X-ParallelHue-Telemetry: 2`
  and its SSE response carries that request's frames, so whatever forwards
  the response (a router, a proxy, a replica of a fleet) forwards them.
- `auto` (the default): in-band when the server's probe (`GET
  {api}/parallelhue`) says it serves it, or when the server is on another
  host (a router in front of a fleet may not forward the probe; a response
  without telemetry then says so per stream); else the socket. The screen
  says which, and why.

Over HTTP there are no `SCM_CREDENTIALS`; `security_line` says on screen
what replaces them for this run (TLS, the API key, each request's frames
only in its own response), with the wording of PROTOCOL.md's "Security of
the telemetry paths".
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import httpx

from parallelhue_vllm.inband import STREAM_VERSION as INBAND_VERSION
from parallelhue_vllm.route import PROBE_PATH

from ..model.advice import is_this_host
from ..model.endpoint import api_base
from ..model.sanitize import one_line
from ..model.stream_errors import api_key_message, connect_reason
from .streams import ConnectTarget, connect_target

__all__ = [
    "TELEMETRY_CHOICES",
    "TelemetryError",
    "TelemetryPlan",
    "choose",
    "probe_url",
    "rejected_line",
    "security_line",
]

TELEMETRY_CHOICES = ("auto", "socket", "http")
# The in-band telemetry version this client asks for and reads (parallelhue_vllm.inband;
# the probe must state the same; version 1 was the removed HTTP telemetry stream).
STREAM_VERSION = INBAND_VERSION
PROBE_TIMEOUT = 10.0


class TelemetryError(Exception):
    """The run cannot get its telemetry; one line naming the fix (exit 2)."""


@dataclass(frozen=True)
class TelemetryPlan:
    """The path chosen for a run (`note`: why auto chose it)."""

    path: Literal["socket", "http"]
    note: str = ""
    accept_uids: tuple[int, ...] = ()


def probe_url(endpoint: str) -> str:
    # The routes live under the API base, like /v1/models (a prefix before /v1 is kept).
    return api_base(endpoint) + PROBE_PATH.removeprefix("/v1")


async def choose(
    client: httpx.AsyncClient,
    endpoint: str,
    setting: str,
    *,
    api_key: str | None,
    accept_uids: Sequence[int] = (),
) -> TelemetryPlan:
    """The run's telemetry path for `--telemetry setting`; auto asks the server."""
    accept = tuple(accept_uids)
    if setting == "socket":
        return TelemetryPlan("socket", accept_uids=accept)
    if setting == "http":
        return TelemetryPlan("http")
    url = probe_url(endpoint)
    remote = not is_this_host(connect_target(endpoint).host)

    def fallback(why: str) -> TelemetryPlan:
        # Another host cannot reach this host's socket: ask in-band anyway (a router
        # may not forward the probe; each response says whether it carries telemetry).
        if remote:
            return TelemetryPlan("http", f"auto: {why}; another host: in-band")
        return TelemetryPlan("socket", f"auto: {why}", accept)

    try:
        response = await client.get(url, timeout=PROBE_TIMEOUT)
    except httpx.HTTPError as error:
        return fallback(f"the probe {one_line(url)} failed: {connect_reason(error)}")
    status = response.status_code
    if status == 401:
        raise TelemetryError(api_key_message(url, api_key is not None))
    if status != 200:
        return fallback(f"the server has no telemetry probe (HTTP {status})")
    try:
        answer = response.json()
        ok = answer.get("object") == "parallelhue.telemetry"
    except (ValueError, AttributeError):
        ok = False
    if not ok:
        return fallback("the server's /v1/parallelhue is not ParallelHue's probe")
    if answer.get("stream_version") != STREAM_VERSION:
        version = one_line(str(answer.get("stream_version")), 20)
        return TelemetryPlan(
            "socket",
            f"auto: the server speaks telemetry stream version {version}, this client "
            f"{STREAM_VERSION}",
            accept,
        )
    if answer.get("exact") is not True:
        reason = one_line(str(answer.get("reason") or "no reason given"), 200)
        return TelemetryPlan("socket", f"auto: the server's probe says: {reason}", accept)
    return TelemetryPlan("http", "auto")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def security_line(
    plan: TelemetryPlan, target: ConnectTarget, api_key: str | None, run_id: str
) -> str:
    """What vouches for this run's telemetry (docs/PROTOCOL.md's table)."""
    note = f" ({plan.note})" if plan.note else ""
    if plan.path == "socket":
        uid = os.geteuid()
        others = [u for u in plan.accept_uids if u != uid]
        if others:
            listed = ", ".join(str(u) for u in others)
            return (
                f"telemetry: local socket, sender uid {uid} and uid {listed} accepted by "
                f"--accept-uid{note}"
            )
        return f"telemetry: local socket, sender uid {uid} checked by the kernel{note}"
    host = f"[{target.host}]" if ":" in target.host else target.host
    where = f"{host}:{target.port}"
    key = "API key sent" if api_key else "no API key"
    run = f"in-band, run {run_id[:8]}…"
    if target.tls:
        return f"telemetry: {where} over HTTPS (certificate verified), {key}, {run}{note}"
    if _is_loopback(target.host):
        return f"telemetry: {where} over plain HTTP (loopback), {key}, {run}{note}"
    clear = "API key sent in clear" if api_key else "no API key"
    return (
        f"telemetry: {where} over plain HTTP: NOT encrypted, anyone on the network path can "
        f"read or forge it; {clear}, {run}{note}"
    )


class _ReceiverWithStats(Protocol):
    def stats(self) -> Mapping[str, Any]: ...


def tell_rejected_uid(
    receiver: _ReceiverWithStats | None, told: bool, run_message: Callable[[str], None]
) -> bool:
    """Tells the run, once, that the socket rejected another uid's datagrams.

    Returns whether the run has been told (pass it back as `told` next time)."""
    if receiver is None or told:
        return told
    stats = receiver.stats()
    if not stats["rejected_uid"]:
        return False
    run_message(rejected_line(stats["last_rejected_uid"]))
    return True


def rejected_line(uid: int | None) -> str:
    """The run message when the socket dropped datagrams of another uid."""
    if uid is None:
        return "telemetry: datagrams without sender credentials rejected on the socket"
    return (
        f"telemetry: datagrams from uid {uid} rejected (not this client's uid): for a server "
        f"in a container on this host use --telemetry http, or --accept-uid {uid}"
    )
