"""register(): inert unless enabled, never raises into vLLM (no vLLM needed here)."""

from __future__ import annotations

import subprocess

import fake_vllm


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    return fake_vllm.run(None, code, **env)


def test_disabled_register_imports_nothing_of_vllm() -> None:
    result = run(
        """
        import sys
        from parallelhue_vllm import plugin
        plugin.register()
        print(plugin.installed(), "vllm" in sys.modules, "parallelhue_vllm.hooks" in sys.modules)
        """,
        PARALLELHUE_VLLM_EXACT="0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "False"]


def test_enabled_register_without_vllm_logs_and_returns() -> None:
    result = run(
        """
        import logging, sys
        logging.basicConfig(format="%(levelname)s %(message)s")
        sys.modules["vllm"] = None  # import vllm raises ImportError
        from parallelhue_vllm import plugin
        plugin.register()
        plugin.register()  # idempotent: no second attempt, no second line
        print(plugin.installed())
        """,
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
    assert result.stderr.splitlines() == [
        "ERROR parallelhue: exact telemetry is OFF, install failed: ModuleNotFoundError: "
        "import of vllm halted; None in sys.modules"
    ]


def test_missing_vllm_module_is_a_mismatch_not_a_crash() -> None:
    result = run(
        """
        import logging, sys, types
        logging.basicConfig(format="%(levelname)s %(message)s")
        sys.modules["vllm"] = types.SimpleNamespace(__version__="0.33.0")
        from parallelhue_vllm import plugin
        plugin.register()
        print(plugin.installed())
        """,
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    # Every adapter misses the same modules: no "closest" adapter is named.
    assert lines[0].startswith(
        "ERROR parallelhue: vLLM 0.33.0: no adapter matches (cannot import "
        "vllm.v1.core.sched.scheduler (ModuleNotFoundError: No module named 'vllm.v1'; "
        "'vllm' is not a package); cannot import vllm.v1.engine.output_processor ("
    )
    assert lines[0].endswith(
        "); exact telemetry is OFF and nothing was patched (tested: vLLM 0.26.0-0.34.0)"
    )
