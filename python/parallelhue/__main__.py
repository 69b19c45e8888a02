"""`python -m parallelhue`: the same CLI as the `parallelhue` command."""

from parallelhue.cli import main

raise SystemExit(main())
