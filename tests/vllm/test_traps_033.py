"""vLLM 0.33's role traps with real 0.33.0 classes, and what the client then shows.

vllm 0.33.0 is a GPU build, but its config, output processor, collectors and
detokenizer import on the CPU from the wheel's Python sources (extracted once
from the wheel test_signatures.py downloads) with the vLLM venv's torch.
tests/vllm/traps_033.py installs the adapter the plugin chooses into those real
classes and drives a real OutputProcessor (an output carrying `error`; a
streaming-input request behind the real StreamingInputOutputCollector) and
the scheduler hook under real SpeculativeConfigs (adaptive verification on;
`fly`). Only the Scheduler is a stand-in (a real one needs a whole VllmConfig).
The frames it sent are then reconciled by both reconcilers beside the SSE the
client would have received: every trapped stream fails with the notice's reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import pytest
import server
from test_signatures import WHEEL_CACHE, wheel

from parallelhue import _native  # type: ignore[attr-defined]
from parallelhue.reference import Reconciler, decode_frame
from parallelhue_vllm import __version__, wire

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN = "0123456789abcdef0123456789abcdef"


def sources_033() -> Path:
    """The 0.33.0 wheel's Python files, extracted once next to the wheel cache."""
    target = WHEEL_CACHE / "vllm-0.33.0-py"
    if not (target / "EXTRACTED").exists():
        with zipfile.ZipFile(wheel("0.33.0")) as archive:
            names = [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            archive.extractall(target, names)
        (target / "EXTRACTED").write_text("vllm 0.33.0 *.py\n")
    return target


@pytest.fixture(scope="module")
def run_033(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    model = server.build_model(tmp_path_factory.mktemp("model-033") / "tiny")
    with tempfile.TemporaryDirectory(prefix="ph033-", dir="/tmp") as sockets:
        os.chmod(sockets, 0o700)
        done = subprocess.run(
            ["nice", "-n", "5", str(vllm_python), str(HERE / "traps_033.py"), str(model), sockets],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            env={
                "PYTHONPATH": f"{sources_033()}:{REPO / 'plugin'}",
                "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "PATH": "/usr/bin:/bin",
                "HOME": os.environ.get("HOME", "/root"),
            },
        )
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def frames_of(result: dict[str, Any]) -> list[bytes]:
    return [bytes.fromhex(h) for h in result["frames"]]


def test_the_traps_exist_in_0_33_as_the_plugin_reads_them(run_033: dict[str, Any]) -> None:
    facts = run_033["facts"]
    assert facts["vllm"] == "0.33.0"
    assert facts["installed"] is True  # the adapter's signature and field checks passed
    assert facts["adapter"] == "vLLM 0.32.0-0.34.0"
    assert facts["adaptive_field_default"] is False
    assert facts["rejection_methods"] == ["standard", "synthetic", "block", "fly"]
    assert facts["streaming_collector_overrides_put"] is True
    assert facts["error_field"] is True
    delivered = run_033["delivered"]
    # What the real collectors gave the API server: text, then the engine's exception.
    assert delivered["error_first_text"]
    assert delivered["error_raised"] == "RetryableRequestError: KV blocks lost"
    assert delivered["error_state_left"] is False
    assert delivered["streaming_text"]


def test_each_trap_is_a_notice_from_the_real_hooks(run_033: dict[str, Any]) -> None:
    notices: dict[int, tuple[int, str]] = {}
    verification: dict[int, int] = {}
    provenance: dict[int, list[int]] = {}
    source_stream: dict[int, int] = {}
    frames = [decode_frame(f) for f in frames_of(run_033)]
    for frame in frames:
        for record in frame.records:
            source_stream[frame.header.source_id] = record.stream
            if isinstance(record, wire.NoticeRecord):
                notices[record.stream] = (record.code, record.message)
            elif isinstance(record, wire.ProvenanceRecord):
                provenance[record.stream] = list(record.roles)
    for frame in frames:
        if frame.hello is not None and frame.hello.role == wire.SOURCE_SCHEDULER:
            verification[source_stream[frame.header.source_id]] = frame.hello.verification
    assert notices == {
        0: (
            wire.NOTICE_HOOK_BYPASSED,
            "the engine ended the request with an error (kv_load_failure: KV blocks lost); "
            "its last output did not pass the telemetry hooks",
        ),
        1: (
            wire.NOTICE_HOOK_BYPASSED,
            "streaming-input request: its outputs pass StreamingInputOutputCollector across "
            "input chunks, which the telemetry hooks do not follow",
        ),
        2: (
            wire.NOTICE_ROLES_UNVERIFIABLE,
            "roles not derivable: ngram adaptive verification is on "
            "(enable_adaptive_verification), so the worker may verify fewer drafts than "
            "were scheduled and a bonus cannot be told from a correction",
        ),
    }
    # Adaptive verification: no roles sent at all; fly: roles, and the hello says lossy.
    assert 2 not in provenance
    assert provenance[3] == [wire.ROLE_ACCEPTED] * 3 + [wire.ROLE_BONUS]
    assert verification == {2: wire.VERIFICATION_STANDARD, 3: wire.VERIFICATION_FLY}


@pytest.mark.parametrize("cls", [Reconciler, _native.Reconciler])
def test_the_client_fails_each_trapped_stream_with_its_reason(
    run_033: dict[str, Any], cls: Any
) -> None:
    """Stream 0 (engine error after two tokens) and 1 (streaming input): the real
    frontend frames beside a scheduler that emitted their first tokens (hand-made:
    the EngineCore side did not run) and the SSE text the collectors delivered."""
    run = bytes.fromhex(RUN)
    rec = cls(RUN, 2)
    source = 0x5C
    rec.push_frame(
        wire.encode_hello(
            wire.Header(run, source, 0, 0, 0),
            wire.Hello(wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_NONE, False, 0,
                       __version__, "0.33.0", "", wire.VERIFICATION_NONE),
        )
    )  # fmt: skip
    text_ids: dict[int, list[int]] = {0: [], 1: []}
    ours = frames_for_streams(run_033, {0, 1})
    for frame in map(decode_frame, ours):
        for record in frame.records:
            if isinstance(record, wire.TextRecord):
                text_ids[record.stream] += [t.token_id for t in record.tokens]
    seq = 1
    for stream, ids in text_ids.items():
        for offset, token_id in enumerate(ids):
            record = wire.ProvenanceRecord(stream, offset, [token_id], [wire.ROLE_PLAIN], 0)
            header = wire.Header(run, source, seq, seq, 0)
            rec.push_frame(wire.encode_records(wire.KIND_PROVENANCE, header, [record]))
            seq += 1
    rec.push_frames(ours)
    delivered = run_033["delivered"]
    for stream, text in ((0, delivered["error_first_text"]), (1, delivered["streaming_text"])):
        rec.push_sse_id(stream, f"cmpl-ph1_{RUN}_{stream}")
        if text_ids[stream]:
            rec.push_sse(stream, text, text_ids[stream])
        rec.finish_sse(stream, None)  # the body ended with the error, no finish_reason
    rec.finalize()
    verdicts = [rec.verdict(0), rec.verdict(1)]
    assert [v[0] for v in verdicts] == ["failed", "failed"]
    assert verdicts[0][1] is not None and verdicts[0][1].startswith(
        "not exact: the engine ended the request with an error (kv_load_failure: KV blocks "
        "lost); its last output did not pass the telemetry hooks (notice 7 from source "
    )
    assert verdicts[1][1] is not None and verdicts[1][1].startswith(
        "not exact: streaming-input request: its outputs pass StreamingInputOutputCollector"
    )
    assert not any(event[0] == "exact" for event in rec.drain())


def frames_for_streams(result: dict[str, Any], streams: set[int]) -> list[bytes]:
    """The frames (hellos included) of the sources that sent records for `streams`."""
    raw = frames_of(result)
    decoded = [decode_frame(f) for f in raw]
    source_stream = {
        frame.header.source_id: record.stream for frame in decoded for record in frame.records
    }
    return [
        frame
        for frame, meaning in zip(raw, decoded, strict=True)
        if source_stream.get(meaning.header.source_id) in streams
    ]
