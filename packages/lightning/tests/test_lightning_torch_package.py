"""`Torch()` in a folder of its own (`pipekit_train.lightning.torch`), read from the source.

The sub-package takes from the package root only what both adapters share, never the
Lightning adapter's own modules; the root reaches into it only through the public names
(`__init__`, `ray`, `testing`) and the step-backend role file (`OnlineTrainer` on
`Lightning()` runs `TorchStepBackend`).
"""

from __future__ import annotations

from pathlib import Path

from pipekit_train.core.testing._imports_graph import import_graph

PACKAGE = "pipekit_train.lightning"
SUB = f"{PACKAGE}.torch"
SRC = Path(__file__).resolve().parents[1] / "src" / "pipekit_train" / "lightning"

# the Lightning adapter and what only it uses (Lightning's hooks, its generated module,
# stateful loaders)
LIGHTNING_ONLY = {f"{PACKAGE}.{name}" for name in ("_adapter", "_bridge", "_module", "_stateful")}
# root modules that may import the sub-package
REACH_IN = {PACKAGE, f"{PACKAGE}.ray", f"{PACKAGE}.testing", f"{PACKAGE}._step_backend"}


def _inside(module: str) -> bool:
    return module == SUB or module.startswith(f"{SUB}.")


def test_torch_takes_nothing_from_the_lightning_adapter() -> None:
    graph = import_graph(SRC, PACKAGE)
    assert f"{SUB}._adapter" in graph.modules and f"{SUB}._step_backend" in graph.modules
    offenders = [
        f"{module} imports {target}"
        for module in graph.modules
        if _inside(module)
        for target in graph.edges[module]
        if target in LIGHTNING_ONLY
    ]
    assert offenders == []


def test_the_root_reaches_into_torch_only_through_its_public_names_and_the_step_backend() -> None:
    graph = import_graph(SRC, PACKAGE)
    offenders = [
        f"{module} imports {target}"
        for module in graph.modules
        if not _inside(module) and module not in REACH_IN
        for target in graph.edges[module]
        if _inside(target)
    ]
    assert offenders == []
