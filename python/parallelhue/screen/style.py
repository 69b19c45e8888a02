"""The palettes that say what each style key looks like.

The screen's lines (`lines.py`) tag every piece of text with a style key such as
`step.2`, `role.accepted` or `label.exact` (the keys: `model/labels.py`), never
with a color. A `Theme`
turns keys into SGR prefixes (the ANSI painter), Rich styles (the Rich
painter) and CSS colors (the HTML and SVG painters), so one palette choice
(`--palette`) and one NO_COLOR rule apply to every output alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from rich.color import Color
from rich.style import Style

from ..model.labels import CHUNK_KEYS, STEP_KEYS

__all__ = [
    "PALETTES",
    "Ink",
    "Theme",
    "xterm_rgb",
]


@dataclass(frozen=True)
class Ink:
    """What a style key looks like: an xterm-256 foreground and attributes."""

    fg: int | None = None
    bold: bool = False
    dim: bool = False
    underline: bool = False
    reverse: bool = False


def _steps(a: int, b: int, c: int, d: int) -> dict[str, Ink]:
    colors = (a, b, c, d)
    inks = {key: Ink(fg=color) for key, color in zip(STEP_KEYS, colors, strict=True)}
    inks.update({key: Ink(fg=color) for key, color in zip(CHUNK_KEYS, colors, strict=True)})
    return inks


_COMMON = {
    "bold": Ink(bold=True),
    "dim": Ink(dim=True),
    "heading": Ink(bold=True),
    "border": Ink(),
    "focus": Ink(bold=True, reverse=True),
    "simulated": Ink(bold=True, reverse=True),
    "replay": Ink(bold=True, reverse=True),
    "label.verifying": Ink(bold=True),
    "label.cancelled": Ink(bold=True, dim=True),
    "label.queued": Ink(dim=True),
    # SERVER-REPORTED STEPS: the engine's own word, a tier below EXACT.
    "label.reported": Ink(fg=6, bold=True),
    # A character whose bytes came from two steps (or tokens of two roles): proven,
    # but no single step or role to color it by.
    "mixed": Ink(underline=True),
    # auto mode shows text before it is proven; it stays uncolored and dim.
    "unproven": Ink(dim=True),
    "role.plain": Ink(),
}

# standard: the predecessor's xterm-256 green, red, blue, yellow for steps, with a
# lighter blue (33, #0087ff, for its 27): every colored text reads at 4.5:1 or more on
# the dark backgrounds it is drawn on (WCAG AA; 27 was 3.7:1 on the export's #101010),
# and so do the labels' bright red (9) and green and yellow.
# colorblind: Okabe-Ito (orange, sky blue, yellow, reddish purple; bluish green is
# left out because next to sky blue it is the pair deuteranopes confuse most).
PALETTES: dict[str, dict[str, Ink]] = {
    "standard": {
        **_COMMON,
        **_steps(46, 196, 33, 226),
        "role.accepted": Ink(fg=46),
        "role.target": Ink(fg=203),
        "role.bonus": Ink(fg=39),
        "label.exact": Ink(fg=2, bold=True),
        "label.chunk": Ink(fg=3, bold=True),
        "label.failed": Ink(fg=9, bold=True),
        "label.error": Ink(fg=9, bold=True),
        "note": Ink(fg=9),
    },
    "colorblind": {
        **_COMMON,
        **_steps(214, 74, 227, 175),
        "role.accepted": Ink(fg=74),
        "role.target": Ink(fg=214),
        "role.bonus": Ink(fg=175),
        "label.exact": Ink(fg=74, bold=True),
        "label.chunk": Ink(fg=227, bold=True),
        "label.failed": Ink(fg=214, bold=True),
        "label.error": Ink(fg=214, bold=True),
        "note": Ink(fg=214),
    },
}

# xterm's 16 system colors (its defaults), then the 6x6x6 cube and the gray ramp.
_SYSTEM = (
    (0, 0, 0), (205, 0, 0), (0, 205, 0), (205, 205, 0),
    (0, 0, 238), (205, 0, 205), (0, 205, 205), (229, 229, 229),
    (127, 127, 127), (255, 0, 0), (0, 255, 0), (255, 255, 0),
    (92, 92, 255), (255, 0, 255), (0, 255, 255), (255, 255, 255),
)  # fmt: skip
_CUBE = (0, 95, 135, 175, 215, 255)


def xterm_rgb(index: int) -> tuple[int, int, int]:
    """The RGB value xterm shows for a 256-color index."""
    if index < 16:
        return _SYSTEM[index]
    if index < 232:
        index -= 16
        return (_CUBE[index // 36], _CUBE[(index // 6) % 6], _CUBE[index % 6])
    level = 8 + 10 * (index - 232)
    return (level, level, level)


class Theme:
    """One palette under one color rule; every painter asks it about style keys."""

    def __init__(self, palette: str = "standard", *, use_color: bool = True) -> None:
        self.palette = palette
        self.use_color = use_color
        self.inks = PALETTES[palette]

    def ink(self, key: str | None) -> Ink:
        if key is None:
            return Ink()
        ink = self.inks.get(key, Ink())
        if not self.use_color and ink.fg is not None:
            ink = Ink(None, ink.bold, ink.dim, ink.underline, ink.reverse)
        return ink

    @cached_property
    def prefixes(self) -> dict[str | None, str]:
        """The SGR escape that starts each style key, built once ("" for none)."""
        prefixes: dict[str | None, str] = {None: ""}
        for key in self.inks:
            prefixes[key] = _sgr_of(self.ink(key))
        return prefixes

    def sgr(self, key: str | None) -> str:
        """The SGR escape that starts `key` ("" for unstyled text)."""
        return self.prefixes.get(key, "")

    @cached_property
    def _rich(self) -> dict[str, Style]:
        return {key: _rich_of(self.ink(key)) for key in self.inks}

    def rich(self, key: str | None) -> Style | None:
        return None if key is None else self._rich.get(key)

    def rgb(self, key: str | None) -> tuple[int, int, int] | None:
        ink = self.ink(key)
        return None if ink.fg is None else xterm_rgb(ink.fg)

    def css_color(self, key: str | None) -> str | None:
        rgb = self.rgb(key)
        return None if rgb is None else "#{:02x}{:02x}{:02x}".format(*rgb)


def _sgr_of(ink: Ink) -> str:
    params: list[str] = []
    if ink.bold:
        params.append("1")
    if ink.dim:
        params.append("2")
    if ink.underline:
        params.append("4")
    if ink.reverse:
        params.append("7")
    if ink.fg is not None:
        if ink.fg < 8:
            params.append(str(30 + ink.fg))
        elif ink.fg < 16:
            params.append(str(90 + ink.fg - 8))
        else:
            params.append(f"38;5;{ink.fg}")
    return f"\x1b[{';'.join(params)}m" if params else ""


def _rich_of(ink: Ink) -> Style:
    return Style(
        color=Color.from_ansi(ink.fg) if ink.fg is not None else None,
        bold=ink.bold or None,
        dim=ink.dim or None,
        underline=ink.underline or None,
        reverse=ink.reverse or None,
    )
