"""What the terminal shows: cells and styles, the pane layout (panes.py), the painters,
the views (grid, stream, plain, tmux), keys, the summary and the exports. Reads the
model (`parallelhue.model`) and the settings; never imports the network side
(tests/test_layering.py)."""
