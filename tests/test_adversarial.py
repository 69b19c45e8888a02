"""The lying-server suite (issue 9): every case through the real client.

A lying OpenAI-compatible server (tests/adversarial/server.py) speaks
docs/PROTOCOL.md to the letter and lies about one field (or, consistently,
with several witnesses); each case runs through a real `Session` for both
reconcilers and both modes. Never EXACT where witnesses contradict, EXACT on
the honest controls. tests/adversarial/CASES.md is the catalog.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import parallelhue.session as session_module
from adversarial.cases import CASES, COMBOS, Case, case_by_id
from adversarial.catalog import render
from adversarial.checks import check
from adversarial.harness import run_transcript
from adversarial.server import LyingServer
from adversarial.story import EOS, build
from adversarial.transcript import Transcript
from parallelhue.cli.config import parse_replay
from parallelhue.cli.replay import replay
from parallelhue.screen.views import make_console
from parallelhue_vllm import wire

try:
    from parallelhue._native import Reconciler as _NativeReconciler  # noqa: F401

    HAVE_NATIVE = True
except ImportError:
    HAVE_NATIVE = False

ROOT = Path(__file__).resolve().parent.parent
CATALOG = ROOT / "tests" / "adversarial" / "CASES.md"
PROTOCOL = ROOT / "docs" / "PROTOCOL.md"
# Long enough for late frames on a loaded machine; an honest run never waits for it
# (the grace period ends as soon as every stream has its verdict).
GRACE_SECONDS = 0.3

# Every field a witness sends (docs/PROTOCOL.md layout tables) and every SSE field the
# client reads: the catalog has at least one case for each.
FIELDS = (
    *(f"header.{f}" for f in (
        "magic", "version", "kind", "flags", "run_id", "source_id", "seq", "step",
        "timestamp_ns", "dropped", "body_len",
    )),
    *(f"hello.{f}" for f in (
        "role", "engine", "role_derivation", "async_scheduling", "num_speculative_tokens",
        "verification", "plugin_version", "engine_version", "spec_method",
    )),
    *(f"provenance.{f}" for f in (
        "record_count", "stream", "flags.finished", "flags.trimmed", "finish_reason",
        "offset", "n_tokens", "drafts_scheduled", "drafts_padded", "token_ids", "roles",
    )),
    *(f"text.{f}" for f in (
        "stream", "flags.finished", "flags.text_truncated", "flags.tokens_trimmed",
        "finish_reason", "offset", "n_tokens", "trimmed_tokens", "http_len", "token_id",
        "frag_len", "span_back", "fragments", "http_delta",
    )),
    "notice.stream", "notice.code", "notice.message", "notice.timing",
    *(f"sse.{f}" for f in (
        "id", "choices.index", "choices", "delta.content", "text", "token_ids",
        "finish_reason", "usage.completion_tokens", "usage.prompt_tokens", "done", "event",
        "comment_lines", "bytes",
        "metrics.per_step_accepted", "metrics.per_step_drafted",
    )),
)  # fmt: skip


@pytest.fixture(scope="module")
def server() -> Iterator[LyingServer]:
    with LyingServer() as lying:
        yield lying


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[str]:
    directory = tempfile.mkdtemp(prefix="pha", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(autouse=True)
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_module, "GRACE_SECONDS", GRACE_SECONDS)


def _params() -> Iterator[Any]:
    need_native = os.environ.get("PH_REQUIRE_NATIVE") == "1"
    for case in CASES:
        for combo in COMBOS:
            reconciler, mode = combo.split("-")
            marks: list[pytest.MarkDecorator] = []
            if case.xfail is not None and combo in case.xfail_in:
                marks.append(pytest.mark.xfail(strict=True, reason=case.xfail))
            if reconciler == "rust" and not HAVE_NATIVE and not need_native:
                marks.append(pytest.mark.skip(reason="the Rust extension is not built"))
            yield pytest.param(case, reconciler, mode, id=f"{case.id}-{combo}", marks=marks)


@pytest.mark.parametrize(("case", "reconciler", "mode"), list(_params()))
def test_lie(case: Case, reconciler: str, mode: str, server: LyingServer, socket_dir: str) -> None:
    outcome = run_transcript(
        server, case.transcript, mode=mode, reconciler=reconciler, socket_dir=socket_dir
    )
    check(case, outcome, mode)


# One lie per C2 input the SSE readers extract (the chunk id, another choice, the usage
# count, vLLM's per-step lists, choice 0's finish_reason): each goes through the
# real client, its recording replays to the same verdicts with either reconciler.
C2_INPUT_CASES = (
    "sse.id.changed",
    "sse.choices.index",
    "sse.usage.completion_tokens",
    "sse.metrics.drafted",
    "sse.metrics.contradict_then_absent",
    "sse.finish_reason.length",
)


@pytest.mark.parametrize("reconciler", ["rust", "python"])
@pytest.mark.parametrize("case_id", C2_INPUT_CASES)
def test_each_sse_input_is_recorded_and_replays_to_the_same_verdicts(
    case_id: str, reconciler: str, server: LyingServer, socket_dir: str, tmp_path: Path
) -> None:
    if not HAVE_NATIVE and os.environ.get("PH_REQUIRE_NATIVE") != "1":
        pytest.skip("the Rust extension is not built")
    case = case_by_id(case_id)
    record = str(tmp_path / "run.phr")
    live = run_transcript(
        server, case.transcript, mode="auto", reconciler=reconciler, socket_dir=socket_dir,
        record=record,
    )  # fmt: skip
    check(case, live, "auto")
    assert live.streams[0].verdict == "failed"
    for kind in ("rust", "python"):
        config = parse_replay(
            [record, "--speed", "max", "--view", "plain", "--reconciler", kind],
            env={},
            stdout_tty=False,
        )
        console = make_console(True, plain=True)
        console.file = io.StringIO()
        code, message, model, _view = asyncio.run(replay(config, console))
        # The same exit line as the live run (never "replay differs from the recording").
        assert (code, message) == (live.exit_code, live.message), kind
        assert [(s.verdict, s.reason, s.error) for s in model.streams] == [
            (s.verdict, s.reason, s.error) for s in live.streams
        ], kind


def test_metrics_control_cross_checks_every_verify_step(
    server: LyingServer, socket_dir: str
) -> None:
    # The honest control with vLLM's per-request metrics: every verify step (record with
    # drafts) of both streams was matched, which the summary's evidence relies on.
    case = case_by_id("honest.sse_metrics")
    for reconciler in ("rust", "python") if HAVE_NATIVE else ("python",):
        outcome = run_transcript(
            server, case.transcript, mode="auto", reconciler=reconciler, socket_dir=socket_dir
        )
        check(case, outcome, "auto")
        steps = [s.stats.get("metrics_steps") for s in outcome.streams]
        transcript = case.transcript("0" * 32)
        with_drafts = [
            sum(1 for f in transcript.frames(kind=wire.KIND_PROVENANCE) for r in f.records
                if r.stream == stream and r.drafts_scheduled)  # type: ignore[union-attr]
            for stream in range(transcript.streams)
        ]  # fmt: skip
        assert steps == with_drafts == [5, 3], reconciler
        assert outcome.totals.get("metrics_steps") == 8, reconciler


def test_catalog_is_current() -> None:
    assert CATALOG.read_text(encoding="utf-8") == render(), (
        "regenerate it: cd tests && python -m adversarial.catalog > adversarial/CASES.md"
    )


def test_catalog_covers_every_field() -> None:
    covered = {case.field for case in CASES}
    assert [f for f in FIELDS if f not in covered] == []


def test_case_ids_are_unique_and_xfails_name_the_issue() -> None:
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    for case in CASES:
        assert case.xfail is None or case.xfail.startswith(("issue 9: ", "finding: ")), case.id
        assert set(case.xfail_in) <= set(COMBOS), case.id
        assert case.expect in ("fail", "exact", "claim", "limit", "uncolored"), case.id
        assert case.rule or case.expect == "exact", case.id


def _protocol_section(title: str) -> str:
    """The text of PROTOCOL.md's section whose heading contains `title` ('' if none)."""
    text = PROTOCOL.read_text(encoding="utf-8")
    match = re.search(rf"^(#+) [^\n]*{re.escape(title)}[^\n]*\n", text, re.MULTILINE | re.I)
    if match is None:
        return ""
    level = len(match.group(1))
    rest = text[match.end() :]
    end = re.search(rf"^#{{1,{level}}} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


NOT_PROVEN = "What EXACT proves"


@pytest.mark.parametrize(
    "field", sorted({c.field for c in CASES if c.expect == "claim"}), ids=lambda f: f
)
def test_claimed_fields_are_documented_as_no_evidence(field: str) -> None:
    # A field whose lie changes nothing must say so where EXACT's meaning is defined.
    name = field.split(".")[-1]
    assert name in _protocol_section(NOT_PROVEN), field


def test_consistent_lies_are_documented_as_limits() -> None:
    section = _protocol_section(NOT_PROVEN)
    assert "consistent" in section.lower()
    # Each lie the suite shows passing on purpose is named where EXACT's limits are.
    limits = [case.id for case in CASES if case.expect == "limit"]
    assert len(limits) >= 8
    assert [case_id for case_id in limits if f"`{case_id}`" not in section] == []


def _prov_records(t: Transcript, stream: int) -> list[wire.ProvenanceRecord]:
    return [
        r
        for f in t.frames(kind=wire.KIND_PROVENANCE)
        for r in f.records
        if isinstance(r, wire.ProvenanceRecord) and r.stream == stream
    ]


def _text_records(t: Transcript, stream: int) -> list[wire.TextRecord]:
    return [
        r
        for f in t.frames(kind=wire.KIND_TEXT)
        for r in f.records
        if isinstance(r, wire.TextRecord) and r.stream == stream
    ]


def test_honest_bases_hold_what_they_describe() -> None:
    """The controls are only worth their description: check each base's shape."""
    run_id = "0" * 32
    chat = build("chat", run_id)
    tokens = [tok for r in _text_records(chat, 0) for tok in r.tokens]
    assert {tok.span_back for tok in tokens} == {0, 1, 2}  # characters over 2 and 3 tokens
    steps_of = {
        r.offset + i: f.step
        for f in chat.frames(kind=wire.KIND_PROVENANCE)
        for r in f.records
        if r.stream == 0
        for i in range(len(r.token_ids))  # type: ignore[union-attr]
    }
    offset = 0
    crossing = []
    for tok in tokens:
        if tok.fragment and tok.span_back and steps_of[offset - tok.span_back] != steps_of[offset]:
            crossing.append(tok.fragment.decode())
        offset += 1
    assert crossing == ["日本", "🙂"]  # fragments whose bytes come from two engine steps
    last0, last1 = _prov_records(chat, 0)[-1], _prov_records(chat, 1)[-1]
    assert (last0.trimmed, last0.finish_reason, last0.token_ids[-1]) == (True, 1, EOS)
    assert (last1.trimmed, last1.finish_reason) == (True, wire.FINISH_LENGTH)
    assert 2 not in {f.step for f in chat.frames() if any(r.stream == 1 for r in f.records)}
    roles = {role for r in _prov_records(chat, 0) for role in r.roles}
    assert roles == {wire.ROLE_PLAIN, wire.ROLE_ACCEPTED, wire.ROLE_TARGET, wire.ROLE_BONUS}

    stop = build("stop_string", run_id)
    end = _text_records(stop, 0)[-1]
    assert (end.text_truncated, end.tokens_trimmed, end.trimmed_tokens) == (True, True, 1)
    assert len(b"".join(r.http_delta for r in _text_records(stop, 0))) < len(
        b"".join(tok.fragment for r in _text_records(stop, 0) for tok in r.tokens)
    )
    text_end = end.offset + len(end.tokens)
    assert _prov_records(stop, 0)[-1].offset > text_end  # a whole surplus step

    max_tokens = build("max_tokens", run_id)
    ends = [_prov_records(max_tokens, s)[-1] for s in (0, 1)]
    assert [(e.finish_reason, e.trimmed) for e in ends] == [(2, True), (2, False)]

    no_spec = build("no_spec", run_id)
    assert all(r.roles == [wire.ROLE_PLAIN] for s in (0, 1) for r in _prov_records(no_spec, s))
    assert no_spec.hello("sched").num_speculative_tokens == 0

    merged = build("merged_sse", run_id)
    steps_per_chunk = [len(e.choice["token_ids"]) for e in merged.sse_events(0) if e.is_content]
    assert len(steps_per_chunk) < len(_prov_records(merged, 0))

    reordered = build("reordered", run_id)
    seqs = [f.seq for f in reordered.frames("sched")]
    assert seqs != sorted(seqs)
    text_seqs = [f.seq for f in reordered.frames("front")]
    assert len(text_seqs) == len(set(text_seqs)) + 1  # one frame sent twice

    two = build("two_frontends", run_id)
    assert {f.source for f in two.frames(kind=wire.KIND_TEXT) if f.records[0].stream == 1} == {
        "front2"
    }
