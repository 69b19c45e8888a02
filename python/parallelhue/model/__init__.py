"""The run as the screen knows it, and the plain data and rules below both the screen
and the network: the stream and run models (state.py) and their span records
(spans.py), the labels and style keys (labels.py), the shapes that cross the
reconciler's boundary (shapes.py), sanitizing, the backend verdict, the fix line
(advice.py), server-reported steps (reported.py), a run's figures (results.py),
endpoint URLs and stream-end messages. Nothing here imports the screen, the
network side or their libraries (tests/test_layering.py)."""
