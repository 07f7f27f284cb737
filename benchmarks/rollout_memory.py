"""The memory of one rollout-training update on Equinox, against `k`, with and without
`Rollout(gradient_checkpointing=True)`: XLA's own accounting of the compiled step.

    uv run python benchmarks/rollout_memory.py [--state 64] [--width 512] [--depth 4]
        [--batch 256] [--steps 1 4 16] [--backprop full|last|M]

For each `k` the script builds the library's jitted train step (`EquinoxStepBackend`) of a
residual MLP emulator and prints `compile().memory_analysis()`'s temporary bytes (the
activations and other intermediates the update holds, not the arguments or the
outputs) as a markdown table, with the wall time of one update. Not named `bench_*`:
`run_all.py` does not run it (its numbers go into `docs/guides/data.md` by hand).
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from pipekit_train.core import Rollout, TrainingLoop, TrajectoryWindows
from pipekit_train.equinox import EquinoxModelOp
from pipekit_train.equinox._step_backend import EquinoxStepBackend


def measure(k: int, checkpointing: bool, args: argparse.Namespace) -> tuple[float, float]:
    """`(temporary MiB, seconds per update)` of one update of a `k`-step rollout."""
    rng = np.random.default_rng(0)
    states = np.cumsum(rng.normal(size=(2, k + args.batch, args.state)), axis=1)
    windows = TrajectoryWindows(states.astype(np.float32), k=k, targets="increments")
    op = EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp",
        in_size=args.state,
        out_size=args.state,
        width=args.width,
        depth=args.depth,
    )
    loop = TrainingLoop(
        op,
        windows,
        rollout=Rollout(
            steps=k, residual=True, backprop=args.backprop, gradient_checkpointing=checkpointing
        ),
        batch_size=args.batch,
        max_steps=1,
        progress=False,
    )
    backend = EquinoxStepBackend(loop.plan, loop.plan.adapter)
    state = backend.init_state()
    batch = backend.put(windows.get_batch(np.arange(args.batch)))
    compiled = backend.fns.train_step.lower(state.leaves, batch).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    leaves, _ = compiled(state.leaves, batch)  # warm-up (donates the state)
    jax.block_until_ready(leaves)
    start, n = time.perf_counter(), 5
    for _ in range(n):
        leaves, _ = compiled(leaves, batch)
    jax.block_until_ready(leaves)
    return temp, (time.perf_counter() - start) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=int, default=64)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--backprop", default="full", help="'full', 'last' or an int m")
    args = parser.parse_args()
    if args.backprop not in ("full", "last"):
        args.backprop = int(args.backprop)
    print(
        f"{jax.default_backend()}: state {args.state}, MLP width {args.width} depth "
        f"{args.depth}, batch {args.batch}, backprop={args.backprop!r}"
    )
    print("| k | temporary memory | with gradient_checkpointing | time per update | with |")
    print("|---|---|---|---|---|")
    for k in args.steps:
        plain, t_plain = measure(k, False, args)
        ckpt, t_ckpt = measure(k, True, args)
        print(
            f"| {k} | {plain:.1f} MiB | {ckpt:.1f} MiB | {1e3 * t_plain:.1f} ms | "
            f"{1e3 * t_ckpt:.1f} ms |"
        )


if __name__ == "__main__":
    main()
