"""ParallelHue's vLLM plugin: exact token provenance telemetry.

Inactive unless PARALLELHUE_VLLM_EXACT=1. Also home of the wire encoder and the
emitter that the embedded simulated engine shares with the plugin.
"""

__version__ = "0.3.0"
