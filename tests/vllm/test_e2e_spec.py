"""Real vLLM on the CPU, the plugin enabled: every request reconciles exactly.

One server per speculative method (ngram, draft_model), each serving a 4-stream
run at temperature 0 and a 16-stream run mixing temperatures 0 and 0.8, stop
strings, max_tokens cut-offs, chat and completions. Every stream must reconcile
exactly through the Rust reconciler, and the run's role totals must agree with
the server's /metrics deltas, token by token where trims make them differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import driver
import pytest
import releases
import server

pytestmark = pytest.mark.vllm

PROMPTS = [
    "東京は日本の首都です。北京是中国的首都。 def add(x, y): return x + y",
    "絵文字 😀🚀🌈 and text: import os, sys; print(sys.argv)",
    "서울은 한국의 수도입니다. class Foo: pass # comment 🎉",
    "Ünïcödé façade — “quotes” … for i in range(10): yield i",
]
STOPS = ("e", "ti")

METHODS = {
    "ngram": lambda model: dict(server.NGRAM),
    "draft_model": lambda model: {"model": str(model), "num_speculative_tokens": 3},
}


def shapes_4() -> list[driver.Shape]:
    """4 streams, greedy, chat and completions, ended by max_tokens (or EOS)."""
    return [
        driver.Shape("chat" if i % 2 else "completions", PROMPTS[i], 48, 0.0, seed=i)
        for i in range(4)
    ]


def shapes_16() -> list[driver.Shape]:
    """16 streams: temperature 0 / 0.8, stop strings on half, short and long max_tokens."""
    shapes = []
    for i in range(16):
        shapes.append(
            driver.Shape(
                endpoint="chat" if i % 2 else "completions",
                prompt=PROMPTS[i % 4],
                max_tokens=24 if i % 3 == 0 else 64,
                temperature=0.8 if (i // 2) % 2 else 0.0,
                stop=STOPS if (i // 4) % 2 else (),
                seed=1000 + i,
            )
        )
    return shapes


@pytest.fixture(scope="module", params=list(METHODS))
def spec_server(
    request: pytest.FixtureRequest, tiny_model: Path, socket_dir: str, logs_dir: Path
) -> Iterator[tuple[str, server.Server, Path]]:
    method = request.param
    trim_log = logs_dir / f"trim-{method}.jsonl"
    srv = server.start(
        tiny_model,
        logs_dir / f"server-{method}.log",
        speculative=METHODS[method](tiny_model),
        plugin=True,
        socket_dir=socket_dir,
        env={"PARALLELHUE_E2E_TRIM_LOG": str(trim_log)},
    )
    try:
        yield method, srv, trim_log
    finally:
        srv.stop()


def trimmed_roles(trim_log: Path, run_id: str) -> dict[str, int]:
    """Roles of tokens the scheduler's stop checks cut in this run (from the test plugin)."""
    removed = {"accepted": 0, "last": 0, "steps": 0}
    if not trim_log.exists():
        return removed
    for line in trim_log.read_text().splitlines():
        entry = json.loads(line)
        if f"ph1_{run_id}_" not in entry["id"]:
            continue
        generated, kept, drafts = entry["generated"], entry["kept"], entry["drafts"]
        accepted_before = generated - 1 if drafts else 0
        # Positions kept..generated-1 were cut: accepted drafts, then the last token.
        removed["accepted"] += max(accepted_before - kept, 0)
        removed["last"] += 1
        removed["steps"] += 1
    return removed


def check_run(
    method: str,
    srv: server.Server,
    trim_log: Path,
    shapes: list[driver.Shape],
    socket_dir: str,
    num_speculative_tokens: int = 3,
) -> dict[str, Any]:
    before = driver.scrape_metrics(srv.url)
    result = driver.run(srv.url, shapes, socket_dir)
    after = driver.scrape_metrics(srv.url)
    delta = {key: after[key] - before[key] for key in after}

    errors = [(i, s.error) for i, s in enumerate(result.streams) if s.error]
    assert not errors, errors
    not_exact = [(i, v) for i, v in enumerate(result.verdicts) if v != ("exact", None)]
    assert not not_exact, f"{method}: streams not exact: {not_exact}\n{srv.log_tail(30)}"
    assert result.counters["dropped_reported"] == 0
    assert result.counters["rejected_frames"] == 0

    schedulers = [s for s in result.sources if s["role"] == "scheduler"]
    assert schedulers and all(s["spec_method"] == method for s in schedulers)
    assert all(s["num_speculative_tokens"] == num_speculative_tokens for s in schedulers)
    assert all(s["role_derivation"] == "draft_ids" for s in schedulers)

    totals = result.totals
    # Every SSE token is a confirmed token with exactly one role.
    sse_tokens = sum(len(s.token_ids) for s in result.streams)
    assert totals["tokens"] == sse_tokens
    roles = totals["plain"] + totals["accepted"] + totals["target"] + totals["bonus"]
    assert roles == totals["tokens"]

    # Drafts: the metric counts every draft slot scheduled (no padding on CPU).
    assert totals["drafts_padded"] == 0
    assert delta["draft_tokens"] == totals["drafts_scheduled"]
    # Accepted: the metric counts before the scheduler's stop checks and before the
    # frontend's stop-string trim; account for both, token by token.
    removed = trimmed_roles(trim_log, result.run_id)
    accounted = totals["accepted"] + totals["surplus_accepted"] + removed["accepted"]
    assert delta["accepted"] == accounted, (delta, totals, removed)
    if not removed["steps"] and not totals["surplus_tokens"]:
        assert delta["accepted"] == totals["accepted"]
    return {
        "method": method,
        "streams": len(shapes),
        "seconds": round(result.seconds, 2),
        "tokens": totals["tokens"],
        "accepted": totals["accepted"],
        "bonus": totals["bonus"],
        "target": totals["target"],
        "metrics_steps": totals["metrics_steps"],
        "surplus": totals["surplus_tokens"],
        "scheduler_trimmed_steps": removed["steps"],
        "metrics_delta": delta,
    }


def test_four_greedy_streams_reconcile_exactly(
    spec_server: tuple[str, server.Server, Path], socket_dir: str
) -> None:
    method, srv, trim_log = spec_server
    summary = check_run(method, srv, trim_log, shapes_4(), socket_dir)
    print(summary)
    assert summary["accepted"] > 0  # speculative decoding really ran


def test_sixteen_mixed_streams_reconcile_exactly(
    spec_server: tuple[str, server.Server, Path], socket_dir: str
) -> None:
    method, srv, trim_log = spec_server
    shapes = shapes_16()
    summary = check_run(method, srv, trim_log, shapes, socket_dir)
    print(summary)


def test_requests_that_cannot_be_exact_get_a_notice(
    spec_server: tuple[str, server.Server, Path], socket_dir: str
) -> None:
    method, srv, _ = spec_server
    shapes = [
        driver.Shape("chat", PROMPTS[0], 24),
        driver.Shape("chat", PROMPTS[1], 24, extra=(("stream_interval", 3),)),
        driver.Shape("completions", PROMPTS[2], 24, 0.8, extra=(("n", 2),)),
    ]
    result = driver.run(srv.url, shapes, socket_dir)
    assert [s.error for s in result.streams] == [None, None, None]
    assert result.verdicts[0] == ("exact", None)
    assert any(s["spec_method"] == method for s in result.sources if s["role"] == "scheduler")
    frontends = [f"{s['source_id']:016x}" for s in result.sources if s["role"] == "frontend"]
    if releases.probe().has("per_request_stream_interval"):
        assert result.verdicts[1][0] == "failed"
        assert result.verdicts[1][1] in {
            f"not exact: stream_interval=3 (notice 1 from source {source})" for source in frontends
        }
    else:
        # This release ignores the body field and streams every step: nothing to notice.
        assert result.verdicts[1] == ("exact", None)
    assert result.verdicts[2][0] == "failed"
    # Whichever comes first: the plugin's notice, or the SSE's second choice (rule 6).
    assert result.verdicts[2][1] in {
        "not exact: n=2: choices of a parallel-sampling request are not tracked "
        f"(notice 2 from source {source})"
        for source in frontends
    } | {"stream 2: SSE chunk with a choice other than the single choice 0 (index 1)"}


def test_sixty_four_recorded_streams_lose_nothing_and_replay_exactly(
    spec_server: tuple[str, server.Server, Path], socket_dir: str, tmp_path: Path
) -> None:
    """The shipped client (the real Session, headless) with --record at 64 streams:
    0 frames lost, every stream exact, and the recording replays to the same verdicts."""
    import asyncio

    from parallelhue import cli
    from parallelhue.headless import run_headless
    from parallelhue.ingest.record import read_recording

    method, srv, _ = spec_server
    record = tmp_path / f"run-{method}.phr"
    result = asyncio.run(
        run_headless(
            srv.url, num_streams=64, socket_dir=socket_dir, max_tokens=32,
            reconciler_kind="rust", mode="exact", prompt=PROMPTS[0], record=str(record),
            timeout=300.0, grace=10.0,
        )
    )  # fmt: skip
    assert result.exit_code == 0, (result.message, srv.log_tail(30))
    assert result.verdicts == [("exact", None)] * 64
    counters = result.counters
    assert (counters["gaps"], counters["dropped_reported"], counters["rejected_frames"]) == (
        0,
        0,
        0,
    )
    assert result.totals["tokens"] == result.sse_tokens > 0
    recording = read_recording(str(record))
    assert recording.footer is not None
    assert recording.footer["verdicts"] == [["exact", None]] * 64
    kinds = {event[1] for event in recording.events}
    assert {"start", "sse", "finish", "frame", "finalize"} <= kinds
    for kind in ("rust", "python"):
        code = cli.main(["replay", str(record), "--speed", "max", "--view", "plain",
                         "--reconciler", kind])  # fmt: skip
        assert code == 0, kind
