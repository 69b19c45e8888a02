"""A stream's proven spans as the screen model keeps them, without the extension too.

The span record: two u64 words a span, its end offset in the stream's UTF-8
text, then `step | role << 32` (step NO_STEP: mixed; role NO_ROLE: none), as
the Rust core packs them (rust/core/src/spans.rs; the binding's
`_native.SpanRecords` and `_native.tail_pieces`, rust/py/src/spans.rs and
panes.rs). Here: the constants, the store (`new_span_records`: the
extension's, else `PySpanRecords`), a pane's styled tail (`tail_pieces`: the
extension's, else `python_tail_pieces`) and its key tables.
"""

from __future__ import annotations

import sys
from array import array
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Union, cast

from .labels import ROLE_KEYS, STEP_KEYS

__all__ = [
    "NO_ROLE",
    "NO_STEP",
    "SPAN_RECORD_BYTES",
    "PySpanRecords",
    "SpanStore",
    "append_le",
    "new_span_records",
    "python_tail_pieces",
    "span_key",
    "tail_keys",
    "tail_pieces",
]


def span_key(step: int | None, role: int | None, color_by: str, roles_known: bool = True) -> str:
    if color_by == "role":
        if role is not None and 0 <= role < len(ROLE_KEYS):
            return ROLE_KEYS[role]
        # No role: tokens of two roles (mixed) when the reconciler reports roles at
        # all (contract C2's 8th span element), else simply not proven.
        return "mixed" if roles_known else "unproven"
    return STEP_KEYS[step % len(STEP_KEYS)] if step is not None else "mixed"


# The span record's size and "none" values (see this module's docstring): declared once, in the
# Rust core (parallelhue_core::spans), and exported by the extension. Without it
# (`--reconciler python` needs none) the same values, which
# tests/test_span_records.py holds equal to the extension's.
try:
    from .._native import NO_ROLE, NO_STEP, SPAN_RECORD_BYTES
except ImportError:  # not built
    NO_STEP, NO_ROLE, SPAN_RECORD_BYTES = 0xFFFFFFFF, 0xFF, 16
# tail_pieces' key tables: by role, one key per role byte (NO_ROLE: none) for
# each value of roles_known; by step, STEP_KEYS (a mixed span: "mixed").
_ROLE_TABLES = {
    known: tuple(
        span_key(None, None if code == NO_ROLE else code, "role", known)
        for code in range(NO_ROLE + 1)
    )
    for known in (False, True)
}
_STEP_TABLE = tuple(STEP_KEYS)


def tail_keys(
    colorize: bool, color_by: str, roles_known: bool
) -> tuple[tuple[str, ...] | None, bool]:
    """tail_pieces' (keys, by_role) for a coloring rule."""
    if not colorize:
        return None, False
    if color_by == "role":
        return _ROLE_TABLES[roles_known], True
    return _STEP_TABLE, False


def python_tail_pieces(
    data: bytes | bytearray,
    records: Any,
    limit: int,
    total: int,
    keys: tuple[str, ...] | None,
    by_role: bool,
    other: str,
) -> list[tuple[str, str | None]]:
    """`_native.tail_pieces` in Python, the same arguments and results (see
    _native.pyi): the spans read back from the end one by one, each decoded
    as `StreamState.spans` does. The client runs without the extension under
    `--reconciler python`; tests/test_pane_tail.py holds the two equal."""
    if keys is not None and (not keys or (by_role and len(keys) <= NO_ROLE)):
        raise ValueError("tail_pieces: by role needs 256 keys, by step at least one")
    pieces: list[tuple[str, str | None]] = []
    position = len(records) // 2 - 1
    end = records[2 * position] if position >= 0 else 0
    while position >= 0 and (limit < 0 or total < limit):
        start = records[2 * position - 2] if position else 0
        if not 0 <= start <= end <= len(data):
            raise ValueError("span outside the text")
        text = data[start:end].decode("utf-8", "replace")
        word = records[2 * position + 1]
        key: str | None
        if keys is None:
            key = None
        elif by_role:
            key = keys[(word >> 32) & NO_ROLE]
        else:
            step = word & NO_STEP
            key = other if step == NO_STEP else keys[step % len(keys)]
        pieces.append((text, key))
        total += len(text)
        position -= 1
        end = start
    pieces.reverse()
    return pieces


if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

    _WordArray = array[int]
else:
    _WordArray = array


class PySpanRecords(_WordArray):
    """`_native.SpanRecords` without the extension (`--reconciler python`
    needs none): an array("Q") of two words a span that notes whether a span
    carried a token role. tests/test_span_records.py holds the two alike."""

    __slots__ = ("has_roles",)
    has_roles: bool

    def __new__(cls) -> PySpanRecords:
        self = cast(PySpanRecords, super().__new__(cls, "Q"))
        self.has_roles = False
        return self

    def _saw(self, start: int) -> None:
        if not self.has_roles:
            self.has_roles = any(
                (self[i] >> 32) & NO_ROLE != NO_ROLE for i in range(start | 1, len(self), 2)
            )

    def extend(self, words: Iterable[int]) -> None:
        start = len(self)
        super().extend(words)
        self._saw(start)

    def frombytes(self, data: ReadableBuffer) -> None:
        size = memoryview(data).nbytes
        if size % SPAN_RECORD_BYTES:
            raise ValueError(
                f"span records come in {SPAN_RECORD_BYTES}-byte spans; got {size} bytes"
            )
        start = len(self)
        super().frombytes(data)
        if _BIG_ENDIAN:  # pragma: no cover - every supported machine is little-endian
            tail = self[start:]
            tail.byteswap()
            self[start:] = tail
        self._saw(start)

    def __setitem__(self, index: Any, word: Any) -> None:
        super().__setitem__(index, word)
        self._saw(0)


SpanStore = Union["_native.SpanRecords", PySpanRecords]

try:
    from .. import _native
    from .._native import tail_pieces

    new_span_records: Callable[[], SpanStore] = _native.SpanRecords
except ImportError:  # not built: the whole client still runs (--reconciler python)
    tail_pieces = python_tail_pieces
    new_span_records = PySpanRecords

_BIG_ENDIAN = sys.byteorder == "big"


def append_le(target: array[int] | array[float], data: bytes | memoryview) -> None:
    """Append little-endian packed values (how the Rust path sends them)."""
    if _BIG_ENDIAN:  # pragma: no cover - every supported machine is little-endian
        extra: array[Any] = array(target.typecode)
        extra.frombytes(data)
        extra.byteswap()
        target.extend(extra)
    else:
        target.frombytes(data)
