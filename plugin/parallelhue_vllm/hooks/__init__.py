"""What the patched vLLM methods do: turn engine state into provenance and text rows.

Version-independent: the adapters (adapters/targets.py, one table for every
release) check the methods and fields the hooks rely on, then wrap vLLM's
methods (adapters/wrappers.py) with these collectors, one per vLLM process:

- `SchedulerTelemetry` (scheduler.py) runs in the EngineCore process around
  `Scheduler.update_from_output`: provenance rows.
- `FrontendTelemetry` (frontend.py, with its stand-ins in standins.py) runs in
  the API-server process: text rows from `OutputProcessor.add_request` and
  `process_outputs`.
- common.py: what both share (the C accelerator, per-process bookkeeping, the
  step's rows).

Cost model (docs/benchmarks/plugin.md): a request without a ParallelHue id is
looked at once, when it arrives (one regular expression over its id); after
that no hook does anything per step or per token for it. The scheduler learns
of requests from `SchedulerOutput.scheduled_new_reqs`, the frontend from
`add_request`, so a step without requests of ours costs two attribute checks.
The hooks build one plain tuple ("row", wire.py's row layout) per request and
step; the emitter's sender thread turns rows into bytes, off vLLM's loop.

Any exception is contained per request: logged once, telemetry for that request
turned off and a notice frame sent so the client knows why.
"""

# The modules that read the C accelerator (tests switch it for all of them).
from . import common, frontend, scheduler, standins
from .common import IMPLEMENTATION, TelemetryError, parse_ours
from .frontend import FrontendTelemetry
from .scheduler import SchedulerTelemetry, finish_code, step_roles
from .standins import stream_recorder

MODULES = (common, scheduler, frontend, standins)

__all__ = [
    "IMPLEMENTATION",
    "MODULES",
    "FrontendTelemetry",
    "SchedulerTelemetry",
    "TelemetryError",
    "finish_code",
    "parse_ours",
    "step_roles",
    "stream_recorder",
]
