"""The one place where a stream's low-level end becomes the user's message.

The Rust HTTP thread, the reference path's httpx reader and `replay` all
describe an abnormal end the same way — a kind (`shapes.EndKind`), an HTTP
status, a detail — and this module turns it into one sanitized line. So a
refused connection, a timeout or an HTTP 500 reads the same whichever path
met it, live or replayed.
"""

from __future__ import annotations

import json

from .sanitize import one_line
from .shapes import EndKind

__all__ = [
    "api_key_message",
    "connect_reason",
    "end_message",
    "error_detail",
    "is_setup_failure",
]

# Where a run's API key comes from (config.py reads both).
API_KEY_SOURCES = "--api-key or OPENAI_API_KEY"


def api_key_message(where: str, given: bool, status: int = 401) -> str:
    """A 401 (or 403) from the server: the key is missing or wrong."""
    if given:
        return (
            f"the server refused the API key (HTTP {status} from {one_line(where)}): "
            f"check {API_KEY_SOURCES}"
        )
    return (
        f"the server needs an API key (HTTP {status} from {one_line(where)}): give it with "
        f"{API_KEY_SOURCES}"
    )


# A stream's failure that the run's setup has, not the stream (end_message's lines for a
# server that is not reached or refuses the key): when every stream meets it before a
# byte, the run exits 2, as when model discovery meets it first.
_SETUP_FAILURES = ("cannot connect to ", "connecting timed out", "TLS failure", "HTTP 401:",
                   "HTTP 403:")  # fmt: skip


def is_setup_failure(message: str) -> bool:
    return message.startswith(_SETUP_FAILURES)


def error_detail(body: str) -> str:
    """The server's error message from a JSON error body, else the body, on one line."""
    detail = body
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            detail = error["message"]
        elif isinstance(error, str):
            detail = error
        elif isinstance(data.get("message"), str):
            detail = data["message"]
        elif isinstance(data.get("detail"), str):
            detail = data["detail"]
    return one_line(detail) or "(empty body)"


def end_message(kind: EndKind, status: int, detail: str, *, timeout: float) -> str:
    """The one-line message for a stream that ended with `kind`.

    `timeout` is the run's --timeout (the connect timeout is min(timeout, 30 s)).
    """
    if kind == "no_finish":
        return "the stream ended without a finish_reason (server closed it early)"
    if kind == "refused":
        return f"cannot connect to {one_line(detail)}: connection refused (is the server running?)"
    if kind == "connect_failed":
        return f"cannot connect to {one_line(detail)}"
    if kind == "connect_timeout":
        return f"connecting timed out after {min(timeout, 30.0):g} s"
    if kind == "read_timeout":
        return f"no data from the server for {timeout:g} s (raise --timeout)"
    if kind == "closed":
        return "the server closed the connection mid-stream"
    if kind == "no_response":
        return "the server closed the connection without sending a response"
    if kind == "framing":
        return "invalid HTTP body: " + one_line(detail)
    if kind == "protocol":
        return "invalid HTTP response: " + one_line(detail)
    if kind == "bad_sse":
        return "bad SSE data: " + one_line(detail)
    if kind == "http_status":
        if status == 401:
            return f"HTTP 401: {error_detail(detail)} (check {API_KEY_SOURCES})"
        return f"HTTP {status}: {error_detail(detail)}"
    if kind == "not_sse":
        shown = one_line(detail.split(";")[0]) or "no content type"
        return (
            f"not an SSE stream: the server answered {shown} (HTTP {status}); "
            "is --endpoint a streaming completions URL?"
        )
    if kind == "encoding":
        return (
            f"the server compressed the SSE stream (Content-Encoding: {one_line(detail)}) "
            "although the client asked for none"
        )
    if kind == "tls":
        return (
            f"TLS failure with {one_line(detail)} "
            "(to trust a private CA: SSL_CERT_FILE=/path/to/ca.pem)"
        )
    if kind == "io":
        return "HTTP failure: " + one_line(detail)
    if kind == "internal":
        return "internal error in this stream: " + one_line(detail)
    return "cancelled"


def connect_reason(error: BaseException) -> str:
    """Why a connection failed, found in the exception chain (httpx hides the errno)."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or "refused" in str(seen).lower():
            return "connection refused (is the server running?)"
        if isinstance(seen, OSError) and seen.strerror:
            return one_line(seen.strerror)
        seen = seen.__cause__ or seen.__context__
    return one_line(str(error) or type(error).__name__)
