"""Where things live on the server, derived from the completions endpoint URL.

Below the screen model and the HTTP client alike: both ask here instead of
reaching into each other (`/v1/models`, `/metrics`, chat or completions).
"""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["api_base", "is_chat_endpoint", "server_root"]


def is_chat_endpoint(endpoint: str) -> bool:
    return urlsplit(endpoint).path.rstrip("/").endswith("/chat/completions")


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
