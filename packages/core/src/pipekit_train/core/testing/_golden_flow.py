"""The golden-run suite's flow case: one flow head, the same numbers on every backend.

Every backend builds its MLP from the same canonical weights (`golden_weights`) with
`flow_width(2, ...)` outputs. The suite records, per backend, the `Flow`'s `log_prob`
at fixed targets and its samples from a fixed seed for the *initial* weights (the same
weights must give the same density and draws), then trains with `flow_nll` and records
every step's loss, the final validation loss and the trained flow's `log_prob` and
samples. `compare_golden_flow` checks two backends' records against each other. The
coupled case (`GOLDEN_FLOW_COUPLED_OPTIONS`: the same flow with `flow_hidden=8`, the
conditioner's weights part of the output) runs the same way with
`run_golden_flow(backend, options=GOLDEN_FLOW_COUPLED_OPTIONS, lr=GOLDEN_FLOW_COUPLED_LR)`
(at Adam's 0.01 its loss jumps about after 20 steps and float rounding then separates
the backends by 0.3; at 1e-3 they agree).

```python
from pipekit_train.core.testing import compare_golden_flow, run_golden_flow
from pipekit_train.equinox.testing import golden_backend as equinox_backend
from pipekit_train.lightning.testing import golden_backend as lightning_backend

assert not compare_golden_flow(
    run_golden_flow(equinox_backend()), run_golden_flow(lightning_backend())
)
```
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from pipekit_train.core import Flow, TrainingLoop, losses
from pipekit_train.core.data import ArrayDataset

from ._golden import GoldenBackend, golden_weights

__all__ = [
    "GOLDEN_FLOW_COUPLED_LR",
    "GOLDEN_FLOW_COUPLED_OPTIONS",
    "GOLDEN_FLOW_OPTIONS",
    "GOLDEN_FLOW_STEPS",
    "compare_golden_flow",
    "golden_flow_task",
    "run_golden_flow",
]

GOLDEN_FLOW_STEPS = 40
"""Optimizer steps of the flow case."""

GOLDEN_FLOW_OPTIONS: dict[str, Any] = {"flow_layers": 2, "flow_bins": 4, "flow_bound": 3.0}
"""`flow_nll`'s options in the flow case (2 layers of 4 bins: 56 outputs for 2 values)."""

GOLDEN_FLOW_COUPLED_OPTIONS: dict[str, Any] = {**GOLDEN_FLOW_OPTIONS, "flow_hidden": 8}
"""The coupled flow case's options (`flow_hidden=8`: 56 + 2 * 115 = 286 outputs)."""

GOLDEN_FLOW_COUPLED_LR = 1e-3
"""Adam's learning rate in the coupled flow case (the element-wise case uses 0.01)."""

_PROBES = 8  # observations whose flows are probed
_DRAWS = 16  # samples per probed flow


def golden_flow_task(
    n_train: int = 256, n_val: int = 64, seed: int = 0
) -> tuple[ArrayDataset, ArrayDataset]:
    """A banana-shaped conditional density over 2 values given 2 inputs, float32.

    `x ~ U(-1, 1)^2`, `theta_1 = x_1 + 0.5 e_1`, `theta_2 = theta_1**2 + 0.5 x_2 + 0.2 e_2`.
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    x = rng.uniform(-1.0, 1.0, (n, 2))
    t1 = x[:, 0] + 0.5 * rng.standard_normal(n)
    t2 = t1**2 + 0.5 * x[:, 1] + 0.2 * rng.standard_normal(n)
    y = np.stack([t1, t2], axis=1)
    x, y = x.astype(np.float32), y.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


def _probe(model: Any, val: ArrayDataset, options: Mapping[str, Any]) -> tuple[list, list]:
    """`(log_prob at the first targets, samples from seed 0)` of the model's flows."""
    batch = val.get_batch(np.arange(_PROBES))
    flow = Flow.from_output(np.asarray(model(batch["x"])), **options)
    log_prob = flow.log_prob(batch["y"])
    samples = flow.sample(np.random.default_rng(0), n=_DRAWS)
    return log_prob.tolist(), samples.tolist()


def run_golden_flow(
    backend: GoldenBackend,
    *,
    steps: int = GOLDEN_FLOW_STEPS,
    options: Mapping[str, Any] = GOLDEN_FLOW_OPTIONS,
    lr: float = 0.01,
) -> dict[str, Any]:
    """The flow case on `backend` (JSON): initial and trained `log_prob` and samples, and
    the training curve of `flow_nll` with Adam.

    Args:
        backend: the backend under test.
        steps: the optimizer steps.
        options: `flow_nll`'s options (`GOLDEN_FLOW_COUPLED_OPTIONS`: the coupled case).
        lr: Adam's learning rate (`GOLDEN_FLOW_COUPLED_LR` in the coupled case).
    """
    options = dict(options)
    train, val = golden_flow_task()
    width = losses.flow_width(
        2, options["flow_layers"], options["flow_bins"], options.get("flow_hidden", 0)
    )
    weights = golden_weights((2, 32, width))
    log_prob0, samples0 = _probe(backend.model_from_weights(weights), val, options)
    artifact = TrainingLoop(
        model=backend.model_from_weights(weights),
        data=train,
        validation=val,
        loss=losses.flow_nll(**options),
        optimizer_config={"name": "adam", "lr": lr},
        batch_size=32,
        max_steps=steps,
        validate_every_n_steps=steps,
        log_every_n_steps=steps,
        seed=0,
        adapter=backend.adapter("float32"),
        progress=False,
    ).run()
    log_prob1, samples1 = _probe(artifact.model, val, options)
    return {
        "backend": backend.name,
        "log_prob_initial": log_prob0,
        "samples_initial": samples0,
        "losses": [float(v) for v in artifact.history["loss"]],
        "val_loss": float(artifact.final_metrics["val_loss"]),
        "log_prob_trained": log_prob1,
        "samples_trained": samples1,
    }


def _worst(got: Any, ref: Any) -> float:
    """The largest difference relative to `max(|ref|, 1)` (log-densities and samples are O(1))."""
    g, r = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if g.shape != r.shape:
        return float("inf")
    return float(np.max(np.abs(g - r) / np.maximum(np.abs(r), 1.0)))


def compare_golden_flow(
    reference: Mapping[str, Any],
    other: Mapping[str, Any],
    *,
    rtol_initial: float = 1e-4,
    rtol: float = 1e-3,
) -> list[str]:
    """Every disagreement of two backends' flow cases, as readable lines (empty: they agree).

    The initial weights' `log_prob` and samples agree to `rtol_initial` (float32 model
    outputs, one float64 flow); every step's loss, the final validation loss and the
    trained flow's `log_prob` and samples to `rtol` (relative to `max(|value|, 1)`).
    """
    problems = []
    checks = (
        ("log_prob_initial", rtol_initial),
        ("samples_initial", rtol_initial),
        ("losses", rtol),
        ("val_loss", rtol),
        ("log_prob_trained", rtol),
        ("samples_trained", rtol),
    )
    for key, tol in checks:
        worst = _worst(other[key], reference[key])
        if not worst <= tol:
            problems.append(
                f"{key}: {other['backend']} vs {reference['backend']} differ by {worst:.2e} "
                f"(rtol {tol:g})"
            )
    return problems
