"""CRPS ensemble training: the library's update against a hand-written equinox + optax one
(issue 60: "the per-member update costs ≤ 1.1× a hand-written CRPS loop"; not part of the
test run).

```bash
uv run python benchmarks/bench_crps.py                      # 3 rounds, 600 updates each
uv run python benchmarks/bench_crps.py --quick --json /tmp/crps.json
```

The problem is the Lorenz-96 example's (`examples/lorenz96.py`, 20 variables). Both sides
train the same generative residual emulator, a `(20 + w) -> 128 -> 128 -> 20` tanh MLP
(the state and `w = 20` noise channels in, the normalised increment out), on windows of
`k + 1` states of 48 training trajectories, batches of 256, `M = 4` members per sample,
adam at 1e-3, through `k = 4` unrolled steps; each step's loss is the fair CRPS of the
`M` members against the true state in normalised units, averaged over the steps:

- `library`: `TrainingLoop(model=EquinoxModelOp(...testing:mlp...), data=TrajectoryWindows(
  train, k=4, targets="increments"), rollout=Rollout(steps=4, residual=True),
  loss=losses.crps(members=4, noise_dim=20), ...)` on `Equinox()`: the members' noise
  is drawn on the host by core's feed (counter-based, so every backend and a resume see
  the same draws) and travels with the batch.
- `hand`: below, plain Equinox + optax + numpy (no pipekit code): what a careful user
  writes, the noise drawn on the device with `jax.random` inside the jitted update, the
  members folded into the batch axis, the pairwise term over `i < j`.

The two sides run interleaved in one process (`_shared.interleaved_round`, turns of
`--chunk` updates); the cost of one update is the time of updates `--warmup + 1 ..
--updates` (compilation excluded), paired per round, and the ratio is library ÷ hand
(median over rounds; target ≤ 1.1×). Per-member cost is the same ratio: both sides
train `M` members per sample.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "examples"))

import lorenz96  # noqa: E402
import reference_rollout_optax as hand_optax  # noqa: E402
from _shared import interleaved_round  # noqa: E402

K, M, NOISE, WIDTH, DEPTH, BATCH, LR = 4, 4, 20, 128, 2, 256, 1e-3
TRAIN_TRAJ, TRAIN_LEN = 48, 201
FLUSH = 50


def library(train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any) -> None:
    """The library side: `TrainingLoop` with the CRPS on `Equinox()`."""
    from pipekit_train.core import Rollout, TrainingLoop, losses
    from pipekit_train.core.data import TrajectoryWindows
    from pipekit_train.equinox import Equinox, EquinoxModelOp

    windows = TrajectoryWindows(train, k=K, targets="increments")
    TrainingLoop(
        model=EquinoxModelOp(
            "pipekit_train.equinox.testing:mlp",
            in_size=lorenz96.N + NOISE,
            out_size=lorenz96.N,
            width=WIDTH,
            depth=DEPTH,
            seed=seed,
        ),
        data=windows,
        normalizer=windows.normalizer(),
        rollout=Rollout(steps=K, residual=True),
        loss=losses.crps(members=M, noise_dim=NOISE),
        optimizer_config={"name": "adam", "lr": LR},
        batch_size=BATCH,
        max_steps=args.updates,
        seed=seed,
        adapter=Equinox(),
        writers=[clock],  # the clock reads itself at the flushed steps
        log_every_n_steps=FLUSH,
        progress=False,
    ).run()


def hand(train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any) -> None:
    """The hand-written side: equinox + optax, the noise drawn with `jax.random`."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import optax

    stats = hand_optax.fit_stats(train)
    mx, sx, mdx, sdx = (jnp.asarray(stats[k], jnp.float32) for k in stats)
    data = hand_optax.windows(train, K)
    mlp = eqx.nn.MLP(
        lorenz96.N + NOISE,
        lorenz96.N,
        WIDTH,
        DEPTH,
        activation=jax.nn.tanh,
        key=jax.random.PRNGKey(seed),
    )
    params, static = eqx.partition(mlp, eqx.is_array)
    optim = optax.adam(LR)
    opt_state = optim.init(params)

    def crps(members: jax.Array, truth: jax.Array) -> jax.Array:  # (B, M, d), (B, d)
        skill = jnp.mean(jnp.abs(members - truth[:, None]), axis=1)
        pairs = sum(
            jnp.sum(jnp.abs(members[:, i : i + 1] - members[:, :i]), axis=1) for i in range(1, M)
        )
        return jnp.mean(skill - pairs / (M * (M - 1)))

    def loss_fn(params: Any, window: jax.Array, key: jax.Array) -> jax.Array:
        model = jax.vmap(eqx.combine(params, static))
        b = window.shape[0]
        x = jnp.repeat(window[:, 0], M, axis=0)  # (B * M, d), the members of a sample adjacent
        noise = jax.random.normal(key, (K, b * M, NOISE))
        total = jnp.zeros(())
        for i in range(1, K + 1):
            u = jnp.concatenate([(x - mx) / sx, noise[i - 1]], axis=-1)
            x = x + model(u) * sdx + mdx
            members = ((x - mx) / sx).reshape(b, M, -1)
            total = total + crps(members, (window[:, i] - mx) / sx)
        return total / K

    @functools.partial(jax.jit, donate_argnums=(0, 1))
    def update(params: Any, opt_state: Any, window: jax.Array, key: jax.Array) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, window, key)
        changes, opt_state = optim.update(grads, opt_state, params)
        return optax.apply_updates(params, changes), opt_state, loss

    rng = np.random.default_rng(seed)
    key = jax.random.PRNGKey(seed + 1)
    per_epoch = len(data) // BATCH
    order = rng.permutation(len(data))
    for i in range(args.updates):
        j = i % per_epoch
        if i and j == 0:
            order = rng.permutation(len(data))
        params, opt_state, loss = update(
            params, opt_state, data[order[j * BATCH : (j + 1) * BATCH]], jax.random.fold_in(key, i)
        )
        if (i + 1) % FLUSH == 0:  # a reading of the clock: wait for the device first
            jax.block_until_ready(loss)
            clock.tick(i + 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--updates", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--chunk", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="2 rounds of 300 updates")
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.updates = 2, 300
    train = lorenz96.trajectories(TRAIN_TRAJ, TRAIN_LEN, seed=0)
    ratios, rates = [], {"library": [], "hand": []}
    for r in range(args.rounds):
        names = ["library", "hand"] if r % 2 == 0 else ["hand", "library"]
        sides = {"library": library, "hand": hand}
        runs = [functools.partial(sides[n], train, r, args) for n in names]
        got = dict(
            zip(names, interleaved_round(runs, args.warmup, args.updates, args.chunk), strict=True)
        )
        for n in names:
            rates[n].append(got[n])
        ratios.append(got["hand"] / got["library"])  # seconds per update, library ÷ hand
        print(
            f"round {r}: library {got['library']:.1f} upd/s, hand {got['hand']:.1f} upd/s, "
            f"library/hand time {ratios[-1]:.3f}",
            flush=True,
        )
    result = {
        "bench": "crps",
        "k": K,
        "members": M,
        "noise_dim": NOISE,
        "batch": BATCH,
        "library_updates_per_s": statistics.median(rates["library"]),
        "hand_updates_per_s": statistics.median(rates["hand"]),
        "ratio_median": statistics.median(ratios),
        "ratios": ratios,
        "target": 1.1,
        "unix_time": time.time(),
    }
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
