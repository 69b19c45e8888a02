"""The plain listing: every stream's header, whole text and note, unwrapped."""

from __future__ import annotations

from ..model.sanitize import sanitize
from ..model.state import RunModel
from .banner import banner_line
from .lines import Line, clean_pieces, wrap
from .pane import header_pieces

__all__ = ["plain_listing"]


def plain_listing(model: RunModel) -> list[Line]:
    """Every stream's header, whole text and note, unwrapped (pipes get whole lines)."""
    lines: list[Line] = [banner_line(model, None)]
    for stream in model.streams:
        lines.append(header_pieces(stream))
        lines.extend(wrap(clean_pieces(stream.segments(False), laid_out=False), None))
        if stream.note:
            lines.append([(sanitize(stream.note, keep_newlines=False), None)])
        lines.append([])
    return lines
