"""Faults of in-band telemetry, applied by the simulated engine to one response.

The datagram faults (`faults.FaultProxy`) lose frames between the emitters
and a socket; these lose them where the in-band path loses them: after the
hub, in the response a client reads (docs/PROTOCOL.md, "In-band telemetry").
Once a response has carried `skip_frames` frame items:

- `stream-drop:N`: the response's claim overflows, exactly as a hub whose
  buffer for it was full: nothing more is kept, and its end item says how
  many frames were dropped (at least N are discarded before the end);
- `stream-end`: the telemetry ends there: the end item says the hub shut down;
- `stream-close`: the connection closes there, without an end item.

The frames themselves are never changed, so what the client sees is byte for
byte what a real hub or a lost connection would give it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from parallelhue_vllm.hub import Claim

from .config import FaultConfig

__all__ = ["StreamFaults"]

log = logging.getLogger("parallelhue.sim")


@dataclass(slots=True)
class StreamFaults:
    """One response's in-band faults (a new instance per response)."""

    config: FaultConfig
    fired: dict[str, int] = field(default_factory=dict)

    def apply(self, claim: Claim) -> str | None:
        """After frames went out: fault the claim once its response carried
        `skip_frames` frames. Returns "close" when the connection must close now."""
        config = self.config
        if claim.frames < config.skip_frames or self.fired:
            return None
        if config.stream_close:
            self._fire("stream_close")
            return "close"
        if config.stream_end:
            self._fire("stream_end")
            claim.fault_hub_closed()
        elif config.stream_drop:
            self._fire("stream_drop")
            claim.fault_poison(config.stream_drop)
        return None

    def _fire(self, name: str) -> None:
        self.fired[name] = self.fired.get(name, 0) + 1
        log.info("SIMULATED fault injected: %s", name.replace("_", "-"))
