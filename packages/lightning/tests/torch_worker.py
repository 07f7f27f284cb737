"""Subprocess worker of the `Torch()` and stateful-loader kill-and-resume tests.

`python torch_worker.py spec.json` trains the spec's loop with `Torch(**adapter)` (or
`Lightning(accelerator="cpu", **adapter)` with `"backend": "lightning"`) and checkpoints;
at `kill_at` it sends itself SIGKILL, like a preempted job. `"data": "stateful"` trains on
a shuffled torchdata `StatefulDataLoader` over the same samples, `"datamodule"` on a
`LightningDataModule` returning one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any


def stateful_loader(train: Any, batch_size: int = 16) -> Any:
    """A shuffled, seeded `StatefulDataLoader` over a core dataset's samples."""
    import numpy as np
    import torch
    from torch.utils.data import TensorDataset
    from torchdata.stateful_dataloader import StatefulDataLoader

    batch = train.get_batch(np.arange(len(train)))
    tensors = TensorDataset(torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"]))
    return StatefulDataLoader(
        tensors, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0)
    )


def _data(spec: dict[str, Any], train: Any) -> Any:
    kind = spec.get("data")
    if kind is None:
        return train
    if kind == "stateful":
        return stateful_loader(train)
    import lightning as L

    class Data(L.LightningDataModule):
        def train_dataloader(self) -> Any:
            return stateful_loader(train)

    return Data()


def _await_commit(spec: dict[str, Any], step: int, timeout: float = 60.0) -> None:
    """Give the last checkpoint due before `step` time to commit before the kill.

    Async writes lag on a busy machine; waiting makes the resume point the one the test
    names instead of a race with the writer. Past `timeout` the kill goes ahead anyway.
    """
    import time
    from pathlib import Path

    directory, every = spec.get("directory"), spec.get("every_n_steps")
    if directory is None or not every:
        return
    due = (step - 1) // int(every) * int(every)
    deadline = time.monotonic() + timeout
    while due > 0 and time.monotonic() < deadline:
        try:
            if list(Path(directory).glob(f"**/{due}/meta.json")):
                return
        except FileNotFoundError:  # a `.tmp-*` folder renamed to its step while listed
            pass
        time.sleep(0.05)


def build(spec: dict[str, Any], *, kill_at: int | None) -> Any:
    """The loop of `spec` (the test builds the same one for the resume and the reference)."""
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.callbacks import LambdaCallback
    from pipekit_train.core.testing import regression_task
    from pipekit_train.lightning import Lightning, Torch, TorchModelOp

    train, val = regression_task()

    def on_step_end(state: Any) -> None:
        if kill_at is not None and state.step >= kill_at:
            _await_commit(spec, state.step)
            sys.stdout.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    directory = spec.get("directory")
    own_validation = spec.get("data") == "datamodule"  # a LightningDataModule brings its own
    return TrainingLoop(
        model=TorchModelOp(
            "pipekit_train.lightning.testing:mlp",
            in_size=4,
            out_size=1,
            width=16,
            dropout=0.1,
            seed=0,
        ),
        data=_data(spec, train),
        validation=None if own_validation else val,
        loss="mse",
        optimizer_config=spec["optimizer_config"],
        batch_size=16,
        max_steps=spec["max_steps"],
        accumulate_grad_batches=spec.get("accumulate_grad_batches", 1),
        checkpoint=None
        if directory is None
        else Checkpoint(directory, every_n_steps=spec["every_n_steps"], max_to_keep=None),
        validate_every_n_steps=None if own_validation else 8,
        seed=0,
        adapter=Lightning(accelerator="cpu", **spec["adapter"])
        if spec.get("backend") == "lightning"
        else Torch(**spec["adapter"]),
        callbacks=[LambdaCallback(on_step_end=on_step_end)],
        progress=False,
    )


def main(path: str) -> None:
    with open(path) as fh:
        spec = json.load(fh)
    build(spec, kill_at=int(spec["kill_at"])).run()
    print("worker finished without being killed", flush=True)
    sys.exit(3)


if __name__ == "__main__":
    main(sys.argv[1])
