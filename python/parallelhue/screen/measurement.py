"""--measurement FILE: one JSON record of a run, following docs/MEASUREMENTS.md.

A number without its conditions is not reported: the record always carries
the hardware, the software, the request shape and n next to the results, and
says plainly when the engine was simulated.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from importlib import metadata
from typing import Any

from ..cli.settings import STDOUT, RunConfig
from ..model.endpoint import api_kind
from ..model.results import run_result, stream_result
from ..model.state import RunModel
from .summary import summary_lines

__all__ = ["MeasurementError", "build_measurement", "write_measurement"]

# 2: per-stream entries are the --json per-stream results (docs/CLIENT.md).
SCHEMA = "parallelhue-measurement/2"


class MeasurementError(Exception):
    """The record could not be written; one line."""


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def hardware() -> dict[str, Any]:
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "memory_bytes": _memory_bytes(),
        "machine": platform.machine(),
        "gpu": "not detected by the client (it never uses one); the server's GPU, if any, "
        "must be stated by whoever publishes the number",
    }


def software(model: RunModel) -> dict[str, Any]:
    from parallelhue import __version__

    engine = [
        {
            "role": source.get("role"),
            "engine": source.get("engine"),
            "engine_version": source.get("engine_version"),
            "plugin_version": source.get("plugin_version"),
            "spec_method": source.get("spec_method"),
            "num_speculative_tokens": source.get("num_speculative_tokens"),
        }
        for source in model.sources
    ]
    return {
        "parallelhue": __version__,
        "python": sys.version.split()[0],
        "os": f"{platform.system()} {platform.release()}",
        "httpx": _version("httpx"),
        "rich": _version("rich"),
        "reconciler": model.reconciler_kind,
        "server_hello": engine,
    }


def build_measurement(model: RunModel, config: RunConfig, model_name: str | None) -> dict[str, Any]:
    total = run_result(model)
    simulated = model.is_simulated
    return {
        "schema": SCHEMA,
        "recorded_unix": time.time(),
        "simulated": simulated,
        "engine_note": (
            "SIMULATED ENGINE: every number below comes from the embedded simulator, "
            "not from a real model"
            if simulated
            else "numbers from the server named under software.server_hello and request.endpoint"
        ),
        "hardware": hardware(),
        "software": software(model),
        "request": {
            "endpoint_kind": api_kind(config.endpoint),
            "model": model_name,
            "max_tokens": config.max_tokens,
            "temperature": config.temperature,
            "seed_base": config.seed,
            "concurrency": config.concurrency,
            "requests": len(config.prompts),
            "request_rate": None if math.isinf(config.request_rate) else config.request_rate,
            "distinct_prompts": len(set(config.prompts)),
            "prompt_chars": [len(p) for p in config.prompts],
            "mode": config.mode,
            "stop": list(config.stop),
            "ignore_eos": config.ignore_eos,
            "system_prompt_chars": len(config.system) if config.system is not None else None,
            "extra_body": config.extra_body,
            # Header values may be credentials: only their names are kept.
            "extra_header_names": [name for name, _value in config.headers],
        },
        "n": {
            "runs": 1,
            "streams": len(model.streams),
            "note": "one run; no repetition, so no spread is reported",
        },
        "backend": {"name": model.backend.name, "evidence": model.backend.evidence},
        "results": {
            "wall_seconds": total["wall_seconds"],
            "sse_tokens": total["tokens"],
            "client_tokens_per_second": total["tokens_per_second"],
            "confirmed_tokens": total["confirmed_tokens"],
            "steps": total["steps"],
            "mean_tokens_per_step": total["mean_tokens_per_step"],
            "tokens_per_step_histogram": total["tokens_per_step_histogram"],
            "acceptance": total["acceptance"],
            "acceptance_by_position": total["acceptance_by_position"],
            "labels": total["labels"],
            "total": total,
            "streams": [stream_result(stream, model.dispatch_at) for stream in model.streams],
            "server_wide_metrics_deltas": {
                "note": "server-wide: every request on the server during the run",
                "values": dict(model.server_deltas),
            },
            "summary_lines": summary_lines(model),
        },
    }


def write_measurement(
    path: str, model: RunModel, config: RunConfig, model_name: str | None
) -> None:
    record = build_measurement(model, config, model_name)
    if path == STDOUT:
        sys.stdout.write(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()
        return
    try:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2, ensure_ascii=False)
            handle.write("\n")
    except OSError as error:
        raise MeasurementError(f"--measurement: cannot write {path}: {error.strerror}") from None
