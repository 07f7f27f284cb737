"""The golden-run suite across backends: the same description trains the same everywhere.

Each backend runs `pipekit_train.core.testing.run_golden` in its own process (Keras's
backend is fixed per process), from the same canonical initial weights, on the same
batches; the per-step training loss and the final validation loss of every case must
agree with Equinox's within the case's tolerance (1e-3 relative per step in float32).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core.testing import (
    GOLDEN_CASES,
    GOLDEN_EMA_CASES,
    GOLDEN_STEPS,
    GoldenCase,
    compare_golden,
    load_runs,
    max_differences,
    max_norm_differences,
)

HERE = Path(__file__).resolve().parent
# label -> (backend package, KERAS_BACKEND)
SETUPS = {
    "equinox": ("equinox", None),
    "lightning": ("lightning", None),
    # pipekit_train.lightning.Torch(): plain torch on core's run loop, 1 and 10 fused steps
    "torch": ("torch", None),
    "torch-k10": ("torch_k10", None),
    "keras-jax": ("keras", "jax"),
    "keras-torch": ("keras", "torch"),
    # the adapter-author walk-through (examples/plain_torch_adapter.py): float32 only
    "plain-torch": ("plain_torch", None),
}


@pytest.fixture(scope="module")
def golden(golden_outputs: Any) -> dict[str, dict]:
    """Every backend's runs of `run_golden` (each in its own process: `golden_outputs`)."""
    return {label: load_runs(golden_outputs(label, "mlp")) for label in SETUPS}


@pytest.mark.slow
@pytest.mark.parametrize(
    "label", ["lightning", "torch", "torch-k10", "keras-jax", "keras-torch", "plain-torch"]
)
def test_every_case_matches_equinox(golden: dict[str, dict], label: str) -> None:
    cases = [
        c
        for c in GOLDEN_CASES
        if label != "plain-torch" or (c.precision == "float32" and "ema" not in c.optimizer_config)
    ]
    problems = compare_golden(golden["equinox"], golden[label], cases)
    table = "\n".join(
        f"{case:28s} step {a:.1e}  val {b:.1e}"
        for case, (a, b) in max_differences(golden["equinox"], golden[label]).items()
    )
    assert not problems, "\n".join(problems) + "\n" + table


@pytest.mark.slow
def test_the_full_description_agrees_to_1e_3_over_100_steps(golden: dict[str, dict]) -> None:
    """Weight decay, warm-up cosine, clipping and accumulation k=2 together, float32."""
    case = next(c for c in GOLDEN_CASES if c.name == "accumulate_2")
    config = case.optimizer_config
    assert case.accumulate_grad_batches == 2 and config["weight_decay"] > 0
    assert config["lr"]["schedule"] == "warmup_cosine" and config["clip_norm"]
    assert case.precision == "float32" and case.rtol <= 1e-3 and GOLDEN_STEPS >= 100
    for label, runs in golden.items():
        assert len(runs["accumulate_2"].losses) == GOLDEN_STEPS, label
        steps, val = max_differences(golden["equinox"], runs)["accumulate_2"]
        assert steps <= 1e-3 and val <= 1e-3, (label, steps, val)
    # and the curve really trains: the loss falls well below where it started
    losses = golden["equinox"]["accumulate_2"].losses
    assert sum(losses[-10:]) < 0.5 * sum(losses[:10])


@pytest.mark.slow
def test_torch_fused_steps_give_the_same_losses(golden: dict[str, dict]) -> None:
    """`Torch(steps_per_execution=10)` runs the same updates as K=1: every loss equal."""
    for case in GOLDEN_CASES:
        one, fused = golden["torch"][case.name], golden["torch-k10"][case.name]
        assert one.losses == fused.losses, case.name
        assert one.val_loss == fused.val_loss, case.name
        assert one.grad_norms == fused.grad_norms and one.grad_norms, case.name


# the setups whose adapters record `grad_norm` (run_golden turns it on where declared)
GRAD_NORM_SETUPS = ["lightning", "torch", "torch-k10", "keras-jax", "keras-torch"]


@pytest.mark.slow
@pytest.mark.parametrize("label", GRAD_NORM_SETUPS)
def test_grad_norm_is_the_same_on_every_backend(golden: dict[str, dict], label: str) -> None:
    """`log_grad_norm=True`: every step's norm (before clipping; with accumulation, of the
    accumulated gradient) agrees with Equinox's like the loss does (compare_golden checks
    it); here: every case recorded one value per step on both, and clipping did not clip it."""
    for case in GOLDEN_CASES:
        ref, got = golden["equinox"][case.name], golden[label][case.name]
        assert len(ref.grad_norms) == len(got.grad_norms) == GOLDEN_STEPS, (label, case.name)
    clipped = golden["equinox"]["warmup_cosine_clip_norm"]
    clip = next(c for c in GOLDEN_CASES if c.name == "warmup_cosine_clip_norm")
    assert max(clipped.grad_norms) > clip.optimizer_config["clip_norm"]  # the unclipped norm
    worst = max_norm_differences(golden["equinox"], golden[label])
    assert set(worst) == {c.name for c in GOLDEN_CASES}
    assert all(worst[c.name] <= c.rtol for c in GOLDEN_CASES), worst


def _hand_optax_ema(case: GoldenCase) -> list[np.ndarray]:
    """The canonical weights of a hand-written optax loop keeping the moving average.

    optax for the update (`chain(clip_by_global_norm, adamw(schedule))` in
    `optax.MultiSteps` for accumulation), the average by hand: it starts from the initial
    weights and after every optimizer update becomes `decay * ema + (1 - decay) * w`.
    """
    import jax
    import jax.numpy as jnp
    import optax

    from pipekit_train.core.data import make_batches
    from pipekit_train.core.testing import golden_task, golden_weights
    from pipekit_train.equinox._optim import build_schedule

    cfg = dict(case.optimizer_config)
    ema_cfg = cfg["ema"]
    decay = ema_cfg["decay"] if isinstance(ema_cfg, dict) else ema_cfg
    lr = build_schedule(cfg["lr"])
    if cfg.get("weight_decay"):
        opt = optax.adamw(lr, weight_decay=cfg["weight_decay"])
    else:
        opt = optax.adam(lr)
    if cfg.get("clip_norm"):
        opt = optax.chain(optax.clip_by_global_norm(cfg["clip_norm"]), opt)
    m = case.accumulate_grad_batches
    multi = optax.MultiSteps(opt, every_k_schedule=m) if m > 1 else None
    tx = multi.gradient_transformation() if multi is not None else opt

    def forward(p: list, x: jax.Array) -> jax.Array:
        h = x
        for i in range(0, len(p) - 2, 2):
            h = jnp.tanh(h @ p[i] + p[i + 1])
        return h @ p[-2] + p[-1]

    @jax.jit
    def step(p: list, s: object, batch: dict) -> tuple[list, object]:
        g = jax.grad(lambda q: jnp.mean((forward(q, batch["x"]) - batch["y"]) ** 2))(p)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    train, _ = golden_task()
    params = [jnp.asarray(w) for w in golden_weights()]
    state = tx.init(params)
    ema = [np.asarray(w, np.float64) for w in params]
    batches = make_batches(train, 32, seed=0)
    for _ in range(GOLDEN_STEPS):
        for _ in range(m):
            params, state = step(params, state, next(batches))
        ema = [
            decay * e + (1 - decay) * np.asarray(w, np.float64)
            for e, w in zip(ema, params, strict=True)
        ]
    return ema


@pytest.mark.slow
def test_ema_weights_match_a_hand_written_optax_loop(golden: dict[str, dict]) -> None:
    """From the same initial weights, every backend's artifact holds the hand loop's average."""
    for case in GOLDEN_EMA_CASES:
        expected = _hand_optax_ema(case)
        for label, runs in golden.items():
            if label == "plain-torch":  # the example refuses `ema`
                assert case.name not in runs
                continue
            got = runs[case.name].weights
            assert got is not None and len(got) == len(expected), (label, case.name)
            for i, (g, e) in enumerate(zip(got, expected, strict=True)):
                rel = np.linalg.norm(np.asarray(g) - e) / np.linalg.norm(e)
                assert rel <= 1e-4, (label, case.name, i, rel)
        # the average is not the trained weights: validation sees a different model
        assert golden["equinox"][case.name].val_loss != golden["equinox"]["adam"].val_loss
