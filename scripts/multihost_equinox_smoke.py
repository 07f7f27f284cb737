"""Two-process `jax.distributed` smoke run of the Equinox adapter on loopback (CPU).

Run:  uv run python scripts/multihost_equinox_smoke.py [--timeout 120] [--elastic]

The launcher starts two copies of this script as workers (`--process-id 0/1`); each
joins `jax.distributed` on 127.0.0.1, builds a 2-device mesh (one CPU device per
process), and trains the same `TrainingLoop` with `sharding=ShardingSpec(mesh)`:
`batch_size` is the global batch, every process reads its half of each batch
(`data_shard`), the global batch is assembled with
`jax.make_array_from_process_local_data`, Orbax writes one checkpoint from both
processes. Then each worker resumes from that checkpoint for 10 more steps. The
launcher checks that both processes report the same losses and weights, that the loss
fell, and that the resume started from the checkpoint. Exit status 0 on success.

`--elastic` adds elastic resume in the same launch, with a dropout model (its masks
come from the run's PRNG key, per global sample). The launcher itself trains on one
process (no `jax.distributed`, one CPU device): an uninterrupted 30-step reference and
20 steps into a checkpoint; the two workers resume that checkpoint to step 30
(1 -> 2 processes), train 20 steps into another checkpoint, and train an uninterrupted
2-process reference; then the launcher resumes the 2-process checkpoint on one process
(2 -> 1). The training data records the sample indices every process reads per step,
so the launcher compares the global sample sequence (the processes' parts of each
step, in process order) with the uninterrupted runs', checks that a checkpoint
restores bit-exactly on the other process count, and measures the weight differences.
The last line is `RESULT {json}` with the sequences' checks and the differences.
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
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loop(
    directory: Path, max_steps: int, ckpt: str | None, mesh: Any, data: Any, dropout: bool = False
) -> Any:
    """The run every phase trains (only the length, checkpoint and placement differ).

    `dropout`: the elastic runs' model draws dropout masks from the run's PRNG key.
    """
    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.testing import regression_task
    from pipekit_train.equinox import EquinoxModelOp, ShardingSpec

    _, val = regression_task()
    factory, extra = (
        ("pipekit_train.equinox.testing:dropout_mlp", {"p": 0.1})
        if dropout
        else ("pipekit_train.equinox.testing:mlp", {})
    )
    return TrainingLoop(
        model=EquinoxModelOp(factory, in_size=4, out_size=1, width=16, seed=0, **extra),
        data=data,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.01},
        batch_size=16,
        max_steps=max_steps,
        seed=0,
        validate_every_n_steps=10,
        checkpoint=None
        if ckpt is None
        else Checkpoint(directory / ckpt, every_n_steps=10, max_to_keep=2),
        sharding=None if mesh is None else ShardingSpec(mesh),
        progress=False,
    )


def _recording_data() -> Any:
    """The training data; `seen` gets the sample indices of every batch read, in order."""
    from pipekit_train.core.data import ArrayDataset
    from pipekit_train.core.testing import regression_task

    class Recording(ArrayDataset):
        gather_block_rows = None  # one get_batch call per batch, when it is taken
        seen: list[list[int]]

        def get_batch(self, indices: Any) -> Any:
            self.seen.append([int(i) for i in indices])
            return super().get_batch(indices)

    train, _ = regression_task()
    data = Recording(**train.arrays)
    data.seen = []
    return data


def _elastic_run(directory: Path, max_steps: int, ckpt: str | None, mesh: Any) -> dict[str, Any]:
    """One recorded run: its steps, resume step, weights and per-step sample indices."""
    import equinox as eqx
    import jax
    import numpy as np

    data = _recording_data()
    art = _loop(directory, max_steps, ckpt, mesh, data, dropout=True).run()
    ran = art.steps - (art.resumed_from_step or 0)
    return {
        "steps": art.steps,
        "resumed_from_step": art.resumed_from_step,
        "weights_sha256": art.weights_sha256,
        "weights": [
            np.asarray(x).ravel().tolist()
            for x in jax.tree.leaves(eqx.filter(art.model.model, eqx.is_array))
        ],
        "loss": art.history["loss"],
        "seen": data.seen[:ran],
    }


def worker(process_id: int, port: int, directory: Path, elastic: bool) -> None:
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

    from pipekit_train.core.testing import regression_task

    assert jax.process_count() == 2 and jax.device_count() == 2, jax.devices()
    mesh = jax.make_mesh((2,), ("data",))
    train, val = regression_task()

    first = _loop(directory, 20, "ckpt", mesh, train).run()
    resumed = _loop(directory, 30, "ckpt", mesh, train).run()
    result: dict[str, Any] = {
        "process": jax.process_index(),
        "data_shard": [jax.process_index(), jax.process_count()],
        "losses": first.history["loss"] + resumed.history["loss"][20:],
        "val_loss": resumed.final_metrics.get("val_loss"),
        "weights_sha256": resumed.weights_sha256,
        "resumed_from_step": resumed.resumed_from_step,
        "steps": resumed.steps,
        "prediction": np.asarray(resumed.model(val.get_batch(np.arange(4))["x"])).tolist(),
    }
    if elastic:
        result["elastic"] = {
            "resume_1_to_2": _elastic_run(directory, 30, "e12", mesh),
            "first_2": _elastic_run(directory, 20, "e21", mesh),
            "reference_2": _elastic_run(directory, 30, None, mesh),
        }
    (directory / f"result-{process_id}.json").write_text(json.dumps(result))
    jax.distributed.shutdown()


def _single_process(directory: Path, phase: str) -> dict[str, Any]:
    """The launcher's own one-process runs (one CPU device, no `jax.distributed`)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax

    assert jax.process_count() == 1, jax.process_count()
    if phase == "before":
        return {
            "reference_1": _elastic_run(directory, 30, None, None),
            "first_1": _elastic_run(directory, 20, "e12", None),
        }
    return {
        "restored_2_on_1": _elastic_run(directory, 20, "e21", None),
        "resume_2_to_1": _elastic_run(directory, 30, "e21", None),
    }


def _global(parts: list[list[list[int]]]) -> list[list[int]]:
    """The global batches of a run from each process's per-step indices."""
    return [sum(step, []) for step in zip(*parts, strict=True)]


def _max_diff(a: dict[str, Any], b: dict[str, Any]) -> float:
    return max(
        max(abs(x - y) for x, y in zip(u, v, strict=True))
        for u, v in zip(a["weights"], b["weights"], strict=True)
    )


def elastic_checks(one: dict[str, Any], two: list[dict[str, Any]]) -> dict[str, Any]:
    """Compare the elastic runs; `one`: the launcher's runs, `two`: each worker's."""
    ref1, ref2 = one["reference_1"], two[0]["reference_2"]
    seq1 = ref1["seen"]
    seq12 = one["first_1"]["seen"] + _global([w["resume_1_to_2"]["seen"] for w in two])
    seq21 = _global([w["first_2"]["seen"] for w in two]) + one["resume_2_to_1"]["seen"]
    r12, r21 = two[0]["resume_1_to_2"], one["resume_2_to_1"]
    checks = {
        "the global sample order is the same on 1 and 2 processes": seq1
        == _global([w["reference_2"]["seen"] for w in two]),
        "1 -> 2 processes: the same global sample sequence": seq12 == seq1,
        "2 -> 1 processes: the same global sample sequence": seq21 == seq1,
        "every step reads a whole global batch of 16": len(seq1) == 30
        and all(len(b) == 16 for b in seq1 + seq12 + seq21),
        "1 -> 2 resumed from step 20 and ran to 30": r12["resumed_from_step"] == 20
        and r12["steps"] == 30,
        "2 -> 1 resumed from step 20 and ran to 30": r21["resumed_from_step"] == 20
        and r21["steps"] == 30,
        "a 2-process checkpoint restores bit-exactly on 1 process": one["restored_2_on_1"][
            "weights_sha256"
        ]
        == two[0]["first_2"]["weights_sha256"],
        "the 2-process replicas agree": all(
            w[k]["weights_sha256"] == two[0][k]["weights_sha256"]
            for w in two
            for k in ("resume_1_to_2", "first_2", "reference_2")
        ),
    }
    diffs = {
        "reference_1_vs_reference_2": _max_diff(ref1, ref2),
        "resume_1_to_2_vs_reference_1": _max_diff(r12, ref1),
        "resume_1_to_2_vs_reference_2": _max_diff(r12, ref2),
        "resume_2_to_1_vs_reference_1": _max_diff(r21, ref1),
        "resume_2_to_1_vs_reference_2": _max_diff(r21, ref2),
    }
    loss_diff = max(
        abs(a - b) for run in (r12, r21) for a, b in zip(run["loss"], ref1["loss"], strict=True)
    )
    return {"checks": checks, "max_abs_weight_diff": diffs, "max_abs_loss_diff": loss_diff}


def launch(timeout: float, elastic: bool) -> int:
    """Start both workers, wait, and check their results; return an exit status."""
    with tempfile.TemporaryDirectory(prefix="pipekit-multihost-") as tmp:
        directory = Path(tmp)
        t0 = time.perf_counter()
        one = _single_process(directory, "before") if elastic else {}
        port = _free_port()
        env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
        args = ["--port", str(port), "--dir", str(directory), *(["--elastic"] if elastic else [])]
        procs = [
            subprocess.Popen(
                [sys.executable, __file__, "--process-id", str(i), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for i in range(2)
        ]
        t1 = time.perf_counter()
        outputs = []
        for proc in procs:
            try:
                out, _ = proc.communicate(timeout=max(1.0, timeout - (time.perf_counter() - t1)))
            except subprocess.TimeoutExpired:
                print(f"FAIL: the workers did not finish within {timeout:.0f}s")
                for i, p in enumerate(procs):  # what each worker said, to see who stopped where
                    p.kill()
                    said, _ = p.communicate()
                    print(f"--- worker {i} (exit {p.returncode}):\n{(said or '')[-4000:]}")
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
        report: dict[str, Any] = {}
        if elastic:
            one.update(_single_process(directory, "after"))
            report = elastic_checks(one, [r["elastic"] for r in results])
            checks.update(report["checks"])
        for name, ok in checks.items():
            print(f"  {'ok  ' if ok else 'FAIL'} {name}")
        wall = time.perf_counter() - t0
        print(
            f"losses: first {a['losses'][0]:.4f}, last {a['losses'][-1]:.4f}; val_loss {a['val_loss']:.4f}; {wall:.1f}s"
        )
        if elastic:
            for name, value in report["max_abs_weight_diff"].items():
                print(f"max |weight difference| {name}: {value:.3g}")
            print(f"max |loss difference| of the resumed runs: {report['max_abs_loss_diff']:.3g}")
            print("RESULT " + json.dumps(report))
        return 0 if all(checks.values()) else 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--process-id", type=int, default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--dir", type=Path, default=None)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument(
        "--elastic", action="store_true", help="also resume across 1 and 2 processes"
    )
    args = parser.parse_args()
    if args.process_id is None:
        sys.exit(launch(args.timeout, args.elastic))
    worker(args.process_id, args.port, args.dir, args.elastic)


if __name__ == "__main__":
    main()
