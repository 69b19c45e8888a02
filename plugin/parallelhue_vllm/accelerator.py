"""Whether the optional C accelerator (`parallelhue_vllm._speedups`) is used: decided once, here.

The plugin is pure Python (one py3-none-any wheel). The accelerator is its own
distribution, `parallelhue-vllm-speedups` (plugin/speedups, C sources in
plugin/speedups/src), one wheel per CPython built by `make plugin-dist`, that
installs the module beside the plugin; a checkout builds it in place
(plugin/build_speedups.py). The hooks run the same work in Python without it,
producing the same rows and bytes, so nothing about a server needs a compiler.
Whatever happens while loading the accelerator (not installed, built for
another Python, built from another version of the source, broken) ends in the
Python code with a one-line reason, never in an exception reaching vLLM.

PARALLELHUE_VLLM_PURE_PYTHON=1 forces the Python code.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

ENV_PURE_PYTHON = "PARALLELHUE_VLLM_PURE_PYTHON"
NOT_INSTALLED = (
    "pure Python (the C accelerator is not installed: pip install the "
    "parallelhue-vllm-speedups wheel built for this Python, see make plugin-dist)"
)
# The C sources this Python code was written against (SPEEDUPS_ABI in speedups.h).
EXPECTED_ABI = 7
# What the hooks call on it.
REQUIRED = (
    "CaptureState",
    "SchedRequest",
    "StreamRecorder",
    "encode_provenance_body",
    "encode_provenance_frame",
    "encode_provenance_step",
    "encode_text_body",
    "encode_text_frame",
    "encode_text_step",
    "has_empty",
    "sampled_lengths",
    "scheduler_rows",
    "take_rows",
)


def load() -> tuple[Any, str]:
    """(the accelerator module or None, a one-line reason for the choice)."""
    if os.environ.get(ENV_PURE_PYTHON) == "1":
        return None, f"pure Python ({ENV_PURE_PYTHON}=1)"
    try:
        module = importlib.import_module(f"{__package__}._speedups")
    except ModuleNotFoundError:
        return None, NOT_INSTALLED
    except Exception as error:  # a broken or foreign build must not stop the plugin
        failure = f"{type(error).__name__}: {error}"
        return None, f"pure Python (the C accelerator failed to load: {failure})"
    abi = getattr(module, "ABI", None)
    if abi != EXPECTED_ABI:
        return (
            None,
            f"pure Python (the C accelerator has ABI {abi}, this plugin needs {EXPECTED_ABI})",
        )
    missing = [name for name in REQUIRED if not hasattr(module, name)]
    if missing:
        return None, f"pure Python (the C accelerator lacks {', '.join(missing)})"
    return module, f"C accelerator ({getattr(module, '__file__', '?')})"
