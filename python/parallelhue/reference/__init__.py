"""Pure-Python reference implementation of the ParallelHue receiver.

The oracle for differential tests against the Rust core, and the baseline for
benchmarks. Written for readability, not speed.
"""

from parallelhue.reference.decode import (
    Frame,
    FrameError,
    decode_frame,
    decode_to_dict,
    frame_meaning,
)
from parallelhue.reference.reconciler import Reconciler

__all__ = ["Frame", "FrameError", "Reconciler", "decode_frame", "decode_to_dict", "frame_meaning"]
