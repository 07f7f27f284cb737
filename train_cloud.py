import os
import sys

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.equinox import EquinoxModelOp

train, val = regression_task()
checkpoint = Checkpoint(
    os.environ.get("CKPT_URI", "s3://pipekit-demo/runs/emulator"),
    every_n_steps=200,
    max_to_keep=2,
)
loop = TrainingLoop(
    model=EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=64),
    data=train,
    validation=val,
    loss="mse",
    optimizer_config={"name": "adam", "lr": 1e-3},
    batch_size=32,
    max_steps=int(sys.argv[1]) if len(sys.argv) > 1 else 2000,
    validate_every_n_steps=200,
    checkpoint=checkpoint,
    progress=False,
)
artifact = loop.run()
print(
    f"resumed_from_step={artifact.resumed_from_step} steps={artifact.steps} "
    f"val_loss={artifact.final_metrics['val_loss']:.5f} sha256={artifact.weights_sha256[:16]}"
)
