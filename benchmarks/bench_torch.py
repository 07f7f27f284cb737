"""Side-by-side benchmark of `pipekit_train.lightning.Torch` (not part of the test run).

```bash
uv run python benchmarks/bench_torch.py                        # 5 repeats of 2000 steps
uv run python benchmarks/bench_torch.py --quick --json /tmp/torch.json   # run_all convention
uv run python benchmarks/bench_torch.py --no-compile --no-lightning      # the fast subset
uv run python benchmarks/bench_torch.py --no-compile --clock cpu         # CPU-time rates
uv run --extra gpu python benchmarks/bench_torch.py --quick --device cuda   # on a CUDA GPU
```

Every loop trains the same model (same initial weights, adam lr 1e-3, mse, batch of
`b` rows drawn without replacement, reshuffled every epoch) in one process, in
interleaved rounds (a rotating order: no loop always runs first):

- `hand, indexed tensors`: the fastest hand-written loop: `x`/`y` staged as tensors
  once, each batch `x[idx]` with `idx` from a per-epoch `torch.randperm`, then
  `zero_grad / forward / F.mse_loss / backward / step`. No `DataLoader`, no resume, no
  metrics kept.
- `hand, DataLoader`: the same loop over `DataLoader(TensorDataset(x, y), batch_size=b,
  shuffle=True, drop_last=True)`, as most tutorials write it.
- `Torch()`, `Torch(steps_per_execution=10)` (fused steps), the same with
  `fused_optimizer=True` (torch's fused Adam kernel) and with `compile=True`
  (`torch.compile`; its compile time is reported in the note and not timed):
  `TrainingLoop(...).run()` on core's batching, with history, the loss kept as a tensor
  and fetched every 50 steps.
- on CUDA, also `compile="cuda-graphs"` (torch's CUDA-graph mode).
- `Lightning()`: the Lightning adapter (`Trainer.fit`) on the same `TrainingLoop`.

Timed: steps `warmup+1 .. total` (warm-up: the first 20%), by the wall clock (or, with
`--clock cpu`, by this process's CPU time), with a
core callback (`on_step_end`) on the adapters and the same points in the hand loops.
The table shows the best rate per loop (on a shared machine noise only slows a run
down), the range, and each rate relative to the fastest hand loop and to `Lightning()`.

Targets (issue 21): `Torch()` ≥ 0.95× the indexed hand loop on both MLPs and ≥ 1.5×
`Lightning()` on the small one; the best fused `Torch()` (K=10) ≥ 1.3× the indexed
hand loop on the small MLP.

Cases: (a) MLP 8→256→256→1 (tanh), batch 256; (b) MLP 2→32→1, batch 32.
`--quick`: 3 repeats of 1000 steps. `--json PATH` writes one row per loop and case.
"""

from __future__ import annotations

import argparse
import copy
import functools
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from _shared import apply_quick, make_data, row, write_rows

from pipekit_train.core import TrainingLoop
from pipekit_train.core.callbacks import LambdaCallback
from pipekit_train.core.data import ArrayDataset
from pipekit_train.lightning import LightningModelOp, Torch

LR = 1e-3
SEED = 0


def make_op(in_size: int, width: int, depth: int) -> LightningModelOp:
    """The benchmark MLP as a model operator."""
    return LightningModelOp(
        "pipekit_train.lightning.testing:mlp",
        in_size=in_size,
        out_size=1,
        width=width,
        depth=depth,
        seed=SEED,
    )


TIMERS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


class Clock:
    """Timestamps at the end of step `warmup` and of step `total`.

    `timer`: `time.perf_counter` (wall clock, the default) or `time.process_time` (CPU
    time of this process: on a shared machine it leaves out the time other jobs hold
    the core, so ratios are steadier; every loop here runs on one thread).
    """

    timer: Callable[[], float] = time.perf_counter

    def __init__(self, warmup: int, total: int):
        self.warmup, self.total = warmup, total
        self.t0 = self.t1 = 0.0

    def tick(self, step: int) -> None:
        if step == self.warmup:
            self.t0 = self.timer()
        elif step == self.total:
            self.t1 = self.timer()

    def rate(self) -> float:
        return (self.total - self.warmup) / (self.t1 - self.t0)


# -- hand-written loops ------------------------------------------------------------------------
def hand_indexed(
    data: ArrayDataset, op: LightningModelOp, batch: int, clock: Clock, device: str
) -> None:
    net = copy.deepcopy(op.model).to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    arrays = data.get_batch(np.arange(len(data)))
    x = torch.from_numpy(arrays["x"]).to(device)
    y = torch.from_numpy(arrays["y"]).to(device)
    gen = torch.Generator().manual_seed(SEED)
    per_epoch = len(data) // batch
    step, loss = 0, None
    while step < clock.total:
        perm = torch.randperm(len(data), generator=gen).to(device)
        for i in range(per_epoch):
            idx = perm[i * batch : (i + 1) * batch]
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            step += 1
            if step == clock.total:
                float(loss.detach())
            clock.tick(step)
            if step == clock.total:
                break


def hand_dataloader(
    data: ArrayDataset, op: LightningModelOp, batch: int, clock: Clock, device: str
) -> None:
    net = copy.deepcopy(op.model).to(device).train()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    arrays = data.get_batch(np.arange(len(data)))
    dataset = torch.utils.data.TensorDataset(
        torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["y"])
    )
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=batch,
        shuffle=True,
        drop_last=True,
        generator=torch.Generator().manual_seed(SEED),
        pin_memory=device != "cpu",
    )
    step = 0
    while step < clock.total:
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(net(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            if step == clock.total:
                float(loss.detach())
            clock.tick(step)
            if step == clock.total:
                break


# -- the adapters ----------------------------------------------------------------------------
def adapter_run(
    make_adapter: Callable[[], Any],
    data: ArrayDataset,
    op: LightningModelOp,
    batch: int,
    clock: Clock,
    device: str,
    notes: dict[str, str] | None = None,
) -> None:
    adapter = make_adapter()
    TrainingLoop(
        model=op,
        data=data,
        loss="mse",
        optimizer_config={"name": "adam", "lr": LR},
        batch_size=batch,
        max_steps=clock.total,
        seed=SEED,
        progress=False,
        adapter=adapter,
        callbacks=[LambdaCallback(on_step_end=lambda s: clock.tick(s.step))],
    ).run()
    report = getattr(adapter, "compile_report", None)
    if report and notes is not None:
        notes.setdefault("compile", [])  # type: ignore[arg-type]
        notes["compile"].append(report.get("compile_seconds"))  # type: ignore[attr-defined]


def loops(device: str, *, compile: bool, lightning: bool) -> dict[str, tuple[str, Any]]:
    """key → (label, run(data, op, batch, clock, device, notes))."""
    dev = None if device == "cpu" else device
    out: dict[str, tuple[str, Any]] = {
        "hand": ("hand, indexed tensors (reference)", hand_indexed),
        "loader": ("hand, DataLoader", hand_dataloader),
        "k1": ("Torch()", functools.partial(adapter_run, lambda: Torch(device=dev))),
        "k10": (
            "Torch(steps_per_execution=10)",
            functools.partial(adapter_run, lambda: Torch(steps_per_execution=10, device=dev)),
        ),
        "k10f": (
            "Torch(steps_per_execution=10, fused_optimizer=True)",
            functools.partial(
                adapter_run,
                lambda: Torch(steps_per_execution=10, fused_optimizer=True, device=dev),
            ),
        ),
    }
    if compile:
        out["k10c"] = (
            "Torch(steps_per_execution=10, fused_optimizer=True, compile=True)",
            functools.partial(
                adapter_run,
                lambda: Torch(
                    steps_per_execution=10, fused_optimizer=True, compile=True, device=dev
                ),
            ),
        )
    if compile and device != "cpu":
        out["k10g"] = (
            "Torch(steps_per_execution=10, fused_optimizer=True, compile='cuda-graphs')",
            functools.partial(
                adapter_run,
                lambda: Torch(
                    steps_per_execution=10,
                    fused_optimizer=True,
                    compile="cuda-graphs",
                    device=dev,
                ),
            ),
        )
    if lightning:
        from pipekit_train.lightning import Lightning

        accelerator = "cpu" if device == "cpu" else "gpu"
        out["lightning"] = (
            "Lightning() adapter",
            functools.partial(adapter_run, lambda: Lightning(accelerator=accelerator, devices=1)),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="3 repeats of 1000 steps")
    parser.add_argument("--json", help="also write the result rows (run_all format) here")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--no-compile", action="store_true", help="skip the compile=True loop")
    parser.add_argument("--no-lightning", action="store_true", help="skip the Lightning() loop")
    parser.add_argument("--cases", default="large,small", help="large, small or both")
    parser.add_argument(
        "--clock",
        choices=sorted(TIMERS),
        default="wall",
        help="wall: wall-clock rates (default); cpu: CPU-time rates (steadier on a shared machine)",
    )
    args = parser.parse_args()
    Clock.timer = TIMERS[args.clock]  # builtins: no method binding
    apply_quick(parser, args, {"repeats": 3, "steps": 1000})
    if args.device != "cpu" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA GPU")
    torch.set_num_threads(1)
    total = args.steps - args.steps % 10
    warmup = total // 5 - (total // 5) % 10
    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats}, "
        f"steps {total} (first {warmup} warm-up), device {args.device}, {args.clock} clock",
        flush=True,
    )
    all_cases = {
        "large": ("MLP 8→256→256→1, batch 256", 8, 256, 2, 256),
        "small": ("MLP 2→32→1, batch 32", 2, 32, 1, 32),
    }
    chosen = [all_cases[c] for c in args.cases.split(",")]
    table = loops(args.device, compile=not args.no_compile, lightning=not args.no_lightning)
    rows: list[dict[str, Any]] = []
    for title, in_size, width, depth, batch in chosen:
        if args.device != "cpu":
            title += f", {args.device}"
        data = make_data(in_size, 16384)
        op = make_op(in_size, width, depth)
        runs: dict[str, list[float]] = {key: [] for key in table}
        notes: dict[str, Any] = {}
        order = list(table)
        for r in range(args.repeats):
            shift = r % len(order)
            for key in order[shift:] + order[:shift]:
                clock = Clock(warmup, total)
                fn = table[key][1]
                if key in ("hand", "loader"):
                    fn(data, op, batch, clock, args.device)
                else:
                    fn(data, op, batch, clock, args.device, notes if key == "k10c" else None)
                if args.device != "cpu":
                    torch.cuda.synchronize()
                runs[key].append(clock.rate())
        best = {k: max(v) for k, v in runs.items()}
        ref = best["hand"]
        lit = best.get("lightning")
        print(f"\n{title}")
        print(f"  {'loop':<64} {'best steps/s':>12} {'÷ hand':>8} {'÷ Lightning':>12}  range")
        for key, (label, _) in table.items():
            vs_lit = f"{best[key] / lit:12.2f}" if lit else f"{'':>12}"
            print(
                f"  {label:<64} {best[key]:12.0f} {best[key] / ref:8.2f} {vs_lit}"
                f"  [{min(runs[key]):.0f}–{max(runs[key]):.0f}]",
                flush=True,
            )
        small = in_size == 2
        for key, (label, _) in table.items():
            target, ok = None, None
            if key == "k1":
                target = ">= 0.95 (÷ hand, indexed)"
                ok = best[key] / ref >= 0.95
            elif key in ("k10", "k10f", "k10c", "k10g") and small:
                target = ">= 1.3 (÷ hand, indexed; the best K=10 variant counts)"
                ok = best[key] / ref >= 1.3
            note = f"range {min(runs[key]):.0f}–{max(runs[key]):.0f} steps/s"
            if lit:
                note += f"; {best[key] / lit:.2f}x Lightning()"
                if key == "k1" and small:
                    note += " (target >= 1.5)"
            if key == "k10c" and notes.get("compile"):
                secs = [s for s in notes["compile"] if s is not None]
                if secs:
                    note += f"; first compiled step {min(secs):.1f}–{max(secs):.1f} s (not timed)"
            rows.append(
                row(
                    "torch",
                    f"{title}: {label}",
                    f"steps/s ({args.clock} clock), best of {args.repeats} "
                    f"({total - warmup} timed steps; ratio: ÷ the indexed hand loop)",
                    best[key],
                    "steps/s",
                    ratio=best[key] / ref,
                    target=target,
                    ok=ok,
                    note=note,
                    digits=1,
                )
            )
    if args.json:
        write_rows(args.json, rows)


if __name__ == "__main__":
    main()
