"""The `vllm.general_plugins` entry point `parallelhue`.

vLLM calls `register()` in every process it starts (API server, EngineCore,
workers). It does nothing unless PARALLELHUE_VLLM_EXACT=1; then it matches the
running vLLM's methods and fields against every adapter (adapters.choose: by
what vLLM has, not by its version string) and patches the matching adapter's
methods, all or none. It opens no socket: the emitters start on the first
request that carries a ParallelHue request id.
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
        use_vllm_logging()
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


def use_vllm_logging() -> None:
    """Make the plugin's lines come out as vLLM's own, even before vLLM set up logging.

    vLLM up to 0.30 configures its logging when `vllm.logger` is imported; from
    0.31 it does so after parsing its arguments, and the API server loads
    plugins before that. With no handler anywhere, Python would print our
    ERROR lines bare and drop the INFO lines. Then (and only then) vLLM's own
    bootstrap configuration is applied, which is what vLLM up to 0.30 did at
    import; vLLM's later configuration replaces it as usual.
    """
    if log.hasHandlers():
        return
    try:
        from vllm import envs
        from vllm import logger as vllm_logger

        configure = getattr(vllm_logger, "_configure_vllm_root_logger", None)
        if configure is not None and envs.VLLM_CONFIGURE_LOGGING:
            configure()
    except Exception:  # our lines then come out bare; nothing reaches vLLM
        return


def _install() -> bool:
    import vllm

    from . import adapters, hooks

    choice = adapters.choose(str(getattr(vllm, "__version__", "unknown")))
    if choice.adapter is None:
        log.error("%s", choice.refusal())
        return False
    adapters.install(choice)
    if choice.tested is None:
        log.warning("%s", choice.untested_warning())
    log.info(
        "parallelhue: exact telemetry hooks installed for vLLM %s (pid %d): adapter for %s "
        "(%s); %s",
        choice.version,
        os.getpid(),
        choice.adapter.label,
        choice.reason,
        hooks.IMPLEMENTATION,
    )
    return True
