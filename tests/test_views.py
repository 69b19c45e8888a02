"""The pane model and its painters: coloring rule, labels, layout, summary table, plain output."""

from __future__ import annotations

import io
import re
import struct
import unicodedata

from rich.cells import cell_len
from rich.console import Console

from parallelhue.ingest.feed import Feed
from parallelhue.model.backend import Backend
from parallelhue.model.labels import LABEL_CHUNK, LABEL_EXACT, LABEL_VERIFYING
from parallelhue.model.state import RunModel, StreamState
from parallelhue.screen.focus import GridUi
from parallelhue.screen.grid import final_grid, grid_layout, grid_screen
from parallelhue.screen.legend import legend_line, legend_lines
from parallelhue.screen.lines import fit, line_text, line_width, tail_fit, wrap
from parallelhue.screen.paint import ansi_line, plain_lines, rich_text
from parallelhue.screen.pane import box_pane, pane_data
from parallelhue.screen.stream import stream_screen
from parallelhue.screen.style import Theme
from parallelhue.screen.summary import summary_block, summary_lines
from parallelhue.screen.views import make_console
from terminal_width import terminal_width

SPECULATIVE = Backend("ngram", True, "plugin hello")
GENERIC = Backend("generic", False, "no plugin hello; no /metrics")
THEME = Theme()
_ANSI_COLOR = re.compile(r"\x1b\[(?:[0-9;]*;)?38;5;(\d+)m([^\x1b]*)")
_SGR = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")


def colored_pieces(text: str) -> list[tuple[int, str]]:
    return [(int(code), piece) for code, piece in _ANSI_COLOR.findall(text)]


def render(text: object, width: int = 120, no_color: bool = False) -> str:
    """What Rich writes for `text` on a 256-color terminal (the Rich painter's output)."""
    console = Console(
        file=io.StringIO(),
        width=width,
        force_terminal=True,
        color_system="256",
        no_color=no_color,
        highlight=False,
        markup=False,
    )
    console.print(text)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


def painted(segments: list[tuple[str, str | None]], theme: Theme = THEME) -> str:
    return render(rich_text([list(segments)], theme))


def exact_stream(mode: str = "auto") -> StreamState:
    stream = StreamState(index=0, mode=mode)
    for text in ("Hel", "lo w", "orld", "!!"):
        stream.add_delta(text, [1], 0.0)
    # Steps 0..4; "lo w" is a mixed span (two steps), so it stays uncolored.
    stream.add_span(0, "Hel", 0, 1)
    stream.add_span(3, "lo w", None, None)
    stream.add_span(7, "orld", 1, 2)
    return stream


def model_of(streams: list[StreamState], mode: str = "auto", **kwargs: object) -> RunModel:
    backend = kwargs.pop("backend", SPECULATIVE)
    return RunModel(streams, mode, backend, no_color=bool(kwargs.pop("no_color", False)), **kwargs)  # type: ignore[arg-type]


def test_proven_spans_are_colored_by_step_and_mixed_spans_are_not() -> None:
    stream = exact_stream()
    segments = stream.segments(colorize=True)
    assert segments == [
        ("Hel", "step.0"),
        ("lo w", "mixed"),
        ("orld", "step.1"),
        ("!!", "unproven"),
    ]
    output = painted(segments)
    assert colored_pieces(output) == [(46, "Hel"), (196, "orld")]
    assert "\x1b[4mlo w" in output  # mixed: underlined, no color
    assert stream.label == LABEL_VERIFYING


def test_step_colors_cycle_through_the_palette() -> None:
    stream = StreamState(index=0, mode="auto")
    for step in range(6):
        stream.add_delta(str(step), [step], 0.0)
        stream.add_span(step, str(step), step)
    output = painted(stream.segments(colorize=True))
    assert colored_pieces(output) == [
        (46, "0"),
        (196, "1"),
        (33, "2"),
        (226, "3"),
        (46, "4"),
        (196, "5"),
    ]
    # The color-blind-safe palette (Okabe-Ito) cycles the same way in its own colors.
    output = painted(stream.segments(colorize=True), Theme("colorblind"))
    assert [code for code, _ in colored_pieces(output)] == [214, 74, 227, 175, 214, 74]


def test_role_colors_follow_the_span_role_and_mixed_roles_stay_uncolored() -> None:
    stream = exact_stream()
    stream.add_span(11, "!!", 2, 3)
    assert stream.segments(True, "role") == [
        ("Hel", "role.accepted"),
        ("lo w", "mixed"),
        ("orld", "role.target"),
        ("!!", "role.bonus"),
    ]
    assert colored_pieces(painted(stream.segments(True, "role"))) == [
        (46, "Hel"),
        (203, "orld"),
        (39, "!!"),
    ]
    # A role-less span is never guessed: from a reconciler that reports roles (contract
    # C2's 8th element) it holds tokens of two roles ("mixed"); from one that reports
    # none (7-element events, role 0xFF packed) no role is proven ("unproven", dim).
    legacy = StreamState(index=0, mode="exact")
    legacy.add_delta("ab", [1], 0.0)
    legacy.add_span(0, "ab", 4)
    assert legacy.segments(True, "role") == [("ab", "mixed")]
    assert legacy.segments(True, "role", roles_known=False) == [("ab", "unproven")]
    assert not legacy.has_roles and stream.has_roles


def _role_model(events: list[tuple[object, ...]]) -> RunModel:
    stream = StreamState(index=0, mode="exact")
    stream.add_delta("abcd", [1, 2], 0.0)
    model = RunModel(
        streams=[stream], mode="exact", backend=Backend("ngram", True, "x"), no_color=False,
        color_by="role",
    )  # fmt: skip
    Feed(model, timeout=1.0).events(events)  # type: ignore[arg-type]
    return model


def test_role_colors_read_the_span_events_8th_element_and_say_unproven_without_it() -> None:
    # Contract C2's span: ("span", stream, byte_start, text, step, first, n_tokens, role).
    c2 = _role_model([("span", 0, 0, "ab", 0, 0, 1, 1), ("span", 0, 2, "cd", 1, 1, 1, None)])
    assert c2.roles_known
    segments = c2.streams[0].tail_segments(True, None, "role", roles_known=c2.roles_known)
    assert segments == [("ab", "role.accepted"), ("cd", "mixed")]
    assert "underlined: tokens of two roles" in line_text(legend_line(c2, None))
    # Before C2: 7 elements, no role anywhere: every span is unproven, the legend says so.
    old = _role_model([("span", 0, 0, "ab", 0, 0, 1), ("span", 0, 2, "cd", 1, 1, 1)])
    assert not old.roles_known
    segments = old.streams[0].tail_segments(True, None, "role", roles_known=old.roles_known)
    assert segments == [("ab", "unproven"), ("cd", "unproven")]
    legend = line_text(legend_line(old, None))
    assert "dim: no role proven" in legend and "two roles" not in legend
    pane = pane_data(old.streams[0], old, None)
    assert [key for _text, key in pane.body] == ["unproven", "unproven"]
    # The Rust path's packed spans: a role code other than 0xFF proves roles are reported.
    packed = StreamState(index=0, mode="exact")
    packed.add_delta("ab", [1], 0.0)
    packed.add_span_runs(struct.pack("<QQ", 2, 0 | 0xFF << 32))
    assert not packed.has_roles
    packed.add_span_runs(struct.pack("<QQ", 2, 0 | 3 << 32))
    assert packed.has_roles


def test_exact_mode_shows_only_proven_text() -> None:
    stream = exact_stream(mode="exact")
    assert "".join(text for text, _ in stream.segments(colorize=True)) == "Hello world"
    stream.verdict = "exact"
    assert stream.label == LABEL_EXACT


def test_auto_downgrade_switches_to_chunk_colors_with_reason() -> None:
    stream = exact_stream()
    stream.verdict = "failed"
    stream.reason = "frames lost: gap in source 00000000000000ab at seq 7"
    assert stream.label == LABEL_CHUNK
    assert stream.note == "downgraded: frames lost: gap in source 00000000000000ab at seq 7"
    output = painted(stream.segments(colorize=True))
    assert colored_pieces(output) == [(46, "Hel"), (196, "lo w"), (33, "orld"), (226, "!!")]


def test_no_color_and_generic_backends_are_monochrome() -> None:
    for backend, no_color in ((SPECULATIVE, True), (GENERIC, False)):
        model = model_of([exact_stream()], backend=backend, no_color=no_color)
        assert not model.colorize
        output = painted(model.streams[0].segments(model.colorize))
        assert "\x1b[38;5;" not in output
        assert "Hello world!!" in output


def test_plain_console_writes_no_ansi() -> None:
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    model = model_of([exact_stream()])
    console.print(rich_text([model.streams[0].segments(True)], THEME))
    assert "\x1b" not in console.file.getvalue()


def test_both_painters_paint_the_same_lines() -> None:
    # One model, two painters: the live grid's ANSI text and Rich's rendering of the
    # same lines hold the same characters and the same colored pieces.
    streams = [exact_stream() for _ in range(3)]
    for index, stream in enumerate(streams):
        stream.index = index
        stream.add_delta(" 日本語 عربي", [5], 0.0)
    model = model_of(streams)
    lines = grid_screen(model, 120, 20)
    ansi = "\n".join(ansi_line(line, THEME) for line in lines)
    rich = render(rich_text(lines, THEME), width=120)
    assert _SGR.sub("", ansi) == _SGR.sub("", rich).rstrip("\n")
    assert colored_pieces(ansi) == colored_pieces(rich)
    assert "\n".join(plain_lines(lines)) == _SGR.sub("", ansi)


def test_grid_has_64_fixed_size_panes_with_headers() -> None:
    streams = []
    for index in range(64):
        stream = StreamState(index=index, mode="chunk")
        stream.add_delta("word " * (index * 7), [1] * index, 0.0)
        streams.append(stream)
    model = model_of(streams, "chunk", backend=GENERIC, no_color=True)
    # 90 rows: banner, legend and status around an 87-row body.
    columns, pane_width, pane_height = grid_layout(64, 240, 87)
    assert (columns, pane_width, pane_height) == (6, 40, 7)
    lines = grid_screen(model, 240, 90)
    text = plain_lines(lines)
    assert len(lines) == 90
    assert all(line_width(line) == 240 for line in lines)
    for index in range(64):
        assert sum(f"#{index} SSE CHUNK MODE" in row for row in text) == 1
        assert any(f"{index} tok - st - t/st acc -" in row for row in text)
    # Ten full rows of six panes, then a last row of four (two pane widths of spaces).
    assert text[2 + 10 * pane_height].startswith("┌" + "─" * 38 + "┐")
    assert text[2 + 10 * pane_height][4 * pane_width :] == " " * (240 - 4 * pane_width)
    assert text[-1].startswith("streams SSE CHUNK MODE: 64")


def test_all_64_streams_are_visible_at_200x50() -> None:
    streams = []
    for index in range(64):
        stream = exact_stream()
        stream.index = index
        stream.stats = {"tokens": 30, "steps": 10, "drafts_scheduled": 40, "accepted": 20}
        streams.append(stream)
    model = model_of(streams)
    lines = grid_screen(model, 200, 50)
    text = plain_lines(lines)
    assert len(lines) == 50 and all(line_width(line) == 200 for line in lines)
    visible = [int(n) for n in re.findall(r"#(\d+)", "\n".join(text))]
    assert sorted(visible) == list(range(64))  # each stream once: a pane or an overview line
    panes = [n for row in text for n in re.findall(r"│#(\d+) VERIFYING", row)]
    overview = [n for row in text for n in re.findall(r" #(\d+) +VERIFY +3\.00 +50% ", row)]
    assert len(panes) >= 10 and len(panes) + len(overview) == 64
    assert "hidden" not in text[-1]


def test_80x24_shows_panes_overview_lines_and_what_is_hidden() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(64)]
    model = model_of(streams, "chunk", backend=GENERIC, no_color=True)
    text = plain_lines(grid_screen(model, 80, 24))
    assert len(text) == 24
    visible = sorted(int(n) for n in re.findall(r"#(\d+)", "\n".join(text)))
    assert visible == list(range(len(visible))) and 30 <= len(visible) < 64
    # The status wraps onto a second line rather than cutting what is hidden and why
    # (issue 26, 7); it labels by the short names when the long ones take a third.
    assert text[-2].rstrip() == (
        f"{64 - len(visible)} of 64 streams hidden: enlarge the terminal, move the focus or "
        "use --tmux"
    )
    assert text[-1].rstrip() == "streams SSE CHUNK MODE: 64"
    assert all(terminal_width(line) == 80 for line in text)
    # Moving the focus past the visible overview lines scrolls them to it.
    ui = GridUi(focus=63, keys=True)
    text = plain_lines(grid_screen(model, 80, 24, ui))
    assert "▶#63" in "\n".join(text)


def test_zoom_gives_the_focused_stream_the_whole_body() -> None:
    streams = [exact_stream() for _ in range(8)]
    for index, stream in enumerate(streams):
        stream.index = index
    model = model_of(streams)
    lines = plain_lines(grid_screen(model, 80, 24, GridUi(focus=5, zoomed=True, keys=True)))
    top = next(row for row, line in enumerate(lines) if line.startswith("┏"))
    assert lines[top] == "┏" + "━" * 78 + "┓"
    assert lines[top + 1].startswith("┃#5 VERIFYING")
    assert lines[-3].startswith("┗")
    assert sum("#" in line for line in lines[top:-1]) == 1
    # Its status line says how to get back (issue 26, 26).
    assert lines[-1].startswith("keys: Esc or z back to the grid · ↑↓←→ next stream")


def test_small_terminal_is_still_useful() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(16)]
    model = model_of(streams, "chunk", backend=GENERIC, no_color=True)
    text = plain_lines(grid_screen(model, 34, 9))
    assert len(text) == 9 and all(cell_len(row) == 34 for row in text)
    assert re.findall(r"#(\d+) +CHUNK", "\n".join(text)) == [str(i) for i in range(7)]
    assert text[-1].startswith("9 of 16 streams hidden")


def test_stream_and_grid_views_print_the_final_picture_and_summary() -> None:
    from parallelhue.screen.views import GridView, StreamView

    for view_class in (StreamView, GridView):
        stream = exact_stream()
        stream.verdict = "exact"
        model = model_of([stream])
        console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="256")
        view = view_class(model, console)
        view.start()
        view.refresh()
        view.stop()
        output = console.file.getvalue()  # type: ignore[attr-defined]
        plain = _SGR.sub("", output)
        assert "#0 EXACT TOKEN PROVENANCE" in plain
        assert "Hello world" in plain
        assert re.search(r"^#0 +EXACT ", plain, re.M)  # the summary table's row
        assert (46, "Hel") in colored_pieces(output)


def test_final_grid_picture_keeps_all_64_panes() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(64)]
    model = model_of(streams, "chunk", backend=GENERIC, no_color=True)
    text = "\n".join(plain_lines(final_grid(model, 120)))
    assert all(f"#{i} SSE CHUNK MODE" in text for i in range(64))
    assert "hidden" not in text


def _live_grid(model: RunModel, width: int, height: int) -> tuple[object, io.StringIO]:
    from parallelhue.screen.views import AnsiGrid

    file = io.StringIO()
    console = Console(
        file=file, width=width, height=height, force_terminal=True, color_system="256"
    )
    return AnsiGrid(model, console), file


def test_live_grid_frame_matches_the_layout_and_the_coloring_rule() -> None:
    from parallelhue.screen.views import AnsiGrid

    streams = []
    for index in range(64):
        stream = exact_stream()
        stream.index = index
        stream.add_delta(" 日本語", [5], 0.0)  # unproven: dim in auto mode
        streams.append(stream)
    streams[1].verdict = "failed"
    streams[1].reason = "byte mismatch at offset 3\nsecond line"
    model = model_of(streams)
    grid, _file = _live_grid(model, 240, 90)
    assert isinstance(grid, AnsiGrid)
    lines = grid.frame(240, 90)
    _columns, pane_width, pane_height = grid_layout(64, 240, 87)
    assert len(lines) == 90
    plain = [_SGR.sub("", line) for line in lines]
    assert all(cell_len(line) == 240 for line in plain)
    text = "\n".join(plain)
    assert all(f"#{i} VERIFYING" in text for i in range(64) if i != 1)
    assert "#1 SSE CHUNK MODE" in text
    assert "downgraded: byte mismatch at offset 3…" in text  # one line, cropped to the pane
    # Proven spans by step (green, red), the mixed span and the unproven tail uncolored.
    pane = box_pane(pane_data(streams[0], model, None), pane_width, pane_height)
    painted_pane = [ansi_line(line, THEME) for line in pane]
    assert all(lines[2 + k].startswith(painted_pane[k]) for k in range(pane_height))
    pieces = colored_pieces("".join(painted_pane))
    assert (46, "Hel") in pieces and (196, "orld") in pieces
    assert all("lo w" not in piece for _, piece in pieces)
    assert "日本語" in text
    assert plain[-1].startswith("streams")


def test_live_grid_redraws_only_rows_that_changed_and_never_erases_a_cell() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(4)]
    model = model_of(streams, "chunk", backend=GENERIC, no_color=True)
    grid, file = _live_grid(model, 160, 30)
    grid.draw()  # type: ignore[attr-defined]
    first = file.getvalue()
    assert first.startswith("\x1b[H\x1b[2J")
    assert "#3 SSE CHUNK MODE" in _SGR.sub("", first)
    # Defect 2: an erase-to-end-of-line after a full-width row takes its last cell.
    assert "\x1b[K" not in first
    file.seek(0)
    file.truncate()
    grid.draw()  # type: ignore[attr-defined]
    assert file.getvalue() == ""  # nothing changed, nothing written
    streams[2].add_delta("fresh words", [1, 2], 0.0)
    grid.draw()  # type: ignore[attr-defined]
    update = file.getvalue()
    assert "fresh words" in update and "2 tok" in update
    # Only the rows holding the changed pane's numbers line, body and the status line.
    rewritten = re.findall(r"\x1b\[(\d+);1H", update)
    assert 0 < len(rewritten) <= 3
    assert "\x1b[2J" not in update and "\x1b[K" not in update
    assert "\x1b[38;5;" not in update  # NO_COLOR


def test_wrap_counts_wide_characters() -> None:
    lines = wrap([("ab日本語cd\nxy", None), ("z" * 9, "step.0")], 5, 10)
    plain = [line_text(line) for line in lines]
    assert plain == ["ab日 ", "本語c", "d    ", "xyzzz", "zzzzz", "z    "]
    assert all(cell_len(line) == 5 for line in plain)
    assert [line_text(line) for line in wrap([("abcdefgh", None)], 3, 2)] == ["def", "gh "]


def test_tail_segments_equal_the_tail_of_all_segments() -> None:
    for mode, verdict in (("auto", "pending"), ("exact", "exact"), ("auto", "failed")):
        stream = exact_stream(mode)
        stream.verdict = verdict
        whole = stream.segments(True)
        for max_chars in (1, 5, 9, 100):
            tail = stream.tail_segments(True, max_chars)
            assert whole[len(whole) - len(tail) :] == tail
            assert sum(len(t) for t, _ in tail) >= min(max_chars, sum(len(t) for t, _ in whole))


def test_role_line_counts_plain_tokens_as_target_and_adds_up() -> None:
    from parallelhue.screen.summary import role_line

    stats = {"tokens": 20, "accepted": 9, "target": 4, "bonus": 2, "plain": 5, "mixed_spans": 1}
    line = role_line(stats)
    assert line == (
        "[accepted draft=9 tokens; target=9 tokens; bonus=2 tokens; mixed spans=1] "
        "(target includes 5 plain tokens from steps without drafts)"
    )
    numbers = [int(n) for n in re.findall(r"=(\d+) tokens", line)]
    assert sum(numbers) == stats["tokens"]


def test_run_model_repr_stays_small_however_long_the_run() -> None:
    # asyncio (3.11) formats the main task's result with repr() at the end of a
    # run; a full repr of every chunk and time cost ~0.2 s per call at 128k tokens.
    stream = StreamState(index=0, mode="auto")
    for _ in range(10_000):
        stream.add_delta("tok ", [1], 0.5)
    model = RunModel(
        streams=[stream], mode="auto", backend=Backend("ngram", True, "x"), no_color=True
    )
    assert repr(stream) == (
        "StreamState(index=0, mode='auto', verdict='pending', sse_tokens=10000, "
        "chunks=10000, spans=0)"
    )
    assert repr(model) == "RunModel(streams=1, mode='auto', backend='ngram', finished=False)"


# --- the legend, the summary table and the defects of issue 12 -------------------------------


def test_legend_says_what_the_colors_mean() -> None:
    model = model_of([exact_stream()])
    text = line_text(grid_screen(model, 200, 30)[1])
    assert text.startswith("colors: engine step ■■■■ (cycling, one per verified step)")
    assert "underlined: a character from two steps" in text and "dim: not yet proven" in text
    model.color_by = "role"
    text = line_text(grid_screen(model, 200, 30)[1])
    assert "■ accepted draft ■ target correction ■ bonus" in text
    assert "underlined: tokens of two roles" in text
    chunk = model_of([StreamState(index=0, mode="chunk")], "chunk")
    assert "SSE chunks" in line_text(grid_screen(chunk, 200, 30)[1])
    generic = model_of([exact_stream()], backend=GENERIC)
    assert line_text(grid_screen(generic, 200, 30)[1]).startswith(
        "colors: none (no speculative decoding proven)"
    )


def _finished(stream: StreamState, start: float, times: list[float]) -> StreamState:
    stream.started_at = start
    for at in times:
        stream.add_delta("ab", [1, 2], at)
    return stream


def test_summary_is_a_table_with_a_row_per_stream_and_a_total() -> None:
    streams = [
        _finished(StreamState(index=i, mode="exact"), 0.0, [0.1, 0.2, 0.3 + i]) for i in range(2)
    ]
    for stream in streams:
        stream.verdict = "exact"
        stream.stats = {
            "tokens": 6, "steps": 3, "hist": {1: 1, 2: 1, 3: 1}, "drafts_scheduled": 6,
            "drafts_padded": 0, "accepted": 3, "target": 2, "bonus": 1, "plain": 0,
            "drafts_by_pos": [3, 2, 1], "accepted_by_pos": [2, 1, 0],
        }  # fmt: skip
    model = model_of(streams, "exact")
    model.totals = {
        "tokens": 12, "steps": 6, "hist": {1: 2, 2: 2, 3: 2}, "drafts_scheduled": 12,
        "drafts_padded": 0, "accepted": 6, "target": 4, "bonus": 2, "plain": 0,
        "drafts_by_pos": [6, 4, 2], "accepted_by_pos": [4, 2, 0],
    }  # fmt: skip
    lines = summary_lines(model)
    assert lines[0].startswith("Summary · 2 streams · mode exact")
    header = lines[1].split()
    assert header[:6] == ["stream", "label", "tokens", "steps", "tok/step", "hist"]
    assert "acc@1..3" in header and "TTFT" in header and "tok/s" in header
    row = lines[2]
    assert re.match(r"#0 +EXACT +6 +3 +2\.00 +███ +50\.0% +67 50 0 +3/2/1 +100\.0 ms ", row)
    assert re.match(r"total +12 +6 +2\.00 +███ +50\.0% +67 50 0 ", lines[4])
    # ITL p50/p90/p99 of the gaps 0.1 s, 0.1 s + i; E2E 0.3 s + i; 6 tokens / E2E per stream.
    assert "100.0/100.0/100.0" in row and "300.0 ms" in row and "20.0" in row
    assert "wall time 1.30 s (first request to last SSE delta); 9.2 tok/s over the run" in lines


def test_summary_says_when_vllm_per_request_metrics_cross_checked_the_steps() -> None:
    streams = [_finished(StreamState(index=i, mode="exact"), 0.0, [0.1]) for i in range(3)]
    for stream, checked in zip(streams, (5, 0, 2), strict=True):
        stream.verdict = "exact"
        stream.stats = {"tokens": 8, "steps": 4, "drafts_scheduled": 8, "accepted": 4}
        if checked:
            stream.stats["metrics_steps"] = checked
    model = model_of(streams, "exact")
    model.totals = {"tokens": 24, "steps": 12, "drafts_scheduled": 24, "accepted": 12}
    assert not any("per-request metrics" in line for line in summary_lines(model))
    model.totals["metrics_steps"] = 7
    assert (
        "cross-checked with vLLM's per-request metrics: 7 verify steps of 2 of 3 streams "
        "agree with the scheduler's records (vLLM sends the lists only for a request the "
        "engine finished with a verify step: none after a stop string)" in summary_lines(model)
    )
    streams[1].stats["metrics_steps"] = 1
    model.totals["metrics_steps"] = 8
    assert (
        "cross-checked with vLLM's per-request metrics: 8 verify steps of 3 of 3 streams "
        "agree with the scheduler's records" in summary_lines(model)
    )
    # Chunk mode never claims it: no step was proven there.
    chunk = model_of(streams, "chunk")
    chunk.totals = dict(model.totals)
    assert not any("per-request metrics" in line for line in summary_lines(chunk))


def test_summary_table_drops_columns_to_fit_the_width() -> None:
    stream = _finished(StreamState(index=0, mode="exact"), 0.0, [0.1, 0.2])
    stream.stats = {"tokens": 4, "steps": 2, "drafts_scheduled": 4, "accepted": 2}
    model = model_of([stream], "exact")
    model.totals = dict(stream.stats)
    lines = plain_lines(summary_block(model, 70))
    assert all(cell_len(line) == 70 for line in lines)
    assert lines[1].split() == [
        "stream", "label", "tokens", "steps", "tok/step", "accept", "TTFT", "tok/s",
    ]  # fmt: skip
    assert plain_lines(summary_block(model, 50))[1].split() == [
        "stream", "label", "tokens", "steps", "tok/step", "accept",
    ]  # fmt: skip


def test_non_speculative_summary_shows_no_walls_of_zeros() -> None:
    # Defect 14: chunk mode / no telemetry printed 0 steps, 0.0% and zero roles per stream.
    streams = [_finished(StreamState(index=i, mode="auto"), 0.0, [0.1, 0.2]) for i in range(2)]
    for stream in streams:
        stream.verdict = "failed"
        stream.reason = "missing telemetry: no frames received for this run"
    model = model_of(streams, backend=GENERIC)
    lines = summary_lines(model)
    assert lines[1].split()[:4] == ["stream", "label", "tokens", "TTFT"]
    assert not any(re.search(r"\b0\.0%|steps=0|accepted draft=0", line) for line in lines)
    assert (
        "steps and roles: not measured (no step of this run was proven by telemetry frames)"
        in lines
    )


def test_frozen_acceptance_of_a_downgraded_stream_carries_a_caveat() -> None:
    stream = _finished(StreamState(index=3, mode="auto"), 0.0, [0.1])
    stream.stats = {"tokens": 2, "steps": 1, "drafts_scheduled": 4, "accepted": 1}
    stream.verdict = "failed"
    stream.reason = "byte mismatch at offset 2"
    model = model_of([stream])
    model.totals = dict(stream.stats)
    lines = summary_lines(model)
    assert re.match(r"#3 +CHUNK +2 +1 +2\.00 .* 25\.0%\* ", lines[2]), lines[2]
    assert (
        "stream 3: * acceptance frozen at the downgrade: it counts only the steps proven "
        "before it" in lines
    )
    assert "acc 25%*" in line_text(box_pane(pane_data(stream, model, None), 40, 6)[2])


def test_singular_stream_and_no_arrival_note_below_four_streams() -> None:
    # Defect 14: "total: 1 streams" and "(arrival times to 5 ms while 4+ streams are open)".
    note = "arrival times to 5 ms while 4+ streams are open"
    one = model_of([_finished(StreamState(index=0, mode="chunk"), 0.0, [0.1])], "chunk")
    one.arrival_note = note
    lines = summary_lines(one)
    assert lines[0].startswith("Summary · 1 stream · mode chunk")
    assert not any(note in line for line in lines)
    four = model_of(
        [_finished(StreamState(index=i, mode="chunk"), 0.0, [0.1]) for i in range(4)], "chunk"
    )
    four.arrival_note = note
    assert any(note in line for line in summary_lines(four))


def test_token_counts_come_from_usage_when_the_server_sends_no_token_ids() -> None:
    # Defect 8: servers without token_ids showed 0 tokens even with usage.completion_tokens.
    stream = _finished(StreamState(index=0, mode="chunk"), 0.0, [])
    stream.add_delta("Hello world", [], 0.1)
    stream.usage = {"prompt_tokens": 3, "completion_tokens": 4}
    assert (stream.tokens, stream.tokens_source) == (4, "usage")
    model = model_of([stream], "chunk")
    lines = summary_lines(model)
    assert re.match(r"#0 +CHUNK +4† ", lines[2])
    # The total counts it too: it carries the mark (issue 26, 29).
    assert re.match(r"total +4† ", lines[3]), lines[3]
    assert "† tokens from usage.completion_tokens: the server sent no token ids" in lines
    assert "4 tok" in line_text(box_pane(pane_data(stream, model, None), 40, 6)[2])
    # A stream with token ids beside it: the total still mixes in a usage figure.
    other = _finished(StreamState(index=1, mode="chunk"), 0.0, [0.1])
    both = summary_lines(model_of([stream, other], "chunk"))
    assert re.match(r"#1 +CHUNK +2 ", both[3]) and re.match(r"total +6† ", both[4]), both[:5]
    assert re.match(r"total +2 ", summary_lines(model_of([other], "chunk"))[3])


def test_nothing_received_prints_nothing_but_the_one_line() -> None:
    # Defect 13: refused connections on every stream drew panes and a long summary.
    from parallelhue.screen.views import GridView, PlainView

    for view_class in (PlainView, GridView):
        streams = [StreamState(index=i, mode="chunk") for i in range(3)]
        for stream in streams:
            stream.fail_http("cannot connect to 127.0.0.1:9: connection refused")
        model = model_of(streams, "chunk")
        console = Console(file=io.StringIO(), width=100)
        view = view_class(model, console)
        view.start()
        view.stop()
        assert console.file.getvalue() == ""  # type: ignore[attr-defined]
    streams[0].fail_http("HTTP 500: boom")  # different failures: the summary tells them apart
    assert not model_of(streams, "chunk").nothing_received


def test_banner_names_model_server_and_lossy_verification() -> None:
    model = model_of([exact_stream()], simulated=True)
    model.model_name, model.server = "tiny-llama", "10.0.0.7:8000"
    text = line_text(grid_screen(model, 200, 30)[0])
    assert text.startswith("SIMULATED ENGINE · model tiny-llama @ 10.0.0.7:8000 · mode auto")
    assert "LOSSY" not in text
    model.sources = [{"role": "scheduler", "verification": "fly"}]
    text = line_text(grid_screen(model, 300, 30)[0])
    assert "LOSSY verification (fly): an accepted draft need not be the target's choice" in text
    assert "UNTESTED" not in text


def test_banner_says_when_the_plugin_runs_on_an_untested_engine() -> None:
    """The plugin's hellos mark a release its adapter matched but nobody tested."""
    model = model_of([exact_stream()])
    model.sources = [{"role": "scheduler", "engine_version": "0.32.0+cpu"}]
    assert "UNTESTED" not in line_text(grid_screen(model, 300, 30)[0])
    model.sources = [{"role": "scheduler", "engine_version": "0.35.0 (untested)"},
                     {"role": "frontend", "engine_version": "0.35.0 (untested)"}]  # fmt: skip
    text = line_text(grid_screen(model, 300, 30)[0])
    assert "UNTESTED engine: vLLM 0.35.0 was never tested with the plugin" in text


def test_emoji_presentation_sequences_keep_every_line_and_export_box_in_its_cells() -> None:
    """The layout and the export measure with one function (cells.py): U+2764 U+FE0F is
    one cell plus none, as wcwidth and tmux draw it; measured whole (two cells) by one and
    per character by the other, a pane line holding it was a cell off and the SVG drew
    the borders after it one cell early (docs/demo.svg, pane #2)."""
    from parallelhue.screen.export import line_boxes

    text = "nd hearts ❤️ 💚💙💛. 한국어 ❤️❤️ x é́ 👍🏽"
    for width in range(3, 40):
        lines = [*wrap([(text, "a"), (text, None)], width)]
        lines += [fit([(text, None)], width), tail_fit([(text, None)], width)]
        for line in lines:
            assert line_width(line) == width, (width, line)
            boxes = line_boxes(line, THEME)
            assert max(box.column + box.cells for box in boxes) <= width, (width, line)
    boxes = line_boxes([("a❤️b", None)], THEME)
    assert [(box.column, box.cells, box.text) for box in boxes] == [
        (0, 1, "a"), (1, 1, "❤️"), (2, 1, "b"),
    ]  # fmt: skip


def test_the_readme_picture_has_its_pane_borders_in_columns() -> None:
    """docs/demo.svg as committed: every row crossing the panes puts its borders at
    the same x (a glyph measured wrong shifts the rest of its row)."""
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "docs", "demo.svg")
    with open(path, encoding="utf-8") as handle:
        svg = handle.read()
    assert "SIMULATED ENGINE" in svg
    rows: dict[str, list[str]] = {}
    for x, y in re.findall(r'<text x="([\d.]+)" y="([\d.]+)"[^>]*>│</text>', svg):
        rows.setdefault(y, []).append(x)
    full = {tuple(xs) for xs in rows.values() if len(xs) > 2}
    assert len(rows) >= 10 and len(full) == 1, full


def _luminance(rgb: tuple[int, int, int]) -> float:
    def channel(value: int) -> float:
        v = value / 255
        return v / 12.92 if v <= 0.03928 else ((v + 0.055) / 1.055) ** 2.4

    red, green, blue = map(channel, rgb)
    return 0.2126 * red + 0.7152 * green + 0.0722 * blue


def test_every_text_color_reads_at_4_5_to_1_on_the_dark_backgrounds() -> None:
    """Issue 26, 30: step color 27 (#005fff) was 3.7:1 on the export's #101010. WCAG AA
    asks 4.5:1 for text: every colored key of both palettes, on the export's background
    and on a black terminal."""
    from parallelhue.screen.style import PALETTES, xterm_rgb

    low = []
    for name, inks in PALETTES.items():
        for key, ink in inks.items():
            if ink.fg is None:
                continue
            for background in ((16, 16, 16), (0, 0, 0)):
                lighter, darker = sorted(
                    (_luminance(xterm_rgb(ink.fg)), _luminance(background)), reverse=True
                )
                ratio = (lighter + 0.05) / (darker + 0.05)
                if ratio < 4.5:
                    low.append((name, key, ink.fg, background, round(ratio, 2)))
    assert low == []


def test_pane_counters_show_no_zero_for_steps_nobody_measured() -> None:
    """Issue 26, 28: `0 st` in auto mode, `- st` in chunk mode for the same missing
    evidence; not measured is never shown as 0, in either mode."""
    for mode in ("auto", "chunk", "exact"):
        stream = _finished(StreamState(index=0, mode=mode), 0.0, [0.1, 0.2])
        stream.stats = {"tokens": 0, "steps": 0}  # the reconciler's empty figures
        model = model_of([stream], mode)
        numbers = line_text(box_pane(pane_data(stream, model, None), 40, 6)[2])
        assert "4 tok - st - t/st acc -" in numbers, (mode, numbers)
        stream.stats = {}  # no figures at all
        assert stream.steps is None and stream.tokens_per_step is None
    stream.stats = {"tokens": 4, "steps": 2}
    assert "4 tok 2 st 2.00 t/st" in line_text(box_pane(pane_data(stream, model, None), 40, 6)[2])


def _positions_model(count: int = 8) -> RunModel:
    streams = [_finished(StreamState(index=i, mode="exact"), 0.0, [0.1, 0.2]) for i in range(count)]
    for stream in streams:
        stream.verdict = "exact"
        stream.stats = {
            "tokens": 4, "steps": 2, "hist": {1: 1, 3: 1}, "drafts_scheduled": 8,
            "drafts_padded": 0, "accepted": 2, "target": 1, "bonus": 1, "plain": 0,
            "drafts_by_pos": [2, 2, 2, 2], "accepted_by_pos": [1, 1, 0, 0],
        }  # fmt: skip
    model = model_of(streams, "exact", simulated=True)
    model.model_name = "parallelhue-sim"
    model.totals = {
        "tokens": 4 * count, "steps": 2 * count, "hist": {1: count, 3: count},
        "drafts_scheduled": 8 * count, "drafts_padded": 0, "accepted": 2 * count,
        "target": count, "bonus": count, "plain": 0,
        "drafts_by_pos": [2 * count] * 4, "accepted_by_pos": [count, count, 0, 0],
    }  # fmt: skip
    return model


def test_summary_at_80_columns_drops_a_column_with_its_footnote_and_keeps_the_title_whole() -> None:
    """Issue 26, 27: at 80 columns the table dropped acc@1..4 % but kept the footnote
    explaining it, and the title wrapped onto a second line."""
    model = _positions_model()
    wide = plain_lines(summary_block(model, 200))
    assert "acc@1..4 %" in wide[1]
    assert any("; acc@i: the same per draft position i" in line for line in wide)
    assert wide[0].rstrip() == (
        "Summary (SIMULATED ENGINE: simulated numbers) · 8 streams · mode exact · model "
        "parallelhue-sim"
    )
    narrow = plain_lines(summary_block(model, 80))
    assert all(terminal_width(line) == 80 for line in narrow)
    assert "acc@" not in narrow[1]
    assert not any("acc@i" in line for line in narrow)
    assert any(line.startswith("acceptance = accepted / (drafts scheduled") for line in narrow)
    # One line: the model's name goes first (the banner has it), nothing is cut.
    assert (
        narrow[0].rstrip()
        == "Summary (SIMULATED ENGINE: simulated numbers) · 8 streams · mode exact"
    )
    assert narrow[1].startswith("stream label")
    model.interrupted = True
    assert plain_lines(summary_block(model, 80))[0].rstrip() == (
        "Summary (SIMULATED ENGINE) (interrupted: partial) · 8 streams · mode exact"
    )


def test_legend_names_chunk_mode_only_when_a_stream_is_in_it() -> None:
    """Issue 26, 22: the legend always mentioned SSE CHUNK MODE streams."""
    streams = [exact_stream() for _ in range(2)]
    for index, stream in enumerate(streams):
        stream.index = index
    model = model_of(streams)
    legend = " ".join(line_text(line) for line in grid_screen(model, 200, 30)[1:2])
    assert "CHUNK" not in legend and legend.startswith("colors: engine step")
    streams[1].verdict, streams[1].reason = "failed", "byte mismatch at offset 3"
    legend = " ".join(line_text(line) for line in legend_lines(model, 200))
    assert "SSE CHUNK MODE streams: colors are SSE chunks" in legend


def test_verifying_streams_say_how_much_is_proven_and_when_the_verdict_comes() -> None:
    """Issue 26, 9: auto mode showed VERIFYING for the whole generation. The pane says
    how much of the text the telemetry proved so far; the legend, that the verdict
    comes when the stream ends."""
    stream = exact_stream()  # 13 bytes, 11 of them proven
    model = model_of([stream])
    pane = plain_lines(box_pane(pane_data(stream, model, None), 40, 6))
    assert pane[1].startswith("│#0 VERIFYING · 84% proven ")
    lines = plain_lines(grid_screen(model, 200, 30))
    assert "dim: not yet proven; the verdict comes when a stream ends" in lines[1]
    assert any(
        line.startswith("#0 VERIFYING · 84% proven · 4 tok")
        for line in plain_lines(stream_screen(model, 120, None))
    )
    stream.verdict = "exact"
    title = plain_lines(box_pane(pane_data(stream, model, None), 40, 6))[1]
    assert title.rstrip("│ ") == "│#0 EXACT TOKEN PROVENANCE"
    assert "verdict" not in plain_lines(grid_screen(model, 200, 30))[1]


def _demo_like(count: int) -> RunModel:
    streams = [exact_stream() for _ in range(count)]
    for index, stream in enumerate(streams):
        stream.index = index
    backend = Backend(
        "ngram", True, "plugin hello: vLLM 0.32.0, K=3, roles from real draft ids", simulated=True
    )
    model = model_of(streams, backend=backend)
    model.model_name, model.server = "parallelhue-sim", "127.0.0.1:41529"
    model.telemetry = "telemetry: local socket, sender uid 1000 checked by the kernel"
    return model


def test_at_80_and_120_columns_banner_legend_and_status_keep_their_meaning() -> None:
    """Issue 26, 7: at 80 and 120 columns the banner, legend and status line were cut
    (`backen…`, `underlined: a chara…`). They wrap by parts now, in shorter words where
    the screen is short, and nothing in them is cut."""
    for width, height in ((80, 24), (120, 30), (120, 50)):
        model = _demo_like(16)
        lines = plain_lines(grid_screen(model, width, height, GridUi(keys=True)))
        assert len(lines) == height and all(terminal_width(line) == width for line in lines)
        first_pane = next(row for row, line in enumerate(lines) if line.startswith("┌"))
        top = " ".join(line.rstrip() for line in lines[:first_pane])
        assert "…" not in top, (width, top)
        for words in ("SIMULATED ENGINE", "mode auto", "backend ngram (plugin hello",
                      "telemetry: local socket", "colors: engine step ■■■■ (cycling",
                      "underlined: ", "dim: not yet proven"):  # fmt: skip
            assert words in top, (width, words, top)
        status = " ".join(line.rstrip() for line in lines[-2:])
        assert "streams VERIFYING: 16" in status and "keys: ↑↓←→ focus · z zoom" in status
        assert "q quit" in status, (width, status)
    # The final picture has room for every word.
    model = _demo_like(4)
    final = plain_lines(final_grid(model, 80))
    words = " ".join(line.rstrip() for line in final[:6])
    assert "plugin hello: vLLM 0.32.0, K=3, roles from real draft ids" in words
    assert "sender uid 1000 checked by the kernel" in words
    assert "(cycling, one per verified step)" in words


def test_arrow_keys_move_on_the_grid_by_geometry() -> None:
    """Issue 26, 11: arrows and hjkl stepped through the streams in order."""
    from parallelhue.screen.focus import move_focus

    model = _demo_like(16)
    ui = GridUi(keys=True)

    def press(key: str) -> int:
        grid_screen(model, 80, 24, ui)  # the frame records where each stream is
        assert move_focus(ui, key, 16)
        return ui.focus

    # 80x24: panes 0 1 / 2 3, then overview lines 4-9 under the left panes, 10-15 right.
    assert press("right") == 1 and press("down") == 3 and press("left") == 2
    assert press("down") == 4 and press("j") == 5 and press("l") == 11
    assert press("k") == 10 and press("up") == 3 and press("h") == 2 and press("up") == 0
    assert press("left") == 0  # nothing further left: it stays
    ui.zoomed = True
    assert press("right") == 1 and press("left") == 0
    assert not move_focus(ui, "x", 16)


def test_overview_tails_never_start_with_an_orphan_mark() -> None:
    """Issue 26, 6: an overview tail could start with a variation selector whose heart
    was cut off (U+2764 and U+FE0F in two steps' spans), or an accent without its letter."""
    from parallelhue.screen.overview import overview_line

    for pieces in (["love \u2764", "\ufe0f and more"], ["the cafe", "\u0301 au lait"]):
        stream = StreamState(index=0, mode="exact")
        offset = 0
        for step, piece in enumerate(pieces):
            stream.add_delta(piece, [1], 0.0)
            stream.add_span(offset, piece, step, 1)
            offset += len(piece.encode())
        stream.verdict = "exact"
        model = model_of([stream], "exact")
        for width in range(24, 45):
            line = overview_line(stream, model, width, focused=False)
            assert terminal_width(line_text(line)) == width, (width, line)
            tail = line_text(line)[22:].lstrip(" ")
            assert "\ufe0f" not in tail
            assert not tail or unicodedata.category(tail[0])[0] != "M", (width, tail)
