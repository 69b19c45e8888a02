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
from dataclasses import replace
from pathlib import Path
from typing import Any

import driver
import httpx
import pytest
import releases
import server

from parallelhue.reference import decode_to_dict

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


def _raw_stream(url: str, shape: driver.Shape) -> tuple[str, dict[str, Any] | None]:
    """The text and the usage chunk vLLM streams for `shape`, read raw."""
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
    text, usage = "", None
    with httpx.stream("POST", url + path, json=body, timeout=300) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                for choice in chunk.get("choices") or ():
                    text += (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                if chunk.get("usage") is not None:
                    usage = chunk
    return text, usage


def vllm_spec_metrics(url: str, shape: driver.Shape) -> dict[str, Any] | None:
    """`metrics.speculative_decoding` of the usage chunk vLLM sends for `shape`,
    read raw: the JSON path and vLLM's own totals, which the client does not use."""
    _, usage = _raw_stream(url, shape)
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


def _witness_facts(inputs: list[tuple[Any, ...]], streams: int) -> list[dict[str, Any]]:
    """Per stream, from the run's frames: the scheduler's steps with drafts (all, and
    those starting before the text's end), whether the scheduler (the engine) finished
    the request, and whether the text ended on a stop string."""
    facts = [
        {"steps": [], "engine_finished": False, "stop_string": False, "text_end": 0}
        for _ in range(streams)
    ]
    for item in inputs:
        if item[0] != "frame":
            continue
        frame = decode_to_dict(item[1])
        for record in frame.get("records", ()):
            if "stream" not in record or record["stream"] >= streams:
                continue
            fact = facts[record["stream"]]
            if frame["kind"] == "provenance":
                if record["drafts_scheduled"]:
                    fact["steps"].append(record["offset"])
                fact["engine_finished"] |= bool(record["flags"] & 1)
            elif frame["kind"] == "text":
                fact["text_end"] = max(fact["text_end"], record["offset"] + len(record["tokens"]))
                fact["stop_string"] |= bool(record["flags"] & 0b110)
    return facts


MIXED_PROMPTS = (
    PROMPT,
    "for i in range(10): print(i)\nfor i in range(10): print(i)\nfor i in",
    "東京は日本の首都です。東京は日本の首都です。東京は",
    "a = [1, 2, 3]\na = [1, 2, 3]\nb = [",
)


def _late_stop(text: str) -> str | None:
    """A stop string that first occurs late in `text` (after a third of it), so the
    request ran verify steps before the frontend stops it; None if there is none."""
    for start in range(len(text) * 2 // 3, len(text) - 3):
        candidate = text[start : start + 3]
        if candidate.strip() and text.find(candidate) >= len(text) // 3:
            return candidate
    return None


def mixed_shapes(url: str) -> list[driver.Shape]:
    """16 streams: chat and completions, temperature 0 and 0.8 (seeded), max_tokens 24
    and 64; on half of them a stop string taken from late in that request's own text
    (read once without it), so the frontend ends it after verify steps."""
    shapes = []
    for i in range(16):
        shape = driver.Shape(
            "chat" if i % 2 else "completions",
            MIXED_PROMPTS[i % 4],
            24 if i % 3 == 0 else 64,
            0.8 if (i // 2) % 2 else 0.0,
            seed=2000 + i,
            extra=USAGE,
        )
        if (i // 4) % 2:
            stop = _late_stop(_raw_stream(url, shape)[0])
            shape = replace(shape, stop=(stop,) if stop else ())
        shapes.append(shape)
    return shapes


def test_vllm_per_request_metrics_sixteen_mixed_streams(
    metrics_server: server.Server, socket_dir: str
) -> None:
    """16 mixed streams (`mixed_shapes`): vLLM sends the lists exactly for the streams
    the engine finished with at least one verify step, and each of those is
    cross-checked step by step. A stream the frontend ended on a stop string (the engine
    never finished it) gets none: vLLM 0.32 attaches them only to the engine's
    finishing output."""
    shapes = mixed_shapes(metrics_server.url)
    result = driver.run(metrics_server.url, shapes, socket_dir)
    errors = [(i, s.error) for i, s in enumerate(result.streams) if s.error]
    assert not errors, errors
    assert result.verdicts == [("exact", None)] * len(shapes), metrics_server.log_tail(30)
    facts = _witness_facts(result.inputs, len(shapes))
    listed, with_lists, rows = 0, 0, []
    for index, (stream, fact) in enumerate(zip(result.streams, facts, strict=True)):
        assert stream.usage is not None, f"stream {index}: no usage chunk"
        _, accepted, drafted = stream.usage
        shown = sum(1 for offset in fact["steps"] if offset < fact["text_end"])
        rows.append(
            f"stream {index}: stop string {fact['stop_string']}, engine finished "
            f"{fact['engine_finished']}, {len(fact['steps'])} verify steps ({shown} up to the "
            f"text's end), lists {None if accepted is None else len(accepted)}"
        )
        # vLLM's lists: exactly when the engine finished the request with verify steps.
        sent = fact["engine_finished"] and bool(fact["steps"])
        assert (accepted is not None) == sent, rows[-1]
        assert (drafted is not None) == sent, rows[-1]
        if accepted is not None:
            assert len(accepted) == len(fact["steps"]), rows[-1]
            listed += len(accepted)
            with_lists += 1
    assert result.totals["metrics_steps"] == listed > 0
    print("\n".join(f"{row}, stop {shape.stop}" for row, shape in zip(rows, shapes, strict=True)))
    stop_ended = [f for f in facts if f["stop_string"] and not f["engine_finished"]]
    unchecked = sum(sum(1 for o in f["steps"] if o < f["text_end"]) for f in stop_ended)
    print(
        f"{listed} verify steps of {with_lists} of {len(shapes)} streams cross-checked; "
        f"{len(stop_ended)} streams ended on a stop string without the engine's finish "
        f"({unchecked} verify steps up to their stop strings), no lists for any of them"
    )
