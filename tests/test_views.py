"""Coloring rule, labels, fixed-size grid panes, plain output."""

from __future__ import annotations

import io
import re

from rich.console import Console

from parallelhue.backend import Backend
from parallelhue.state import (
    LABEL_CHUNK,
    LABEL_EXACT,
    LABEL_VERIFYING,
    PALETTE,
    RunModel,
    StreamState,
)
from parallelhue.views import grid_layout, grid_renderable, make_console, styled_text

SPECULATIVE = Backend("ngram", True, "plugin hello")
GENERIC = Backend("generic", False, "no plugin hello; no /metrics")
_ANSI_COLOR = re.compile(r"\x1b\[38;5;(\d+)m([^\x1b]*)")


def colored_pieces(text: str) -> list[tuple[int, str]]:
    return [(int(code), piece) for code, piece in _ANSI_COLOR.findall(text)]


def render(renderable: object, width: int = 120, no_color: bool = False) -> str:
    console = Console(
        file=io.StringIO(),
        width=width,
        force_terminal=True,
        color_system="256",
        no_color=no_color,
        highlight=False,
        markup=False,
    )
    console.print(renderable)
    output = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(output, str)
    return output


def exact_stream(mode: str = "auto") -> StreamState:
    stream = StreamState(index=0, mode=mode)
    for text in ("Hel", "lo w", "orld", "!!"):
        stream.add_delta(text, [1], 0.0)
    # Steps 0..4; "lo w" is a mixed span (two steps), so it stays uncolored.
    stream.add_span(0, "Hel", 0)
    stream.add_span(3, "lo w", None)
    stream.add_span(7, "orld", 1)
    return stream


def test_proven_spans_are_colored_by_step_and_mixed_spans_are_not() -> None:
    stream = exact_stream()
    segments = stream.segments(colorize=True)
    assert segments == [("Hel", PALETTE[0]), ("lo w", None), ("orld", PALETTE[1]), ("!!", None)]
    output = render(styled_text(segments))
    assert colored_pieces(output) == [(46, "Hel"), (196, "orld")]
    assert stream.label == LABEL_VERIFYING


def test_step_colors_cycle_through_the_palette() -> None:
    stream = StreamState(index=0, mode="auto")
    for step in range(6):
        stream.add_delta(str(step), [step], 0.0)
        stream.add_span(step, str(step), step)
    output = render(styled_text(stream.segments(colorize=True)))
    assert colored_pieces(output) == [
        (46, "0"),
        (196, "1"),
        (27, "2"),
        (226, "3"),
        (46, "4"),
        (196, "5"),
    ]


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
    output = render(styled_text(stream.segments(colorize=True)))
    assert colored_pieces(output) == [(46, "Hel"), (196, "lo w"), (27, "orld"), (226, "!!")]


def test_no_color_and_generic_backends_are_monochrome() -> None:
    for backend, no_color in ((SPECULATIVE, True), (GENERIC, False)):
        model = RunModel([exact_stream()], "auto", backend, no_color=no_color)
        assert not model.colorize
        output = render(styled_text(model.streams[0].segments(model.colorize)))
        assert "\x1b[38;5;" not in output
        assert "Hello world!!" in output


def test_plain_console_writes_no_ansi() -> None:
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    model = RunModel([exact_stream()], "auto", SPECULATIVE, no_color=False)
    console.print(styled_text(model.streams[0].segments(True)))
    assert "\x1b" not in console.file.getvalue()


def test_grid_has_64_fixed_size_panes_with_headers() -> None:
    streams = []
    for index in range(64):
        stream = StreamState(index=index, mode="chunk")
        stream.add_delta("word " * (index * 7), [1] * index, 0.0)
        streams.append(stream)
    streams.append(StreamState(index=64, mode="chunk"))
    model = RunModel(streams, "chunk", GENERIC, no_color=True)
    console = Console(file=io.StringIO(), width=240, force_terminal=True, color_system=None)
    columns, pane_width, pane_height = grid_layout(64, 240, 90)
    assert (columns, pane_width, pane_height) == (6, 40, 8)
    output = render(grid_renderable(model, console, 240, 90), width=240, no_color=True)
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)  # bold/dim only: no colors asked
    lines = output.splitlines()
    # banner + 8 rows of panes + status line; every pane row is exactly pane_height lines.
    assert len(lines) == 1 + 11 * pane_height + 1
    for index in range(64):
        assert f"#{index} SSE CHUNK MODE" in output
        assert f"{index} tok - st - t/st acc -" in output
    # Ten full rows of six panes, then a last row of four: every pane is 40 cells wide.
    widths = [len(line) for line in lines[1:-1]]
    assert widths == [6 * pane_width] * (10 * pane_height) + [4 * pane_width] * pane_height
    assert "#64 " not in output
    assert lines[-1].startswith("1 of 65 streams hidden: the grid holds 64 · streams SSE CHUNK")


def test_grid_follows_the_terminal_size() -> None:
    assert grid_layout(16, 80, 24)[0] == 2
    assert grid_layout(16, 200, 50)[0] == 5
    assert grid_layout(1, 200, 50) == (1, 200, 48)


def test_stream_and_grid_views_print_the_final_picture_and_summary() -> None:
    from parallelhue.views import GridView, StreamView

    for view_class in (StreamView, GridView):
        stream = exact_stream()
        stream.verdict = "exact"
        model = RunModel([stream], "auto", SPECULATIVE, no_color=False)
        console = Console(file=io.StringIO(), width=100, force_terminal=True, color_system="256")
        view = view_class(model, console)
        view.start()
        view.refresh()
        view.stop()
        output = console.file.getvalue()  # type: ignore[attr-defined]
        plain = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", output)
        assert "#0 EXACT TOKEN PROVENANCE" in plain
        assert "Hello world" in plain
        assert "stream 0: EXACT TOKEN PROVENANCE" in plain
        assert (46, "Hel") in colored_pieces(output)


def test_small_terminal_shows_whole_rows_and_says_what_is_hidden() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(16)]
    model = RunModel(streams, "chunk", GENERIC, no_color=True)
    console = Console(file=io.StringIO(), width=80, force_terminal=True, color_system=None)
    output = render(grid_renderable(model, console, 80, 24), width=80, no_color=True)
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)
    lines = output.splitlines()
    # 2 columns of 6-line panes: 3 rows fit in 24 lines with the banner and status.
    assert len(lines) <= 24
    assert "#5 SSE CHUNK MODE" in output and "#6 " not in output
    assert lines[-1].startswith("10 of 16 streams hidden: enlarge the terminal or use --tmux")


def test_final_grid_picture_keeps_all_64_panes() -> None:
    from parallelhue.views import GridView

    streams = [StreamState(index=i, mode="chunk") for i in range(64)]
    model = RunModel(streams, "chunk", GENERIC, no_color=True)
    console = Console(file=io.StringIO(), width=120, force_terminal=True, color_system=None)
    output = render(GridView(model, console).final_picture(console), width=120, no_color=True)
    output = re.sub(r"\x1b\[[0-9;]*m", "", output)
    assert all(f"#{i} SSE CHUNK MODE" in output for i in range(64))
    assert "hidden" not in output


def _live_grid(model: RunModel, width: int, height: int) -> tuple[object, io.StringIO]:
    from parallelhue.views import AnsiGrid

    file = io.StringIO()
    console = Console(
        file=file, width=width, height=height, force_terminal=True, color_system="256"
    )
    return AnsiGrid(model, console), file


def test_live_grid_frame_matches_the_layout_and_the_coloring_rule() -> None:
    from rich.cells import cell_len

    from parallelhue.views import AnsiGrid, pane_ansi

    streams = []
    for index in range(64):
        stream = exact_stream()
        stream.index = index
        stream.add_delta(" 日本語", [5], 0.0)  # unproven: shown uncolored in auto mode
        streams.append(stream)
    streams[1].verdict = "failed"
    streams[1].reason = "byte mismatch at offset 3\nsecond line"
    model = RunModel(streams, "auto", SPECULATIVE, no_color=False)
    grid, _file = _live_grid(model, 240, 90)
    assert isinstance(grid, AnsiGrid)
    lines = grid.frame(240, 90)
    _columns, pane_width, pane_height = grid_layout(64, 240, 90)
    assert len(lines) == 1 + 11 * pane_height + 1
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
    widths = [cell_len(line) for line in plain[1:-1]]
    assert widths == [6 * pane_width] * (10 * pane_height) + [4 * pane_width] * pane_height
    text = "\n".join(plain)
    assert all(f"#{i} VERIFYING" in text for i in range(64) if i != 1)
    assert "#1 SSE CHUNK MODE" in text
    assert "downgraded: byte mismatch at offset 3…" in text  # one line, cropped to the pane
    # Proven spans by step (green, red), the mixed span and the unproven tail uncolored.
    pane = pane_ansi(streams[0], model, pane_width, pane_height)
    assert all(lines[1 + k].startswith(pane[k]) for k in range(pane_height))
    pieces = colored_pieces("".join(pane))
    assert (46, "Hel") in pieces and (196, "orld") in pieces
    assert all("lo w" not in piece for _, piece in pieces)
    assert "日本語" in text
    assert plain[-1].startswith("streams")


def test_live_grid_redraws_only_rows_that_changed() -> None:
    streams = [StreamState(index=i, mode="chunk") for i in range(4)]
    model = RunModel(streams, "chunk", GENERIC, no_color=True)
    grid, file = _live_grid(model, 160, 30)
    grid.draw()  # type: ignore[attr-defined]
    first = file.getvalue()
    assert first.startswith("\x1b[H\x1b[2J")
    assert "#3 SSE CHUNK MODE" in re.sub(r"\x1b\[[0-9;]*m", "", first)
    file.seek(0)
    file.truncate()
    grid.draw()  # type: ignore[attr-defined]
    assert file.getvalue() == ""  # nothing changed, nothing written
    streams[2].add_delta("fresh words", [1, 2], 0.0)
    grid.draw()  # type: ignore[attr-defined]
    update = file.getvalue()
    assert "fresh words" in update and "2 tok" in update
    # Only the rows holding the changed pane's header line and body were rewritten.
    rewritten = re.findall(r"\x1b\[(\d+);1H", update)
    assert 0 < len(rewritten) <= 3
    assert "\x1b[2J" not in update
    assert "\x1b[38;5;" not in update  # NO_COLOR


def test_wrap_cells_counts_wide_characters() -> None:
    from rich.cells import cell_len

    from parallelhue.views import wrap_cells

    lines = wrap_cells([("ab日本語cd\nxy", ""), ("z" * 9, "\x1b[38;5;46m")], 5, 10)
    plain = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in lines]
    assert plain == ["ab日 ", "本語c", "d    ", "xyzzz", "zzzzz", "z    "]
    assert all(cell_len(line) == 5 for line in plain)
    assert wrap_cells([("abcdefgh", "")], 3, 2) == ["def", "gh "]


def test_tail_segments_equal_the_tail_of_all_segments() -> None:
    for mode, verdict in (("auto", "pending"), ("exact", "exact"), ("auto", "failed")):
        stream = exact_stream(mode)
        stream.verdict = verdict
        for max_chars in (1, 5, 9, 100):
            whole = styled_text(stream.segments(True), max_chars=max_chars)
            tail = styled_text(stream.tail_segments(True, max_chars))
            assert (whole.plain, whole.spans) == (tail.plain, tail.spans)


def test_role_line_counts_plain_tokens_as_target_and_adds_up() -> None:
    from parallelhue.summary import role_line

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
