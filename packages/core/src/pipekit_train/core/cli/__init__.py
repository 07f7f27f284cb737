"""The `pipekit-train` command line (console script of pipekit-train-core).

```bash
pipekit-train run run.toml --backend keras         # train; resumes from its checkpoint
pipekit-train registry list runs/models            # what is registered
pipekit-train registry show runs/models emulator:3 # one version, verified
pipekit-train checkpoint inspect runs/exp1/ckpt    # steps, complete or torn, metadata
```

The run config holds the fields of `TrainingLoop` plus the dataset and the model by
factory name; see docs/cli.md. `pipekit_train.core.cli` imports no backend: `run`
imports the chosen backend's adapter package by name. `python -m pipekit_train.core.cli`
is the same command.
"""

from ._config import RunConfig, apply_overrides, load_run_config
from ._inspect import inspect_checkpoints
from ._main import main
from ._progress import ProgressLines

__all__ = [
    "ProgressLines",
    "RunConfig",
    "apply_overrides",
    "inspect_checkpoints",
    "load_run_config",
    "main",
]
