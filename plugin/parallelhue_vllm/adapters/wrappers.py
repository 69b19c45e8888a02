"""The wrappers put around vLLM's methods: call the hooks around vLLM's own code.

Each calls the original unchanged, and nothing the hooks raise reaches vLLM
(a failure becomes a notice for the requests concerned).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .. import hooks

PATCHED_MARK = "__parallelhue__"


def already_patched(function: Any) -> bool:
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


def wrap_scheduler(
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


def wrap_process_outputs(
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


def wrap_add_request(
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
