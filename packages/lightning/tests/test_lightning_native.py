"""User `LightningModule`s, `torch.nn.Module`s, `DataLoader`s and `LightningDataModule`s."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import HookRecorder
from pipekit_train.core.writers import MemoryWriter
from pipekit_train.lightning import Lightning, TorchModelOp

L = pytest.importorskip("lightning")


class Regressor(L.LightningModule):
    """A user module: own loss, own optimizer, logs `val_loss` from `validation_step`."""

    def __init__(self, in_size: int = 4, lr: float = 0.05):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Linear(in_size, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch if not isinstance(batch, dict) else (batch["x"], batch["y"])
        return torch.nn.functional.mse_loss(self(x), y)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self(x), y))

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)


class NoOptimizer(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self(batch["x"]), batch["y"])


class Data(L.LightningDataModule):
    def __init__(self, train: Any, val: Any):
        super().__init__()
        self.train, self.val = train, val

    def train_dataloader(self) -> DataLoader:
        return loader(self.train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return loader(self.val)


def loader(ds: Any, shuffle: bool = False) -> DataLoader:
    batch = ds.get_batch(np.arange(len(ds)))
    tensors = TensorDataset(torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"]))
    return DataLoader(
        tensors, batch_size=16, shuffle=shuffle, generator=torch.Generator().manual_seed(0)
    )


def test_user_module_with_dataloaders(regression: Any, tmp_path: Path) -> None:
    train, val = regression
    torch.manual_seed(0)
    module = Regressor()
    mem, rec = MemoryWriter(), HookRecorder()
    art = TrainingLoop(
        model=module,
        data=loader(train, shuffle=True),
        validation=loader(val),
        metrics=["mae"],
        max_steps=30,
        validate_every_n_steps=10,
        writers=[mem],
        callbacks=[rec],
        checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=10, async_save=False),
        adapter=Lightning(accelerator="cpu"),
        progress=False,
    ).run()
    assert art.steps == 30 and art.history.series("val_loss")[0] == [10, 20, 30]
    assert "val_mae" in art.final_metrics
    losses = np.asarray(art.history["loss"])
    assert losses[-5:].mean() < 0.5 * losses[:5].mean()
    assert [s for h, s in rec.calls if h == "on_checkpoint"] == [10, 20, 30]
    # the artifact's operator wraps the trained module and rebuilds from its hparams
    assert isinstance(art.model, TorchModelOp)
    assert art.model.kwargs == {"in_size": 4, "lr": 0.05}
    x = val.get_batch(np.arange(4))["x"]
    np.testing.assert_allclose(
        art.model(x), module(torch.from_numpy(x)).detach().numpy(), rtol=1e-6
    )
    # resume restores model, optimizer and step (the loader restarts its epoch, warned,
    # pointing to the loader that resumes exactly)
    with pytest.warns(
        UserWarning, match=r"Resuming at step 30.*\(DataLoader\).*StatefulDataLoader"
    ):
        again = TrainingLoop(
            model=Regressor(),
            data=loader(train, shuffle=True),
            validation=loader(val),
            max_steps=35,
            checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=10, async_save=False),
            adapter=Lightning(accelerator="cpu"),
            progress=False,
        ).run()
    assert again.resumed_from_step == 30 and again.steps == 35


def test_user_module_with_datamodule_uses_its_validation(regression: Any) -> None:
    train, val = regression
    torch.manual_seed(0)
    art = TrainingLoop(
        model=Regressor(),
        data=Data(train, val),
        max_steps=32,
        adapter=Lightning(accelerator="cpu", val_check_interval=8, check_val_every_n_epoch=None),
        progress=False,
    ).run()
    steps, values = art.history.series("val_loss")
    assert steps == [8, 16, 24, 32] and values[-1] < values[0]


def test_module_without_optimizer_uses_the_plan(regression: Any) -> None:
    train, _ = regression
    art = TrainingLoop(
        model=NoOptimizer(),
        data=train,
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=40,
        adapter=Lightning(accelerator="cpu"),
        progress=False,
    ).run()
    losses = np.asarray(art.history["loss"])
    assert losses[-5:].mean() < 0.25 * losses[:5].mean()


def test_plain_torch_module_with_core_data(regression: Any, tmp_path: Path) -> None:
    train, val = regression
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    kwargs: dict[str, Any] = dict(
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.02},
        batch_size=16,
        validate_every_n_steps=5,
        adapter=Lightning(accelerator="cpu"),
        progress=False,
    )
    art = TrainingLoop(model=net, max_steps=10, **kwargs).run()
    assert art.steps == 10 and art.history.series("val_loss")[0] == [5, 10]
    assert isinstance(art.model, TorchModelOp)
    assert (
        art.model.serialize_weights() != TorchModelOp.wrap(net).serialize_weights()
    )  # the input is copied


def test_model_op_with_native_loader(regression: Any) -> None:
    train, val = regression
    art = TrainingLoop(
        model=TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1),
        data=loader(train, shuffle=True),
        validation=loader(val),
        metrics=["rmse"],
        optimizer_config={"name": "adam", "lr": 0.05},
        max_steps=20,
        validate_every_n_steps=10,
        adapter=Lightning(accelerator="cpu"),
        progress=False,
    ).run()
    assert art.history.series("val_rmse")[0] == [10, 20]
    assert art.steps == 20


def test_skip_is_refused_for_a_user_module(regression: Any) -> None:
    """`on_nonfinite="skip"` needs the generated training step: refused before any work."""
    from pipekit_train.core import NotSupportedError

    train, _ = regression
    with pytest.raises(NotSupportedError, match=r"model=Regressor, on_nonfinite='skip'"):
        TrainingLoop(
            model=Regressor(),
            data=train,
            max_steps=4,
            on_nonfinite="skip",
            adapter=Lightning(accelerator="cpu"),
            progress=False,
        )
