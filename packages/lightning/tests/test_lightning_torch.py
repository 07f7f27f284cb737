"""`pipekit_train.lightning.Torch`: plain torch on core's run loop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipekit_train.core import Checkpoint, ConfigError, OnlineTrainer, TrainingLoop
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.data import ArrayDataset, make_batches
from pipekit_train.core.testing import AdapterConformance, regression_task, run_python
from pipekit_train.lightning import CompileFallbackWarning, Torch, TorchModelOp

HERE = Path(__file__).resolve().parent
# the kill-and-resume workers fork from a server that imported these
WORKER_PRELOAD = ("torch", "pipekit_train.lightning", "pipekit_train.core.testing", "grain")


class TestTorchConformance(AdapterConformance):
    worker_preload = WORKER_PRELOAD
    # Torch() saves through Lightning()'s engine from core's step loop: the trial runs with
    # Lightning() and with the numpy reference's step loop
    fencing_trial = False

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return TorchModelOp(
            "pipekit_train.lightning.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )

    def make_adapter(self) -> Any:
        return Torch()


def mlp(seed: int = 0, **kwargs: Any) -> TorchModelOp:
    return TorchModelOp(
        "pipekit_train.lightning.testing:mlp", in_size=4, out_size=1, width=16, seed=seed, **kwargs
    )


def loop(data: Any, adapter: Any, **kwargs: Any) -> TrainingLoop:
    base: dict[str, Any] = {
        "model": mlp(),
        "data": data,
        "loss": "mse",
        "optimizer_config": {"name": "adam", "lr": 0.01},
        "batch_size": 32,
        "max_steps": 30,
        "seed": 0,
        "adapter": adapter,
        "progress": False,
        "log_every_n_steps": 1,
    }
    base.update(kwargs)
    return TrainingLoop(**base)


# -- native parity: the loop every PyTorch user writes --------------------------------------
def hand_loop(data: ArrayDataset, make_optimizer: Any, steps: int) -> tuple[bytes, list[float]]:
    """zero_grad / forward / F.mse_loss / backward / step over core's batches for seed 0."""
    net = mlp().model
    import copy

    net = copy.deepcopy(net).train()
    opt = make_optimizer(net.parameters())
    batches = make_batches(data, 32, seed=0)
    losses = []
    for _ in range(steps):
        b = next(batches)
        x, y = torch.from_numpy(b["x"]), torch.from_numpy(b["y"])
        opt.zero_grad(set_to_none=True)
        loss = F.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return mlp().with_model(net.eval()).serialize_weights(), losses


PARITY = [
    ({"name": "adam", "lr": 0.01}, lambda p: torch.optim.Adam(p, lr=0.01)),
    (
        {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True},
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True),
    ),
    (
        {"name": "adamw", "lr": 0.01, "weight_decay": 0.1},
        lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    ),
]


@pytest.mark.parametrize("k", [1, 10])
@pytest.mark.parametrize("config, make", PARITY, ids=[c["name"] for c, _ in PARITY])
def test_bit_identical_to_a_hand_written_loop(config: dict, make: Any, k: int) -> None:
    train, _ = regression_task()
    art = loop(train, Torch(steps_per_execution=k), optimizer_config=config).run()
    weights, losses = hand_loop(train, make, 30)
    assert art.model.serialize_weights() == weights
    assert list(art.history["loss"]) == losses


@pytest.mark.parametrize("precision", [None, torch.bfloat16])
@pytest.mark.parametrize("name", ["mse", "mae", "huber", "huber_0.3"])
def test_direct_loss_kernels_are_bit_identical_to_the_functionals(
    name: str, precision: Any
) -> None:
    from pipekit_train.core import losses
    from pipekit_train.lightning._losses import torch_loss

    core_loss, functional = {
        "mse": (losses.mse, F.mse_loss),
        "mae": (losses.mae, F.l1_loss),
        "huber": (losses.huber, F.huber_loss),
        "huber_0.3": (losses.huber(delta=0.3), lambda a, b: F.huber_loss(a, b, delta=0.3)),
    }[name]
    fused = torch_loss(core_loss)
    assert fused is not core_loss
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(5, 3, generator=gen, requires_grad=True)
    x, y = torch.randn(64, 5, generator=gen), 3 * torch.randn(64, 3, generator=gen)
    results = []
    for fn in (fused, lambda a, b: functional(a, b.to(a.dtype))):
        w.grad = None
        with torch.autocast(
            "cpu", dtype=precision or torch.bfloat16, enabled=precision is not None
        ):
            loss = fn(x @ w, y)
        loss.backward()
        results.append((loss.detach(), w.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_grad_reset_is_zero_grad_and_keeps_an_overridden_one() -> None:
    from pipekit_train.lightning.torch._grads import GradReset

    net = torch.nn.Linear(3, 2)
    extra = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    reset = GradReset()
    for p in net.parameters():
        p.grad = torch.ones_like(p)
    reset(opt)
    assert all(p.grad is None for p in net.parameters())
    opt.add_param_group({"params": [extra]})  # a new group is picked up
    extra.grad = torch.ones(4)
    reset(opt)
    assert extra.grad is None

    class Zeroing(torch.optim.SGD):
        def zero_grad(self, set_to_none: bool = True) -> None:
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = torch.zeros_like(p)

    own = Zeroing(net.parameters(), lr=0.1)
    reset(own)  # a different optimizer: its own zero_grad runs
    assert all(p.grad is not None and not p.grad.any() for p in net.parameters())


def test_fused_steps_match_single_steps_with_accumulation_schedule_and_clip() -> None:
    train, val = regression_task()
    config = {
        "name": "adamw",
        "lr": {
            "schedule": "warmup_cosine",
            "peak_value": 0.02,
            "warmup_steps": 5,
            "decay_steps": 30,
        },
        "weight_decay": 0.05,
        "clip_norm": 0.5,
    }
    seen: list[int] = []
    from pipekit_train.core.callbacks import LambdaCallback

    cb = LambdaCallback(on_step_end=lambda s: seen.append(s.step))
    runs = [
        loop(
            train,
            Torch(steps_per_execution=k),
            model=mlp(dropout=0.2),
            validation=val,
            optimizer_config=config,
            accumulate_grad_batches=2,
            validate_every_n_steps=7,
            callbacks=[cb] if k == 10 else [],
        ).run()
        for k in (1, 10)
    ]
    assert runs[0].model.serialize_weights() == runs[1].model.serialize_weights()
    assert list(runs[0].history["loss"]) == list(runs[1].history["loss"])
    assert runs[0].history.series("val_loss") == runs[1].history.series("val_loss")
    assert seen == list(range(1, 31))  # callbacks see every fused step


def test_global_rng_untouched_and_dropout_reproducible() -> None:
    train, _ = regression_task()
    torch.manual_seed(123)
    before = torch.get_rng_state()
    a = loop(train, Torch(), model=mlp(dropout=0.3), max_steps=10).run()
    assert torch.equal(torch.get_rng_state(), before)
    b = loop(train, Torch(), model=mlp(dropout=0.3), max_steps=10).run()
    c = loop(train, Torch(), model=mlp(dropout=0.3), max_steps=10, seed=1).run()
    assert a.model.serialize_weights() == b.model.serialize_weights()
    assert a.model.serialize_weights() != c.model.serialize_weights()


# -- precision, non-finite skip ---------------------------------------------------------------
@pytest.mark.parametrize("precision", ["bfloat16-mixed", "float16-mixed"])
def test_mixed_precision_trains_close_to_float32(precision: str) -> None:
    train, _ = regression_task()
    ref = loop(train, Torch(), max_steps=60).run()
    mixed = loop(train, Torch(precision=precision), max_steps=60).run()
    a, b = np.asarray(ref.history["loss"]), np.asarray(mixed.history["loss"])
    assert b[-5:].mean() < 0.5 * b[:5].mean()
    np.testing.assert_allclose(b, a, rtol=0.05)
    assert not np.array_equal(a, b)  # autocast really ran


def test_float16_grad_scaler_state_resumes_exactly(tmp_path: Path) -> None:
    """A crash at step 14; the resume (scaler scale and growth tracker included) is exact."""
    from pipekit_train.core.callbacks import LambdaCallback

    train, _ = regression_task()
    policy = Checkpoint(tmp_path / "ck", every_n_steps=4, max_to_keep=None, async_save=False)

    def crash(state: Any) -> None:
        if state.step == 14:
            raise RuntimeError("crash")

    adapter = Torch(precision="float16-mixed")
    with pytest.raises(RuntimeError, match="crash"):
        loop(
            train,
            adapter,
            max_steps=24,
            checkpoint=policy,
            callbacks=[LambdaCallback(on_step_end=crash)],
        ).run()
    assert step_dirs(policy) == [4, 8, 12]
    extra = json.loads((tmp_path / "ck" / "12" / "extra.json").read_text())
    assert extra["grad_scaler"]["scale"] > 0
    resumed = loop(train, Torch(precision="float16-mixed"), max_steps=24, checkpoint=policy).run()
    ref = loop(train, Torch(precision="float16-mixed"), max_steps=24).run()
    assert resumed.resumed_from_step == 12
    assert resumed.model.serialize_weights() == ref.model.serialize_weights()


def test_skip_nonfinite_leaves_the_update_out() -> None:
    train, _ = regression_task()
    x = np.array(train.get_batch(np.arange(len(train)))["x"])
    y = np.array(train.get_batch(np.arange(len(train)))["y"])
    y[5] = np.nan  # every batch holding row 5 has a NaN loss
    data = ArrayDataset(x=x, y=y)
    art = loop(data, Torch(steps_per_execution=5), on_nonfinite="skip", max_steps=40).run()
    losses = np.asarray(art.history["loss"])
    skipped = int(np.sum(~np.isfinite(losses)))
    assert skipped > 0
    assert art.history.last("nonfinite_skipped") == skipped
    state = art.model.model.state_dict()
    assert all(bool(torch.isfinite(v).all()) for v in state.values())


# -- data ---------------------------------------------------------------------------------------
def test_torch_dataloaders_train_and_validate() -> None:
    train, val = regression_task()
    tx = train.get_batch(np.arange(len(train)))
    vx = val.get_batch(np.arange(len(val)))
    tds = torch.utils.data.TensorDataset(torch.from_numpy(tx["x"]), torch.from_numpy(tx["y"]))
    vds = torch.utils.data.TensorDataset(torch.from_numpy(vx["x"]), torch.from_numpy(vx["y"]))
    gen = torch.Generator().manual_seed(0)
    art = loop(
        torch.utils.data.DataLoader(tds, batch_size=32, shuffle=True, generator=gen),
        Torch(steps_per_execution=4),
        validation=torch.utils.data.DataLoader(vds, batch_size=64),
        validate_every_n_steps=20,
        max_steps=60,
    ).run()
    losses = np.asarray(art.history["loss"])
    assert len(losses) == 60 and losses[-5:].mean() < 0.5 * losses[:5].mean()
    assert "val_loss" in art.final_metrics


def test_online_trainer_runs_on_torch() -> None:
    rng = np.random.default_rng(0)
    trainer = OnlineTrainer(mlp(), optimizer_config={"name": "adam", "lr": 0.02}, adapter=Torch())
    errs = []
    for _ in range(40):
        x = rng.standard_normal((8, 4)).astype(np.float32)
        batch = {"x": x, "y": x[:, :1] * 2.0}
        errs.append(float(np.mean((trainer(batch) - batch["y"]) ** 2)))
    assert np.mean(errs[-5:]) < 0.5 * np.mean(errs[:5])


# -- refusals, before any work -------------------------------------------------------------------
def test_lightning_only_options_point_to_lightning() -> None:
    with pytest.raises(ConfigError, match=r"Received: strategy='ddp'.*Lightning\("):
        Torch(strategy="ddp")
    with pytest.raises(ConfigError, match=r"Received: devices=2.*Lightning\("):
        Torch(devices=2)
    with pytest.raises(
        ConfigError, match=r"`steps_per_execution`.*Received: steps_per_execution=0"
    ):
        Torch(steps_per_execution=0)
    with pytest.raises(ConfigError, match=r"Received: precision='float8'"):
        Torch(precision="float8")
    with pytest.raises(ConfigError, match=r"Received: compile='fastest'"):
        Torch(compile="fastest")


def test_a_launched_process_without_a_process_group_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    train, _ = regression_task()
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"WORLD_SIZE=2.*init_process_group\('gloo'\)"):
        loop(train, Torch(), checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=2))
    assert not (tmp_path / "ck").exists()


def test_cuda_graph_mode_is_refused_on_cpu(tmp_path: Path) -> None:
    train, _ = regression_task()
    with pytest.raises(ConfigError, match=r"needs a CUDA device.*Received: compile='cuda-graphs'"):
        loop(
            train,
            Torch(compile="cuda-graphs"),
            checkpoint=Checkpoint(tmp_path / "ck", every_n_steps=2),
        )
    assert not (tmp_path / "ck").exists()


def test_cuda_device_without_a_gpu_is_refused() -> None:
    if torch.cuda.is_available():
        pytest.skip("this host has a CUDA GPU: the refusal cannot happen")
    train, _ = regression_task()
    with pytest.raises(ConfigError, match=r"torch sees no CUDA GPU.*Received: device='cuda'"):
        loop(train, Torch(device="cuda"))


# -- compile -----------------------------------------------------------------------------------
def _failing_backend(gm: Any, example_inputs: Any) -> Any:
    raise RuntimeError("this compiler backend always fails")


def test_compile_failure_warns_and_trains_eagerly() -> None:
    train, _ = regression_task()
    adapter = Torch(compile={"backend": _failing_backend})
    with pytest.warns(CompileFallbackWarning, match="training continues eagerly"):
        art = loop(train, adapter, max_steps=10).run()
    eager = loop(train, Torch(), max_steps=10).run()
    assert art.model.serialize_weights() == eager.model.serialize_weights()
    assert adapter.compile_report is not None and adapter.compile_report["compiled"] is False
    assert "always fails" in adapter.compile_report["fell_back"]


@pytest.mark.slow
def test_compile_trains_and_reports_its_time() -> None:
    train, _ = regression_task()
    adapter = Torch(compile=True, steps_per_execution=5)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)
        art = loop(train, adapter, max_steps=30).run()
    eager = loop(train, Torch(), max_steps=30).run()
    report = adapter.compile_report
    assert report is not None and report["compiled"] and report["compile_seconds"] > 0
    np.testing.assert_allclose(art.history["loss"], eager.history["loss"], rtol=1e-4)


def test_fused_optimizer_agrees_to_rounding() -> None:
    train, _ = regression_task()
    ref = loop(train, Torch()).run()
    fused = loop(train, Torch(fused_optimizer=True)).run()
    np.testing.assert_allclose(fused.history["loss"], ref.history["loss"], rtol=1e-4)
    assert isinstance(fused.model.serialize_weights(), bytes)


# -- kill and resume -------------------------------------------------------------------------
RESUME = {
    "k1": {"adapter": {}},
    "k10": {"adapter": {"steps_per_execution": 10}},
    "accumulate": {"adapter": {"steps_per_execution": 4}, "accumulate_grad_batches": 3},
    "bf16": {"adapter": {"precision": "bfloat16-mixed"}},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RESUME))
def test_sigkill_and_resume_is_exact(name: str, tmp_path: Path, torch_worker: Any) -> None:
    spec = {
        "optimizer_config": {
            "name": "adamw",
            "lr": {"schedule": "cosine", "init_value": 0.02, "decay_steps": 40},
            "weight_decay": 0.01,
            "clip_norm": 1.0,
        },
        "max_steps": 40,
        "every_n_steps": 6,
        "kill_at": 27,
        "directory": str(tmp_path / "ck"),
        **RESUME[name],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    proc = run_python(
        [str(HERE / "torch_worker.py"), str(path)],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        preload=WORKER_PRELOAD,
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-3000:])
    resumed = torch_worker.build(spec, kill_at=None).run()
    assert resumed.resumed_from_step is not None and resumed.resumed_from_step >= 18
    reference = torch_worker.build({**spec, "directory": None}, kill_at=None).run()
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    assert list(resumed.history["loss"]) == list(reference.history["loss"])


@pytest.mark.slow
def test_torch_never_imports_lightning(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pipekit_train.core import TrainingLoop\n"
        "from pipekit_train.core.testing import regression_task\n"
        "from pipekit_train.lightning import TorchModelOp, Torch\n"
        "train, val = regression_task()\n"
        "TrainingLoop(model=TorchModelOp('pipekit_train.lightning.testing:mlp', in_size=4,"
        " out_size=1), data=train, validation=val, batch_size=16, max_steps=12,"
        " validate_every_n_steps=6, adapter=Torch(steps_per_execution=3), progress=False).run()\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning'))\n"
        "print('LIGHTNING', bad)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "LIGHTNING []" in proc.stdout, proc.stdout


def test_torch_trains_without_the_nvml_check_that_lightning_sets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`import lightning` sets PYTORCH_NVML_BASED_CUDA_CHECK=1 process-wide, which makes
    every optimizer step query NVML; Torch() unsets it while it trains and restores it."""
    from pipekit_train.core.callbacks import LambdaCallback

    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    seen: list[str | None] = []
    train, _ = regression_task()
    callback = LambdaCallback(
        on_step_end=lambda s: seen.append(os.environ.get("PYTORCH_NVML_BASED_CUDA_CHECK"))
    )
    loop(train, Torch(), max_steps=3, callbacks=[callback]).run()
    assert seen == [None, None, None]
    assert os.environ["PYTORCH_NVML_BASED_CUDA_CHECK"] == "1"
