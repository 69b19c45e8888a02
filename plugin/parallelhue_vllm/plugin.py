"""The `vllm.general_plugins` entry point `parallelhue`.

vLLM calls `register()` in every process it starts (API server, EngineCore,
workers). It does nothing unless PARALLELHUE_VLLM_EXACT=1; then it picks the
adapter for `vllm.__version__`, checks the signature of every method the
adapter patches and patches them all, or none. It opens no socket: the
emitters start on the first request that carries a ParallelHue request id.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("vllm.parallelhue")

ENV_ENABLE = "PARALLELHUE_VLLM_EXACT"

# Process-wide outcome of register(): None until it ran with the plugin enabled.
_installed: bool | None = None


def enabled() -> bool:
    return os.environ.get(ENV_ENABLE, "") == "1"


def register() -> None:
    """Install the hooks once per process; never raises into vLLM."""
    global _installed
    if _installed is not None or not enabled():
        return
    try:
        # One hub scope per server, chosen in the first process and inherited by
        # every process vLLM starts, so their frames reach this server's hubs.
        from .hub import ensure_scope

        ensure_scope()
        _installed = _install()
    except Exception as error:  # the server must keep serving whatever happens here
        _installed = False
        log.error(
            "parallelhue: exact telemetry is OFF, install failed: %s: %s",
            type(error).__name__,
            error,
        )


def installed() -> bool:
    """Whether this process runs with the hooks installed."""
    return bool(_installed)


def _install() -> bool:
    import vllm

    from . import adapters

    version = str(getattr(vllm, "__version__", "unknown"))
    adapter = adapters.select(version)
    if adapter is None:
        log.error(
            "parallelhue: vLLM %s is not supported (supported: %s); exact telemetry is OFF "
            "and nothing was patched",
            version,
            adapters.SUPPORTED,
        )
        return False
    if not adapters.install(adapter, version):
        return False
    from . import hooks

    log.info(
        "parallelhue: exact telemetry hooks installed for vLLM %s (pid %d), %s",
        version,
        os.getpid(),
        hooks.IMPLEMENTATION,
    )
    return True
