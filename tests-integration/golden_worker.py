"""Run the golden-run suite on one backend and write its runs as JSON.

`python golden_worker.py <equinox|lightning|torch|torch_k10|keras|plain_torch> <out.json>`
(Keras's backend comes from `KERAS_BACKEND`); a third argument `field` runs the conv-net
field cases (`run_golden_field`) instead, `plateau` the `ReduceLROnPlateau` cases
(`run_golden_plateau`, any backend above), `flow` the flow-head cases (`run_golden_flow`,
element-wise and coupled), `rollout` the rollout-training cases (`run_golden_rollout`).
A comma-separated list (`mlp,plateau,field`) runs several suites in this one process (one
framework import for all), writing `<out>.<suite>.json` each. Several `<backend> <out>
<suites,>` triples run one after another in this one process; Keras's backend is fixed per
process, so one process per Keras backend. `plain_torch` is the example adapter of
`examples/plain_torch_adapter.py`; `torch` / `torch_k10` are
`pipekit_train.lightning.Torch()` with 1 / 10 fused steps.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(backend: str, out: str, suite: str = "mlp") -> None:
    from pipekit_train.core.testing import GOLDEN_CASES, GoldenBackend, dump_runs, run_golden

    start = time.perf_counter()
    if suite == "plateau":
        _plateau(backend, out)
        return
    if suite == "flow":
        _flow(backend, out)
        return
    if suite == "rollout":
        from pipekit_train.core.testing import run_golden_rollout

        Path(out).write_text(dump_runs(run_golden_rollout(_backend(backend))))
        return
    if suite == "field":
        from pipekit_train.core.testing import run_golden_field

        testing = importlib.import_module(f"pipekit_train.{backend}.testing")
        runs = run_golden_field(testing.golden_backend())
    elif backend == "plain_torch":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from plain_torch_adapter import PlainTorch

        from pipekit_train.lightning.testing import mlp_from_weights

        golden = GoldenBackend("plain-torch", mlp_from_weights, lambda precision: PlainTorch())
        # float32 only, and no moving average of the weights (the example refuses `ema`)
        cases = [
            c for c in GOLDEN_CASES if c.precision == "float32" and "ema" not in c.optimizer_config
        ]
        runs = run_golden(golden, cases)
    elif backend in ("torch", "torch_k10"):
        from pipekit_train.lightning.testing import torch_golden_backend

        runs = run_golden(torch_golden_backend(10 if backend == "torch_k10" else 1))
    else:
        testing = importlib.import_module(f"pipekit_train.{backend}.testing")
        runs = run_golden(testing.golden_backend())
    Path(out).write_text(dump_runs(runs))
    print(f"{backend}: {len(runs)} cases in {time.perf_counter() - start:.1f} s")


def _plateau(backend: str, out: str) -> None:
    import json

    from pipekit_train.core.testing import GoldenBackend, run_golden_plateau

    if backend == "plain_torch":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
        from plain_torch_adapter import PlainTorch

        from pipekit_train.lightning.testing import mlp_from_weights

        golden = GoldenBackend("plain-torch", mlp_from_weights, lambda precision: PlainTorch())
    elif backend in ("torch", "torch_k10"):
        from pipekit_train.lightning.testing import torch_golden_backend

        golden = torch_golden_backend(10 if backend == "torch_k10" else 1)
    else:
        golden = importlib.import_module(f"pipekit_train.{backend}.testing").golden_backend()
    runs = run_golden_plateau(golden)
    Path(out).write_text(json.dumps({k: v.to_json() for k, v in runs.items()}))


def _backend(backend: str) -> object:
    """The `GoldenBackend` of a package name (`torch` / `torch_k10`: `Torch()`)."""
    if backend in ("torch", "torch_k10"):
        from pipekit_train.lightning.testing import torch_golden_backend

        return torch_golden_backend(10 if backend == "torch_k10" else 1)
    return importlib.import_module(f"pipekit_train.{backend}.testing").golden_backend()


def _flow(backend: str, out: str) -> None:
    import json

    from pipekit_train.core.testing import (
        GOLDEN_FLOW_COUPLED_LR,
        GOLDEN_FLOW_COUPLED_OPTIONS,
        run_golden_flow,
    )

    golden = _backend(backend)
    record = run_golden_flow(golden)
    record["coupled"] = run_golden_flow(
        golden, options=GOLDEN_FLOW_COUPLED_OPTIONS, lr=GOLDEN_FLOW_COUPLED_LR
    )
    Path(out).write_text(json.dumps(record))


def main_many(backend: str, out: str, suites: str) -> None:
    """Several suites in one process: `<out>.<suite>.json` each."""
    for suite in filter(None, suites.split(",")):
        main(backend, f"{out}.{suite}.json", suite)


def main_setups(args: list[str]) -> None:
    """Several backends in one process, one `<package> <out> <suites,>` triple each (the
    torch-based ones share one torch import; Keras's backend is the process's)."""
    if len(args) % 3:
        raise SystemExit(
            f"golden_worker: arguments come in `<backend> <out> <suites,>` triples. "
            f"Received: {len(args)} arguments ({args!r})."
        )
    for at in range(0, len(args), 3):
        main_many(*args[at : at + 3])


if __name__ == "__main__":
    if len(sys.argv) > 3 and "," in sys.argv[3]:
        main_setups(sys.argv[1:])
    else:
        main(*sys.argv[1:4])
