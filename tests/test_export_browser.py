"""--export in a real headless Chromium: a screenshot, and a DOM check that no text box
overlaps another or a pane border, with CJK, emoji, Arabic/Hebrew and combining marks.

Chromium is the Debian package `chromium` (.ci/apt-packages); CI fails when it is missing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from parallelhue.model.backend import Backend
from parallelhue.model.state import RunModel, StreamState
from parallelhue.screen.export import export_picture
from parallelhue.screen.views import GridView

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None and os.environ.get("CI"):
    raise RuntimeError("CI needs chromium (.ci/apt-packages) for the export tests")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed")

HARD_TEXTS = [
    "Plain ASCII text that wraps over a few lines of the pane, step by step. ",
    "日本語のテキスト\uff1a投機的デコーディング。中文\uff1a推测解码。한국어: 빠른 토큰. ",
    "Emoji 🚀✨🎉 families 👩💻 flags 🇯🇵🇫🇷 hearts 💚💙💛 and skin 👍🏽. ",
    "عربي: رموز مقبولة ومرفوضة. עברית: אסימונים. mixed العربية and English. ",
    "Combining: é à ö ñ e\u0301 a\u0308 Tiếng Việt có dấu; Devanagari हिन्दी टोकन। ",
]

# Reads the layout once the page has fitted its glyphs; writes what it found into #ph-result.
_CHECK = """
<pre id="ph-result"></pre>
<script>
function phCheck() {
  const problems = [];
  let boxes = 0;
  const rows = [...document.querySelectorAll(".screen .r")];
  let previousBottom = -Infinity;
  rows.forEach((row, index) => {
    const rowRect = row.getBoundingClientRect();
    if (rowRect.top < previousBottom - 0.01) problems.push(`row ${index} overlaps the row above`);
    previousBottom = rowRect.bottom;
    const spans = [...row.children]
      .map((box) => ({ box, rect: box.getBoundingClientRect() }))
      .sort((a, b) => a.rect.left - b.rect.left);
    let previousRight = -Infinity;
    for (const { box, rect } of spans) {
      boxes += 1;
      if (rect.left < previousRight - 0.01)
        problems.push(`row ${index}: "${box.textContent}" overlaps its left neighbour`);
      previousRight = rect.right;
      if (rect.top < rowRect.top - 0.01 || rect.bottom > rowRect.bottom + 0.01)
        problems.push(`row ${index}: "${box.textContent}" leaves its row`);
      const range = document.createRange();
      range.selectNodeContents(box);
      for (const drawn of range.getClientRects()) {
        if (drawn.width > 0 && (drawn.left < rect.left - 0.5 || drawn.right > rect.right + 0.5))
          problems.push(`row ${index}: "${box.textContent}" is drawn outside its cells`);
      }
    }
  });
  // No glyph is squeezed out of shape into its cells (issue 26, 14: a flag's letters or
  // a skin tone drawn alone, as narrow colored bars).
  for (const box of document.querySelectorAll(".screen .b.g")) {
    const squeeze = /scaleX\\(([0-9.e-]+)\\)/.exec(box.firstElementChild.style.transform || "");
    if (squeeze && parseFloat(squeeze[1]) < 0.6)
      problems.push(`"${box.textContent}" squeezed to ${squeeze[1]} of its width`);
  }
  // Pane borders stand in columns (issue 26, 14: stray bars inside a pane on emoji
  // rows): every vertical border at the x of a corner above or below it.
  const corners = new Set();
  const verticals = [];
  for (const box of document.querySelectorAll(".screen .b")) {
    const x = Math.round(box.getBoundingClientRect().left * 2) / 2;
    if ("┌┐└┘┏┓┗┛".includes(box.textContent)) corners.add(x);
    if ("│┃".includes(box.textContent) && box.textContent) verticals.push([x, box]);
  }
  for (const [x, box] of verticals)
    if (!corners.has(x))
      problems.push(`a border at x=${x} under no corner: ${box.parentElement.textContent}`);
  document.getElementById("ph-result").textContent = JSON.stringify(
    { boxes, rows: rows.length, verticals: verticals.length,
      problems: problems.slice(0, 20), count: problems.length });
}
function phWait() { if (document.body.dataset.fitted) phCheck(); else setTimeout(phWait, 20); }
phWait();
</script>
"""

_SVG_CHECK = """
<pre id="ph-result"></pre>
<script>
// Where the glyphs are placed (their advances, as SVG lays them out): each text element
// must stay within the cells it was given, and so never reach into its neighbour's.
function phCheck() {
  const problems = [];
  let boxes = 0;
  const rows = new Set();
  for (const text of document.querySelectorAll("svg text")) {
    const count = text.getNumberOfChars();
    if (!count) continue;
    boxes += 1;
    rows.add(text.getAttribute("y"));
    const x = parseFloat(text.getAttribute("x"));
    const length = parseFloat(text.getAttribute("textLength"));
    const start = text.getStartPositionOfChar(0).x;
    const end = text.getEndPositionOfChar(count - 1).x;
    if (Math.min(start, end) < x - 0.5 || Math.max(start, end) > x + length + 0.5)
      problems.push(`"${text.textContent}" at y=${text.getAttribute("y")} leaves its cells`);
  }
  const cells = new Map();
  for (const text of document.querySelectorAll("svg text")) {
    const y = text.getAttribute("y");
    const x = parseFloat(text.getAttribute("x"));
    const length = parseFloat(text.getAttribute("textLength"));
    if (!cells.has(y)) cells.set(y, []);
    cells.get(y).push([x, x + length, text.textContent]);
  }
  for (const [y, spans] of cells) {
    spans.sort((a, b) => a[0] - b[0]);
    for (let i = 1; i < spans.length; i++)
      if (spans[i][0] < spans[i - 1][1] - 0.01)
        problems.push(`"${spans[i][2]}" at y=${y} overlaps "${spans[i - 1][2]}"`);
  }
  document.getElementById("ph-result").textContent = JSON.stringify(
    { boxes, rows: rows.size, problems: problems.slice(0, 20), count: problems.length });
}
setTimeout(phCheck, 200);
</script>
"""


_PLOT_CHECK = """
<pre id="ph-result"></pre>
<script>
// Every label of every plot inside its drawing (nothing clipped at an edge), every
// title and caption on the page, and the timeline's time axis: ticks in seconds, left
// to right, starting at 0 s.
function phCheck() {
  const problems = [];
  const figures = [...document.querySelectorAll("figure.plot")];
  for (const figure of figures) {
    const svg = figure.querySelector("svg").getBoundingClientRect();
    for (const text of figure.querySelectorAll("svg text")) {
      const box = text.getBoundingClientRect();
      if (box.left < svg.left - 0.5 || box.right > svg.right + 0.5 ||
          box.top < svg.top - 0.5 || box.bottom > svg.bottom + 0.5)
        problems.push(`"${text.textContent}" is clipped by its plot's edge`);
    }
    for (const caption of figure.querySelectorAll(".pt, .pc")) {
      const box = caption.getBoundingClientRect();
      if (!caption.textContent.trim() || box.width <= 0 || box.height <= 0)
        problems.push(`a caption of "${figure.textContent.slice(0, 30)}" is not shown`);
    }
  }
  const timeline = figures.find((f) => f.textContent.startsWith("Steps over time"));
  const ticks = timeline ? [...timeline.querySelectorAll("svg text")]
    .filter((t) => /^[0-9.]+ s$/.test(t.textContent))
    .map((t) => [t.getBoundingClientRect().left, parseFloat(t.textContent)]) : [];
  for (let i = 1; i < ticks.length; i++)
    if (!(ticks[i][0] > ticks[i - 1][0] && ticks[i][1] > ticks[i - 1][1]))
      problems.push(`time ticks out of order at ${ticks[i][1]} s`);
  document.getElementById("ph-result").textContent = JSON.stringify({
    figures: figures.length, ticks: ticks.map((t) => t[1]),
    problems: problems.slice(0, 20), count: problems.length });
}
setTimeout(phCheck, 200);
</script>
"""


def hard_model(count: int = 8) -> RunModel:
    streams = []
    for index in range(count):
        stream = StreamState(index=index, mode="exact")
        stream.started_at = 0.0
        offset = 0
        for step, text in enumerate(HARD_TEXTS[index % 5 :] + HARD_TEXTS[: index % 5]):
            stream.add_delta(text, [1] * 4, 0.05 * (step + 1))
            # Alternate proven steps and a mixed span, as the reconciler reports them.
            stream.add_span(offset, text, None if step == 2 else step + index, (step % 3) + 1)
            offset += len(text.encode())
        stream.verdict = "exact"
        stream.stats = {
            "tokens": 20, "steps": 8, "hist": {1: 2, 2: 2, 3: 4}, "drafts_scheduled": 24,
            "drafts_padded": 0, "accepted": 10, "target": 6, "bonus": 4, "plain": 0,
        }  # fmt: skip
        streams.append(stream)
    streams[3].verdict = "failed"
    streams[3].reason = "byte mismatch at offset 40: SSE 'عربي' vs frames 'עברית'"
    model = RunModel(streams, "exact", Backend("ngram", True, "plugin hello: test"), False)
    model.totals = {
        "tokens": 20 * count, "steps": 8 * count,
        "hist": {1: 2 * count, 2: 2 * count, 3: 4 * count},
        "drafts_scheduled": 24 * count, "drafts_padded": 0, "accepted": 10 * count,
        "drafts_by_pos": [8 * count, 8 * count, 8 * count],
        "accepted_by_pos": [6 * count, 3 * count, 1 * count],
    }  # fmt: skip
    return model


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=10000", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )  # fmt: skip


def dom_check(page: str) -> dict[str, object]:
    return chromium_dom(page, None)


def chromium_dom(page: str, size: str | None) -> dict[str, object]:
    window = [f"--window-size={size}"] if size else []
    result = chromium(*window, "--dump-dom", "file://" + page)
    match = re.search(r'<pre id="ph-result">(.*?)</pre>', result.stdout, re.S)
    assert match is not None and match.group(1), result.stderr[-2000:]
    data = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert isinstance(data, dict)
    return data


def screenshot(page: str, png: str, size: str) -> None:
    chromium(f"--window-size={size}", f"--screenshot={png}", "file://" + page)
    assert os.path.getsize(png) > 10_000  # a real picture, not an empty page


def test_html_export_places_every_glyph_in_its_cells(tmp_path: pytest.TempPathFactory) -> None:
    model = hard_model()
    page = os.path.join(str(tmp_path), "run.html")
    export_picture(page, model, GridView(model, _console()))
    with open(page, encoding="utf-8") as handle:
        content = handle.read()
    # Self-contained and dark like a terminal.
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", content)
    assert "background:#101010" in content
    assert 'class="plot"' in content and "Acceptance per draft position" in content
    assert "Steps over time, per stream" in content and "Tokens per step" in content
    checked = os.path.join(str(tmp_path), "checked.html")
    with open(checked, "w", encoding="utf-8") as handle:
        handle.write(content.replace("</body>", _CHECK + "</body>"))
    result = dom_check(checked)
    assert result["count"] == 0, result["problems"]
    assert int(str(result["boxes"])) > 500 and int(str(result["rows"])) > 30
    assert int(str(result["verticals"])) > 100
    screenshot(page, os.path.join(str(tmp_path), "run-html.png"), "1500,1900")


@pytest.mark.parametrize("size", ["1500,1900", "700,1900"])
def test_html_plots_keep_their_labels_and_the_timeline_has_a_time_axis(
    tmp_path: pytest.TempPathFactory, size: str
) -> None:
    """Issue 26, 30: captions were clipped at the plots' bottom edge and the timeline
    had no time axis; at a narrow window too, where the plots wrap."""
    model = hard_model()
    for index, stream in enumerate(model.streams):
        stream.started_at = 0.01 * index
    page = os.path.join(str(tmp_path), "run.html")
    export_picture(page, model, GridView(model, _console()))
    with open(page, encoding="utf-8") as handle:
        content = handle.read()
    checked = os.path.join(str(tmp_path), "plots.html")
    with open(checked, "w", encoding="utf-8") as handle:
        handle.write(content.replace("</body>", _PLOT_CHECK + "</body>"))
    result = chromium_dom(checked, size)
    assert result["count"] == 0, result["problems"]
    assert result["figures"] == 3
    ticks = result["ticks"]
    assert isinstance(ticks, list) and len(ticks) >= 4 and ticks[0] == 0.0, ticks


def test_svg_export_places_every_glyph_in_its_cells(tmp_path: pytest.TempPathFactory) -> None:
    model = hard_model()
    svg = os.path.join(str(tmp_path), "run.svg")
    export_picture(svg, model, GridView(model, _console()))
    with open(svg, encoding="utf-8") as handle:
        content = handle.read()
    assert content.startswith("<svg") and 'lengthAdjust="spacingAndGlyphs"' in content
    # Step colors as inline fills (a stylesheet rule would hide presentation attributes).
    assert "fill:#00ff00" in content and "fill:#ff0000" in content
    wrapper = os.path.join(str(tmp_path), "svg.html")
    with open(wrapper, "w", encoding="utf-8") as handle:
        handle.write(f"<!DOCTYPE html><html><body>{content}{_SVG_CHECK}</body></html>")
    result = dom_check(wrapper)
    assert result["count"] == 0, result["problems"]
    assert int(str(result["boxes"])) > 500
    screenshot(svg, os.path.join(str(tmp_path), "run-svg.png"), "1400,1000")


def test_export_without_a_terminal_keeps_step_colors(tmp_path: pytest.TempPathFactory) -> None:
    # Defect 4: an export made with stdout redirected (`> log`) had no step colors.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARALLELHUE_", "NO_COLOR"))}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "python")
    env["PARALLELHUE_SOCKET_DIR"] = str(tmp_path)
    svg = os.path.join(str(tmp_path), "demo.svg")
    result = subprocess.run(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "3", "--max-tokens", "30",
         "--step-ms", "1", "--export", svg],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "\x1b[" not in result.stdout  # the log itself has no escape codes
    with open(svg, encoding="utf-8") as handle:
        content = handle.read()
    fills = set(re.findall(r"fill:(#[0-9a-f]{6})", content))
    assert {"#00ff00", "#ff0000", "#0087ff", "#ffff00"} <= fills  # the four step colors
    assert "SIMULATED ENGINE" in content


def _console() -> object:
    import io

    from rich.console import Console

    return Console(file=io.StringIO(), width=160)
