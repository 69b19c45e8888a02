"""--export FILE.svg|FILE.html: a picture of the final grid and the summary."""

from __future__ import annotations

import io
from typing import Protocol

from rich.console import Console, RenderableType

from .state import RunModel
from .summary import render_summary

__all__ = ["ExportError", "export_picture"]

EXPORT_WIDTH = 160


class ExportError(Exception):
    """The picture could not be written; one line."""


class _HasFinalPicture(Protocol):
    def final_picture(self, console: Console) -> RenderableType: ...


def export_picture(path: str, model: RunModel, view: _HasFinalPicture) -> None:
    """Render the view's final picture and the summary into an SVG or HTML file."""
    console = Console(
        file=io.StringIO(),
        record=True,
        width=EXPORT_WIDTH,
        force_terminal=True,
        color_system=None if model.no_color else "256",
        no_color=model.no_color,
        highlight=False,
        markup=False,
        emoji=False,
    )
    console.print(view.final_picture(console))
    console.print(render_summary(model))
    title = "ParallelHue (SIMULATED ENGINE)" if model.simulated else "ParallelHue"
    try:
        if path.lower().endswith(".svg"):
            console.save_svg(path, title=title)
        else:
            console.save_html(path)
    except OSError as error:
        raise ExportError(f"--export: cannot write {path}: {error.strerror}") from None
