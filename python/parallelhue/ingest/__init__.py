"""The network side of a run: what it sends (request bodies, the arrival schedule,
the HTTP streams) and what comes in (SSE, telemetry over the socket or HTTP,
/metrics), the reconciler it feeds and the recording. Two paths, one interface
(`base.py`): `native.py` is the shipped path (Rust threads); `reference.py` reads
on the event loop and feeds the reference reconciler through `driver.py`, which
replay reuses."""
