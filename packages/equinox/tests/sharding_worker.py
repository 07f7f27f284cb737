"""Run by `test_equinox_sharding.py` in a fresh interpreter with 2 simulated CPU devices.

Prints one JSON line with the results (not a test module: pytest does not collect it).
"""

from __future__ import annotations

import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop  # noqa: E402
from pipekit_train.core.testing import regression_task  # noqa: E402
from pipekit_train.equinox import Equinox, EquinoxModelOp, ShardingSpec  # noqa: E402


def loop(sharding, k=1, max_steps=20, **kw):
    train, val = regression_task()
    return TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=8, seed=0
        ),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=max_steps,
        seed=0,
        validate_every_n_steps=10,
        progress=False,
        sharding=sharding,
        adapter=Equinox(steps_per_execution=k),
        **kw,
    )


def main(directory: str) -> None:
    out: dict = {"devices": jax.device_count()}
    mesh = jax.make_mesh((2,), ("data",))
    reference = loop(None).run()
    dp = loop(ShardingSpec(mesh)).run()
    out["dp_max_loss_diff"] = float(
        np.max(np.abs(np.subtract(dp.history["loss"], reference.history["loss"])))
    )
    out["dp_val_diff"] = abs(dp.final_metrics["val_loss"] - reference.final_metrics["val_loss"])
    # the batch really is split, the model replicated
    backend = loop(ShardingSpec(mesh)).plan
    backend = backend.adapter.step_backend(backend)
    state = backend.init_state()
    batch = backend.put(regression_task()[0].get_batch(np.arange(16)))
    state, _ = backend.train_step(state, batch)
    out["model_spec"] = str(tuple(backend.train_state(state).model.layers[0].weight.sharding.spec))
    # model sharded over the same axis, 4 fused steps, an Auto-axes mesh
    auto = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
    ms = loop(ShardingSpec(auto, model_pspec=P("data")), k=4).run()
    out["ms_max_loss_diff"] = float(
        np.max(np.abs(np.subtract(ms.history["loss"], reference.history["loss"])))
    )
    plan = loop(ShardingSpec(auto, model_pspec=P("data"))).plan
    be = plan.adapter.step_backend(plan)
    ts = be.train_state(be.init_state())
    out["ms_specs"] = sorted(
        {str(tuple(x.sharding.spec)) for x in jax.tree.leaves(ts.model) if isinstance(x, jax.Array)}
    )
    out["ms_opt_specs"] = sorted(
        {
            str(tuple(x.sharding.spec))
            for x in jax.tree.leaves(ts.opt_state)
            if isinstance(x, jax.Array) and x.ndim == 2
        }
    )
    # sharded checkpoint, sharding-aware restore
    policy = Checkpoint(os.path.join(directory, "ckpt"), every_n_steps=10)
    loop(ShardingSpec(mesh), checkpoint=policy).run()
    resumed = loop(ShardingSpec(mesh), max_steps=30, checkpoint=policy).run()
    full = loop(ShardingSpec(mesh), max_steps=30).run()
    out["resumed_from_step"] = resumed.resumed_from_step
    out["resume_bytes_equal"] = resumed.model.serialize_weights() == full.model.serialize_weights()
    # validation of the spec
    errors = {}
    for name, kwargs in {
        "axis": {"sharding": ShardingSpec(mesh, data_pspec=P("batch"))},
        "divisible": {"sharding": ShardingSpec(mesh), "batch_size": 15},
        "mesh": {"sharding": ShardingSpec("mesh")},  # type: ignore[arg-type]
    }.items():
        try:
            train, _ = regression_task()
            TrainingLoop(
                model=EquinoxModelOp("pipekit_train.equinox.testing:linear", in_size=4, out_size=1),
                data=train,
                max_steps=2,
                **{"batch_size": 16, **kwargs},
            )
            errors[name] = None
        except ConfigError as exc:
            errors[name] = str(exc)
    out["errors"] = errors
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
