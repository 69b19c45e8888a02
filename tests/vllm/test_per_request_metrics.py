"""The fourth witness on real vLLM: `--per-request-spec-decode-metrics detailed`.

vLLM (from 0.29) puts `metrics.speculative_decoding` in the final usage
chunk of a stream (with `stream_options.include_usage`) when the engine
itself finished the request: per verify step, in order, the accepted drafts
(counted before a stop cut the step) and the drafted tokens (grammar-invalid
ones excluded). Both reconcilers check them against the scheduler's records
with drafts; this runs one cheap ngram server and checks the JSON path, that
every stream is exact, and that every listed step was cross-checked.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import driver
import httpx
import pytest
import releases
import server

pytestmark = pytest.mark.vllm

PROMPT = "def add(x, y): return x + y\ndef add(x, y): return x + y\ndef add("
USAGE = (("stream_options", {"include_usage": True}),)


@pytest.fixture(scope="module")
def metrics_server(tiny_model: Path, socket_dir: str, logs_dir: Path) -> Iterator[server.Server]:
    releases.require("per_request_spec_metrics")
    srv = server.start(
        tiny_model,
        logs_dir / "server-metrics.log",
        speculative=dict(server.NGRAM),
        plugin=True,
        socket_dir=socket_dir,
        extra_args=["--per-request-spec-decode-metrics", "detailed"],
    )
    try:
        yield srv
    finally:
        srv.stop()


def vllm_spec_metrics(url: str, shape: driver.Shape) -> dict[str, Any] | None:
    """`metrics.speculative_decoding` of the usage chunk vLLM sends for `shape`,
    read raw: the JSON path and vLLM's own totals, which the client does not use."""
    chat = shape.endpoint == "chat"
    body: dict[str, Any] = {
        "model": "tiny",
        "stream": True,
        "max_tokens": shape.max_tokens,
        "temperature": shape.temperature,
        "seed": shape.seed,
        **dict(shape.extra),
    }
    if shape.stop:
        body["stop"] = list(shape.stop)
    if chat:
        body["messages"] = [{"role": "user", "content": shape.prompt}]
    else:
        body["prompt"] = shape.prompt
    path = "/v1/chat/completions" if chat else "/v1/completions"
    usage: dict[str, Any] | None = None
    with httpx.stream("POST", url + path, json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk.get("usage") is not None:
                    usage = chunk
    assert usage is not None, "no usage chunk"
    spec: dict[str, Any] | None = (usage.get("metrics") or {}).get("speculative_decoding")
    return spec


def test_vllm_per_request_metrics_cross_check_every_verify_step(
    metrics_server: server.Server, socket_dir: str
) -> None:
    shapes = [
        # Engine finishes (max_tokens, maybe EOS): metrics in the usage chunk.
        driver.Shape("completions", PROMPT, 40, 0.0, seed=1, extra=USAGE),
        driver.Shape("chat", PROMPT, 33, 0.0, seed=2, extra=USAGE),
        # A stop string ends it in the frontend: the engine never finished it, no metrics.
        driver.Shape("completions", PROMPT, 40, 0.0, stop=("y)",), seed=3, extra=USAGE),
    ]
    result = driver.run(metrics_server.url, shapes, socket_dir)
    errors = [(i, s.error) for i, s in enumerate(result.streams) if s.error]
    assert not errors, errors
    assert result.verdicts == [("exact", None)] * len(shapes), metrics_server.log_tail(30)
    listed = 0
    for index, stream in enumerate(result.streams):
        # What the client extracted from the usage chunk (C2 push_sse_usage).
        assert stream.usage is not None, f"stream {index}: no usage chunk"
        completion_tokens, accepted, drafted = stream.usage
        assert completion_tokens == len(stream.token_ids)
        # vLLM's own object at that JSON path, read raw (not reconciled): its totals.
        spec = vllm_spec_metrics(metrics_server.url, shapes[index])
        if stream.finish_reason == "stop" and shapes[index].stop:
            assert accepted is None and drafted is None, f"stream {index}: metrics without finish"
            assert spec is None, f"stream {index}: metrics without the engine's finish"
            continue
        assert accepted is not None and drafted is not None, f"stream {index}: no metrics"
        assert spec is not None, f"stream {index}: no metrics.speculative_decoding"
        assert len(accepted) == len(drafted) > 0
        assert len(spec["per_step_accepted"]) == len(spec["per_step_drafted"])
        assert len(spec["per_step_accepted"]) == spec["num_spec_steps"] > 0
        assert sum(spec["per_step_accepted"]) == spec["num_accepted_draft_tokens"]
        listed += len(accepted)
    # Every verify step vLLM listed was matched with a scheduler record with drafts.
    assert result.totals["metrics_steps"] == listed > 0


def test_vllm_per_request_metrics_summary_says_cross_checked(
    metrics_server: server.Server, socket_dir: str
) -> None:
    """`parallelhue` itself: exact mode, 3 streams the engine finishes (max_tokens), and
    the summary says every stream's verify steps were cross-checked."""
    done = subprocess.run(
        [
            sys.executable, "-m", "parallelhue", PROMPT, "--endpoint",
            metrics_server.url + "/v1/completions", "--mode", "exact", "--concurrency", "3",
            "--max-tokens", "40", "--temperature", "0", "--view", "plain",
        ],
        env={**os.environ, "PARALLELHUE_SOCKET_DIR": socket_dir},
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, ""), done.stderr + metrics_server.log_tail(30)
    assert done.stdout.count("EXACT TOKEN PROVENANCE ·") == 3, done.stdout
    checked = re.findall(
        r"cross-checked with vLLM's per-request metrics: (\d+) verify steps? of 3 of 3 streams "
        r"agree with the scheduler's records",
        done.stdout,
    )
    assert len(checked) == 1 and int(checked[0]) >= 3, done.stdout
