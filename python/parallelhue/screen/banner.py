"""The banner: engine, model and server, mode, backend and its evidence, telemetry."""

from __future__ import annotations

from ..model.backend import untested_engine
from ..model.sanitize import sanitize
from ..model.state import SIMULATED_LABEL, RunModel
from .chrome import chrome_lines
from .lines import Line

__all__ = ["banner_line", "banner_lines", "reported_text"]


def _banner_parts(model: RunModel, short: bool) -> list[Line]:
    parts: list[Line] = []
    if model.is_simulated:
        parts.append([(SIMULATED_LABEL, "simulated")])
    if model.replay_of is not None:
        parts.append([(f"REPLAY of {sanitize(model.replay_of, keep_newlines=False)}", "replay")])
    texts = []
    if model.model_name:
        where = f" @ {model.server}" if model.server else ""
        texts.append(f"model {model.model_name}{where}")
    elif model.server:
        texts.append(f"server {model.server}")
    texts.append(f"mode {model.mode}")
    evidence = model.backend.evidence
    if short:
        # Where the verdict came from, without its details ("plugin hello: vLLM 0.32.0, K=3…").
        evidence = evidence.split(":", 1)[0]
    texts.append(f"backend {model.backend.name} ({evidence})")
    if any(source.get("verification") == "fly" for source in model.sources):
        # Contract C1: lossy verification; "accepted" then does not mean "what the target
        # would have sampled", and the banner must not let the colors suggest it.
        texts.append("LOSSY verification (fly): an accepted draft need not be the target's choice")
    if (untested := untested_engine(model.sources)) is not None:
        texts.append(f"UNTESTED engine: vLLM {untested} was never tested with the plugin")
    if not model.backend.speculative:
        texts.append("monochrome: no speculative decoding proven")
    reported = reported_text(model, short)
    if reported:
        texts.append(reported)
    if model.telemetry:
        # Where telemetry comes from and what vouches for it; short: the path and its
        # one warning ("over plain HTTP: NOT encrypted"), before the first comma.
        texts.append(model.telemetry.split(", ", 1)[0] if short else model.telemetry)
    parts += [[(sanitize(text, keep_newlines=False), None)] for text in texts]
    return parts


def reported_text(model: RunModel, short: bool) -> str:
    """The banner's word on server-reported steps: which engine's statements color
    which streams and why (no plugin telemetry), or that they will at a stream's end."""
    shown, waiting = model.reported_engines()
    if not shown and not waiting:
        if not model.reported_possible():
            return ""
        # Nothing stated yet: say when colors could come rather than guess now.
        if short:
            return "no telemetry so far: steps, if reported, at stream ends"
        return (
            "no plugin telemetry so far: if the server reports its steps "
            "(vLLM --per-request-spec-decode-metrics detailed), each stream is colored when it ends"
        )
    if short:
        return "REPORTED steps" if shown else "REPORTED steps at stream ends"
    engines = " and ".join(shown) if shown else "the server"
    text = f"server-reported steps from {engines} (no plugin telemetry: the engine's own word)"
    return text + ("; colors when each stream ends" if waiting else "")


def banner_lines(model: RunModel, width: int | None, max_lines: int | None = None) -> list[Line]:
    """The banner: engine, model and server, mode, backend and its evidence, telemetry."""
    wordings = [_banner_parts(model, False), _banner_parts(model, True)]
    return chrome_lines(wordings, width, max_lines)


def banner_line(model: RunModel, width: int | None) -> Line:
    """The banner on one line (cut with "…" when it does not fit)."""
    return banner_lines(model, width, 1)[0]
