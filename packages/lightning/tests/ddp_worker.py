"""Two-process DDP run on CPU, launched by Lightning itself (`strategy="ddp"`).

`python ddp_worker.py OUT_DIR STRATEGY`: Lightning's script launcher re-runs this file as
global rank 1. Both ranks train 6 steps, then 10 (a resume from the first run's
checkpoints), then 10 from scratch in another directory (the reference), then one epoch
(per-shard: 128 samples, 8 steps of 16), then one epoch under `on_nonfinite="skip"` with
a NaN in one sample (one process's shard), and write `OUT_DIR/rank<k>.json`.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path


def main(out: Path, strategy: str) -> None:
    import numpy as np

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.testing import regression_task
    from pipekit_train.core.writers import JsonlWriter
    from pipekit_train.lightning import Lightning, LightningModelOp

    train, val = regression_task()
    results = []
    for max_steps, directory in ((6, "ckpt"), (10, "ckpt"), (10, "reference")):
        loop = TrainingLoop(
            model=LightningModelOp(
                "pipekit_train.lightning.testing:mlp",
                in_size=4,
                out_size=1,
                width=8,
                dropout=0.1,
                seed=0,
            ),
            data=train,
            validation=val,
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=16,
            max_steps=max_steps,
            validate_every_n_steps=3,
            checkpoint=Checkpoint(out / directory, every_n_steps=3, max_to_keep=None),
            writers=[JsonlWriter(str(out / f"metrics-{directory}-{max_steps}.jsonl"))],
            adapter=Lightning(accelerator="cpu", devices=2, strategy=strategy),
            progress=False,
        )
        art = loop.run()
        results.append(
            {
                "rank": art.extra["global_rank"],
                "world": art.extra["world_size"],
                "steps": art.steps,
                "resumed_from_step": art.resumed_from_step,
                "history_steps": art.history.series("loss")[0],
                "val_steps": art.history.series("val_loss")[0]
                if "val_loss" in art.history.names
                else [],
                "sha": hashlib.sha256(art.model.serialize_weights()).hexdigest(),
                "pred": np.asarray(art.model(val.get_batch(np.arange(4))["x"])).ravel().tolist(),
            }
        )
    epoch = TrainingLoop(
        model=LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
        data=train,
        batch_size=16,
        max_epochs=1,
        adapter=Lightning(accelerator="cpu", devices=2, strategy=strategy),
        progress=False,
    ).run()
    results.append({"rank": epoch.extra["global_rank"], "steps": epoch.steps})
    # on_nonfinite="skip" with a NaN in one process's shard only: both drop that update
    batch = train.get_batch(np.arange(len(train)))
    batch["x"][37] = np.nan
    skipped = TrainingLoop(
        model=LightningModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
        data=ArrayDataset(**batch),
        batch_size=16,
        max_epochs=1,
        on_nonfinite="skip",
        checkpoint=Checkpoint(out / "skip", every_n_steps=1, max_to_keep=None),
        adapter=Lightning(accelerator="cpu", devices=2, strategy=strategy),
        progress=False,
    ).run()
    results.append(
        {
            "steps": skipped.steps,
            "skipped": skipped.history.series("nonfinite_skipped")[0]
            if "nonfinite_skipped" in skipped.history
            else [],
            "sha": hashlib.sha256(skipped.model.serialize_weights()).hexdigest(),
            "finite": bool(np.isfinite(np.asarray(skipped.model(batch["x"][:4]))).all()),
        }
    )
    rank = results[0]["rank"]
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "ddp")
