"""The names the screen model gives things, each written once.

A stream's label: its words (the pane, the summary, the JSON document), its
short form (the overview line, the status line and the summary table, where
columns are narrow) and its style key. The style keys text is tagged with:
steps, SSE chunks and token roles (with the roles' names for the legend).
Keys, never colors: `screen/style.py` says what each key looks like.
"""

from __future__ import annotations

__all__ = [
    "CHUNK_KEYS",
    "LABEL_CANCELLED",
    "LABEL_CHUNK",
    "LABEL_ERROR",
    "LABEL_EXACT",
    "LABEL_NOT_EXACT",
    "LABEL_QUEUED",
    "LABEL_REPORTED",
    "LABEL_VERIFYING",
    "ROLE_KEYS",
    "ROLE_NAMES",
    "SHORT_LABELS",
    "STEP_KEYS",
    "label_key",
]

LABEL_EXACT = "EXACT TOKEN PROVENANCE"
LABEL_CHUNK = "SSE CHUNK MODE"
LABEL_VERIFYING = "VERIFYING"
LABEL_NOT_EXACT = "NOT EXACT"
LABEL_ERROR = "ERROR"
LABEL_CANCELLED = "CANCELLED"
LABEL_QUEUED = "QUEUED"  # --requests: not sent yet (waiting for its arrival time or a stream)
# The engine's own statement of its steps (reported.py): a tier below EXACT.
LABEL_REPORTED = "SERVER-REPORTED STEPS"

# Each label: its short form, its style key.
_LABELS = {
    LABEL_EXACT: ("EXACT", "label.exact"),
    LABEL_CHUNK: ("CHUNK", "label.chunk"),
    LABEL_VERIFYING: ("VERIFY", "label.verifying"),
    LABEL_NOT_EXACT: ("FAILED", "label.failed"),
    LABEL_ERROR: ("ERROR", "label.error"),
    LABEL_CANCELLED: ("CANCEL", "label.cancelled"),
    LABEL_QUEUED: ("QUEUED", "label.queued"),
    LABEL_REPORTED: ("REPORTED", "label.reported"),
}
SHORT_LABELS = {label: short for label, (short, _key) in _LABELS.items()}

# Steps (and SSE chunks in chunk mode) cycle through four colors.
STEP_KEYS = ("step.0", "step.1", "step.2", "step.3")
CHUNK_KEYS = ("chunk.0", "chunk.1", "chunk.2", "chunk.3")
# Token role codes of the span events (docs/PROTOCOL.md): 0 plain, 1 accepted, 2 target, 3 bonus.
ROLE_KEYS = ("role.plain", "role.accepted", "role.target", "role.bonus")
ROLE_NAMES = ("plain", "accepted draft", "target correction", "bonus")


def label_key(label: str) -> str:
    """The style key of a label ("bold" for any other text in a label's place)."""
    entry = _LABELS.get(label)
    return "bold" if entry is None else entry[1]
