"""The training run shared by the sbibm benchmark's estimators (`bench_sbi.py`, `sbi_nle.py`).

Batch 256, Adam with a cosine schedule from 1e-3 (to 2% at `steps`), gradient clipping at
1.0, validation every `validate_every` updates, early stopping after `patience`
validations without improvement (0: none); backend `torch` trains the Lightning network
with the lean `Torch()` adapter.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["fit", "mlp"]


def fit(
    model: Any,
    backend: str,
    train_set: Any,
    val_set: Any,
    normalizer: Any,
    loss: Any,
    *,
    steps: int,
    seed: int,
    patience: int,
    validate_every: int,
    what: str = "",
) -> tuple[Any, float]:
    """Train through `TrainingLoop` on `backend`'s adapter (`torch`: `Torch()`); returns
    `(artifact, seconds)` and prints the losses."""
    from _shared import build_adapter

    from pipekit_train.core import EarlyStopping, TrainingLoop

    adapter = build_adapter(backend)  # the model operator's own, but on `torch`
    started = time.perf_counter()
    artifact = TrainingLoop(
        model=model,
        data=train_set,
        validation=val_set,
        normalizer=normalizer,
        loss=loss,
        optimizer_config={
            "name": "adam",
            "lr": {"schedule": "cosine", "init_value": 1e-3, "decay_steps": steps, "alpha": 0.02},
            "clip_norm": 1.0,
        },
        batch_size=256,
        max_steps=steps,
        validate_every_n_steps=validate_every,
        callbacks=[EarlyStopping(patience=patience)] if patience > 0 else [],
        seed=seed,
        adapter=adapter,
        progress=False,
    ).run()
    seconds = time.perf_counter() - started
    val = artifact.history["val_loss"]
    print(
        f"    trained {what}{artifact.steps} updates ({artifact.stop_reason}) in {seconds:.0f} s; "
        f"loss {artifact.history['loss'][-1]:.3f}, val_loss {[round(v, 3) for v in val]}",
        flush=True,
    )
    return artifact, seconds


def mlp(backend: str, in_size: int, out_size: int, seed: int, **options: Any) -> Any:
    """The benchmark's MLP (`toymodels`, width 128, depth 2) for `backend` (`torch`: the
    Lightning network, trained by `Torch()`)."""
    import toymodels
    from _shared import backend_entry

    return toymodels.model_op(
        backend_entry(backend).model_op_class().backend,  # torch: lightning's
        in_size=in_size,
        out_size=out_size,
        width=128,
        seed=seed,
        **options,
    )
