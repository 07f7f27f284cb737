"""The adapter-author walk-through: plain PyTorch through the contract, in one file.

`examples/plain_torch_adapter.py` implements only a `StepAdapter` and its `StepBackend`;
core's step driver gives it batching, validation, checkpoints, exact resume, callbacks
and writers. (Its loss curves are checked against Equinox's in `test_golden_runs.py`.)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, ConfigError, NotSupportedError, TrainingLoop
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.core.testing import AdapterConformance, regression_task
from pipekit_train.lightning import LightningModelOp

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"

pytest.importorskip("torch")
from plain_torch_adapter import PlainTorch  # noqa: E402  (examples/ is on sys.path)


class Boom(RuntimeError):
    pass


def loop(**overrides: Any) -> TrainingLoop:
    train, val = regression_task()
    kwargs: dict[str, Any] = {
        "model": LightningModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
        "data": train,
        "validation": val,
        "optimizer_config": {"name": "adamw", "lr": 0.02, "clip_norm": 1.0},
        "batch_size": 16,
        "max_steps": 20,
        "accumulate_grad_batches": 2,
        "validate_every_n_steps": 5,
        "adapter": PlainTorch(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs)


def test_trains_and_resumes_exactly(tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path / "ck", every_n_steps=5, max_to_keep=2, async_save=False)

    def crash(state: Any) -> None:
        if state.step == 13:
            raise Boom("killed")

    with pytest.raises(Boom):
        loop(checkpoint=policy, callbacks=[LambdaCallback(on_step_end=crash)]).run()
    assert step_dirs(tmp_path / "ck") == [5, 10]
    resumed = loop(checkpoint=policy).run()
    reference = loop().run()
    assert resumed.resumed_from_step == 10 and resumed.backend == "plain_torch"
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    losses = reference.history["loss"]
    assert len(losses) == 20 and losses[-1] < 0.5 * losses[0]
    assert reference.history.series("val_loss")[0] == [5, 10, 15, 20]


def test_capabilities_refuse_what_it_does_not_offer() -> None:
    with pytest.raises(NotSupportedError, match="not supported by the 'plain_torch' backend"):
        loop(sharding="dp")
    with pytest.raises(ConfigError, match="keys the 'adamw' optimizer does not take"):
        loop(optimizer_config={"name": "adamw", "momentum": 0.9})


@pytest.mark.slow
class TestPlainTorchConformance(AdapterConformance):
    """The contract's conformance suite, run against the one-file example backend."""

    # the kill-and-resume workers fork from a server that imported these
    worker_preload = ("torch", "pipekit_train.lightning", "grain")

    flow_resume = False  # the flow head's kill-and-resume on torch runs with Torch()
    fencing_trial = False  # the stall-and-takeover trial: core's lifecycle and store, run
    # with the numpy reference's step loop and every shipped backend

    def make_model(self, in_size: int, out_size: int, seed: int = 0) -> Any:
        return LightningModelOp(
            "pipekit_train.lightning.testing:linear", in_size=in_size, out_size=out_size, seed=seed
        )

    def make_adapter(self) -> Any:
        return PlainTorch()


_RUN_TOML = """
backend = "plain_torch"
max_steps = 12
batch_size = 16
accumulate_grad_batches = 2
metrics = ["mae"]

[optimizer]
name = "adamw"
lr = 0.02

[model]
factory = "pipekit_train.lightning.testing:mlp"
kwargs = { in_size = 4, out_size = 1 }

[data]
factory = "pipekit_train.core.testing:regression_task"
kwargs = { n_train = 128, n_val = 32 }

[checkpoint]
directory = "ckpt"
every_n_steps = 4

[registry]
uri = "models"
name = "plain"
"""


def _register_backend(site: Path, value: str) -> None:
    """What installing a distribution that declares the entry point leaves on sys.path."""
    info = site / "plain_torch_backend-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: plain-torch-backend\nVersion: 0.1\n"
    )
    (info / "entry_points.txt").write_text(f"[pipekit_train.backends]\nplain_torch = {value}\n")


def _cli(tmp_path: Path, site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(EXAMPLES)])}
    return subprocess.run(
        [sys.executable, "-m", "pipekit_train.core.cli", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_a_fourth_backend_registered_by_entry_point_runs_from_the_cli(tmp_path: Path) -> None:
    """No edit to core: the entry point alone makes `backend = "plain_torch"` a CLI backend."""
    site = tmp_path / "site"
    _register_backend(site, "plain_torch_adapter:BACKEND")
    (tmp_path / "run.toml").write_text(_RUN_TOML)

    proc = _cli(tmp_path, site, "run", "run.toml")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backend=plain_torch" in proc.stdout and "done: 12 steps" in proc.stdout
    assert step_dirs(tmp_path / "ckpt") == [4, 8, 12]

    shown = _cli(tmp_path, site, "registry", "show", "models", "plain", "--json")
    assert shown.returncode == 0, shown.stderr[-3000:]
    lineage = json.loads(shown.stdout)["lineage"]
    assert lineage["backend"] == "plain_torch"
    versions = lineage["versions"]
    assert versions["plain-torch-backend"] == "0.1"  # the distribution declaring the entry
    assert versions["torch"] == importlib.metadata.version("torch")
    assert versions["safetensors"] == importlib.metadata.version("safetensors")
    assert "lightning" not in versions  # only what this backend's entry names

    # without the entry point, the same config names the installed backends instead
    bare = tmp_path / "bare"
    bare.mkdir()
    proc = _cli(tmp_path, bare, "run", "run.toml")
    assert proc.returncode == 2
    assert "`backend` must be an installed backend" in proc.stderr
    assert "Received: backend='plain_torch'" in proc.stderr and "'equinox'" in proc.stderr
    assert not (tmp_path / "models" / "plain" / "2").exists()


def test_an_entry_point_that_names_something_else_is_a_config_error(tmp_path: Path) -> None:
    site = tmp_path / "site"
    _register_backend(site, "plain_torch_adapter:PlainTorch")  # the class, not an entry
    (tmp_path / "run.toml").write_text(_RUN_TOML)
    proc = _cli(tmp_path, site, "run", "run.toml", "--dry-run")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "must name a BackendEntry with name='plain_torch'" in proc.stderr
    assert not (tmp_path / "ckpt").exists()
