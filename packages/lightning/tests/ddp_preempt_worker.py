"""Two-process DDP run on CPU that a test preempts with a real SIGTERM to global rank 1.

`python ddp_preempt_worker.py OUT_DIR`: Lightning's script launcher re-runs this file as
global rank 1, which writes its pid to `OUT_DIR/pid1`. Both ranks train slowly (one step
each 0.25 s, checkpoints far apart) and write their step to `OUT_DIR/progress<k>`; the
test sends SIGTERM to rank 1 only. Both must stop with `Preempted` at the same step and
checkpoint it. Each rank then resumes from that checkpoint to the end, and trains an
uninterrupted reference in another directory, and writes `OUT_DIR/rank<k>.json`.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

MAX_STEPS = 24


def _loop(out: Path, directory: str, slow: bool, rank_file: Any) -> Any:
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.callbacks import LambdaCallback
    from pipekit_train.core.testing import regression_task
    from pipekit_train.lightning import Lightning, TorchModelOp

    train, val = regression_task()

    def on_step_end(state: Any) -> None:
        if slow:
            rank_file.write(f"{state.step}\n")
            rank_file.flush()
            time.sleep(0.25)

    return TrainingLoop(
        model=TorchModelOp(
            "pipekit_train.lightning.testing:mlp",
            in_size=4,
            out_size=1,
            width=8,
            dropout=0.1,
            seed=0,
        ),
        data=train,
        validation=val,
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=MAX_STEPS,
        validate_every_n_steps=5,
        checkpoint=Checkpoint(out / directory, every_n_steps=1000, max_to_keep=None),
        callbacks=[LambdaCallback(on_step_end=on_step_end)],
        adapter=Lightning(accelerator="cpu", devices=2, strategy="ddp"),
        progress=False,
    )


def main(out: Path) -> None:
    from pipekit_train.core import Preempted

    rank = int(os.environ.get("NODE_RANK", "0")) * 2 + int(os.environ.get("LOCAL_RANK", "0"))
    if rank == 1:
        (out / "pid1.tmp").write_text(str(os.getpid()))
        os.replace(out / "pid1.tmp", out / "pid1")
    result: dict[str, Any] = {"rank": rank}
    with open(out / f"progress{rank}", "a") as progress:
        try:
            _loop(out, "ckpt", True, progress).run()
            result["preempted"] = None
        except Preempted as exc:
            result["preempted"] = {
                "step": exc.step,
                "checkpoint": exc.checkpoint,
                "signal": exc.signal,
                "at": time.time(),
            }
    resumed = _loop(out, "ckpt", False, None).run()
    reference = _loop(out, "reference", False, None).run()
    result.update(
        resumed_from_step=resumed.resumed_from_step,
        steps=resumed.steps,
        history_steps=resumed.history.series("loss")[0],
        sha=hashlib.sha256(resumed.model.serialize_weights()).hexdigest(),
        reference_sha=hashlib.sha256(reference.model.serialize_weights()).hexdigest(),
    )
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
