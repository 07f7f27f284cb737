"""Rollout training: the library's k = 4 update against a hand-written one, and the errors
per lead time they reach (issue 32's reference runs; not part of the test run).

```bash
uv run python benchmarks/bench_rollout_training.py                    # 3 seeds, 3000 updates
uv run python benchmarks/bench_rollout_training.py --quick --json /tmp/rt.json   # run_all
uv run python benchmarks/bench_rollout_training.py --markdown benchmarks/rollout-training.md
uv run python benchmarks/bench_rollout_training.py --backends torch   # one pair only
uv run python benchmarks/bench_rollout_training.py --backends keras lightning  # two pairs
uv run python benchmarks/bench_rollout_training.py --backends lightning-trainer
```

`--markdown` rewrites the tables of that page and keeps what follows its notes marker
(`NOTES`): the reading of the numbers, written by hand.

The problem is the chaotic example's (`examples/lorenz96.py`: Lorenz-96, 20 variables,
one emulator step = 0.05 time units, about 13 steps per Lyapunov time). Both sides train
the same residual emulator, a 20 → 128 → 128 → 20 tanh MLP initialised from
`PRNGKey(seed)`, on the same 48 training trajectories of 201 states, windows of 5
states (stride 1), per-variable statistics of states and increments, adam at a constant
learning rate of 1e-3, batches of 256, with k = 4 rollout steps per update and the mean
of the four per-step losses (mse in normalised units of the state):

- `library`: `TrainingLoop(model=EquinoxModelOp(...testing:mlp...), data=TrajectoryWindows(
  train, k=4, targets="increments"), normalizer=windows.normalizer(),
  rollout=Rollout(steps=4, residual=True), ...)` on the Equinox adapter, then
  `NeuralForward(artifact.model, normalizer, residual=True).rollout(...)` for the errors.
- `hand`: `reference_rollout_optax.py` beside this file, plain Equinox + optax + numpy
  (no pipekit code), its own batch order from the same seed.

Each round is one seed: both sides train `--updates` updates, interleaved in one process
(`_shared.interleaved_round`: each in a thread of its own, one at a time, taking turns
of `--chunk` updates, so the machine's slow and fast seconds hit both alike), and the
time of updates `--warmup + 1 .. --updates` (set-up and compilation excluded) gives the
cost of one update. The library's clock reads at its metric flushes (every 50 updates,
each waits for the device; the clock is the run's metric writer); the hand loop
waits for the loss at the same updates. The cost ratio is paired per round (library ÷
hand seconds per update), median over the rounds; target ≤ 1.1×.

Errors: every trained emulator rolls out 16 held-out trajectories (another seed of the
simulator) from 2 starts each for `--horizon` steps; the error at a lead is the nRMSE
`sqrt(mean((pred - true)²) / mean(true²))` over trajectories, starts and variables.
The table gives the mean and the range (min–max) over the seeds of each side; they are
"equal within the spread of three seeds" when the two ranges overlap.

**The torch pair.** `library`: the same `TrainingLoop` with
`TorchModelOp("pipekit_train.lightning.testing:mlp", ...)` and `adapter=Torch()`;
`hand`: `reference_rollout_torch.py`, plain torch + numpy (no pipekit code), the same
windows, statistics, step, loss and batch order as the optax reference. Both torch sides
build the MLP under `torch.manual_seed(seed)` with torch's default initialisation, so
they start from the same weights (not the Equinox pair's: another generator), and both
run torch on one intra-op thread (`torch.set_num_threads(1)` in their own thread). The
hand loop is eager and synchronous on the CPU, so its clock reads need no wait.

**The keras pair.** `library`: the same `TrainingLoop` with
`KerasModelOp("pipekit_train.keras.testing:mlp", ...)` and its default adapter (`Keras()`:
`model.fit`, one step per execution, XLA) on Keras's jax backend; `hand`: the Equinox
pair's optax reference (`hand_equinox` again, the same rounds and seeds). Keras reads its
backend at its first import, so the script sets `KERAS_BACKEND=jax` at its top, before
anything imports keras (`os.environ.setdefault`: an explicit `KERAS_BACKEND` is kept, and
a non-jax one is not this pair). Keras's `mlp` draws its initial weights from Keras's own
generator (the same uniform `±1/sqrt(fan_in)` family, other numbers), so the two sides
start from different weights: the errors are compared as ranges over the seeds.

**The lightning pair.** `library`: the same `TrainingLoop` with
`TorchModelOp("pipekit_train.lightning.testing:mlp", ...)` and its default adapter
(`Lightning()`, the one `TrainingLoop` picks without `adapter=`: a real Lightning
`Trainer.fit`); `hand`: the torch pair's plain-torch reference (`hand_torch` again). Both start from the same weights
(`torch.manual_seed(seed)`, as in the torch pair) and run torch on one thread.

**The lightning-trainer pair.** `library`: the lightning pair's library side
(`library("lightning")` again: `Lightning()`, a real `Trainer.fit`); `hand`:
`reference_rollout_lightning.py`, the plain-torch reference's training written by hand as
a Lightning user writes it (no pipekit code): a `LightningModule` whose `training_step`
does the k = 4 rollout and returns the loss, `configure_optimizers` returning
`torch.optim.Adam`, fitted by `lightning.Trainer(max_steps=..., accelerator="cpu",
devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
enable_model_summary=False)` over a plain iterable of the plain-torch reference's batches
(same windows, statistics, step, loss, batch order and initial weights: it imports them).
Both sides pay Lightning's own loop and hooks, so this pair measures the library's part of
the lightning pair's cost. The hand side's clock reads come from its module's
`on_train_batch_end` (after the optimizer step; eager on the CPU, no wait), and both run
torch on one thread.

Every library side is `_library(backend, ...)`: the same `TrainingLoop(...)`, only the
model operator and the adapter differ (`_shared.mlp_op` and `_shared.build_adapter` of the
backend). On every backend the run's metric log calls each writer's `write(step, metrics)`
for every step at each flush (every `log_every_n_steps = 50` updates); the round's
`_shared.Clock` is the writer, so it reads itself at the same updates on all of them.

`--backends torch` runs one pair; with `--markdown` the rows of the other pairs already on
the page are kept, with the line that says how they were measured. Another backend joins
through `SIDES` below (each side takes `(train, seed, args, clock)` and returns the trained
emulator's rollout function): every side gets the same data, seeds, budget and error
definition from `bench`, and the tables grow a pair of rows per backend.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _shared import (
    apply_quick,
    build_adapter,
    cpu_model,
    interleaved_round,
    make_parser,
    mlp_op,
    row,
    write_rows,
)

# Keras fixes its backend at its first import: the keras pair runs on jax (set before anything
# imports keras; an explicit KERAS_BACKEND is kept)
os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import lorenz96  # noqa: E402  (examples/, put on the path above)
import reference_rollout_optax as hand_optax  # noqa: E402

K = 4
WIDTH, DEPTH = 128, 2
BATCH = 256
LR = 1e-3
TRAIN_TRAJ, TRAIN_LEN = 48, 200
TEST_TRAJ, TEST_STARTS = 16, (0, 60)
TARGET = 1.1
LEADS = (1, 4, 13, 26, 50)
FLUSH = 50  # the library's metric flush (log_every_n_steps): its clock reads there
QUICK = {"updates": 1000, "warmup": 250, "rounds": 2, "horizon": 26}
LOAD_AT_START = os.getloadavg()


def _library(
    backend: str, train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
) -> Callable[[np.ndarray, int], np.ndarray]:
    """Train the 20 → 128 → 128 → 20 tanh MLP of `backend` (`testing:mlp`) with
    `TrainingLoop(rollout=Rollout(...))` on the backend's adapter (`torch`: `Torch()` and
    the Lightning network); the trained emulator's rollout. Every library side."""
    from pipekit_train.core import NeuralForward, Rollout, TrainingLoop, TrajectoryWindows

    model = mlp_op(backend, lorenz96.N, WIDTH, DEPTH, out_size=lorenz96.N, seed=seed)
    windows = TrajectoryWindows(train, k=K, targets="increments")
    normalizer = windows.normalizer()
    artifact = TrainingLoop(
        model=model,
        data=windows,
        normalizer=normalizer,
        rollout=Rollout(steps=K, residual=True),
        loss="mse",
        optimizer_config={"name": "adam", "lr": LR},
        batch_size=BATCH,
        max_steps=args.updates,
        seed=seed,
        adapter=build_adapter(backend),
        writers=[clock],  # the round's clock reads itself at the flushed steps
        log_every_n_steps=FLUSH,
        progress=False,
    ).run()
    forward = NeuralForward(artifact.model, normalizer=normalizer, residual=True)
    return lambda x0, n: forward.rollout(x0, n)


def library(backend: str) -> Callable[..., Callable[[np.ndarray, int], np.ndarray]]:
    """The library side on `backend`: Equinox (`Equinox()`), Keras on jax (`Keras()`),
    torch (`Torch()`) or Lightning (`Lightning()`); torch and Lightning on one torch
    thread."""

    def side(
        train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
    ) -> Callable[[np.ndarray, int], np.ndarray]:
        if backend in ("torch", "lightning"):
            _torch_one_thread()
        return _library(backend, train, seed, args, clock)

    return side


def hand_equinox(
    train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
) -> Callable[[np.ndarray, int], np.ndarray]:
    """Train with the hand-written optax loop; the trained emulator's rollout."""
    import jax

    def on_update(i: int, loss: Any) -> None:
        if i % args.chunk == 0:  # a reading of the clock: wait for the device first
            jax.block_until_ready(loss)
            clock.tick(i)

    model, stats = hand_optax.train(
        train,
        k=K,
        updates=args.updates,
        batch_size=BATCH,
        lr=LR,
        width=WIDTH,
        depth=DEPTH,
        seed=seed,
        on_update=on_update,
    )
    return lambda x0, n: hand_optax.rollout(model, stats, x0, n)


def _torch_one_thread() -> None:
    """One intra-op thread for torch in the calling thread (both torch sides call it).

    With OpenMP, `torch.set_num_threads` holds for the calling thread only, and each side
    runs in a thread of its own (`interleaved_round`): an idle team's spinning on the
    other core would slow whichever side runs next.
    """
    import torch

    torch.set_num_threads(1)


def _hand_torch_loop(
    reference: Any, train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
) -> Callable[[np.ndarray, int], np.ndarray]:
    """Train with a hand-written torch reference module (`train`/`rollout`, one torch
    thread); the trained emulator's rollout."""
    _torch_one_thread()

    def on_update(i: int, loss: Any) -> None:
        if i % args.chunk == 0:  # on the CPU the update has finished: read the clock
            clock.tick(i)

    model, stats = reference.train(
        train,
        k=K,
        updates=args.updates,
        batch_size=BATCH,
        lr=LR,
        width=WIDTH,
        depth=DEPTH,
        seed=seed,
        on_update=on_update,
    )
    return lambda x0, n: reference.rollout(model, stats, x0, n)


def hand_torch(
    train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
) -> Callable[[np.ndarray, int], np.ndarray]:
    """Train with the hand-written plain-torch loop; the trained emulator's rollout."""
    import reference_rollout_torch

    return _hand_torch_loop(reference_rollout_torch, train, seed, args, clock)


def hand_lightning(
    train: np.ndarray, seed: int, args: argparse.Namespace, clock: Any
) -> Callable[[np.ndarray, int], np.ndarray]:
    """Train with the hand-written Lightning module and `Trainer`; the trained emulator's
    rollout."""
    import reference_rollout_lightning

    return _hand_torch_loop(reference_rollout_lightning, train, seed, args, clock)


# (backend, library side, hand-written side)
SIDES: list[tuple[str, Callable[..., Any], Callable[..., Any]]] = [
    ("equinox", library("equinox"), hand_equinox),
    ("torch", library("torch"), hand_torch),
    ("keras", library("keras"), hand_equinox),
    ("lightning", library("lightning"), hand_torch),
    ("lightning-trainer", library("lightning"), hand_lightning),
]
HAND_LABEL = {
    "equinox": "equinox + optax",
    "torch": "plain torch",
    "keras": "equinox + optax",
    "lightning": "plain torch",
    "lightning-trainer": "hand-written Lightning Trainer",
}


def lead_errors(rollout: Callable[[np.ndarray, int], np.ndarray], test: np.ndarray, horizon: int):
    """nRMSE per lead `1..horizon` of rollouts from every start of every test trajectory."""
    pred, true = [], []
    for start in TEST_STARTS:
        pred.append(np.asarray(rollout(test[:, start], horizon), np.float64)[1:])  # (H, n, d)
        true.append(np.moveaxis(test[:, start + 1 : start + horizon + 1], 0, 1))
    p, t = np.concatenate(pred, axis=1), np.concatenate(true, axis=1).astype(np.float64)
    return np.sqrt(((p - t) ** 2).mean(axis=(1, 2)) / (t**2).mean(axis=(1, 2)))


def _side_run(
    side: Callable[..., Any],
    name: str,
    trained: dict[str, Any],
    train: np.ndarray,
    seed: int,
    args: argparse.Namespace,
) -> Callable[[Any], None]:
    """One side's body for `interleaved_round`: train, keep its rollout in `trained`."""

    def body(clock: Any) -> None:
        trained[name] = side(train, seed, args, clock)

    return body


def bench(args: argparse.Namespace, say: Callable[[str], None]) -> list[dict[str, Any]]:
    """Every round (seed) trains each side once, interleaved; the rows of the table."""
    train = lorenz96.trajectories(TRAIN_TRAJ, TRAIN_LEN, seed=0)
    test = lorenz96.trajectories(TEST_TRAJ, max(TEST_STARTS) + args.horizon, seed=1)
    persistence = lead_errors(lambda x0, n: np.repeat(x0[None], n + 1, axis=0), test, args.horizon)
    rows: list[dict[str, Any]] = []
    for backend, library, hand in SIDES:
        if backend not in args.backends:
            continue
        sides = {"library": library, "hand": hand}
        cost: dict[str, list[float]] = {"library": [], "hand": []}
        errors: dict[str, list[np.ndarray]] = {"library": [], "hand": []}
        for r in range(args.rounds):
            seed = r
            order = list(sides) if r % 2 == 0 else list(sides)[::-1]
            trained: dict[str, Callable[[np.ndarray, int], np.ndarray]] = {}

            runs = [_side_run(sides[name], name, trained, train, seed, args) for name in order]
            timer = time.process_time if args.timer == "cpu" else time.perf_counter
            rates = interleaved_round(runs, args.warmup, args.updates, args.chunk, timer=timer)
            for name, rate in zip(order, rates, strict=True):
                cost[name].append(1.0 / rate)
                errors[name].append(lead_errors(trained[name], test, args.horizon))
                say(
                    f"  {backend} {name:7s} seed {seed}: {1e3 / rate:.2f} ms/update, "
                    + ", ".join(
                        f"lead {lead} {errors[name][-1][lead - 1]:.3f}"
                        for lead in LEADS
                        if lead <= args.horizon
                    )
                )
        rows += backend_rows(backend, cost, errors, persistence, args)
    return rows


def backend_rows(
    backend: str,
    cost: dict[str, list[float]],
    errors: dict[str, list[np.ndarray]],
    persistence: np.ndarray,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """One cost row, then per lead one error row of each side (ratio: library ÷ hand)."""
    ratio = statistics.median(a / b for a, b in zip(cost["library"], cost["hand"], strict=True))
    rounds = f"{args.updates - args.warmup} updates timed, {args.rounds} rounds"
    rows = [
        row(
            "rollout-training",
            f"{backend}: library k={K} update (TrainingLoop, Rollout(steps={K}))",
            f"ms per update, best of rounds; {rounds} (ratio: x hand, paired, median)",
            1e3 * min(cost["library"]),
            "ms",
            ratio=ratio,
            target=f"<= {TARGET}",
            ok=ratio <= TARGET,
        ),
        row(
            "rollout-training",
            f"{backend}: hand-written k={K} update ({HAND_LABEL[backend]})",
            f"ms per update, best of rounds; {rounds}",
            1e3 * min(cost["hand"]),
            "ms",
        ),
    ]
    for lead in LEADS:
        if lead > args.horizon:
            continue
        lib = [float(e[lead - 1]) for e in errors["library"]]
        hnd = [float(e[lead - 1]) for e in errors["hand"]]
        overlap = max(min(lib), min(hnd)) <= min(max(lib), max(hnd))
        note = (
            f"range over seeds {min(lib):.4f}-{max(lib):.4f}; hand {min(hnd):.4f}-{max(hnd):.4f};"
            f" persistence {persistence[lead - 1]:.4f}"
        )
        rows.append(
            row(
                "rollout-training",
                f"{backend}: nRMSE at lead {lead} after {args.updates} updates",
                f"mean over {args.rounds} seeds (ratio: library ÷ hand; ok: the ranges overlap)",
                statistics.mean(lib),
                "nRMSE",
                ratio=statistics.mean(lib) / statistics.mean(hnd),
                target="ranges overlap",
                ok=overlap,
                note=note,
                digits=4,
            )
        )
        rows[-1].update(hand=statistics.mean(hnd), lib_range=(min(lib), max(lib)))
        rows[-1].update(hand_range=(min(hnd), max(hnd)), persistence=float(persistence[lead - 1]))
    for r in rows:
        r["backend"] = backend
    return rows


def table(rows: list[dict[str, Any]], kept: Sequence[str] = ()) -> str:
    """Two markdown tables: the cost of an update, and the errors per lead time.

    `kept`: rows of other backends from an earlier page, put first (by their columns).
    """
    cost = [
        "| backend | library ms/update | hand-written ms/update | library ÷ hand |",
        "|---|---:|---:|---:|",
    ]
    errs = [
        "| backend | lead (steps) | library nRMSE: mean (range) | hand-written nRMSE: mean "
        "(range) | ranges overlap | persistence |",
        "|---|---:|---:|---:|:---:|---:|",
    ]
    cost += [line for line in kept if line.count("|") == 5]
    errs += [line for line in kept if line.count("|") == 7]
    for i, r in enumerate(rows):
        if r["case"].endswith(")") and "library" in r["case"]:
            cost.append(
                f"| {r['backend']} | {r['value']:.2f} | {rows[i + 1]['value']:.2f} "
                f"| {r['ratio']:.2f}× |"
            )
        elif "nRMSE at lead" in r["case"]:
            lead = r["case"].split("lead ")[1].split(" ")[0]
            (llo, lhi), (hlo, hhi) = r["lib_range"], r["hand_range"]
            errs.append(
                f"| {r['backend']} | {lead} | {r['value']:.4f} ({llo:.4f}–{lhi:.4f}) "
                f"| {r['hand']:.4f} ({hlo:.4f}–{hhi:.4f}) | {'yes' if r['ok'] else 'no'} "
                f"| {r['persistence']:.3f} |"
            )
    return "\n".join(cost) + "\n\n" + "\n".join(errs)


def kept_rows(page: str, args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The table rows of the backends not run now, and the lines saying how they were run."""
    others = [b for b, _, _ in SIDES if b not in args.backends]
    head = page.partition(NOTES)[0]
    rows = [line for line in head.splitlines() if any(line.startswith(f"| {b} |") for b in others)]
    how = [line for line in head.splitlines() if line.startswith("Measured with") and rows]
    return rows, how


def markdown(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    kept: Sequence[str] = (),
    kept_how: Sequence[str] = (),
) -> str:
    """The tables as a page: what was run, where and when (and the rows kept from before)."""
    import datetime as dt

    cpu = cpu_model()
    flags = (
        (
            ""
            if set(args.backends) == {b for b, _, _ in SIDES}
            else f"--backends {' '.join(args.backends)} "
        )
        + f"--updates {args.updates} --warmup {args.warmup} --rounds {args.rounds} "
        f"--chunk {args.chunk} --timer {args.timer}"
    )
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load = ", ".join(f"{v:.1f}" for v in LOAD_AT_START)
    # the clock and the budget of the kept rows are their own run's, not this one's
    kept_note = "; the kept rows: as measured above" if kept else ""
    return "\n".join(
        [
            "# Rollout training against a hand-written reference",
            "",
            f"Measured with `uv run python benchmarks/bench_rollout_training.py {flags} "
            f"--markdown benchmarks/rollout-training.md` on {when}, on {cpu} "
            f"({os.cpu_count()} cores, shared with other jobs: load average {load} at the "
            "start), CPU only. Lorenz-96 (20 variables), a 20 → 128 → 128 → 20 tanh MLP, "
            f"k = {K}, batches of {BATCH}, adam 1e-3; one round per seed (seeds 0.."
            f"{args.rounds - 1}). What each side is, and how it is timed, is in the "
            "script's docstring; the hand-written sides are `reference_rollout_optax.py`, "
            "`reference_rollout_torch.py` and `reference_rollout_lightning.py`.",
            "",
            *(
                [
                    f"The rows of {', '.join(sorted({r.split('|')[1].strip() for r in kept}))} "
                    f"are kept from {'earlier runs' if len(kept_how) > 1 else 'an earlier run'} "
                    "of the page:",
                    "",
                    *[part for line in kept_how for part in (line, "")],
                ]
                if kept
                else []
            ),
            f"The cost of one k = 4 update ({args.timer} clock{kept_note}; best over the rounds; the "
            f"ratio is paired per round, median; target ≤ {TARGET}×):",
            "",
            table(rows, kept).split("\n\n")[0],
            "",
            f"The errors per lead time after {args.updates} updates (nRMSE over "
            f"{TEST_TRAJ} held-out trajectories × {len(TEST_STARTS)} starts; one Lyapunov "
            f"time is about 13 steps; mean and range over the seeds{kept_note}):",
            "",
            table(rows, kept).split("\n\n")[1],
            "",
        ]
    )


def main() -> None:
    parser = make_parser(
        __doc__,
        quick_help="1000 updates (250 warm-up), 2 rounds, horizon 26",
        markdown_help="also write the tables to this file",
    )
    parser.add_argument("--updates", type=int, default=3000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3, help="seeds 0..rounds-1")
    parser.add_argument(
        "--chunk", type=int, default=250, help="updates per turn of the interleaving"
    )
    parser.add_argument("--horizon", type=int, default=50)
    parser.add_argument(
        "--timer",
        choices=("wall", "cpu"),
        default="wall",
        help="wall: time.perf_counter; cpu: time.process_time (the process's CPU time, all "
        "its threads: steadier on a loaded machine, but it counts the library's prefetching "
        "thread in whichever turn it runs)",
    )
    parser.add_argument(
        "--backends",
        nargs="+",
        choices=[b for b, _, _ in SIDES],
        default=[b for b, _, _ in SIDES],
        help="the pairs to run (default: all); with --markdown, the rows of the others "
        "already on the page are kept",
    )
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    if (
        args.chunk % FLUSH
        or args.warmup % args.chunk
        or args.updates % args.chunk
        or not 0 < args.warmup < args.updates
    ):
        parser.error(
            f"Received: --chunk {args.chunk}, --warmup {args.warmup}, --updates "
            f"{args.updates}, but the chunk must be a multiple of {FLUSH} (the library's "
            "metric flush), warmup and updates multiples of the chunk, 0 < warmup < updates."
        )
    rows = bench(args, print)
    print()
    print(table(rows))
    if args.json:
        write_rows(args.json, [{k: v for k, v in r.items() if k in _SCHEMA} for r in rows])
    if args.markdown:
        path = Path(args.markdown)
        page = path.read_text() if path.exists() else ""
        notes = page.partition(NOTES)[2]
        kept, how = kept_rows(page, args)
        path.write_text(markdown(rows, args, kept, how) + (f"\n{NOTES}{notes}" if notes else ""))


NOTES = "<!-- notes: kept when the tables are written again -->"
_SCHEMA = ("benchmark", "case", "metric", "value", "unit", "ratio", "target", "ok", "note")


if __name__ == "__main__":
    main()
