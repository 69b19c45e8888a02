"""`python -m parallelhue_vllm check`: the server-side self-check (check.py)."""

from .check import main

raise SystemExit(main())
