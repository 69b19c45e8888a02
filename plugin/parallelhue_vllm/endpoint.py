"""The `vllm.endpoint_plugins` entry point `parallelhue` (vLLM >= 0.32): telemetry on vLLM's port.

Enabled only when named in `VLLM_PLUGINS` (vLLM's rule for endpoint plugins;
the same name also allows the `general_plugins` entry point, which installs
the hooks). vLLM loads it in every API-server process: each one starts its
own hub (`hub.py`) and serves the routes of `route.py` from it. Routes live
under `/v1`, so vLLM's `--api-key` middleware guards them and vLLM's TLS
settings apply. Nothing here raises into vLLM: a failure is logged and the
route answers 503 with the reason.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
from typing import Any

from . import hub as hub_module
from . import plugin, route

__all__ = ["ParallelHueEndpoint"]

log = logging.getLogger("vllm.parallelhue")

_HUB: hub_module.Hub | None = None
_OFF_REASON = "the ParallelHue endpoint plugin has not started"


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
        log.error("parallelhue: telemetry over HTTP is OFF: %s", error)
        return None
    atexit.register(hub.close)
    _HUB = hub
    log.info(
        "parallelhue: telemetry hub listening at %s; runs are served at POST %s",
        hub.path,
        route.RUNS_PATH,
    )
    return hub


class ParallelHueEndpoint:
    """Satisfies vllm.plugins.endpoint_plugins.interface.EndpointPlugin."""

    name = "parallelhue"
    required_tasks: tuple[str, ...] | None = ("generate",)

    def attach_router(self, app: Any) -> None:
        try:
            # Plain Starlette routes: the handlers take the request positionally.
            app.add_route(route.PROBE_PATH, _probe, methods=["GET", "HEAD"])
            app.add_route(route.RUNS_PATH, _create_run, methods=["POST"])
        except Exception as error:  # never break vLLM's app
            log.error(
                "parallelhue: telemetry routes not added: %s: %s", type(error).__name__, error
            )

    async def init_state(self, engine_client: Any, state: Any, args: Any) -> None:
        try:
            start_hub()
        except Exception as error:  # pragma: no cover - start_hub contains its errors
            log.error("parallelhue: telemetry hub not started: %s: %s", type(error).__name__, error)


# ------------------------------------------------------------------ handlers
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


class _TelemetryResponse:
    """Streams one run; frees the subscription on disconnect, however the response ends."""

    def __init__(self, sub: hub_module.Subscription) -> None:
        self.sub = sub

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sub = self.sub

        async def watch_disconnect() -> None:
            while True:
                message = await receive()
                if message.get("type") == "http.disconnect":
                    sub.close()
                    return

        watcher = asyncio.ensure_future(watch_disconnect())
        headers = [(k.lower().encode(), v.encode()) for k, v in route.stream_headers()]
        try:
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            async for chunk in route.stream_body(sub):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write
        finally:
            watcher.cancel()
            sub.close()


async def _probe(request: Any) -> _JsonResponse:
    body = route.probe(_HUB, engine="vllm", off_reason=_off_reason())
    return _JsonResponse(200, json.dumps(body).encode(), head=request.method == "HEAD")


async def _create_run(request: Any) -> _JsonResponse | _TelemetryResponse:
    try:
        body = await route.read_body(request.stream(), request.headers.get("content-length"))
        route.check_create_body(body)
        sub = route.subscribe(_HUB, _off_reason())
    except route.RouteError as error:
        return _JsonResponse(error.status, route.error_body(error.status, error.message))
    except Exception as error:  # e.g. the client disconnected mid-body: no traceback in vLLM's log
        message = f"request body could not be read: {type(error).__name__}"
        return _JsonResponse(400, route.error_body(400, message))
    return _TelemetryResponse(sub)
