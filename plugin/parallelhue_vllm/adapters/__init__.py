"""Which adapter fits the running vLLM, chosen by what vLLM has, never by its version string.

`choose(version)` reads the parameters of every method in targets.TARGETS
and the fields in targets.FIELDS from the imported vLLM and compares them with
each adapter (one release line of the table); the adapter whose every form
matches is chosen, and the choice says why. When none matches, nothing is
patched and the choice names what differs from the closest adapter.
`install(choice)` patches the chosen adapter's targets, all or none.
A release that matches but is not in targets.TESTED is "untested": the hooks
run and say so in their hello (wire.UNTESTED_MARK after the engine version).
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .. import hooks, wire
from .targets import FIELDS, STREAM_DETOKENIZERS, TARGETS, TESTED, Target, release_key
from .wrappers import PATCHED_MARK, already_patched
from .wrappers import wrap_add_request as _wrap_add_request
from .wrappers import wrap_process_outputs as _wrap_process_outputs
from .wrappers import wrap_scheduler as _wrap_scheduler

__all__ = [
    "ADAPTERS",
    "PATCHED_MARK",
    "TESTED_RANGE",
    "Adapter",
    "Choice",
    "choose",
    "install",
]

log = logging.getLogger("vllm.parallelhue")


def _range(releases: list[str]) -> str:
    ordered = sorted(releases, key=release_key)
    return ordered[0] if len(ordered) == 1 else f"{ordered[0]}-{ordered[-1]}"


# The tested releases, as every message says them (one place).
TESTED_RANGE = "vLLM " + _range(list(TESTED))


@dataclass(frozen=True, slots=True)
class Adapter:
    """One release line of the table: for each target, the form that line has."""

    line: str  # the first release of the line, e.g. "0.31"
    releases: tuple[str, ...]  # the tested releases it stands for

    @property
    def label(self) -> str:
        return "vLLM " + (_range(list(self.releases)) if self.releases else self.line)

    def params(self, target: Target) -> tuple[str, ...]:
        return target.params(self.line)


def _adapters() -> tuple[Adapter, ...]:
    """One adapter per release line where some target changes, newest first."""
    lines = sorted({first for target in TARGETS for first, _ in target.forms}, key=release_key)
    made = []
    for at, line in enumerate(lines):
        upper = release_key(lines[at + 1]) if at + 1 < len(lines) else None
        releases = tuple(
            release
            for release in TESTED
            if release_key(line) <= release_key(release)[:2]
            and (upper is None or release_key(release)[:2] < upper)
        )
        made.append(Adapter(line, releases))
    return tuple(reversed(made))


ADAPTERS: tuple[Adapter, ...] = _adapters()


@dataclass(slots=True)
class _Found:
    """What the running vLLM has: per target its owner class, function and parameters
    (or why it is missing), and the fields missing on its data classes."""

    methods: dict[str, tuple[Any, Callable[..., Any], tuple[str, ...]] | str] = field(
        default_factory=dict
    )
    fields_missing: list[str] = field(default_factory=list)


def _owner(module: str, owner: str, modules: dict[str, Any]) -> Any:
    """The class, or a string saying why it is not there (each module imported once)."""
    if module not in modules:
        try:
            modules[module] = importlib.import_module(module)
        except Exception as error:  # an import that fails in any way: not this vLLM
            modules[module] = f"cannot import {module} ({type(error).__name__}: {error})"
    found = modules[module]
    if isinstance(found, str):
        return found
    cls = getattr(found, owner, None)
    return cls if cls is not None else f"{module}.{owner} not found"


def _probe() -> _Found:
    found = _Found()
    modules: dict[str, Any] = {}
    for target in TARGETS:
        owner = _owner(target.module, target.owner, modules)
        if isinstance(owner, str):
            found.methods[target.name] = owner
            continue
        function = owner.__dict__.get(target.method)
        if function is None:
            found.methods[target.name] = f"{target.name} not found"
            continue
        function = inspect.unwrap(function)
        params = tuple(inspect.signature(function).parameters)
        found.methods[target.name] = (owner, function, params)
    for entry in FIELDS:
        owner = _owner(entry.module, entry.owner, modules)
        if isinstance(owner, str):
            found.fields_missing.append(owner)
            continue
        names = set(getattr(owner, "__dataclass_fields__", ())) | set(
            getattr(owner, "__struct_fields__", ())
        )
        missing = [name for name in entry.names if name not in names]
        if missing:
            found.fields_missing.append(f"{entry.owner} has no field {', '.join(missing)}")
    return found


def _differences(adapter: Adapter, found: _Found) -> list[str]:
    differences = []
    for target in TARGETS:
        got = found.methods[target.name]
        if isinstance(got, str):
            differences.append(got)
            continue
        expected = adapter.params(target)
        if got[2] != expected:
            differences.append(
                f"{target.name} has parameters ({', '.join(got[2])}), "
                f"expected ({', '.join(expected)})"
            )
    # One line per cause: a module that does not import is named once.
    return list(dict.fromkeys(differences + found.fields_missing))


def _why(adapter: Adapter) -> str:
    """What tells this adapter's release line from the others (its distinguishing forms)."""
    parts = []
    for target in TARGETS:
        if len(target.forms) < 2:
            continue
        mine = set(adapter.params(target))
        every = [set(params) for _, params in target.forms]
        others = set[str]().union(*every) - mine
        extra = sorted(mine - every[0].intersection(*every[1:]))
        if extra:
            parts.append(f"{target.name} with {', '.join(extra)}")
        elif others:
            parts.append(f"{target.name} without {', '.join(sorted(others))}")
    return ", ".join(parts)


@dataclass(frozen=True, slots=True)
class Choice:
    """The outcome of matching the running vLLM against every adapter."""

    version: str  # vllm.__version__
    adapter: Adapter | None
    reason: str  # why this adapter (its distinguishing forms), or what differs
    tested: str | None  # how this release was tested (targets.TESTED), None: never
    found: _Found | None = None

    @property
    def hello_version(self) -> str:
        """The engine version the hellos announce (marked when untested)."""
        mark = "" if self.tested is not None else wire.UNTESTED_MARK
        return (self.version + mark)[: wire.MAX_STR8]

    def refusal(self) -> str:
        """The one ERROR line when no adapter matches."""
        return (
            f"parallelhue: vLLM {self.version}: no adapter matches ({self.reason}); "
            f"exact telemetry is OFF and nothing was patched (tested: {TESTED_RANGE})"
        )

    def untested_warning(self) -> str:
        assert self.adapter is not None
        return (
            f"parallelhue: vLLM {self.version} was never tested with this plugin (tested: "
            f"{TESTED_RANGE}); every hooked method and field matches the adapter for "
            f"{self.adapter.label}, so the hooks are installed and the client's banner says "
            "UNTESTED"
        )


def _tested(version: str) -> str | None:
    return TESTED.get(version.split("+", 1)[0])


def choose(version: str) -> Choice:
    """Match the imported vLLM against every adapter (imports vLLM's modules, patches nothing)."""
    found = _probe()
    tried = [(adapter, _differences(adapter, found)) for adapter in ADAPTERS]
    for adapter, differences in tried:
        if not differences:
            why = _why(adapter)
            reason = f"every hooked method and field matches{': ' + why if why else ''}"
            return Choice(version, adapter, reason, _tested(version), found)
    # The closest adapter (fewest differences; the newest among equals) says what differs.
    closest, differences = min(tried, key=lambda pair: len(pair[1]))
    reason = "; ".join(differences)
    if any(other != differences for _, other in tried):
        reason = f"closest is the adapter for {closest.label}: {reason}"
    return Choice(version, None, reason, _tested(version), found)


def install(choice: Choice) -> bool:
    """Patch the chosen adapter's targets (all of them; each at most once per process)."""
    if choice.adapter is None or choice.found is None:
        return False
    scheduler = hooks.SchedulerTelemetry(choice.hello_version)
    stream_detokenizers = tuple(
        getattr(importlib.import_module(module), name) for module, name in STREAM_DETOKENIZERS
    )
    frontend = hooks.FrontendTelemetry(
        choice.hello_version, stream_detokenizers=stream_detokenizers
    )
    factories: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
        "update_from_output": lambda original: _wrap_scheduler(original, scheduler),
        "process_outputs": lambda original: _wrap_process_outputs(original, frontend),
        "add_request": lambda original: _wrap_add_request(original, frontend),
    }
    for target in TARGETS:
        if not target.patched:
            continue
        resolved = choice.found.methods[target.name]
        assert not isinstance(resolved, str)
        owner = resolved[0]
        current = owner.__dict__[target.method]
        if already_patched(current):
            continue  # already installed in this process
        # Wrap what is there now (another plugin may have wrapped it already).
        setattr(owner, target.method, factories[target.method](current))
    return True
