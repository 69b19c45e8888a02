"""The legend: what the colors mean in this run, in the colors themselves."""

from __future__ import annotations

from ..model.labels import (
    LABEL_CHUNK,
    LABEL_REPORTED,
    LABEL_VERIFYING,
    ROLE_KEYS,
    ROLE_NAMES,
    STEP_KEYS,
)
from ..model.state import RunModel
from .chrome import chrome_lines
from .lines import Line

__all__ = ["legend_line", "legend_lines"]


def _shows_chunks(model: RunModel) -> bool:
    return any(stream.shows_chunks for stream in model.shown_streams())


def _legend_parts(model: RunModel, short: bool) -> list[Line]:
    if not model.colorize:
        reason = "NO_COLOR" if model.no_color else "no speculative decoding proven"
        return [[("colors: none (" + reason + ")", "dim")]]
    if model.mode == "chunk":
        squares: Line = [("■", key) for key in STEP_KEYS]
        what = " (network chunks)" if short else " (network chunks, not engine steps)"
        return [[("colors: SSE chunks ", None), *squares, (what, None)]]
    parts: list[Line] = []
    verifying = model.mode == "auto" and any(
        stream.label == LABEL_VERIFYING for stream in model.shown_streams()
    )
    if model.color_by == "role":
        colors: Line = [("colors: token role", None)]
        for code in (1, 2, 3):
            colors += [(" ", None), ("■", ROLE_KEYS[code]), (f" {ROLE_NAMES[code]}", None)]
        parts.append(colors)
        parts.append([("plain: a step without drafts", None)])
        # A reconciler without contract C2's roles: no span is shown with a role.
        mixed = "underlined: tokens of two roles" if model.roles_known else None
        unproven = "dim: not yet proven" if model.roles_known else "dim: no role proven"
    else:
        cycle = " (cycling)" if short else " (cycling, one per verified step)"
        parts.append(
            [("colors: engine step ", None), *[("■", k) for k in STEP_KEYS], (cycle, None)]
        )
        mixed = (
            "underlined: 2 steps in 1 character"
            if short
            else ("underlined: a character from two steps")
        )
        unproven = "dim: not yet proven"
    if mixed is not None:
        parts.append([(mixed, "mixed")])
    unproven_part: Line = [(unproven, "unproven")]
    if verifying:
        # auto mode proves a stream as it goes; its verdict waits for the stream's end.
        unproven_part.append(
            ("; verdict when a stream ends" if short else "; the verdict comes when a stream ends",
             None)
        )  # fmt: skip
    parts.append(unproven_part)
    shown, waiting = model.reported_engines()
    if shown or waiting:
        # What the tier proves, and that its colors come only with a stream's end
        # (vLLM's lists arrive in the final chunk; llama's steps are judged there too).
        what = (
            "REPORTED streams: the server's own steps (one witness), colored at its end"
            if short
            else f"{LABEL_REPORTED} streams: steps and roles as the engine states them, "
            "cross-checked for consistency (one witness, not EXACT); "
            "colored when the stream ends"
        )
        parts.append([(what, None)])
    if _shows_chunks(model):
        parts.append(
            [(f"{'CHUNK' if short else LABEL_CHUNK} streams: colors are SSE chunks", None)]
        )
    return parts


def legend_lines(model: RunModel, width: int | None, max_lines: int | None = None) -> list[Line]:
    """What the colors of this run mean, in the colors themselves."""
    return chrome_lines([_legend_parts(model, False), _legend_parts(model, True)], width, max_lines)


def legend_line(model: RunModel, width: int | None) -> Line:
    """The legend on one line (cut with "…" when it does not fit)."""
    return legend_lines(model, width, 1)[0]
