"""Orbax checkpoints: layout, interrupted saves, mismatches, retention, exact resume."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, CheckpointError, TornCheckpointWarning
from pipekit_train.core.checkpoint import step_dirs
from pipekit_train.equinox import Equinox


def test_layout_and_meta(make_loop, tmp_path: Path) -> None:
    art = make_loop(
        max_steps=10, checkpoint=Checkpoint(tmp_path, every_n_steps=5, max_to_keep=None)
    ).run()
    assert step_dirs(tmp_path) == [5, 10]
    step = tmp_path / "10"
    assert {"state", "meta", "pipekit"} <= {p.name for p in step.iterdir()}
    meta = json.loads((step / "meta" / "metadata").read_text())
    assert (
        meta["step"] == 10 and meta["data_iter"]["index"] is not None and "history" in meta["run"]
    )
    record = json.loads((step / "pipekit" / "metadata").read_text())
    assert "step" in record["leaves"] and "key" in record["leaves"]
    assert art.checkpoint_dir == str(tmp_path)


def test_interrupted_save_is_ignored_and_cleaned(make_loop, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=5, max_to_keep=None)
    make_loop(max_steps=10, checkpoint=policy).run()
    tmp = tmp_path / "15.orbax-checkpoint-tmp-1700000000"
    (tmp / "state").mkdir(parents=True)
    (tmp / "state" / "junk").write_bytes(b"\0" * 100)
    resumed = make_loop(max_steps=15, checkpoint=policy).run()
    assert resumed.resumed_from_step == 10
    assert step_dirs(tmp_path) == [5, 10, 15]
    assert not tmp.exists()


@pytest.mark.slow
def test_a_different_model_is_an_error_not_a_torn_step(make_loop, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=5)
    make_loop("mlp", model_kwargs={"width": 8}, max_steps=5, checkpoint=policy).run()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TornCheckpointWarning)
        with pytest.raises(CheckpointError, match="different model state"):
            make_loop("mlp", model_kwargs={"width": 16}, max_steps=10, checkpoint=policy).run()
    assert step_dirs(tmp_path) == [5]  # nothing was deleted


def test_damaged_arrays_are_torn(make_loop, tmp_path: Path) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=4, max_to_keep=None, async_save=False)
    make_loop(max_steps=8, checkpoint=policy).run()
    data = [
        p for p in (tmp_path / "8" / "state").rglob("*") if p.is_file() and p.parent.name == "d"
    ]
    for p in data:
        p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.warns(TornCheckpointWarning, match="8"):
        resumed = make_loop(max_steps=12, checkpoint=policy).run()
    assert resumed.resumed_from_step == 4
    assert step_dirs(tmp_path) == [4, 8, 12]  # step 8 was written again


def test_keep_best_survives_a_resume(make_loop, tmp_path: Path) -> None:
    policy = Checkpoint(
        tmp_path, every_n_steps=2, max_to_keep=1, keep_best=1, mode="max", monitor="val_loss"
    )
    make_loop(max_steps=8, validate_every_n_steps=2, checkpoint=policy).run()
    art = make_loop(max_steps=12, validate_every_n_steps=2, checkpoint=policy).run()
    assert art.resumed_from_step == 8
    steps, values = art.history.series("val_loss")
    worst = steps[values.index(max(values))]
    assert step_dirs(tmp_path) == sorted({worst, 12})


@pytest.mark.parametrize("factory", ["dropout_mlp", "batchnorm_mlp"])
@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.slow
def test_exact_resume_with_rng_and_layer_state(
    make_loop, tmp_path: Path, factory: str, k: int
) -> None:
    policy = Checkpoint(tmp_path, every_n_steps=8)
    adapter = Equinox(steps_per_execution=k)
    make_loop(factory, max_steps=8, checkpoint=policy, adapter=adapter).run()
    resumed = make_loop(factory, max_steps=16, checkpoint=policy, adapter=adapter).run()
    reference = make_loop(factory, max_steps=16, adapter=adapter).run()
    assert resumed.resumed_from_step == 8
    assert resumed.model.serialize_weights() == reference.model.serialize_weights()
    assert resumed.history["loss"] == reference.history["loss"]


@pytest.mark.parametrize("where", ["local", "memory"])
def test_async_save_snapshots_before_the_next_step_donates(tmp_path: Path, where: str) -> None:
    import uuid

    import jax
    import jax.numpy as jnp
    import numpy as np

    from pipekit_train.equinox._checkpoint import OrbaxCheckpointer, abstract_of

    directory = str(tmp_path / "ck") if where == "local" else f"memory://eqx/{uuid.uuid4().hex}"
    policy = Checkpoint(directory, max_to_keep=1, async_save=True)

    def checkpointer() -> OrbaxCheckpointer:
        return OrbaxCheckpointer(
            policy,
            to_tree=lambda state: {k: jnp.copy(v) for k, v in state.items()},
            live_tree=dict,
            template_tree=abstract_of,
            from_tree=lambda tree, template: dict(tree),
        )

    step = jax.jit(lambda s: {k: v + 1 for k, v in s.items()}, donate_argnums=0)
    state = {"w": jnp.arange(6.0).reshape(2, 3), "b": jnp.ones(3, jnp.bfloat16)}
    first = {k: np.asarray(v).copy() for k, v in state.items()}
    ckpt = checkpointer()
    try:
        for n in (1, 2):
            ckpt.save(n, state, {"step": n}, {})  # the second save reuses the host buffers
            state = step(state)  # donates the saved buffers while the writer may still run
            ckpt.wait()
            reader = checkpointer()
            try:
                restored = reader.restore_latest(state)
            finally:
                reader.close()
            assert restored is not None and restored.step == n
            for k, v in first.items():
                want = (v + (n - 1)).astype(v.dtype)
                np.testing.assert_array_equal(np.asarray(restored.state[k]), want)
                assert restored.state[k].dtype == v.dtype
    finally:
        ckpt.close()
        if where == "memory":
            fs, root = policy.filesystem()
            fs.rm(root, recursive=True)


def test_restore_best_holds_the_best_checkpoint(tmp_path: Path) -> None:
    """`restore_best=True`: the artifact's weights are the best Orbax checkpoint's, byte
    for byte (core's shared check)."""
    from pipekit_train.core.testing import check_restore_best
    from pipekit_train.equinox import EquinoxModelOp

    def model() -> EquinoxModelOp:
        return EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0)

    check_restore_best(model, Equinox(), tmp_path)
