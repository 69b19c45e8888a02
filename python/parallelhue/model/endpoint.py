"""Where things live on the server, from the endpoint as the user gave it.

`completions_url` accepts what the OpenAI SDK takes as a base URL
(`http://host:8000`, `http://host:8000/v1`, `OPENAI_BASE_URL`) or a full
completions URL (`.../v1/chat/completions`, `.../v1/completions`, the
predecessor's form, with or without a version segment before the suffix)
and returns the full URL the streams post to. Everything else derives from
that URL: the API base is what precedes the suffix (`/models`, the telemetry
probe), the server root that base without its `/v1` (`/metrics`). Below the
screen model and the HTTP client alike: both ask here instead of reaching into
each other.
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit, urlunsplit

__all__ = [
    "API_PATHS",
    "EndpointError",
    "api_base",
    "api_kind",
    "completions_url",
    "display_server",
    "is_chat_endpoint",
    "server_root",
]

API_PATHS = {"chat": "/chat/completions", "completions": "/completions"}
# A version segment such as v1 or v1beta: the OpenAI-style API root.
_VERSION = re.compile(r"v\d+[a-z0-9]*")


class EndpointError(ValueError):
    """Not a usable endpoint; the message says why and what to give (no flag name)."""


def _shown(raw: str, parts: SplitResult | None) -> str:
    """The URL as typed, with any credentials in it masked."""
    if parts is None or not (parts.username or parts.password):
        return raw
    host = parts.hostname or ""
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = f"***@{host}" + (f":{port}" if port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def completions_url(raw: str, api: str | None = None) -> str:
    """The full completions URL for a base URL or a full URL; `api` (chat or
    completions) picks the path for a base URL and must agree with a full one."""
    value = raw.strip()
    try:
        parts: SplitResult | None = urlsplit(value)
        assert parts is not None
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        parts = None
    if (
        parts is None
        or parts.scheme not in ("http", "https")
        or not parts.hostname
        or parts.query
        or parts.fragment
    ):
        raise EndpointError(
            "must be an http(s) URL: a base URL (http://host:8000 or http://host:8000/v1) "
            "or a full .../v1/chat/completions or .../v1/completions URL, "
            f"got '{_shown(value, parts)}'"
        )
    path = parts.path.rstrip("/")
    for kind, suffix in API_PATHS.items():
        if path.endswith(suffix) and (kind == "chat" or not path.endswith("/chat/completions")):
            # Any prefix, with or without a version (`/chat/completions`,
            # `/openai/chat/completions`): a full URL is posted to as given, as the
            # predecessor did; /models and the telemetry probe live beside it.
            if api is not None and api != kind:
                raise EndpointError(
                    f"ends in {suffix}, which is the {kind} API, but --api {api} was given: "
                    "give the base URL (.../v1) with --api, or drop --api"
                )
            return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    if not path:
        path = "/v1"  # the OpenAI SDK's base URL is the API root; vLLM serves it at /v1
    elif not _VERSION.fullmatch(path.rsplit("/", 1)[-1]):
        raise EndpointError(
            "must be a base URL ending in an API version (http://host:8000/v1) or a full URL "
            f"ending in /v1/chat/completions or /v1/completions, got '{_shown(value, parts)}'"
        )
    return urlunsplit((parts.scheme, parts.netloc, path + API_PATHS[api or "chat"], "", ""))


def is_chat_endpoint(endpoint: str) -> bool:
    return urlsplit(endpoint).path.rstrip("/").endswith("/chat/completions")


def api_kind(endpoint: str) -> str:
    """chat or completions, for a full completions URL."""
    return "chat" if is_chat_endpoint(endpoint) else "completions"


def api_base(endpoint: str) -> str:
    """`http://host:port/v1` for `http://host:port/v1/chat/completions`."""
    parts = urlsplit(endpoint)
    path = parts.path.rstrip("/")
    for suffix in ("/chat/completions", "/completions"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return urlunsplit((parts.scheme, parts.netloc, path, "", ""))


def server_root(endpoint: str) -> str:
    """`http://host:port` plus any prefix before /v1 (where /metrics lives)."""
    base = api_base(endpoint)
    return base[: -len("/v1")] if base.endswith("/v1") else base


def display_server(endpoint: str) -> str:
    """`host:port` (never credentials), for the banner."""
    parts = urlsplit(endpoint)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host
