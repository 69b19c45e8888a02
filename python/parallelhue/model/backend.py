"""Which decoding the server runs, decided from evidence only.

Evidence, strongest first: the plugin's hello frames (the engine itself says
which speculative method runs, with K and how roles were derived), then a
stream's server-reported steps with drafts (vLLM's per-step lists,
llama-server's draft counters), then the server's /metrics (spec-decode
counters exist), else nothing: generic and monochrome. The model name is
never looked at. `--backend` overrides the verdict and the screen says it
was declared by the user.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from parallelhue_vllm.wire import UNTESTED_MARK

from .sanitize import one_line
from .shapes import MetricsSnapshot, SourceInfo

__all__ = ["Backend", "detect_backend", "untested_engine"]

_DERIVATION_TEXT = {
    "draft_ids": "roles from real draft ids",
    "counts": "roles from counts only",
    "none": "no drafts",
}


@dataclass(frozen=True)
class Backend:
    name: str  # speculative method, "generic", or "speculative (method unknown)"
    speculative: bool  # colors are only used for speculative servers
    evidence: str  # where the verdict came from, shown on screen
    simulated: bool = False

    def describe(self) -> str:
        prefix = "SIMULATED ENGINE · " if self.simulated else ""
        return f"{prefix}backend {self.name} ({self.evidence})"


def _from_hello(sources: Sequence[SourceInfo]) -> Backend | None:
    schedulers = [s for s in sources if s.get("role") == "scheduler"] or list(sources)
    if not schedulers:
        return None
    hello = schedulers[0]
    simulated = any(s.get("engine") == "simulated" for s in sources)
    engine = "simulated engine" if hello.get("engine") == "simulated" else "vLLM"
    version = one_line(str(hello.get("engine_version", "")), 40)
    method = one_line(str(hello.get("spec_method", "")), 40)
    k = int(hello.get("num_speculative_tokens", 0) or 0)
    if not method:
        return Backend(
            name="no speculative decoding",
            speculative=False,
            evidence=f"plugin hello: {engine} {version}, no speculative method",
            simulated=simulated,
        )
    derivation = _DERIVATION_TEXT.get(str(hello.get("role_derivation")), "roles unknown")
    return Backend(
        name=method,
        speculative=True,
        evidence=f"plugin hello: {engine} {version}, K={k}, {derivation}",
        simulated=simulated,
    )


def untested_engine(sources: Sequence[SourceInfo]) -> str | None:
    """The engine version a plugin hello marks as never tested with the plugin, or None.

    The plugin's adapter matched that engine by its signatures (the hooks run);
    the mark is the plugin's statement and carries no evidence: it is shown.
    """
    for source in sources:
        version = str(source.get("engine_version", ""))
        if version.endswith(UNTESTED_MARK):
            return one_line(version[: -len(UNTESTED_MARK)], 40)
    return None


def detect_backend(
    override: str,
    sources: Sequence[SourceInfo],
    metrics: MetricsSnapshot | None,
    reported: str | None = None,
) -> Backend:
    """The backend verdict from the evidence at hand (call again as hellos arrive);
    `reported`: what a stream's server-reported steps showed of drafting."""
    simulated = any(s.get("engine") == "simulated" for s in sources)
    if override == "generic":
        return Backend("generic", False, "user-declared with --backend generic", simulated)
    if override != "auto":
        return Backend(override, True, f"user-declared with --backend {override}", simulated)
    from_hello = _from_hello(sources)
    if from_hello is not None:
        return from_hello
    if reported is not None:
        return Backend("speculative (method unknown)", True, f"no plugin hello; {reported}")
    if metrics is not None and metrics.has_spec_decode:
        return Backend(
            "speculative (method unknown)",
            True,
            "server /metrics has spec-decode counters",
        )
    if metrics is not None:
        evidence = "no plugin hello; /metrics has no spec-decode counters"
    else:
        evidence = "no plugin hello; no /metrics"
    return Backend("generic", False, evidence)
