"""Side-by-side benchmark of the Lightning adapter (not part of the test run).

```bash
uv run python benchmarks/bench_lightning.py                      # 5 repeats of 2000 steps
uv run python benchmarks/bench_lightning.py --repeats 3 --steps 1000 --profile
uv run python benchmarks/bench_lightning.py --quick --json /tmp/lightning.json   # run_all convention
uv run --group gpu python benchmarks/bench_lightning.py --quick --accelerator gpu   # on a CUDA GPU
```

Three loops train the same model (same initial weights, adam lr 1e-3, mse) on the same
batches — every loop draws numpy batches from core's batching engine (`make_batches`)
and converts them with `torch.from_numpy`; none is pre-staged:

- `adapter`: `TrainingLoop(..., adapter=Lightning(accelerator="cpu")).run()`: core's
  `RunContext` driven from Lightning hooks (loss kept as a tensor, fetched every 50
  steps, history), the generated `LightningModule`, the data feed that tracks the
  iterator state for exact resume.
- `Trainer.fit`: a hand-written `LightningModule` (`F.mse_loss`, Adam) and the same
  batches from an iterable, `Trainer(logger=False, enable_checkpointing=False,
  enable_progress_bar=False, enable_model_summary=False)`; run twice: as a user gets it
  (`import lightning` sets `PYTORCH_NVML_BASED_CUDA_CHECK=1`) and with that variable
  unset, as the adapter runs it.
- `raw torch`: `zero_grad / forward / mse / backward / step` in a Python loop (NVML check
  unset: its speed without lightning imported).

What is measured: steps `warmup+1 .. total`. The two Lightning loops carry the same
timing callback (`on_train_batch_end` timestamps of the wall clock and of this process's
CPU time); the raw loop is timed over the same steps. Runs are interleaved (in a rotating
order) and repeated. The table shows the best wall-clock rate (the least disturbed run:
on a shared machine noise only ever slows a run down) and the median CPU time per step
(`time.process_time`: waiting for a core does not count, but a process sharing the core
still inflates it), each with the adapter's speed relative to the row (> 1: the adapter
is faster), and the range of wall-clock rates. On a busy 2-core machine runs of the same
loop vary by ±30%: read ratios near 1 as "equal within noise", and use `--profile` for
the adapter's own per-step cost, measured directly. `--profile` adds, for the small case, the wall time spent in the
adapter's own per-step code (perf_counter around the bridge hook and the data feed) and a
cProfile of one adapter run grouped by where its time goes.

Cases: (a) MLP 8→256→256→1 (tanh), batch 256; (b) MLP 2→32→1, batch 32.

`--accelerator gpu` runs all three loops on the first CUDA GPU (the raw loop moves the
model and each batch there; `scripts/gpu_check.py` runs it so). `--quick` runs the same cases and loops, 3 repeats of 400 steps (explicit `--repeats` /
`--steps` win). `--json PATH` also writes one row per loop and case (the convention in
`benchmarks/run_all.py`): the best wall-clock steps/s, with `ratio` = that rate ÷ plain
`Trainer.fit`'s (NVML check unset, the reference; > 1: faster than it), and the median
CPU µs/step and the range in the note. No target is set: the adapter is expected to run
equal to plain `Trainer.fit` within noise.
"""

from __future__ import annotations

import copy
import cProfile
import functools
import os
import pstats
import statistics
import time
from typing import Any

import lightning as L
import torch
from _shared import Clock, apply_quick, make_data, make_parser, mlp_op, row, write_rows

from pipekit_train.core import TrainingLoop
from pipekit_train.core.data import ArrayDataset, make_batches
from pipekit_train.lightning import Lightning, TorchModelOp

LR = 1e-3
SEED = 0
NVML = "PYTORCH_NVML_BASED_CUDA_CHECK"
ACCELERATOR = "cpu"  # set by --accelerator


def make_op(in_size: int, width: int, depth: int) -> TorchModelOp:
    """The benchmark MLP as a model operator."""
    return mlp_op("lightning", in_size, width, depth, seed=SEED)


class Timer(L.Callback):
    """A `Clock` of optimizer steps `warmup+1 .. total`, ticked at the end of each."""

    def __init__(self, warmup: int, total: int):
        self.clock = Clock(warmup, total)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self.clock.tick(trainer.global_step)

    def rate(self) -> tuple[float, float]:
        """`(steps/s by the wall clock, CPU µs per step of this process)`."""
        return self.clock.rate(), self.clock.cpu_us()


# -- the three loops -------------------------------------------------------------------------
def run_adapter(
    data: ArrayDataset, op: TorchModelOp, batch: int, warmup: int, total: int
) -> tuple[float, float]:
    timer = Timer(warmup, total)
    TrainingLoop(
        model=op,
        data=data,
        loss="mse",
        optimizer_config={"name": "adam", "lr": LR},
        batch_size=batch,
        max_steps=total,
        seed=SEED,
        progress=False,
        adapter=Lightning(accelerator=ACCELERATOR, devices=1, callbacks=[timer]),
    ).run()
    return timer.rate()


class HandWritten(L.LightningModule):
    """What a user writes: the model, `F.mse_loss`, Adam."""

    def __init__(self, net: torch.nn.Module):
        super().__init__()
        self.net = net

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.net.parameters(), lr=LR)


class Batches:
    """Core's batches as tensors (the same stream the adapter trains on)."""

    def __init__(self, data: ArrayDataset, batch: int):
        self.data, self.batch = data, batch

    def __iter__(self) -> Any:
        for b in make_batches(self.data, self.batch, seed=SEED):
            yield {k: torch.from_numpy(v) for k, v in b.items()}


def run_fit(
    data: ArrayDataset, op: TorchModelOp, batch: int, warmup: int, total: int, *, nvml: bool
) -> tuple[float, float]:
    timer = Timer(warmup, total)
    trainer = L.Trainer(
        accelerator=ACCELERATOR,
        devices=1,
        max_steps=total,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[timer],
    )
    saved = os.environ.pop(NVML, None)
    if nvml:
        os.environ[NVML] = "1"
    try:
        with torch.random.fork_rng(devices=[]):
            trainer.fit(
                HandWritten(copy.deepcopy(op.model)), train_dataloaders=Batches(data, batch)
            )
    finally:
        os.environ.pop(NVML, None)
        if saved is not None:
            os.environ[NVML] = saved
    return timer.rate()


def run_raw(
    data: ArrayDataset, op: TorchModelOp, batch: int, warmup: int, total: int
) -> tuple[float, float]:
    device = torch.device("cuda" if ACCELERATOR == "gpu" else "cpu")
    net = copy.deepcopy(op.model).to(device)
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    saved = os.environ.pop(NVML, None)
    try:
        it = make_batches(data, batch, seed=SEED)
        t0 = c0 = 0.0
        loss = None
        for step in range(1, total + 1):
            b = next(it)
            x, y = torch.from_numpy(b["x"]).to(device), torch.from_numpy(b["y"]).to(device)
            opt.zero_grad(set_to_none=True)
            loss = torch.nn.functional.mse_loss(net(x), y)
            loss.backward()
            opt.step()
            if step == warmup:
                t0, c0 = time.perf_counter(), time.process_time()
        assert loss is not None
        float(loss.detach())
        n = total - warmup
        return n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e6
    finally:
        if saved is not None:
            os.environ[NVML] = saved


# -- profile ---------------------------------------------------------------------------------
def time_layer(data: ArrayDataset, op: TorchModelOp, batch: int, steps: int) -> None:
    """Wall time inside the adapter's own per-step code, measured with perf_counter."""
    from pipekit_train.lightning import _bridge, _data

    spent = {"bridge": 0.0, "feed": 0.0}
    hook = _bridge.LightningHooks.on_train_batch_end
    generate = _data.TensorBatches._generate

    def timed_hook(self: Any, *args: Any) -> None:
        t = time.perf_counter()
        hook(self, *args)
        spent["bridge"] += time.perf_counter() - t

    def timed_generate(self: Any) -> Any:
        inner = generate(self)
        while True:
            t = time.perf_counter()
            item = next(inner)
            spent["feed"] += time.perf_counter() - t
            yield item

    _bridge.LightningHooks.on_train_batch_end = timed_hook  # type: ignore[method-assign,assignment]
    _data.TensorBatches._generate = timed_generate  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        run_adapter(data, op, batch, steps // 5, steps)
        wall = time.perf_counter() - t0
    finally:
        _bridge.LightningHooks.on_train_batch_end = hook  # type: ignore[method-assign]
        _data.TensorBatches._generate = generate  # type: ignore[method-assign]
    print(
        f"\nthe adapter's own per-step code, MLP 2→32→1 b{batch}, {steps} steps (perf_counter, whole run)"
    )
    print(
        f"  {spent['bridge'] / steps * 1e6:7.1f} µs/step  hooks.on_train_batch_end: record_step (+ a fetch "
        "every 50 steps), schedules, stop"
    )
    print(
        f"  {spent['feed'] / steps * 1e6:7.1f} µs/step  feed: core next() + torch.from_numpy + iterator-state "
        "snapshot (the plain loop does all but the snapshot)"
    )
    print(f"  {wall / steps * 1e6:7.1f} µs/step  whole run() incl. Trainer set-up")


def profile_adapter(data: ArrayDataset, op: TorchModelOp, batch: int, steps: int) -> None:
    """cProfile of one adapter run, grouped."""
    prof = cProfile.Profile()
    prof.enable()
    run_adapter(data, op, batch, steps // 5, steps)
    prof.disable()
    stats = pstats.Stats(prof)
    raw = stats.stats  # type: ignore[attr-defined]
    total = sum(v[3] for k, v in raw.items() if k[2] == "run_adapter")
    groups = {
        "hooks.on_train_batch_end (RunLifecycle: record, schedules)": (
            "_bridge.py",
            "on_train_batch_end",
        ),
        "feed: core make_batches next() + from_numpy + get_state": ("_data.py", "_generate"),
        "generated training_step (forward + fused mse)": ("_module.py", "training_step"),
        "Lightning optimizer step (closure: fwd+bwd+adam)": ("optimizer.py", "step"),
        "  of which torch.optim.Adam.step": ("adam.py", "step"),
        "  of which backward": ("_tensor.py", "backward"),
    }
    print(
        f"\ncProfile of one adapter run, MLP 2→32→1 b{batch}, {steps} steps (inflates Python-heavy parts)"
    )
    print(f"  total in run_adapter: {total:.2f}s")
    for label, (file, func) in groups.items():
        cum = sum(v[3] for k, v in raw.items() if k[0].endswith(file) and k[2] == func)
        print(f"  {cum / steps * 1e3:7.3f} ms/step  {cum / total:5.1%}  {label}")


LOOPS = (
    ("adapter (TrainingLoop + Lightning)", "adapter"),
    ("plain Trainer.fit (NVML check unset)", "fit"),
    ("plain Trainer.fit (as imported: NVML check)", "fit_nvml"),
    ("raw torch loop", "raw"),
)
REFERENCE = "fit"


def result_rows(
    title: str, runs: dict[str, list[tuple[float, float]]], repeats: int, steps: int
) -> list[dict[str, Any]]:
    """The rows of one case (see run_all.py): ratio = steps/s ÷ plain `Trainer.fit`'s."""
    wall = {k: max(w for w, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    out = []
    for label, key in LOOPS:
        walls = [w for w, _ in runs[key]]
        note = (
            f"CPU {cpu[key]:.0f} µs/step (median), {cpu[key] / cpu[REFERENCE]:.3f}x Trainer.fit's; "
            f"wall range {min(walls):.0f}–{max(walls):.0f} steps/s"
        )
        if key == REFERENCE:
            note = "reference; " + note
        out.append(
            row(
                "lightning",
                f"{title}: {label}",
                f"steps/s, best of {repeats} ({steps - steps // 5} timed steps; "
                "ratio: ÷ plain Trainer.fit, NVML check unset)",
                wall[key],
                "steps/s",
                ratio=wall[key] / wall[REFERENCE],
                note=note,
                digits=1,
            )
        )
    return out


def main() -> None:
    parser = make_parser(
        __doc__, quick_help="3 repeats of 400 steps instead of 5 of 2000", repeats=5
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--accelerator", choices=["cpu", "gpu"], default="cpu", help="where all loops train"
    )
    args = parser.parse_args()
    apply_quick(parser, args, {"repeats": 3, "steps": 400})
    global ACCELERATOR
    ACCELERATOR = args.accelerator
    if ACCELERATOR == "gpu" and not torch.cuda.is_available():
        raise SystemExit("--accelerator gpu: torch sees no CUDA GPU (torch.cuda.is_available())")
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, lightning {L.__version__}, threads {torch.get_num_threads()}, "
        f"repeats {args.repeats}, steps {args.steps} (first 20% warm-up), accelerator {ACCELERATOR}"
    )
    cases = [("MLP 8→256→256→1, batch 256", 8, 256, 2, 256), ("MLP 2→32→1, batch 32", 2, 32, 1, 32)]
    if ACCELERATOR == "gpu":
        cases = [(f"{title}, GPU", *rest) for title, *rest in cases]
    rows: list[dict[str, Any]] = []
    for title, in_size, width, depth, batch in cases:
        data = make_data(in_size, 16384)
        op = make_op(in_size, width, depth)
        total, warmup = args.steps, args.steps // 5
        runs: dict[str, list[tuple[float, float]]] = {
            "adapter": [],
            "fit": [],
            "fit_nvml": [],
            "raw": [],
        }
        args_ = (data, op, batch, warmup, total)
        loops = {
            "adapter": functools.partial(run_adapter, *args_),
            "fit": functools.partial(run_fit, *args_, nvml=False),
            "fit_nvml": functools.partial(run_fit, *args_, nvml=True),
            "raw": functools.partial(run_raw, *args_),
        }
        order = list(loops)
        for r in range(args.repeats):
            for key in order[r % 4 :] + order[: r % 4]:  # rotate: no loop always runs first
                runs[key].append(loops[key]())
        wall = {k: max(w for w, _ in v) for k, v in runs.items()}
        cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
        print(f"\n{title}")
        print(
            f"  {'loop':<44} {'best steps/s':>12} {'adapter ÷ it':>12}"
            f" {'CPU µs/step':>12} {'adapter ÷ it':>12}  wall steps/s range"
        )
        for label, key in LOOPS:
            walls = [w for w, _ in runs[key]]
            print(
                f"  {label:<44} {wall[key]:12.0f} {wall['adapter'] / wall[key]:12.3f}"
                f" {cpu[key]:12.0f} {cpu[key] / cpu['adapter']:12.3f}  [{min(walls):.0f}–{max(walls):.0f}]",
                flush=True,
            )
        rows += result_rows(title, runs, args.repeats, args.steps)
    if args.json:
        write_rows(args.json, rows)
    if args.profile:
        time_layer(make_data(2, 16384), make_op(2, 32, 1), 32, args.steps)
        profile_adapter(make_data(2, 16384), make_op(2, 32, 1), 32, args.steps)


if __name__ == "__main__":
    main()
