"""ParallelHue's vLLM plugin: exact token provenance telemetry.

Inactive unless PARALLELHUE_VLLM_EXACT=1. Also home of the wire encoder and the
emitter that the embedded simulated engine shares with the plugin.
"""

__version__ = "0.3.1"

# The server-side self-check (parallelhue_vllm/check.py); the client points at it
# when a run gets no telemetry.
SELF_CHECK = "python -m parallelhue_vllm check"
SELF_CHECK_HINT = f"on the server run: {SELF_CHECK}"
