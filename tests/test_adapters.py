"""The adapter is chosen by what vLLM has, never by its version string (no vLLM needed).

Each test writes a stand-in `vllm` package (tests/fake_vllm.py) whose methods
have the parameters of one release line of adapters/targets.py, or of a
release that changed one of them, and runs register() in a fresh interpreter.
The real releases 0.26.0-0.34.0 are matched against the same table in
tests/vllm/test_signatures.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import fake_vllm
from parallelhue_vllm import adapters, wire
from parallelhue_vllm.adapters.targets import TARGETS, TESTED

ENABLED = {"PARALLELHUE_VLLM_EXACT": "1", "PARALLELHUE_VLLM_PURE_PYTHON": "1"}
IMPLEMENTATION = "pure Python (PARALLELHUE_VLLM_PURE_PYTHON=1)"
PATCHED = """
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.output_processor import OutputProcessor, RequestState
def marked(f):
    return bool(getattr(f, "__parallelhue__", False))
print(plugin.installed(), [marked(m) for m in (Scheduler.update_from_output,
      OutputProcessor.process_outputs, OutputProcessor.add_request,
      RequestState.make_request_output)])
"""
REGISTER = "import os\nfrom parallelhue_vllm import plugin\nplugin.register()\nprint(os.getpid())\n"
PROCESS = {
    "0.26": "OutputProcessor.process_outputs without weight_version, "
    "RequestState.make_request_output without error, "
    "RequestState.__init__ without remote_prefill_cached_tokens",
    "0.31": "OutputProcessor.process_outputs without weight_version, "
    "RequestState.make_request_output without error, "
    "RequestState.__init__ with remote_prefill_cached_tokens",
    "0.32": "OutputProcessor.process_outputs with weight_version, "
    "RequestState.make_request_output with error, "
    "RequestState.__init__ with remote_prefill_cached_tokens",
}


def params(name: str, line: str) -> tuple[str, ...]:
    return next(t for t in TARGETS if t.name == name).params(line)


def test_one_adapter_per_release_line_covering_every_tested_release() -> None:
    assert [(a.line, a.label) for a in adapters.ADAPTERS] == [
        ("0.32", "vLLM 0.32.0-0.34.0"),
        ("0.31", "vLLM 0.31.0"),
        ("0.26", "vLLM 0.26.0-0.30.0"),
    ]
    covered = sorted(r for a in adapters.ADAPTERS for r in a.releases)
    assert covered == sorted(TESTED)


@pytest.mark.parametrize(
    ("version", "line", "label"),
    [
        ("0.28.0", "0.26", "vLLM 0.26.0-0.30.0"),
        ("0.31.0", "0.31", "vLLM 0.31.0"),
        ("0.34.0", "0.32", "vLLM 0.32.0-0.34.0"),
        ("0.32.0+cpu", "0.32", "vLLM 0.32.0-0.34.0"),
    ],
)
def test_the_adapter_whose_forms_match_is_installed_and_named(
    tmp_path: Path, version: str, line: str, label: str
) -> None:
    root = fake_vllm.write(tmp_path, version, line)
    result = fake_vllm.run(root, REGISTER + PATCHED, **ENABLED)
    assert result.returncode == 0, result.stderr
    pid, state = result.stdout.splitlines()
    assert state == "True [True, True, True, False]"
    assert result.stderr.splitlines() == [
        f"VLLMFAKE INFO parallelhue: exact telemetry hooks installed for vLLM {version} "
        f"(pid {pid}): adapter for {label} (every hooked method and field matches: "
        f"{PROCESS[line]}); {IMPLEMENTATION}"
    ]


def test_the_version_string_is_not_consulted(tmp_path: Path) -> None:
    """A build that says 0.26.0 but has 0.32's forms gets 0.32's adapter."""
    root = fake_vllm.write(tmp_path, "0.26.0", "0.32")
    result = fake_vllm.run(root, REGISTER + PATCHED, **ENABLED)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "True [True, True, True, False]"
    assert "adapter for vLLM 0.32.0-0.34.0" in result.stderr


def test_an_untested_release_that_matches_runs_and_says_so(tmp_path: Path) -> None:
    root = fake_vllm.write(tmp_path, "0.35.0", "0.32")
    result = fake_vllm.run(
        root,
        REGISTER + PATCHED + "from parallelhue_vllm import hooks\n"
        "cells = [c.cell_contents for c in Scheduler.update_from_output.__closure__]\n"
        "print([t.engine_version for t in cells if isinstance(t, hooks.SchedulerTelemetry)])\n",
        **ENABLED,
    )
    assert result.returncode == 0, result.stderr
    pid, state, versions = result.stdout.splitlines()
    assert state == "True [True, True, True, False]"
    # The hellos announce the engine version with the mark the client's banner shows.
    assert versions == "['0.35.0 (untested)']"
    assert wire.UNTESTED_MARK == " (untested)"
    assert result.stderr.splitlines() == [
        "VLLMFAKE WARNING parallelhue: vLLM 0.35.0 was never tested with this plugin (tested: "
        "vLLM 0.26.0-0.34.0); every hooked method and field matches the adapter for vLLM "
        "0.32.0-0.34.0, so the hooks are installed and the client's banner says UNTESTED",
        f"VLLMFAKE INFO parallelhue: exact telemetry hooks installed for vLLM 0.35.0 (pid {pid}): "
        f"adapter for vLLM 0.32.0-0.34.0 (every hooked method and field matches: "
        f"{PROCESS['0.32']}); {IMPLEMENTATION}",
    ]


def test_a_release_no_adapter_matches_patches_nothing_and_names_the_difference(
    tmp_path: Path,
) -> None:
    changed = (*params("OutputProcessor.process_outputs", "0.32"), "trace_context")
    root = fake_vllm.write(
        tmp_path, "0.35.0", "0.32", params={"OutputProcessor.process_outputs": changed}
    )
    result = fake_vllm.run(root, REGISTER + PATCHED, **ENABLED)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "False [False, False, False, False]"
    assert result.stderr.splitlines() == [
        "VLLMFAKE ERROR parallelhue: vLLM 0.35.0: no adapter matches (closest is the adapter "
        "for vLLM 0.32.0-0.34.0: OutputProcessor.process_outputs has parameters (self, "
        "engine_core_outputs, engine_core_timestamp, iteration_stats, weight_version, "
        "trace_context), expected (self, engine_core_outputs, engine_core_timestamp, "
        "iteration_stats, weight_version)); exact telemetry is OFF and nothing was patched "
        "(tested: vLLM 0.26.0-0.34.0)"
    ]


def test_forms_of_two_release_lines_mixed_match_no_adapter(tmp_path: Path) -> None:
    root = fake_vllm.write(
        tmp_path,
        "0.32.0",
        "0.32",
        params={"RequestState.__init__": params("RequestState.__init__", "0.26")},
    )
    result = fake_vllm.run(root, REGISTER + PATCHED, **ENABLED)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1] == "False [False, False, False, False]"
    (line,) = result.stderr.splitlines()
    assert line.startswith(
        "VLLMFAKE ERROR parallelhue: vLLM 0.32.0: no adapter matches (closest is the adapter "
        "for vLLM 0.32.0-0.34.0: RequestState.__init__ has parameters (self, request_id, "
    )
    assert line.endswith(
        "temperature, stream_input, remote_prefill_cached_tokens)); exact telemetry is OFF "
        "and nothing was patched (tested: vLLM 0.26.0-0.34.0)"
    )


def test_a_missing_field_matches_no_adapter(tmp_path: Path) -> None:
    """vLLM 0.34 dropped req_id_to_index, which the hooks no longer read; req_ids they do."""
    root = fake_vllm.write(
        tmp_path,
        "0.35.0",
        "0.32",
        fields={"ModelRunnerOutput": ("req_id_to_index", "sampled_token_ids")},
    )
    result = fake_vllm.run(root, REGISTER + PATCHED, **ENABLED)
    assert result.returncode == 0, result.stderr
    assert result.stderr.splitlines() == [
        "VLLMFAKE ERROR parallelhue: vLLM 0.35.0: no adapter matches (closest is the adapter "
        "for vLLM 0.32.0-0.34.0: ModelRunnerOutput has no field req_ids); exact telemetry is "
        "OFF and nothing was patched (tested: vLLM 0.26.0-0.34.0)"
    ]


def test_lines_come_out_through_vllm_logging_set_up_early(tmp_path: Path) -> None:
    """vLLM >= 0.31 sets up its logging after the API server loads plugins: the plugin
    applies vLLM's own bootstrap configuration first (the VLLMFAKE prefix above). With a
    handler already in place, or VLLM_CONFIGURE_LOGGING=0, it leaves logging alone."""
    root = fake_vllm.write(tmp_path / "a", "0.35.0", "0.32")
    configured = "import logging\nlogging.basicConfig(format='ROOT %(levelname)s %(message)s')\n"
    result = fake_vllm.run(root, configured + REGISTER, **ENABLED)
    assert result.returncode == 0, result.stderr
    # The application's root handler (level WARNING) shows the warning; no VLLMFAKE.
    assert [line[:54] for line in result.stderr.splitlines()] == [
        "ROOT WARNING parallelhue: vLLM 0.35.0 was never tested"
    ]
    root = fake_vllm.write(tmp_path / "b", "0.35.0", "0.32", configure_logging=False)
    result = fake_vllm.run(root, REGISTER, **ENABLED)
    assert result.returncode == 0, result.stderr
    # Python's last-resort handler: WARNING and above, bare; vLLM's logging untouched.
    assert [line[:41] for line in result.stderr.splitlines()] == [
        "parallelhue: vLLM 0.35.0 was never tested"
    ]
