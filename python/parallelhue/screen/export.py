"""--export FILE.svg|FILE.html: the final picture and the summary, painted from the pane model.

Both painters place text by terminal cells, exactly as the terminal would:
every run of ASCII text and every other character gets its own box at its
cell column, as many cells wide as the terminal gives it (CJK and emoji two).
A glyph is squeezed into its box when the font draws it wider (SVG
`textLength`, a CSS transform in HTML), so nothing overlaps its neighbour or
a pane border, and each box is left-to-right on its own: right-to-left text is
never reordered across boxes or borders (it shows in cell order, as in a
terminal). The HTML page is self-contained and dark like a terminal, and adds
plots: the tokens-per-step histogram, acceptance per draft position and a
per-stream timeline of steps. Colors come from the run's theme, never from
the console, so an export made without a terminal keeps its step colors.
"""

from __future__ import annotations

import html
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ..model.labels import CHUNK_KEYS, ROLE_KEYS, STEP_KEYS
from ..model.results import by_position, run_result
from ..model.state import SIMULATED_LABEL, RunModel
from .cells import cells, char_cells
from .lines import Line
from .paint import theme_for
from .style import Theme
from .summary import summary_block

__all__ = ["EXPORT_WIDTH", "ExportError", "export_picture", "html_page", "svg_picture"]

EXPORT_WIDTH = 160
FOREGROUND = "#d0d0d0"
BACKGROUND = "#101010"
_FONT = '"DejaVu Sans Mono", "Liberation Mono", "Noto Sans Mono", Menlo, Consolas, monospace'
# SVG geometry in pixels: a 14 px monospace font, cells 8.4 px wide, rows 17 px high.
_CELL = 8.4
_ROW = 17.0
_BASELINE = 13.0
_PAD = 12.0
_PLOT_MAX = 930  # the widest plot (the timeline), px


class ExportError(Exception):
    """The picture could not be written; one line."""


class _HasFinalLines(Protocol):
    def final_lines(self, width: int) -> list[Line]: ...


@dataclass(frozen=True)
class Box:
    """Text placed at a cell column: `kind` a = ASCII run, g = one glyph, f = a run of
    one repeated narrow glyph (border lines), stretched to fill its cells."""

    column: int
    cells: int
    text: str
    key: str | None
    kind: str


def _visible(text: str, key: str | None, theme: Theme) -> bool:
    return bool(text.strip()) or theme.ink(key).reverse


_SKIN_TONES = ("\U0001f3fb", "\U0001f3ff")
_REGIONAL = ("\U0001f1e6", "\U0001f1ff")


def _draws_with(char: str, width: int, before: str) -> bool:
    """Whether `char` is part of the picture of the text `before` it: a mark (an accent,
    no cell of its own; a spacing vowel sign, Devanagari's, one cell), a skin-tone
    modifier after its emoji, the second regional indicator of a flag."""
    if width == 0 or unicodedata.category(char) == "Mc":
        return True
    if _SKIN_TONES[0] <= char <= _SKIN_TONES[1]:
        return bool(before) and not before.isascii()
    regional = _REGIONAL[0] <= char <= _REGIONAL[1]
    return regional and len(before) == 1 and _REGIONAL[0] <= before <= _REGIONAL[1]


def line_boxes(line: Line, theme: Theme) -> list[Box]:
    """The boxes of one line, left to right, with their cell columns."""
    boxes: list[Box] = []
    column = 0
    for text, key in line:
        index = 0
        while index < len(text):
            char = text[index]
            if char.isascii():
                end = index
                while end < len(text) and text[end].isascii():
                    end += 1
                run = text[index:end]
                if _visible(run, key, theme):
                    # Leading and trailing blanks are no box of their own.
                    stripped = run if theme.ink(key).reverse else run.strip(" ")
                    lead = 0 if theme.ink(key).reverse else len(run) - len(run.lstrip(" "))
                    boxes.append(Box(column + lead, len(stripped), stripped, key, "a"))
                column += len(run)
                index = end
                continue
            width = char_cells(char)
            last_text = boxes[-1].text if boxes else ""
            if _draws_with(char, width, last_text):
                # Drawn with the character before it, in that character's box, so the
                # browser draws them as one picture (as many cells wide as a terminal
                # gives the two) rather than each squeezed into its own cells.
                if boxes and boxes[-1].column + boxes[-1].cells == column:
                    last = boxes[-1]
                    boxes[-1] = Box(last.column, last.cells + width, last.text + char, last.key,
                                    last.kind)  # fmt: skip
                elif width:
                    boxes.append(Box(column, width, char, key, "g"))
                column += width
                index += 1
                continue
            end = index
            while end < len(text) and text[end] == char:
                end += 1
            count = end - index
            if width == 1 and count > 1:
                boxes.append(Box(column, count, char * count, key, "f"))
                column += count
            else:
                for _ in range(count):
                    boxes.append(Box(column, width, char, key, "g"))
                    column += width
            index = end
    return boxes


# --- HTML ------------------------------------------------------------------------------


def _css_classes(theme: Theme) -> str:
    rules = []
    for key in theme.inks:
        ink = theme.ink(key)
        decls = []
        color = theme.css_color(key)
        if ink.reverse:
            decls.append(f"background:{color or FOREGROUND};color:{BACKGROUND}")
        elif color:
            decls.append(f"color:{color}")
        if ink.bold:
            decls.append("font-weight:bold")
        if ink.dim:
            decls.append("opacity:.6")
        if ink.underline:
            decls.append("text-decoration:underline")
        if decls:
            rules.append(f".k-{_class(key)}{{{';'.join(decls)}}}")
    return "\n".join(rules)


def _class(key: str) -> str:
    return key.replace(".", "-")


_FIT_SCRIPT = """
// Squeeze each glyph into its cells where the font draws it wider (or, for a border
// line, stretch it to fill them): nothing may overlap a neighbour or a border.
function phFit() {
  for (const box of document.querySelectorAll(".b.g, .b.f")) {
    const inner = box.firstElementChild;
    inner.style.transform = "";
    const drawn = inner.getBoundingClientRect().width;
    const room = box.clientWidth;
    if (drawn > 0 && (box.classList.contains("f") || drawn > room)) {
      inner.style.transform = "scaleX(" + (room / drawn) + ")";
    }
  }
  document.body.dataset.fitted = "1";
}
if (document.fonts && document.fonts.ready) { document.fonts.ready.then(phFit); } else { phFit(); }
"""


def _html_screen(lines: Sequence[Line], theme: Theme, width: int) -> str:
    rows = []
    for line in lines:
        spans = []
        for box in line_boxes(line, theme):
            classes = ["b"]
            if box.kind != "a":
                classes.append(box.kind)
            if box.key is not None:
                classes.append("k-" + _class(box.key))
            text = html.escape(box.text)
            inner = f"<i>{text}</i>" if box.kind != "a" else text
            spans.append(
                f'<span class="{" ".join(classes)}" style="left:{box.column}ch;'
                f'width:{box.cells}ch">{inner}</span>'
            )
        rows.append(f'<div class="r">{"".join(spans)}</div>')
    return f'<div class="screen" style="width:{width}ch">\n' + "\n".join(rows) + "\n</div>"


def _figure(title: str, svg: str, caption: str) -> str:
    """A plot with its title and caption as page text around it: they wrap to the
    plot's width instead of being clipped at the drawing's edge."""
    return (
        f'<figure class="plot"><figcaption class="pt">{html.escape(title)}</figcaption>'
        f'{svg}<p class="pc">{html.escape(caption)}</p></figure>'
    )


def _bar_chart(title: str, caption: str, labels: list[str], values: list[float | None],
               value_text: list[str], color: str) -> str:  # fmt: skip
    width, height, left, top, bottom = 520.0, 200.0, 10.0, 18.0, 20.0
    plot_height = height - top - bottom
    peak = max([v for v in values if v is not None] or [0.0]) or 1.0
    slot = (width - 2 * left) / max(1, len(values))
    parts = [
        f'<svg width="{width:.0f}" height="{height:.0f}" role="img" '
        f'aria-label="{html.escape(title)}">',
        f'<line x1="{left}" y1="{top + plot_height}" x2="{width - left}" '
        f'y2="{top + plot_height}" class="ax"/>',
    ]
    for index, (label, value, shown) in enumerate(zip(labels, values, value_text, strict=True)):
        x = left + index * slot + slot * 0.15
        bar_width = slot * 0.7
        middle = x + bar_width / 2
        if value is not None:
            bar = plot_height * value / peak
            parts.append(
                f'<rect x="{x:.1f}" y="{top + plot_height - bar:.1f}" width="{bar_width:.1f}" '
                f'height="{bar:.1f}" fill="{color}"/>'
            )
            parts.append(
                f'<text x="{middle:.1f}" y="{top + plot_height - bar - 4:.1f}" class="pv" '
                f'text-anchor="middle">{html.escape(shown)}</text>'
            )
        parts.append(
            f'<text x="{middle:.1f}" y="{height - 5:.1f}" class="pl" '
            f'text-anchor="middle">{html.escape(label)}</text>'
        )
    parts.append("</svg>")
    return _figure(title, "".join(parts), caption)


def _histogram_plot(model: RunModel, color: str) -> str:
    hist = {int(k): int(v) for k, v in (model.totals.get("hist") or {}).items()}
    if not hist:
        return '<p class="nodata">Tokens per step: no step of this run was proven.</p>'
    keys = list(range(1, max(hist) + 1))
    values: list[float | None] = [float(hist.get(k, 0)) for k in keys]
    return _bar_chart(
        "Tokens per step (steps)",
        "how many verified engine steps (bar height) confirmed 1, 2, … tokens each (below), "
        "from this run's frames",
        [str(k) for k in keys],
        values,
        [str(hist.get(k, 0)) for k in keys],
        color,
    )


def _position_plot(model: RunModel, color: str) -> str:
    rates = by_position(model.totals) if model.mode != "chunk" else None
    if not rates:
        return (
            '<p class="nodata">Acceptance per draft position: not reported (no drafts '
            "proven, or a reconciler without per-position counts).</p>"
        )
    return _bar_chart(
        "Acceptance per draft position",
        "accepted / drafted at each position 1..K, from this run's frames",
        [str(i + 1) for i in range(len(rates))],
        [None if r is None else r * 100 for r in rates],
        ["-" if r is None else f"{r * 100:.0f}%" for r in rates],
        color,
    )


def _tick_step(span: float) -> float:
    """A round step (1, 2 or 5 times a power of ten) giving 4 to 10 ticks over `span`."""
    step: float = 10.0 ** math.floor(math.log10(max(span, 1e-6) / 10))
    for factor in (1, 2, 5, 10, 20, 50):
        if span / (step * factor) <= 10:
            return step * factor
    return step * 100


def _time_axis(left: float, width: float, y: float, span: float) -> list[str]:
    """A time axis under the timeline: a tick and a label in seconds at round values."""
    step = _tick_step(span)
    digits = max(0, -math.floor(math.log10(step))) if step < 1 else 0
    parts = [f'<line x1="{left}" y1="{y:.1f}" x2="{left + width}" y2="{y:.1f}" class="ax"/>']
    count = int(span / step + 1e-9)
    for number in range(count + 1):
        at = number * step
        x = left + width * at / span
        parts.append(f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x:.1f}" y2="{y + 4:.1f}" class="ax"/>')
        parts.append(
            f'<text x="{x:.1f}" y="{y + 15:.1f}" class="pl" text-anchor="middle">'
            f"{at:.{digits}f} s</text>"
        )
    return parts


def _timeline_plot(model: RunModel, theme: Theme) -> str:
    streams = model.streams
    starts = [s.started_at for s in streams if s.started_at is not None]
    if not starts:
        return ""
    origin = min(starts)
    wall = model.wall_seconds or 0.0
    span = max(wall, 1e-3)
    left, width, row, top = 44.0, 860.0, 12.0, 4.0
    # --requests: a row per stream, its requests one after another (a tick where each starts).
    queueing = model.queueing and model.concurrency is not None
    rows = model.concurrency if queueing and model.concurrency is not None else len(streams)
    axis = top + row * rows + 2
    height = axis + 22
    title = "Steps over time, per stream" + (
        f" ({len(streams)} requests on {rows} streams)" if queueing else ""
    )
    parts = [
        f'<svg width="{left + width + 24:.0f}" height="{height:.0f}" role="img" '
        f'aria-label="{html.escape(title)}">',
    ]
    if queueing:
        for number in range(rows):
            y = top + number * row
            parts.append(f'<text x="0" y="{y + row - 2:.1f}" class="pl">s{number}</text>')
    for index, stream in enumerate(streams):
        if queueing:
            if stream.slot is None or stream.started_at is None:
                continue  # never sent
            y = top + stream.slot * row
            x = left + width * (stream.started_at - origin) / span
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="1" height="{row - 2:.1f}" '
                f'fill="{FOREGROUND}" opacity="0.5"/>'
            )
        else:
            y = top + index * row
            parts.append(f'<text x="0" y="{y + row - 2:.1f}" class="pl">#{stream.index}</text>')
        marks = stream.step_marks()
        if stream.shows_chunks or not marks:
            for number, at in enumerate(stream.chunk_arrivals()):
                key = CHUNK_KEYS[number % len(CHUNK_KEYS)] if model.colorize else None
                color = theme.css_color(key) or "#808080"
                x = left + width * (at - origin) / span
                parts.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="1.5" height="{row - 2:.1f}" '
                    f'fill="{color}"/>'
                )
            continue
        for at, step, role, _chars in marks:
            if model.color_by == "role":
                key = ROLE_KEYS[role] if role is not None and 0 <= role < 4 else None
            else:
                key = STEP_KEYS[step % len(STEP_KEYS)] if step is not None else None
            color = (theme.css_color(key) if model.colorize else None) or FOREGROUND
            x = left + width * (at - origin) / span
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="2" height="{row - 2:.1f}" fill="{color}"/>'
            )
    parts += _time_axis(left, width, axis, span)
    parts.append("</svg>")
    caption = (
        "time since the first request (client clock, SSE arrival); each mark is a proven "
        "span, colored by its step, at the arrival of its first byte; gray marks are SSE "
        "chunks without proof"
    )
    return _figure(title, "".join(parts), caption)


def html_page(lines: Sequence[Line], model: RunModel, width: int) -> str:
    theme = theme_for(model)
    title = _title(model)
    # Bars in the palette's bonus and accepted colors: no step color means anything here.
    plots = [
        _histogram_plot(model, theme.css_color("role.bonus") or FOREGROUND),
        _position_plot(model, theme.css_color("role.accepted") or FOREGROUND),
        _timeline_plot(model, theme),
    ]
    total = run_result(model)
    facts = html.escape(
        (
            f"{total['requests']} requests on {total['concurrency']} streams"
            if model.queueing
            else f"{total['streams']} streams"
        )
        + f" · {total['tokens']} tokens · mode {model.mode}"
        + (f" · {SIMULATED_LABEL}: simulated numbers" if model.is_simulated else "")
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="color-scheme" content="dark">
<title>{html.escape(title)}</title>
<style>
body{{margin:0;padding:16px;background:{BACKGROUND};color:{FOREGROUND};font:14px/1 {_FONT}}}
h1{{font-size:15px;margin:0 0 12px 0}}
.screen{{position:relative}}
.r{{position:relative;height:1.2em}}
.b{{position:absolute;top:0;height:1.2em;line-height:1.2em;overflow:hidden;white-space:pre;
direction:ltr;unicode-bidi:isolate;text-align:left}}
.b.g{{text-align:center}}
.b>i{{display:inline-block;width:max-content;font-style:normal;white-space:pre;
transform-origin:left center}}
{_css_classes(theme)}
.plots{{display:flex;flex-wrap:wrap;gap:24px;margin-top:24px;font-family:sans-serif}}
.plot{{margin:0;max-width:min(100%,{_PLOT_MAX}px)}}
.plot svg{{display:block;overflow:visible}}
.plot text{{fill:{FOREGROUND};font:12px sans-serif}}
.plot .pl{{font-size:10px}}
.plot .pt{{font:bold 13px sans-serif;margin:0 0 6px 0}}
.plot .pc{{color:#a8a8a8;font:11px/1.3 sans-serif;margin:4px 0 0 0}}
.plot .ax{{stroke:#808080}}
.nodata{{color:#909090;font:12px sans-serif}}
</style></head>
<body>
<h1>{html.escape(title)} <span style="font-weight:normal">· {facts}</span></h1>
{_html_screen(lines, theme, width)}
<div class="plots">
{"".join(plots)}
</div>
<script>{_FIT_SCRIPT}</script>
</body></html>
"""


# --- SVG -------------------------------------------------------------------------------


def svg_picture(lines: Sequence[Line], model: RunModel, width: int) -> str:
    theme = theme_for(model)
    title = _title(model)
    total_width = width * _CELL + 2 * _PAD
    total_height = len(lines) * _ROW + 2 * _PAD
    body = []
    for row, line in enumerate(lines):
        y = _PAD + row * _ROW
        for box in line_boxes(line, theme):
            x = _PAD + box.column * _CELL
            length = box.cells * _CELL
            ink = theme.ink(box.key)
            color = theme.css_color(box.key)
            if ink.reverse:
                body.append(
                    f'<rect x="{x:.1f}" y="{y:.1f}" width="{length:.1f}" height="{_ROW:.1f}" '
                    f'fill="{color or FOREGROUND}"/>'
                )
            # Inline styles: the stylesheet's `text` rule would beat presentation attributes.
            style = []
            fill = BACKGROUND if ink.reverse else color
            if fill:
                style.append(f"fill:{fill}")
            if ink.bold:
                style.append("font-weight:bold")
            if ink.dim:
                style.append("opacity:.6")
            if ink.underline:
                style.append("text-decoration:underline")
            attrs = [
                f'x="{x:.1f}"',
                f'y="{y + _BASELINE:.1f}"',
                f'textLength="{length:.1f}"',
                'lengthAdjust="spacingAndGlyphs"',
            ]
            if style:
                attrs.append(f'style="{";".join(style)}"')
            body.append(f"<text {' '.join(attrs)}>{html.escape(box.text)}</text>")
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_width:.0f}" '
        f'height="{total_height:.0f}" viewBox="0 0 {total_width:.0f} {total_height:.0f}">\n'
        f"<title>{html.escape(title)}</title>\n"
        f"<style>text{{font:14px {html.escape(_FONT)};white-space:pre;fill:{FOREGROUND};"
        "direction:ltr;unicode-bidi:isolate}</style>\n"
        f'<rect width="100%" height="100%" rx="6" fill="{BACKGROUND}"/>\n'
        + "\n".join(body)
        + "\n</svg>\n"
    )


def _title(model: RunModel) -> str:
    title = "ParallelHue"
    if model.replay_of is not None:
        title += " replay"
    if model.is_simulated:
        title += f" ({SIMULATED_LABEL})"
    return title


def export_picture(path: str, model: RunModel, view: _HasFinalLines) -> None:
    """The view's final picture and the summary into an SVG or HTML file."""
    lines = [*view.final_lines(EXPORT_WIDTH), [], *summary_block(model, EXPORT_WIDTH)]
    width = max([EXPORT_WIDTH, *(sum(cells(t) for t, _ in line) for line in lines)])
    if path.lower().endswith(".svg"):
        content = svg_picture(lines, model, width)
    else:
        content = html_page(lines, model, width)
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(content)
    except OSError as error:
        raise ExportError(f"--export: cannot write {path}: {error.strerror}") from None
