"""What the terminal shows, one renderable per module.

Every screen is laid out once as lines of styled pieces (`lines.py`, measured in
terminal cells by `cells.py`, style keys from `model/labels.py`, what each looks
like from `style.py`) and painted by
`paint.py` (ANSI, Rich) or `export.py` (HTML, SVG). The renderables: `banner.py`,
`legend.py`, `status.py` (laid out from parts by `chrome.py`), a stream's pane
(`pane.py`), an overview line (`overview.py`), the grid (`grid.py`, with the
zoomed pane; the keys' focus in `focus.py`), one stream (`stream.py`), the plain
listing (`plain.py`), the summary table (`summary.py`). The views that draw them
live are `views.py` (and `tmux.py`, `keys.py`); `measurement.py` writes the
run's record. Reads the model (`parallelhue.model`) and the settings; never
imports the network side (tests/test_layering.py).
"""
