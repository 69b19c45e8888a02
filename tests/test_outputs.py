"""--json against its documented schema; replay's markers and its one-line errors."""

from __future__ import annotations

import gzip
import json
import os
import re
import tempfile
from typing import Any

import jsonschema
import pytest

from parallelhue import cli
from test_cli import _CLEARED

SCHEMA_PATH = os.path.join(os.path.dirname(__file__), "..", "docs", "result.schema.json")
CLIENT_DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "CLIENT.md")


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))


def schema() -> dict[str, Any]:
    with open(SCHEMA_PATH, encoding="utf-8") as handle:
        data = json.load(handle)
    assert isinstance(data, dict)
    return data


def run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main([*args, "--json"])
    out, _err = capsys.readouterr()
    document = json.loads(out)  # stdout holds the JSON document and nothing else
    jsonschema.validate(document, schema(), cls=jsonschema.Draft202012Validator)
    return code, document


def test_the_schema_is_a_valid_json_schema_and_documented() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())
    with open(CLIENT_DOC, encoding="utf-8") as handle:
        doc = handle.read()
    section = doc.split("## --json", 1)[1].split("\n## ", 1)[0]
    for key in schema()["required"]:
        assert f"`{key}`" in section, key
    for key in schema()["$defs"]["stream"]["required"]:
        assert f"`{key}`" in section, key


def test_json_of_an_exact_run_validates_and_carries_every_figure(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, result = run_json(
        ["demo", "--concurrency", "3", "--max-tokens", "24", "--step-ms", "1", "--mode", "exact"],
        capsys,
    )
    assert code == 0 and result["exit_code"] == 0 and result["message"] is None
    assert result["simulated"] is True and result["replay_of"] is None
    assert result["server"]["api"] == "chat" and result["server"]["model"] == "parallelhue-sim"
    streams = result["streams"]
    assert [s["verdict"] for s in streams] == ["exact"] * 3
    for stream in streams:
        assert stream["finish_reason"] == "length" and stream["tokens"] == 24
        assert stream["confirmed_tokens"] == 24 and stream["steps"] >= 1
        roles = stream["roles"]
        assert roles["accepted"] + roles["target"] + roles["bonus"] + roles["plain"] == 24
        assert sum(int(k) * v for k, v in stream["tokens_per_step_histogram"].items()) == 24
        assert stream["ttft_s"] is not None and stream["itl_s"]["p99"] >= stream["itl_s"]["p50"]
        assert stream["e2e_s"] >= stream["ttft_s"]
    total = result["total"]
    assert total["tokens"] == 72 and total["labels"] == {"EXACT TOKEN PROVENANCE": 3}
    assert total["steps"] == sum(s["steps"] for s in streams)


def test_json_of_a_downgraded_and_a_chunk_run(capsys: pytest.CaptureFixture[str]) -> None:
    _code, result = run_json(
        ["demo", "--concurrency", "2", "--max-tokens", "24", "--step-ms", "1",
         "--fault", "sse-byte,target-stream:1"],
        capsys,
    )  # fmt: skip
    broken = result["streams"][1]
    assert broken["label"] == "SSE CHUNK MODE" and broken["verdict"] == "failed"
    assert broken["reason"].startswith("byte mismatch")
    assert broken["acceptance_frozen"] is (broken["acceptance"] is not None)
    _code, result = run_json(
        ["demo", "--concurrency", "2", "--max-tokens", "10", "--step-ms", "1", "--mode", "chunk"],
        capsys,
    )
    for stream in result["streams"]:
        # No telemetry: null, never walls of zeros.
        assert stream["steps"] is None and stream["roles"] is None and stream["tokens"] == 10


def _record(directory: str, capsys: pytest.CaptureFixture[str]) -> str:
    record = os.path.join(directory, "run.phr")
    code = cli.main(
        ["demo", "--concurrency", "2", "--max-tokens", "12", "--step-ms", "1",
         "--reconciler", "python", "--view", "plain", "--record", record]
    )  # fmt: skip
    assert code == 0
    capsys.readouterr()
    return record


def test_replay_is_marked_as_a_replay(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 10: nothing marked the output as a replay.
    record = _record(str(tmp_path), capsys)
    code = cli.main(["replay", record, "--speed", "max", "--view", "plain"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith(f"SIMULATED ENGINE · REPLAY of {record} · ")
    assert f"Summary (SIMULATED ENGINE: simulated numbers) (replay of {record})" in out
    code, result = run_json(["replay", record, "--speed", "max", "--view", "plain"], capsys)
    assert code == 0 and result["replay_of"] == record


def test_replay_without_a_footer_warns_and_exits_1(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 10: a recording without its footer replayed with exit 0 and no warning.
    from parallelhue.ingest.record import read_recording, write_recording

    recording = read_recording(_record(str(tmp_path), capsys))
    recording.footer = None  # as an interrupted run leaves it
    cut = os.path.join(str(tmp_path), "cut.phr")
    write_recording(cut, recording)
    code = cli.main(["replay", cut, "--speed", "max", "--view", "plain"])
    out, err = capsys.readouterr()
    assert code == 1
    assert err == (
        f"parallelhue: replay: {cut} has no footer (the recorded run was interrupted or the "
        "file is cut short): the replayed verdicts could not be compared with the recording\n"
    )
    assert re.search(r"^#1 +EXACT", out, re.M)  # the replay itself is still shown


def _fixed_recording() -> bytes:
    """A valid recording with fixed bytes (gzip without name or time): the damage below
    hits the same place on every run."""
    from parallelhue._native import encode_recording

    header = {
        "run_id": "0" * 32, "num_streams": 1, "mode": "chunk", "backend_override": "auto",
        "simulated": False, "model": "m", "max_tokens": 400, "prompts": ["hi"],
    }  # fmt: skip
    events: list[tuple[Any, ...]] = [(0.0, "start", 0)]
    events += [(0.001 * i, "sse", 0, f"word{i} ", [i]) for i in range(1, 400)]
    events += [(0.5, "finish", 0, "length")]
    footer = {"verdicts": [["pending", None]], "errors": [None], "wall_seconds": 0.6}
    data = encode_recording(json.dumps(header), events, json.dumps(footer))
    return gzip.compress(bytes(data), mtime=0)


def test_replay_of_a_damaged_gzip_is_one_line_exit_2(
    tmp_path: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    # Defect 10: a flipped byte inside the gzip stream gave "internal error ... Error -3".
    data = _fixed_recording()
    intact = os.path.join(str(tmp_path), "intact.phr")
    with open(intact, "wb") as handle:
        handle.write(data)
    assert cli.main(["replay", intact, "--speed", "max", "--view", "plain"]) == 0
    capsys.readouterr()
    cases = [
        # A flipped byte in the first deflate block's header (after gzip's 10-byte header):
        # the data no longer inflates.
        (10, "is damaged (its gzip data does not decompress)"),
        # A flipped byte of the trailer's CRC-32: the data inflates, the checksum differs.
        (len(data) - 8, "is damaged (its gzip checksum does not match)"),
        # Cut short: the end-of-stream marker is missing.
        (None, "is damaged (its gzip data ends early)"),
    ]
    for position, why in cases:
        damaged = os.path.join(str(tmp_path), "damaged.phr")
        with open(damaged, "wb") as handle:
            if position is None:
                handle.write(data[: len(data) // 2])
            else:
                handle.write(
                    data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]
                )
        code = cli.main(["replay", damaged, "--view", "plain"])
        out, err = capsys.readouterr()
        assert (code, out) == (2, "")
        assert err == f"parallelhue: error: replay: {damaged} {why}\n"


def test_ctrl_c_still_prints_the_json_of_what_arrived() -> None:
    import signal
    import subprocess
    import sys
    import time

    socket_dir = os.environ["PARALLELHUE_SOCKET_DIR"]
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env["PYTHONPATH"] = os.path.join(os.path.dirname(__file__), "..", "python")
    env["PARALLELHUE_SOCKET_DIR"] = socket_dir
    process = subprocess.Popen(
        [sys.executable, "-m", "parallelhue", "demo", "--concurrency", "2", "--max-tokens",
         "8000", "--step-ms", "20", "--json"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not any(name.endswith(".sock") for name in os.listdir(socket_dir)):
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    time.sleep(0.5)  # some tokens arrive
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    result = json.loads(out)
    jsonschema.validate(result, schema(), cls=jsonschema.Draft202012Validator)
    assert result["interrupted"] is True and result["exit_code"] == 130
    assert result["total"]["tokens"] > 0
    assert err.endswith("parallelhue: interrupted\n")
    assert "(interrupted: partial figures)" in err  # the partial summary went to stderr
