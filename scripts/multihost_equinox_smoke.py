"""Two-process `jax.distributed` smoke run of the Equinox adapter on loopback (CPU).

Run:  uv run python scripts/multihost_equinox_smoke.py [--timeout 120]

The launcher starts two copies of this script as workers (`--process-id 0/1`); each
joins `jax.distributed` on 127.0.0.1, builds a 2-device mesh (one CPU device per
process), and trains the same `TrainingLoop` with `sharding=ShardingSpec(mesh)`:
every process reads its own half of each epoch (`data_shard`), the global batch is
assembled with `jax.make_array_from_process_local_data`, Orbax writes one checkpoint
from both processes. Then each worker resumes from that checkpoint for 10 more
steps. The launcher checks that both processes report the same losses and weights,
that the loss fell, and that the resume started from the checkpoint. Exit status 0
on success.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def worker(process_id: int, port: int, directory: Path) -> None:
    """One process of the run; writes `result-<id>.json` into `directory`."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.pop("XLA_FLAGS", None)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=60,
    )
    import numpy as np

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import regression_task
    from pipekit_train.equinox import EquinoxModelOp, ShardingSpec

    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    mesh = jax.make_mesh((2,), ("data",))
    train, val = regression_task()

    def loop(max_steps: int) -> TrainingLoop:
        return TrainingLoop(
            model=EquinoxModelOp(
                "pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=16, seed=0
            ),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config={"name": "adam", "lr": 0.01},
            batch_size=8,
            max_steps=max_steps,
            seed=0,
            validate_every_n_steps=10,
            checkpoint=Checkpoint(directory / "ckpt", every_n_steps=10, max_to_keep=2),
            sharding=ShardingSpec(mesh),
            progress=False,
        )

    first = loop(20).run()
    resumed = loop(30).run()
    result = {
        "process": jax.process_index(),
        "data_shard": [jax.process_index(), jax.process_count()],
        "losses": first.history["loss"] + resumed.history["loss"][20:],
        "val_loss": resumed.final_metrics.get("val_loss"),
        "weights_sha256": resumed.weights_sha256,
        "resumed_from_step": resumed.resumed_from_step,
        "steps": resumed.steps,
        "prediction": np.asarray(resumed.model(val.get_batch(np.arange(4))["x"])).tolist(),
    }
    (directory / f"result-{process_id}.json").write_text(json.dumps(result))
    jax.distributed.shutdown()


def launch(timeout: float) -> int:
    """Start both workers, wait, and check their results; return an exit status."""
    with tempfile.TemporaryDirectory(prefix="pipekit-multihost-") as tmp:
        directory = Path(tmp)
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    __file__,
                    "--process-id",
                    str(i),
                    "--port",
                    str(port),
                    "--dir",
                    str(directory),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
        t0 = time.perf_counter()
        outputs = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t0)))
            except subprocess.TimeoutExpired:
                for p in procs:
                    p.kill()
                print(f"FAIL: the workers did not finish within {timeout:.0f}s")
                return 2
            outputs.append(out)
        for i, (proc, out) in enumerate(zip(procs, outputs, strict=True)):
            if proc.returncode != 0:
                print(f"FAIL: worker {i} exited with {proc.returncode}:\n{out[-4000:]}")
                return 1
        results = [json.loads((directory / f"result-{i}.json").read_text()) for i in range(2)]
        a, b = results
        checks = {
            "both processes trained 30 steps": a["steps"] == b["steps"] == 30,
            "the resume started from step 20": a["resumed_from_step"]
            == b["resumed_from_step"]
            == 20,
            "same weights on both processes": a["weights_sha256"] == b["weights_sha256"],
            "same losses on both processes": a["losses"] == b["losses"],
            "same predictions on both processes": a["prediction"] == b["prediction"],
            "disjoint data shards": a["data_shard"] == [0, 2] and b["data_shard"] == [1, 2],
            "the loss fell": sum(a["losses"][-5:]) < 0.5 * sum(a["losses"][:5]),
        }
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        wall = time.perf_counter() - t0
        print(
            f"losses: first {a['losses'][0]:.4f}, last {a['losses'][-1]:.4f}; val_loss {a['val_loss']:.4f}; {wall:.1f}s"
        )
        return 0 if all(checks.values()) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    if args.process_id is None:
        sys.exit(launch(args.timeout))
    worker(args.process_id, args.port, args.dir)


if __name__ == "__main__":
    main()
