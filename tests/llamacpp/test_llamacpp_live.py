"""The server-reported tier live on llama-server (built here: build_server.sh).

llama-server's draft-model speculative decoding, the tiny model drafting for
itself (at most 3 drafts a step), chat and completions, 1 and 4 slots (-np):
every stream's grouping is checked against its own draft counters (the fit of
python/parallelhue/model/reported.py), and the facts the tier rests on are checked
on the wire: one chunk per token with cumulative `timings`, the draft counters
of every chunk of one verify step equal, at most 3 drafts a step. A llama-server
without a draft model stays monochrome.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import llama_server
import pytest

from parallelhue.model.labels import LABEL_CHUNK, LABEL_REPORTED
from stock_runs import run_client, summarize

PROMPT = "東京は日本の首都です。 def add(x, y): return x + y"


@pytest.fixture(scope="module", params=[1, 4], ids=["np1", "np4"])
def drafting(
    request: pytest.FixtureRequest, llama_binary: Path, gguf: Path, logs_dir: Path
) -> Iterator[tuple[llama_server.LlamaServer, int]]:
    slots = int(request.param)
    srv = llama_server.start(llama_binary, gguf, logs_dir / f"np{slots}.log", slots=slots)
    try:
        yield srv, slots
    finally:
        srv.stop()


def _chunks(url: str, chat: bool) -> list[dict[str, object]]:
    body: dict[str, object] = {"model": "tiny", "max_tokens": 48, "stream": True,
                               "timings_per_token": True, "temperature": 0.8, "seed": 7,
                               "stream_options": {"include_usage": True}}  # fmt: skip
    if chat:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    else:
        body["prompt"] = PROMPT
    path = "/v1/chat/completions" if chat else "/v1/completions"
    chunks = []
    with httpx.stream("POST", url + path, json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_the_wire_is_what_the_tier_reads(
    drafting: tuple[llama_server.LlamaServer, int], chat: bool
) -> None:
    srv, _ = drafting
    timed = [c["timings"] for c in _chunks(srv.url, chat) if "timings" in c]
    assert len(timed) > 10
    counts = [(t["predicted_n"], t.get("draft_n", 0), t.get("draft_n_accepted", 0)) for t in timed]
    # Cumulative: never back; the token count goes up by one a chunk (two when a
    # token ended inside a character), the draft counters once per verify step.
    for (n0, d0, a0), (n1, d1, a1) in itertools.pairwise(counts):
        assert n1 >= n0 and d1 >= d0 and a1 >= a0 and a1 <= d1
        assert d1 - d0 <= 3 * max(1, n1 - n0)  # --spec-draft-n-max 3
    assert counts[-1][1] > 0, "no drafts: speculative decoding is not running"


@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
@pytest.mark.parametrize("reconciler", ["rust", "python"])
def test_every_stream_is_colored_by_its_own_counters(
    drafting: tuple[llama_server.LlamaServer, int], chat: bool, reconciler: str, socket_dir: str
) -> None:
    srv, slots = drafting
    path = "/v1/chat/completions" if chat else "/v1/completions"
    streams = 2 * slots
    result = run_client(
        srv.url + path,
        ["--concurrency", str(streams), "--max-tokens", "64", "--reconciler", reconciler,
         "--seed", "11", "--", PROMPT],
        socket_dir,
    )  # fmt: skip
    states = result.model.streams
    print(f"llama-server -np {slots} {'chat' if chat else 'completions'}: {summarize(states)}")
    assert [s.error for s in states] == [None] * streams
    assert [s.label for s in states] == [LABEL_REPORTED] * streams, [
        (s.label, s.note) for s in states
    ]
    assert result.model.colorize
    assert result.model.backend.evidence == "no plugin hello; llama-server reports drafts per step"
    for state in states:
        reported = state.reported
        assert reported is not None and reported.engine == "llama-server"
        assert reported.tokens == state.usage["completion_tokens"]  # type: ignore[index]
        if reported.steps is not None:
            assert sum(s.size for s in reported.steps) == reported.tokens
            assert all(s.drafted <= 3 for s in reported.steps if s.drafts_known)
            assert sum(s.drafted for s in reported.steps) == reported.drafted
        assert reported.colored_bytes > 0


def test_a_llama_server_without_a_draft_model_stays_monochrome(
    llama_binary: Path, gguf: Path, logs_dir: Path, socket_dir: str
) -> None:
    srv = llama_server.start(llama_binary, gguf, logs_dir / "plain.log", slots=2, draft=False)
    try:
        result = run_client(
            srv.url + "/v1/chat/completions",
            ["--concurrency", "2", "--max-tokens", "32", "--", PROMPT],
            socket_dir,
        )
    finally:
        srv.stop()
    states = result.model.streams
    assert [s.label for s in states] == [LABEL_CHUNK] * 2
    assert not result.model.colorize
    assert all(s.reported is not None and s.reported.engine is None for s in states)
