"""The reference path of a live run (`--reconciler python`): httpx streams and
`PyReceiver` on the session's event loop feed the pure-Python reference
reconciler through `RunDriver`. Opened like the shipped path (`native.py`):
constructor, `open_run()`, `begin()`; the session's loop then drives it
(`base.IngestPath`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import httpx

from ..model.endpoint import server_root
from ..model.state import RunModel
from .base import Requests
from .driver import RunDriver
from .feed import Feed
from .receiver import PyReceiver
from .reconciler import make_reconciler
from .record import open_writer
from .streams import read_stream
from .telemetry import TelemetryPlan, tell_rejected_uid

__all__ = ["ReferenceIngest"]


class ReferenceIngest:
    """The reference path: httpx streams and `PyReceiver` on this event loop (in-band
    telemetry comes inside the streams). Opened like `RustIngest`: constructor,
    `open_run()`, `begin()`."""

    def __init__(
        self,
        model: RunModel,
        feed: Feed,
        client: httpx.AsyncClient,
        *,
        run_id: str,
        endpoint: str,
        telemetry: TelemetryPlan | None,
        socket_path: str | None,
        timeout: float,
    ) -> None:
        self.model = model
        self.feed = feed
        self.client = client
        self.endpoint = endpoint
        self.run_id = run_id
        self.telemetry = telemetry if model.mode != "chunk" else None
        self.socket_path = socket_path
        self.timeout = timeout
        self.requests: Requests = []
        self.receiver: PyReceiver | None = None
        # In-band: each request asks for its telemetry inside its own response.
        self.inband = self.telemetry is not None and self.telemetry.path == "http"
        self.driver = RunDriver(model, feed, None, None)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self._told_rejected = False
        self._closed = False

    async def open_run(self) -> str:
        return self.run_id

    def begin(self, requests: Requests, record: tuple[str, dict[str, Any]] | None) -> None:
        self.requests = requests
        if self.model.mode != "chunk":
            # A ReconcilerError goes to the session, which makes it a setup error.
            self.driver.reconciler = make_reconciler("python", self.run_id, len(self.model.streams))
        self.driver.recorder = open_writer(*record) if record is not None else None
        if not self.inband and self.driver.reconciler is not None and self.socket_path is not None:
            accept = self.telemetry.accept_uids if self.telemetry is not None else ()
            self.receiver = PyReceiver(self.socket_path, accept_uids=accept)

    def start(self) -> None:
        """Every request at once."""
        for request, _body in self.requests:
            self.start_request(request.index)

    def start_request(self, index: int) -> None:
        request, body = self.requests[index]
        # Telemetry is read from this loop: the readers yield after every event.
        yield_each_read = self.receiver is not None
        self.driver.start(request.index)
        endpoint = (
            self.endpoint if request.path is None else server_root(self.endpoint) + request.path
        )
        self.tasks[request.index] = asyncio.create_task(
            read_stream(
                self.client,
                endpoint,
                body,
                request,
                self.driver,
                yield_each_read=yield_each_read,
                inband=self.inband,
            )
        )

    def telemetry_pending(self) -> bool:
        return False  # `PyReceiver.take` reads what the kernel holds, on this thread

    def poll(self) -> None:
        if self.receiver is not None:
            self.driver.frames(self.receiver.take())
        self.driver.apply_events()

    def streams_done(self) -> bool:
        """Every started request's exchange is over (the session knows which are to come)."""
        return all(task.done() for task in self.tasks.values())

    def cancel(self, stream: int) -> None:
        task = self.tasks.get(stream)
        if task is not None and not task.done():
            task.cancel()
        self.driver.on_end(stream, "cancelled", 0, "")

    def update_stats(self) -> None:
        self.driver.update_stats()
        self._told_rejected = tell_rejected_uid(
            self.receiver, self._told_rejected, self.feed.run_message
        )

    def finalize(self) -> None:
        self.poll()
        self.driver.finalize()
        self.update_stats()

    def close(self, footer: dict[str, Any] | None = None) -> None:
        if self._closed:
            return
        self._closed = True
        for task in self.tasks.values():
            task.cancel()
        if self.receiver is not None:
            self.receiver.close()
        if self.driver.recorder is not None:
            self.driver.recorder.close(footer)

    def receiver_stats(self) -> Mapping[str, object]:
        if self.receiver is not None:
            return self.receiver.stats()
        return {}
