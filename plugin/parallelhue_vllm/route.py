"""The telemetry probe, independent of the web framework.

`GET|HEAD /v1/parallelhue` (under `/v1`, so vLLM's `--api-key` guards it like
every other `/v1` route): 200 with a JSON description when the plugin
answers, so a client's `--telemetry auto` can tell it from a 404 and a user
can check a server with curl. The telemetry itself travels inside each
request's own response when the request asks for it (`inband.py`,
docs/PROTOCOL.md "In-band telemetry"); this route only describes it.

`endpoint.py` adapts this to vLLM's FastAPI app, the simulated engine
(`parallelhue.sim.server`) to its own HTTP server.
"""

from __future__ import annotations

import json
from typing import Any

from . import __version__, inband
from .hub import Hub

__all__ = ["PROBE_PATH", "error_body", "probe"]

PROBE_PATH = "/v1/parallelhue"

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    503: "ServiceUnavailable",
}


def error_body(status: int, message: str) -> bytes:
    """vLLM's error shape."""
    error = {"message": message, "type": _ERROR_TYPES.get(status, "Error"), "param": None}
    return json.dumps({"error": {**error, "code": status}}).encode()


def probe(hub: Hub | None, *, engine: str, off_reason: str | None) -> dict[str, Any]:
    """What GET /v1/parallelhue answers."""
    body: dict[str, Any] = {
        "object": "parallelhue.telemetry",
        "plugin_version": __version__,
        "engine": engine,
        "stream_version": inband.STREAM_VERSION,
        "request_header": inband.HEADER,
        "exact": hub is not None,
        "reason": None if hub is not None else off_reason,
    }
    if hub is not None:
        limits = hub.limits
        body["hub"] = {
            **hub.stats(),
            "buffer_bytes": limits.buffer_bytes,
            "total_bytes": limits.total_bytes,
            "max_claims": limits.max_claims,
            "wait_seconds": limits.wait_seconds,
        }
    return body
