"""Which vLLM release the live tier runs on, and what that release offers.

The tier runs against whichever venv PARALLELHUE_VLLM_VENV names (one release
per pytest run; `make vllm-matrix` runs it once per release). A feature some
releases lack is probed in the venv itself (`probe`) and compared with FIRST,
the release that introduced it as read from vLLM's sources: a test that needs
a feature the release lacks skips with the reason naming both
(`require`), and test_releases.py fails when the probe and FIRST disagree, so a
skip can only mean the release really lacks the feature.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from functools import cache

import pytest
import server

# The first release with each feature the tier exercises (vLLM's sources).
FIRST: dict[str, tuple[int, int, int]] = {
    # `stream_interval` in the OpenAI request body (per-request streaming interval).
    "per_request_stream_interval": (0, 27, 0),
    # `--per-request-spec-decode-metrics` (metrics.speculative_decoding per request).
    "per_request_spec_metrics": (0, 29, 0),
    # The frontend deletes the tokens after a matched stop string (ids and text agree).
    "surplus_token_trim": (0, 32, 0),
    # `vllm.endpoint_plugins`: routes on vLLM's own port (telemetry over HTTP).
    "endpoint_plugins": (0, 26, 0),
}

# Runs in the vLLM venv: its version and, per feature, whether it is there.
_PROBE = r"""
import dataclasses, json
import vllm
import vllm.plugins
from vllm.config.observability import ObservabilityConfig
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.v1.engine.output_processor import OutputProcessor
fields = {f.name for f in dataclasses.fields(ObservabilityConfig)}
print(json.dumps({
    "version": vllm.__version__,
    "features": {
        "per_request_stream_interval": "stream_interval" in ChatCompletionRequest.model_fields
        and "stream_interval" in CompletionRequest.model_fields,
        "per_request_spec_metrics": "per_request_spec_decode_metrics" in fields,
        "surplus_token_trim": hasattr(OutputProcessor, "_trim_surplus_tokens"),
        "endpoint_plugins": hasattr(vllm.plugins, "load_endpoint_plugins"),
    },
}))
"""


def version_tuple(version: str) -> tuple[int, int, int]:
    """(0, 32, 0) for "0.32.0" or "0.32.0+cpu"."""
    parts = version.split("+", 1)[0].split(".")
    major, minor, patch = (int(part) for part in parts[:3])
    return major, minor, patch


@dataclass(frozen=True)
class Release:
    version: str  # vllm.__version__, e.g. "0.26.0" or "0.34.0+cpu"
    features: dict[str, bool]

    @property
    def number(self) -> tuple[int, int, int]:
        return version_tuple(self.version)

    def has(self, feature: str) -> bool:
        return self.features[feature]

    def summary(self) -> str:
        """One line: the version, then each feature, absent ones with their first release."""
        described = [
            name if present else f"no {name} (first in {'.'.join(map(str, FIRST[name]))})"
            for name, present in self.features.items()
        ]
        return f"vLLM {self.version}: " + ", ".join(described)

    def lacks_reason(self, feature: str) -> str:
        first = ".".join(map(str, FIRST[feature]))
        return f"vLLM {self.version} has no {feature} (first in {first})"


@cache
def probe() -> Release:
    """The release in the tier's vLLM venv (one subprocess per test session)."""
    done = subprocess.run(
        [str(server.vllm_python()), "-c", _PROBE],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"cannot probe vLLM in {server.vllm_venv()}:\n{done.stderr[-2000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    return Release(found["version"], found["features"])


def require(feature: str) -> Release:
    """The release, or a skip naming what it lacks and where the feature starts."""
    release = probe()
    if not release.has(feature):
        pytest.skip(release.lacks_reason(feature))
    return release
