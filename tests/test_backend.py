"""The backend verdict comes from evidence, and the screen says which evidence."""

from __future__ import annotations

import tempfile

import pytest

from client_fakes import FakeServer
from parallelhue import cli, session
from parallelhue.ingest.metrics import parse_metrics, server_deltas
from parallelhue.model.backend import detect_backend
from test_cli import _CLEARED

SCHEDULER_HELLO = {
    "source_id": 1,
    "role": "scheduler",
    "engine": "vllm",
    "role_derivation": "draft_ids",
    "async_scheduling": False,
    "num_speculative_tokens": 3,
    "plugin_version": "0.1.0",
    "engine_version": "0.32.0+cpu",
    "spec_method": "ngram",
}

SPEC_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
"""

PLAIN_METRICS = """\
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
"""


def test_hello_is_the_strongest_evidence() -> None:
    backend = detect_backend("auto", [SCHEDULER_HELLO], parse_metrics(PLAIN_METRICS))
    assert backend.name == "ngram"
    assert backend.speculative
    assert backend.evidence == "plugin hello: vLLM 0.32.0+cpu, K=3, roles from real draft ids"
    assert not backend.simulated


def test_hello_without_speculation_is_monochrome() -> None:
    hello = dict(SCHEDULER_HELLO, spec_method="", num_speculative_tokens=0, role_derivation="none")
    backend = detect_backend("auto", [hello], parse_metrics(SPEC_METRICS))
    assert not backend.speculative
    assert backend.name == "no speculative decoding"


def test_simulated_engine_is_named() -> None:
    hello = dict(SCHEDULER_HELLO, engine="simulated", engine_version="sim-1")
    backend = detect_backend("auto", [hello], None)
    assert backend.simulated
    assert backend.evidence.startswith("plugin hello: simulated engine sim-1")


def test_metrics_counters_are_second() -> None:
    backend = detect_backend("auto", [], parse_metrics(SPEC_METRICS))
    assert backend.speculative
    assert backend.evidence == "server /metrics has spec-decode counters"
    backend = detect_backend("auto", [], parse_metrics(PLAIN_METRICS))
    assert not backend.speculative
    assert backend.evidence == "no plugin hello; /metrics has no spec-decode counters"
    backend = detect_backend("auto", [], None)
    assert (backend.name, backend.evidence) == ("generic", "no plugin hello; no /metrics")


def test_override_is_user_declared() -> None:
    backend = detect_backend("eagle3", [], None)
    assert backend.speculative and backend.evidence == "user-declared with --backend eagle3"
    backend = detect_backend("generic", [SCHEDULER_HELLO], parse_metrics(SPEC_METRICS))
    assert not backend.speculative
    assert backend.evidence == "user-declared with --backend generic"


def test_server_deltas_are_counter_increases() -> None:
    after = SPEC_METRICS.replace("} 10.0", "} 14.0").replace("} 30.0", "} 42.0")
    after = after.replace("} 12.0", "} 18.0").replace("} 100.0", "} 130.0")
    deltas = dict(server_deltas(parse_metrics(SPEC_METRICS), parse_metrics(after)))
    assert deltas["drafts"] == 4
    assert deltas["draft tokens"] == 12
    assert deltas["accepted draft tokens"] == 6
    assert deltas["generation tokens"] == 30
    assert deltas["acceptance (server-wide)"] == 0.5
    # A counter that went down was reset: no delta rather than a negative one.
    reset = dict(server_deltas(parse_metrics(after), parse_metrics(SPEC_METRICS)))
    assert "drafts" not in reset


def test_not_prometheus_is_no_evidence() -> None:
    assert parse_metrics("this is {not prometheus") is None


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _CLEARED:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PARALLELHUE_SOCKET_DIR", tempfile.mkdtemp(prefix="phc", dir="/tmp"))
    monkeypatch.setattr(session, "GRACE_SECONDS", 0.1)


@pytest.mark.usefixtures("clean_env")
def test_model_name_is_never_evidence(capsys: pytest.CaptureFixture[str]) -> None:
    # The predecessor colored any model with "qwen" in its name; a name proves nothing.
    with FakeServer(models=["Qwen3-eagle3-speculative-mtp"]) as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk"]
        )
    out, _err = capsys.readouterr()
    assert code == 0
    assert "backend generic (no plugin hello; no /metrics)" in out
    assert "monochrome: no speculative decoding proven" in out


@pytest.mark.usefixtures("clean_env")
def test_metrics_evidence_reaches_the_screen(capsys: pytest.CaptureFixture[str]) -> None:
    with FakeServer(metrics=SPEC_METRICS) as server:
        code = cli.main(
            ["hi", "--endpoint", server.url + "/v1/chat/completions", "--mode", "chunk"]
        )
    out, _err = capsys.readouterr()
    assert code == 0
    assert "backend speculative (method unknown) (server /metrics has spec-decode counters)" in out
    assert "server-wide /metrics deltas (all requests on the server during the run" in out
