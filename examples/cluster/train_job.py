"""The training script the cluster recipes launch (`equinox.sbatch`, `lightning.sbatch`,
`trainjob-*.yaml`): one `TrainingLoop`, resumed from its checkpoint when one exists.

`python train_job.py equinox CHECKPOINT` joins `jax.distributed` from the scheduler's
variables (SLURM's, or those a Kubeflow JAX runtime sets) and trains data-parallel over
every process; `python train_job.py lightning CHECKPOINT` trains with Lightning's DDP,
whose cluster environment reads SLURM's (or torchrun's) variables. A preemption signal
checkpoints the step reached and exits with status 75 (`PREEMPTED_EXIT_STATUS`); the
requeued job runs this script again and continues exactly.
"""

from __future__ import annotations

import os
import sys


def main(backend: str, checkpoint: str) -> int:
    from pipekit_train.core import PREEMPTED_EXIT_STATUS, Checkpoint, Preempted, TrainingLoop
    from pipekit_train.core.testing import regression_task

    train, val = regression_task()
    common = dict(
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 1e-3},
        batch_size=64,
        max_steps=int(os.environ.get("MAX_STEPS", "20000")),
        validate_every_n_steps=500,
        checkpoint=Checkpoint(checkpoint, every_n_steps=1000, max_to_keep=2),
        progress=False,
    )
    if backend == "equinox":
        import jax

        jax.distributed.initialize()  # SLURM / Kubeflow variables: coordinator, count, id
        from pipekit_train.equinox import EquinoxModelOp, ShardingSpec

        loop = TrainingLoop(
            model=EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=4, out_size=1),
            sharding=ShardingSpec(jax.make_mesh((jax.device_count(),), ("data",))),
            **common,
        )
    else:
        from pipekit_train.lightning import Lightning, TorchModelOp

        nodes = int(os.environ.get("SLURM_NNODES", os.environ.get("PET_NNODES", "1")))
        loop = TrainingLoop(
            model=TorchModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
            adapter=Lightning(accelerator="auto", devices="auto", num_nodes=nodes, strategy="ddp"),
            **common,
        )
    try:
        artifact = loop.run()
    except Preempted as stop:
        print(f"preempted at step {stop.step}; checkpoint {stop.checkpoint}", flush=True)
        return PREEMPTED_EXIT_STATUS
    print(f"done: {artifact.steps} steps, resumed from {artifact.resumed_from_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
