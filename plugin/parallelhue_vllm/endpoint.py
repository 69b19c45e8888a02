"""The `vllm.endpoint_plugins` entry point `parallelhue` (vLLM >= 0.26): in-band telemetry.

Enabled only when named in `VLLM_PLUGINS` (vLLM's rule for endpoint plugins;
the same name also allows the `general_plugins` entry point, which installs
the hooks). vLLM loads it in every API-server process: each one starts its
own hub (`hub.py`), adds the probe route (`route.py`) and an ASGI middleware
that, for a request carrying `X-ParallelHue-Telemetry: 2`, claims the
request in its hub and writes that request's frames into its own SSE
response (docs/PROTOCOL.md, "In-band telemetry"). vLLM adds its own
middlewares (API key, CORS) after the plugins, so they run before this one.
Requests without the header pass through untouched. Nothing here raises into
vLLM: a failure is logged and the request is served without telemetry.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
from typing import Any

from . import hub as hub_module
from . import inband, plugin, route

__all__ = ["InbandMiddleware", "ParallelHueEndpoint", "start_hub"]

log = logging.getLogger("vllm.parallelhue")

_HUB: hub_module.Hub | None = None
_OFF_REASON = "the ParallelHue endpoint plugin has not started"
_HEADER = inband.HEADER.lower().encode("ascii")
_VERSION = str(inband.STREAM_VERSION).encode("ascii")
_DONE = b"data: [DONE]\n\n"
_warned: set[str] = set()


def _off_reason() -> str:
    if not plugin.enabled():
        return (
            "exact telemetry is off on this server: PARALLELHUE_VLLM_EXACT is not 1 "
            "(restart vLLM with PARALLELHUE_VLLM_EXACT=1)"
        )
    if not plugin.installed():
        return (
            "exact telemetry is off on this server: the plugin's hooks are not installed "
            "(see the vLLM log)"
        )
    return _OFF_REASON


def start_hub() -> hub_module.Hub | None:
    """This process's hub, started once; None (with the reason logged) when it cannot run."""
    global _HUB, _OFF_REASON
    if _HUB is not None:
        return _HUB
    plugin.register()  # idempotent; vLLM normally ran it already in this process
    if not plugin.installed():
        _OFF_REASON = _off_reason()
        return None
    try:
        hub = hub_module.Hub(hub_module.ensure_scope(), limits=hub_module.HubLimits.from_env())
        hub.start()
    except (hub_module.HubError, OSError) as error:
        _OFF_REASON = f"the telemetry hub could not start: {error}"
        log.error("parallelhue: in-band telemetry is OFF: %s", error)
        return None
    atexit.register(hub.close)
    _HUB = hub
    log.info(
        "parallelhue: telemetry hub listening at %s; requests with %s: %s get their "
        "telemetry in-band",
        hub.path,
        inband.HEADER,
        inband.STREAM_VERSION,
    )
    return hub


def _warn_once(key: str, message: str, *args: object) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


class ParallelHueEndpoint:
    """Satisfies vllm.plugins.endpoint_plugins.interface.EndpointPlugin."""

    name = "parallelhue"
    required_tasks: tuple[str, ...] | None = ("generate",)

    def attach_router(self, app: Any) -> None:
        try:
            # A plain Starlette route: the handler takes the request positionally.
            app.add_route(route.PROBE_PATH, _probe, methods=["GET", "HEAD"])
            app.add_middleware(InbandMiddleware)
        except Exception as error:  # never break vLLM's app
            log.error(
                "parallelhue: in-band telemetry not added: %s: %s", type(error).__name__, error
            )

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        try:
            start_hub()
        except Exception as error:  # pragma: no cover - start_hub contains its errors
            log.error("parallelhue: telemetry hub not started: %s: %s", type(error).__name__, error)


# ------------------------------------------------------------------ the middleware
class InbandMiddleware:
    """ASGI: a request that asks gets its own frames inside its own SSE response."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        asked = _asked(scope)
        hub = _HUB
        if asked is None or hub is None:
            await self.app(scope, receive, send)
            return
        if asked != _VERSION:
            _warn_once(
                "version",
                "parallelhue: a request asked for in-band telemetry version %r; this "
                "server speaks %s (served without telemetry)",
                asked.decode("latin-1"),
                inband.STREAM_VERSION,
            )
            await self.app(scope, receive, send)
            return
        try:
            claim = hub.claim()
        except hub_module.HubFull as error:
            _warn_once("full", "parallelhue: request served without telemetry: %s", error)
            await self.app(scope, receive, send)
            return
        writer = InbandWriter(claim, send)
        token = inband.use_claim(claim)
        try:
            await self.app(scope, receive, writer.send)
        finally:
            inband.reset_claim(token)
            await writer.close()


def _asked(scope: Any) -> bytes | None:
    """The request's X-ParallelHue-Telemetry value (None: it did not ask)."""
    if scope.get("type") != "http" or scope.get("method") != "POST":
        return None
    for name, value in scope.get("headers") or ():
        if name.lower() == _HEADER:
            return bytes(value).strip()
    return None


class InbandWriter:
    """Wraps one response's ASGI `send`: the claim's frames go out as SSE events
    between the engine's own events (never inside one), and before `data: [DONE]`
    the end (Claim.finish). Anything but a 200 event stream passes untouched."""

    def __init__(self, claim: hub_module.Claim, send: Any) -> None:
        self.claim = claim
        self._send = send
        self.active = False
        self.ended = False
        self._boundary = True  # the body so far ends between two events
        self._lock = asyncio.Lock()
        self._pump: asyncio.Future[None] | None = None

    async def send(self, message: Any) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            headers = list(message.get("headers") or ())
            if message.get("status") == 200 and _is_event_stream(headers):
                self.active = True
                headers.append((_HEADER, _VERSION))
                message = {**message, "headers": headers}
                await self._send(message)
                self._pump = asyncio.ensure_future(self._run_pump())
                return
            self.claim.close()  # no event stream to carry it
            await self._send(message)
            return
        if kind != "http.response.body" or not self.active or self.ended:
            await self._send(message)
            return
        body = bytes(message.get("body") or b"")
        more = bool(message.get("more_body", False))
        async with self._lock:
            done = body.endswith(_DONE) and _at_boundary(body[: -len(_DONE)], self._boundary)
            if not done and more:
                await self._send(message)
                self._note(body)
                if self._boundary:
                    events = self.claim.take()
                    if events:
                        await self._body(events)
                return
            # The end of the response: the frames of the final step, then the end item.
            head = body[: -len(_DONE)] if done else body
            if head:
                await self._body(head)
                self._note(head)
            self.ended = True
            self._stop_pump()
            if self._boundary:
                await self._body(await self.claim.finish())
            else:
                self.claim.close()  # cut inside an event: nothing more can be added
            await self._send(
                {"type": "http.response.body", "body": _DONE if done else b"", "more_body": more}
            )

    async def _body(self, data: bytes) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": True})

    def _note(self, body: bytes) -> None:
        if body:
            self._boundary = _at_boundary(body, self._boundary)

    async def _run_pump(self) -> None:
        """Frames that come between two engine chunks go out at once."""
        try:
            while not self.ended:
                await self.claim.news()
                if self.ended or self.claim.closed:
                    return
                async with self._lock:
                    if self.ended:
                        return
                    if not self._boundary:
                        await asyncio.sleep(0.001)
                        continue
                    events = self.claim.take()
                    if events:
                        await self._body(events)
        except asyncio.CancelledError:
            raise
        except Exception:  # the client went away: the response's own path ends it
            return

    def _stop_pump(self) -> None:
        if self._pump is not None and not self._pump.done():
            self._pump.cancel()

    async def close(self) -> None:
        self.ended = True
        self._stop_pump()
        if self._pump is not None:
            with contextlib.suppress(BaseException):
                await self._pump
        self.claim.close()


def _is_event_stream(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"content-type":
            return value.split(b";")[0].strip().lower() == b"text/event-stream"
    return False


def _at_boundary(body: bytes, before: bool) -> bool:
    """Whether a body that went on with `body` now ends between two events."""
    if not body:
        return before
    return body.endswith((b"\n\n", b"\r\n\r\n", b"\r\r"))


# ------------------------------------------------------------------ the probe
# Starlette calls `await response(scope, receive, send)` on what a handler
# returns: plain ASGI callables are enough, so the plugin imports no web framework.
class _JsonResponse:
    def __init__(self, status: int, body: bytes, head: bool = False) -> None:
        self.status = status
        self.body = body
        self.head = head

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(self.body)).encode()),
        ]
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if self.head else self.body})


async def _probe(request: Any) -> _JsonResponse:
    body = route.probe(_HUB, engine="vllm", off_reason=_off_reason())
    return _JsonResponse(200, json.dumps(body).encode(), head=request.method == "HEAD")
