"""Two-process DDP run on CPU, launched by Lightning itself (`strategy="ddp"`).

`python ddp_worker.py OUT_DIR STRATEGY [elastic]`: Lightning's script launcher re-runs
this file as global rank 1. Both ranks train 6 steps, then 10 (a resume from the first
run's checkpoints), then 10 from scratch in another directory (the reference), then one
epoch (256 samples in global batches of 16: 16 steps), then one epoch under
`on_nonfinite="skip"` with a NaN in one sample (one process's shard), then a run on
`OUT_DIR/held`, whose lease the test holds (every rank must be refused), and write
`OUT_DIR/rank<k>.json`.

With `elastic` the same launch also resumes across process counts (a model without
dropout, whose per-process RNG streams would differ): before the first DDP run, the
main process alone (one process, no DDP) trains an uninterrupted 10-step reference and
6 steps into a checkpoint; the two ranks resume that checkpoint to step 10 (1 -> 2),
train 6 steps into another checkpoint and an uninterrupted 2-process reference; then the
main process alone restores that checkpoint and resumes it to step 10 (2 -> 1). Every run
records the sample indices each process reads per step; each process writes
`OUT_DIR/elastic-rank<k>.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any


def _mlp(dropout: float = 0.0) -> Any:
    """The workers' model: the testing MLP (4 -> 8 -> 1), seed 0."""
    from pipekit_train.lightning import TorchModelOp

    return TorchModelOp(
        "pipekit_train.lightning.testing:mlp",
        in_size=4,
        out_size=1,
        width=8,
        dropout=dropout,
        seed=0,
    )


def _recording_data() -> Any:
    """The training data; `seen` gets the sample indices of every batch read, in order."""
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.testing import regression_task

    class Recording(ArrayDataset):
        gather_block_rows = None  # one get_batch call per batch, when it is taken
        seen: list[list[int]]

        def get_batch(self, indices: Any) -> Any:
            self.seen.append([int(i) for i in indices])
            return super().get_batch(indices)

    train, _ = regression_task()
    data = Recording(**train.arrays)
    data.seen = []
    return data


def _elastic_run(out: Path, max_steps: int, ckpt: str | None, devices: int) -> dict[str, Any]:
    """One recorded run on `devices` processes (1: no DDP)."""
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import regression_task
    from pipekit_train.lightning import Lightning

    _, val = regression_task()
    data = _recording_data()
    strategy = {"strategy": "ddp"} if devices > 1 else {}
    art = TrainingLoop(
        model=_mlp(),
        data=data,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=max_steps,
        validate_every_n_steps=3,
        checkpoint=None
        if ckpt is None
        else Checkpoint(out / ckpt, every_n_steps=3, max_to_keep=None),
        adapter=Lightning(accelerator="cpu", devices=devices, **strategy),
        progress=False,
    ).run()
    ran = art.steps - (art.resumed_from_step or 0)
    return {
        "world": art.extra["world_size"],
        "steps": art.steps,
        "resumed_from_step": art.resumed_from_step,
        "sha": hashlib.sha256(art.model.serialize_weights()).hexdigest(),
        "weights": [
            t.detach().double().ravel().tolist() for t in art.model.model.state_dict().values()
        ],
        "loss": art.history["loss"],
        "seen": data.seen[:ran],  # Lightning fetches one batch ahead of the last step
    }


def main(out: Path, strategy: str, elastic: bool) -> None:
    import numpy as np

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.testing import regression_task
    from pipekit_train.core.writers import JsonlWriter
    from pipekit_train.lightning import Lightning, TorchModelOp

    launched = "LOCAL_RANK" in os.environ  # a rank Lightning's launcher started
    runs: dict[str, Any] = {}
    if elastic and not launched:
        runs["reference_1"] = _elastic_run(out, 10, None, 1)
        runs["first_1"] = _elastic_run(out, 6, "e12", 1)
    train, val = regression_task()
    results = []
    for max_steps, directory in ((6, "ckpt"), (10, "ckpt"), (10, "reference")):
        loop = TrainingLoop(
            model=_mlp(dropout=0.1),
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
        model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
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
        model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
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
    # a location another run holds (the test planted its lease): every rank is refused
    from pipekit_train.core.checkpoint._lease import LeaseError

    try:
        TrainingLoop(
            model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
            data=train,
            batch_size=16,
            max_steps=4,
            checkpoint=Checkpoint(out / "held", every_n_steps=2),
            adapter=Lightning(accelerator="cpu", devices=2, strategy=strategy),
            progress=False,
        ).run()
        results.append({"refused": None})
    except LeaseError as err:
        results.append({"refused": str(err)})
    rank = results[0]["rank"]
    (out / f"rank{rank}.json").write_text(json.dumps(results))
    if elastic:
        runs["resume_1_to_2"] = _elastic_run(out, 10, "e12", 2)
        runs["first_2"] = _elastic_run(out, 6, "e21", 2)
        runs["reference_2"] = _elastic_run(out, 10, None, 2)
        if rank == 0:
            runs["restored_2_on_1"] = _elastic_run(out, 6, "e21", 1)
            runs["resume_2_to_1"] = _elastic_run(out, 10, "e21", 1)
        (out / f"elastic-rank{rank}.json").write_text(json.dumps(runs))
    if elastic:
        (out / f"torch-rank{rank}.json").write_text(json.dumps(_torch_runs(out, rank)))


def _torch_runs(out: Path, rank: int) -> dict[str, Any]:
    """`Torch()` on the process group Lightning's DDP left initialized: data parallel."""
    import numpy as np
    import torch

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.testing import regression_task
    from pipekit_train.lightning import Torch
    from pipekit_train.lightning._state import TrainState
    from pipekit_train.lightning.torch._distributed import DataParallel

    assert torch.distributed.is_initialized()
    train, val = regression_task()

    def run(tag: str, max_steps: int, *, dropout: float = 0.0, **kwargs: Any) -> dict[str, Any]:
        data = kwargs.pop("data", None) or _recording_data()
        art = TrainingLoop(
            model=_mlp(dropout),
            data=data,
            validation=val,
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=16,
            max_steps=max_steps,
            validate_every_n_steps=3,
            adapter=Torch(),
            progress=False,
            **kwargs,
        ).run()
        ran = art.steps - (art.resumed_from_step or 0)
        return {
            "steps": art.steps,
            "resumed_from_step": art.resumed_from_step,
            "sha": hashlib.sha256(art.model.serialize_weights()).hexdigest(),
            "weights": [
                t.detach().double().ravel().tolist() for t in art.model.model.state_dict().values()
            ],
            "loss": art.history["loss"],
            "seen": getattr(data, "seen", [])[:ran],
            "skipped": art.history.series("nonfinite_skipped")[0]
            if "nonfinite_skipped" in art.history
            else [],
        }

    def ckpt(name: str, every: int = 3) -> Checkpoint:
        return Checkpoint(out / name, every_n_steps=every, max_to_keep=None)

    runs: dict[str, Any] = {
        # the same run as Lightning's two-process `reference_2` (no dropout)
        "plain": run("plain", 10),
        # dropout: 6 steps, a resume to 10, an uninterrupted 10
        "first": run("first", 6, dropout=0.1, checkpoint=ckpt("t-ckpt")),
        "resumed": run("resumed", 10, dropout=0.1, checkpoint=ckpt("t-ckpt")),
        "reference": run("reference", 10, dropout=0.1),
    }
    # on_nonfinite="skip" with a NaN in one process's shard only: both drop that update
    batch = train.get_batch(np.arange(len(train)))
    batch["x"][37] = np.nan
    runs["skip"] = run("skip", 16, data=ArrayDataset(**batch), on_nonfinite="skip")
    # a torch DataLoader would be read whole by every process: refused before any work
    from torch.utils.data import DataLoader, TensorDataset

    from pipekit_train.core import ConfigError

    tensors = TensorDataset(torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"]))
    try:
        run("loader", 4, data=DataLoader(tensors, batch_size=8), checkpoint=ckpt("t-loader"))
        runs["refused_loader"] = None
    except ConfigError as err:
        runs["refused_loader"] = str(err)
    runs["loader_dir"] = (out / "t-loader").exists()
    # each process draws its own dropout stream from the one shared private state
    dp = DataParallel(torch.device("cpu"))
    state = TrainState(torch.nn.Linear(1, 1), torch_rng=torch.manual_seed(0).get_state())
    dp.reseed(state)
    runs["draw"] = torch.rand(4).tolist()
    runs["shared_rng"] = hashlib.sha256(state.torch_rng.numpy().tobytes()).hexdigest()
    return runs


if __name__ == "__main__":
    main(
        Path(sys.argv[1]),
        sys.argv[2] if len(sys.argv) > 2 else "ddp",
        len(sys.argv) > 3 and sys.argv[3] == "elastic",
    )
