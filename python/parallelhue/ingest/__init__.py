"""The network side of a run: what it sends (request bodies, the arrival schedule,
the HTTP streams) and what comes in (SSE, telemetry over the socket or HTTP,
/metrics), the reconciler it feeds and the recording. `native.py` is the shipped
path (Rust threads); the reference path reads on the event loop (session.py)."""
