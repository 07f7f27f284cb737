"""`TorchModelOp`, the safetensors weight format, optimizer configs, `Lightning()` arguments."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from pipekit_train.core import ConfigError, TrainingLoop, model_op_from_config
from pipekit_train.lightning import Lightning, TorchModelOp
from pipekit_train.lightning._optim import build_optimizer, check_optimizer_config
from pipekit_train.lightning._weights import (
    decode_optimizer,
    decode_tensors,
    encode_optimizer,
    encode_tensors,
)

LINEAR = "pipekit_train.lightning.testing:linear"
MLP = "pipekit_train.lightning.testing:mlp"


def test_same_seed_same_bytes_and_global_rng_untouched() -> None:
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = TorchModelOp(LINEAR, in_size=4, out_size=2, seed=0)
    b = TorchModelOp(LINEAR, in_size=4, out_size=2, seed=0)
    c = TorchModelOp(LINEAR, in_size=4, out_size=2, seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    assert a.serialize_weights() == b.serialize_weights() != c.serialize_weights()
    assert c.with_weights(a.serialize_weights()).serialize_weights() == a.serialize_weights()


def test_call_is_eval_mode_numpy_in_numpy_out() -> None:
    op = TorchModelOp(MLP, in_size=3, out_size=2, width=16, dropout=0.5, seed=0)
    x = np.random.default_rng(0).standard_normal((5, 3))  # float64 in: cast to the model's dtype
    out1, out2 = op(x), op(x)
    assert isinstance(out1, np.ndarray) and out1.shape == (5, 2) and out1.dtype == np.float32
    np.testing.assert_array_equal(out1, out2)  # dropout is off
    assert op.model.training  # the mode is restored


def test_config_round_trip_and_registry_rebuild() -> None:
    op = TorchModelOp(MLP, in_size=2, out_size=1, width=8, seed=3)
    config = json.loads(json.dumps(op.get_config()))
    rebuilt = model_op_from_config(config)
    assert isinstance(rebuilt, TorchModelOp)
    assert rebuilt.serialize_weights() == op.serialize_weights()
    assert isinstance(op.default_adapter(), Lightning)


class _OwnOp(TorchModelOp):
    """A user's subclass: its configs name it, not `TorchModelOp`."""


def test_lightning_model_op_is_the_same_class_under_its_earlier_name() -> None:
    """Code that writes `LightningModelOp` and configs written before the rename still work."""
    import pipekit_train.lightning as pl
    from pipekit_train.core.utils import load_backend
    from pipekit_train.lightning._model import LightningModelOp

    assert LightningModelOp is TorchModelOp is pl.LightningModelOp
    assert {"LightningModelOp", "TorchModelOp"} <= set(pl.__all__)
    op = LightningModelOp(MLP, in_size=2, out_size=1, width=8, seed=3)
    # the stored path is the one configs always named: resume keys and records compare equal
    assert op.get_config()["type"] == "pipekit_train.lightning._model:LightningModelOp"
    old = {"type": "pipekit_train.lightning._model:LightningModelOp", "backend": "lightning"}
    rebuilt = model_op_from_config({**old, "factory": MLP, "seed": 3, "kwargs": op.kwargs})
    assert type(rebuilt) is TorchModelOp
    assert rebuilt.serialize_weights() == op.serialize_weights()
    assert type(op.default_adapter()) is Lightning
    for name in ("lightning", "torch"):
        assert load_backend(name).model_op_class() is TorchModelOp
    own = _OwnOp(MLP, in_size=2, out_size=1, width=8)
    assert own.get_config()["type"].endswith("test_lightning_model:_OwnOp")


def test_tied_weights_stored_once_and_stay_tied() -> None:
    op = TorchModelOp("pipekit_train.lightning.testing:tied", size=4, seed=0)
    blob = op.serialize_weights()
    tensors, _ = decode_tensors(blob)
    assert set(tensors) == {"decode.weight", "encode.weight"}
    other = TorchModelOp("pipekit_train.lightning.testing:tied", size=4, seed=9).with_weights(blob)
    assert other.model.encode.weight is other.model.decode.weight
    assert other.serialize_weights() == blob


def test_overlapping_views_are_copied() -> None:
    base = torch.arange(12, dtype=torch.float32)
    blob = encode_tensors({"a": base[:6], "b": base[6:], "c": base})
    out, _ = decode_tensors(blob)
    assert torch.equal(out["a"], base[:6]) and torch.equal(out["c"], base)
    assert encode_tensors({"c": base, "b": base[6:], "a": base[:6]}) == blob  # order-independent


def test_bad_weights_and_bad_factory() -> None:
    op = TorchModelOp(LINEAR, in_size=4, out_size=1)
    with pytest.raises(ConfigError, match="Received"):
        op.with_weights(b"not safetensors")
    other = TorchModelOp(LINEAR, in_size=3, out_size=1).serialize_weights()
    with pytest.raises(ConfigError, match="shape"):
        op.with_weights(other)
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        TorchModelOp("builtins:dict")
    with pytest.raises(ConfigError, match="JSON"):
        TorchModelOp(LINEAR, in_size=np.zeros(2), out_size=1)


def test_optimizer_state_round_trip() -> None:
    net = torch.nn.Linear(3, 2)
    opt, _ = build_optimizer(
        {"name": "adamw", "learning_rate": 0.1, "b1": 0.8}, net.parameters(), total_steps=10
    )
    assert opt.param_groups[0]["betas"] == (0.8, 0.999)
    net(torch.ones(4, 3)).sum().backward()
    opt.step()
    tensors, text = encode_optimizer(opt.state_dict())
    again = encode_optimizer(opt.state_dict())
    assert (tensors, text) == again  # deterministic
    state = decode_optimizer(tensors, text)
    opt2, _ = build_optimizer(
        {"name": "adamw", "learning_rate": 0.1, "b1": 0.8},
        torch.nn.Linear(3, 2).parameters(),
        total_steps=10,
    )
    opt2.load_state_dict(state)
    assert encode_optimizer(opt2.state_dict()) == (tensors, text)


@pytest.mark.parametrize(
    "config, fragment",
    [
        ({"name": "adamw_typo", "learning_rate": 0.01}, "adamw_typo"),
        ({"name": "adam", "learning_rate": 0.01, "weigth_decay": 0.1}, "weigth_decay"),
        ({"name": "sgd", "learning_rate": 0.01, "b1": 0.9}, "b1"),
        ({"name": "adam", "learning_rate": 0.01, "betas": [0.9, 0.99], "b1": 0.8}, "betas"),
        ({"name": "adam", "learning_rate": 0.01, "betas": [2.0, 0.99]}, "b1"),
        ("adam", "optimizer_config"),
    ],
)
def test_bad_optimizer_configs(config: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment) as info:
        check_optimizer_config(config)
    assert "Received" in str(info.value)


@pytest.mark.parametrize(
    ("config", "cls", "group"),
    [
        ({"name": "adam"}, "Adam", {"eps": 1e-8, "weight_decay": 0}),
        ({"name": "adamw"}, "AdamW", {"weight_decay": 0.01}),
        ({"name": "adam", "weight_decay": 0.1}, "AdamW", {"weight_decay": 0.1}),
        ({"name": "sgd", "momentum": 0.9, "nesterov": True}, "SGD", {"nesterov": True}),
        ({"name": "sgd", "weight_decay": 0.1}, "DecoupledSGD", {"weight_decay": 0}),
        ({"name": "rmsprop", "decay": 0.8}, "RMSprop", {"alpha": 0.8, "eps": 1e-8}),
        ({"name": "adagrad"}, "Adagrad", {"initial_accumulator_value": 0.1}),
    ],
)
def test_every_core_optimizer_translates(config: dict, cls: str, group: dict) -> None:
    """Core's defaults apply, not torch's; weight decay is never torch's coupled L2."""
    opt, _ = build_optimizer(
        {**config, "learning_rate": 0.01}, torch.nn.Linear(2, 1).parameters(), total_steps=1
    )
    assert type(opt).__name__ == cls
    for key, value in group.items():
        assert opt.param_groups[0][key] == value, key


def test_decoupled_weight_decay_on_sgd_is_lr_times_wd_times_param() -> None:
    net = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        net.weight.fill_(2.0)
    opt, _ = build_optimizer(
        {"name": "sgd", "learning_rate": 0.1, "weight_decay": 0.5}, net.parameters(), total_steps=1
    )
    net.weight.grad = torch.zeros_like(net.weight)
    opt.step()
    # a zero gradient leaves only the decay: 2 - 0.1 * 0.5 * 2
    assert torch.allclose(net.weight, torch.full_like(net.weight, 1.9))


def test_schedule_follows_core_curve() -> None:
    from pipekit_train.core.adapter import learning_rate_at
    from pipekit_train.core.spec._optimizer import resolve_optimizer_config

    config = resolve_optimizer_config(
        {
            "name": "sgd",
            "lr": {
                "schedule": "warmup_cosine",
                "peak_value": 0.5,
                "warmup_steps": 3,
                "decay_steps": 10,
            },
        }
    )
    net = torch.nn.Linear(1, 1)
    opt, sched = build_optimizer(config, net.parameters(), total_steps=10)
    seen = []
    for _ in range(12):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([learning_rate_at(config["learning_rate"], t) for t in range(12)])
    json.dumps(sched.state_dict())  # plain JSON


def test_lightning_arguments() -> None:
    with pytest.raises(ConfigError, match="max_steps"):
        Lightning(max_steps=10)
    with pytest.raises(ConfigError, match="devicez"):
        Lightning(devicez=2)
    with pytest.raises(ConfigError, match=r"TrainingLoop\(accumulate_grad_batches=k\)"):
        Lightning(accumulate_grad_batches=2)
    assert Lightning(precision="bfloat16-mixed").trainer_kwargs["precision"] == "bf16-mixed"
    with pytest.raises(ConfigError, match="precision"):
        Lightning(precision="fp8")
    for strategy in ("ddp_fork", "ddp_spawn", "ddp_notebook"):
        with pytest.raises(ConfigError, match="strategy='ddp'"):
            Lightning(strategy=strategy)
    adapter = Lightning(devices=1, precision="bf16-mixed", callbacks=[object()])
    config = adapter.get_config()
    assert config["type"] == "pipekit_train.lightning:Lightning"
    assert config["kwargs"]["precision"] == "bf16-mixed" and isinstance(
        config["kwargs"]["callbacks"], str
    )
    json.dumps(config)


def test_plan_checks(regression) -> None:
    train, val = regression
    model = TorchModelOp(LINEAR, in_size=4, out_size=1)
    with pytest.raises(ConfigError, match="sharding"):
        TrainingLoop(model=model, data=train, max_steps=2, sharding="dp")
    with pytest.raises(ConfigError, match="clip"):
        TrainingLoop(
            model=model,
            data=train,
            max_steps=2,
            optimizer_config={"name": "adam", "clip_norm": 1.0},
            adapter=Lightning(gradient_clip_val=2.0),
        )
    with pytest.raises(ConfigError, match="TorchModelOp"):
        TrainingLoop(model=object(), data=train, max_steps=2, adapter=Lightning())
    with pytest.raises(ConfigError, match="data"):
        TrainingLoop(model=model, data=[1, 2, 3], max_steps=2)


def test_global_batch_must_split_over_the_ranks(regression, tmp_path) -> None:
    """Refused before `Trainer.fit` launches any rank, and before anything is written."""
    train, _ = regression
    loop = TrainingLoop(
        model=TorchModelOp(LINEAR, in_size=4, out_size=1),
        data=train,
        batch_size=15,
        max_steps=2,
        checkpoint=str(tmp_path / "ckpt"),
        adapter=Lightning(accelerator="cpu", devices=2, strategy="ddp"),
        progress=False,
    )
    with pytest.raises(ConfigError) as info:
        loop.run()
    assert str(info.value) == (
        "`batch_size` (the global batch) must split evenly over the 2 processes. "
        "Received: batch_size=15. Use a multiple of 2."
    )
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_import_does_not_import_lightning() -> None:
    import subprocess
    import sys

    code = "import sys, pipekit_train.lightning; print('lightning' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert random.random() is not None


def test_wrap_refuses_a_negative_seed() -> None:
    with pytest.raises(ConfigError, match=r"Received: seed=-1"):
        TorchModelOp.wrap(torch.nn.Linear(2, 1), seed=-1)
