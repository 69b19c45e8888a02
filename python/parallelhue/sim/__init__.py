"""The embedded simulated engine: a SIMULATED batched speculative-decoding server.

An OpenAI-compatible streaming API over a scheduler loop that simulates draft
length K, per-stream acceptance, bonus tokens, steps without drafts, stop
strings and multi-byte characters split across tokens, emitting telemetry
through the same emitter and encoder as the vLLM plugin. Every number it
produces is simulated. See docs/SIMULATOR.md.
"""

from .config import FaultConfig, SimConfig
from .server import SimServer

__all__ = ["FaultConfig", "SimConfig", "SimServer"]
