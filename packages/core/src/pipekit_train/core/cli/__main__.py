"""`python -m pipekit_train.core.cli`: the `pipekit-train` command."""

from ._main import main

raise SystemExit(main())
