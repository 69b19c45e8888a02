"""ParallelHue: see what speculative decoding does, one verified step at a time."""

__version__ = "0.1.0"
