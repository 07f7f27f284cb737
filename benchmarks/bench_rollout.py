"""Ensemble rollouts: the library's device rollout against a hand-written rollout of the
same model, and against the host loop (not part of the test run).

```bash
uv run python benchmarks/bench_rollout.py                       # 7 rounds of 500 steps
uv run python benchmarks/bench_rollout.py --backends equinox --members 64
uv run python benchmarks/bench_rollout.py --quick --json /tmp/rollout.json   # run_all convention
```

One model, an 8 → 64 → 64 → 8 tanh MLP (`testing:mlp`, width 64, depth 2, the same
initial weights on every backend), used as a residual emulator with the core
`Normalizer`: each step normalises the state, runs the model, de-normalises the
increment and adds it (`NeuralForward(op, normalizer, residual=True)`). An ensemble of
`n` states (1, 64, 1024) is advanced `--steps` steps (500) and every state comes back to
the host as numpy, on each backend:

- `library`: `NeuralForward.rollout(ensemble, steps)` (what `Cycle(forward, steps).run`
  runs): jax — one jitted `lax.fori_loop` of core's step with the finiteness check inside;
  torch — a `torch.no_grad()` loop on tensors, one vectorised finiteness check at the end.
- `hand`: the same math written by hand, without checks: jax (Equinox, Keras on jax) —
  one `eqx.filter_jit`-ed `lax.scan` whose outputs are the states; torch — a no-grad loop appending
  each state to a list and one `torch.stack`.
- `host loop`: `Cycle(forward, steps, hook=...)` with a per-step no-op hook, which keeps
  the host path of before the device rollout: numpy in, the model, numpy out, checks in
  Python, per step.

Each backend runs in a process of its own. Each round runs every variant of a case once, in a rotating order, after a warm-up call
(compilation excluded). Rates are ensemble steps per second; the table shows the best
rate over the rounds, and the ratio is paired: library ÷ hand in the same round, median
over the rounds. Target (issue 33): library ≥ 0.9× the hand-written rollout at
ensembles of 64 and 1024. `--quick`: 3 rounds of 200 steps. `--device cuda` puts the
torch module and the hand loop's tensors on the GPU (jax and Keras on jax take jax's
default device: the GPU where jax has one); `scripts/gpu_check.py` runs it so. torch runs with one
intra-op thread (`--torch-threads`): on a shared 2-core machine two threads made its
rates swing by 10× from round to round.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from _shared import apply_quick, cpu_model, git_commit, make_parser, mlp_op, row, write_rows

os.environ.setdefault("KERAS_BACKEND", "jax")

BACKENDS = ("equinox", "torch", "keras")
MEMBERS = (1, 64, 1024)
D, WIDTH, DEPTH = 8, 64, 2
TARGET = 0.9
QUICK = {"steps": 200, "rounds": 3}
VARIANTS = ("library", "hand", "host loop")
LOAD_AT_START = os.getloadavg()


def _normalizer() -> Any:
    from pipekit_train.core.data import Normalizer

    rng = np.random.default_rng(0)
    return Normalizer(
        {"x": rng.uniform(-1, 1, D), "y": rng.uniform(-0.01, 0.01, D)},
        {"x": rng.uniform(0.5, 2, D), "y": rng.uniform(0.005, 0.02, D)},
    )


def _op(backend: str, device: str = "cpu") -> Any:
    op = mlp_op(backend, D, WIDTH, DEPTH, out_size=D)
    if backend == "torch":
        op.model.to(device)  # the device rollout runs where the module's parameters are
    return op


def _hand(backend: str, op: Any, norm: Any, steps: int) -> Callable[[np.ndarray], np.ndarray]:
    """The hand-written rollout of the same model and step, returning every state as numpy."""
    xm, xs, ym, ys = (np.asarray(a, np.float32) for a in (*_stats(norm, "x"), *_stats(norm, "y")))
    if backend == "torch":
        import torch

        module = op.model.eval()
        device = next(module.parameters()).device
        txm, txs, tym, tys = (torch.from_numpy(a).to(device) for a in (xm, xs, ym, ys))

        def hand_torch(x0: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                x = torch.from_numpy(x0.astype(np.float32)).to(device)
                states = [x]
                for _ in range(steps):
                    x = x + module((x - txm) / txs) * tys + tym
                    states.append(x)
                return torch.stack(states).cpu().numpy()  # (waits for the device)

        return hand_torch
    import jax
    import jax.numpy as jnp

    if backend == "equinox":
        model = op.model

        def apply(params: Any, x: Any) -> Any:
            return jax.vmap(params)(x)

        params: Any = model
    else:
        keras_model = op.model
        params = None  # read at each call: Keras's predict donates the variables' buffers

        def apply(params: Any, x: Any) -> Any:
            return keras_model.stateless_call(params[0], params[1], x, training=False)[0]

    import equinox as eqx

    @eqx.filter_jit
    def scan(params: Any, x0: Any) -> Any:
        def body(x: Any, _: Any) -> Any:
            x = x + apply(params, (x - xm) / xs) * ys + ym
            return x, x

        return jax.lax.scan(body, x0, None, length=steps)[1]

    def hand_jax(x0: np.ndarray) -> np.ndarray:
        x = jnp.asarray(x0, jnp.float32)
        p = params
        if p is None:
            p = (
                [v.value for v in keras_model.trainable_variables],
                [v.value for v in keras_model.non_trainable_variables],
            )
        return np.concatenate([x0.astype(np.float32)[None], np.asarray(scan(p, x))])

    return hand_jax


def _stats(norm: Any, key: str) -> tuple[np.ndarray, np.ndarray]:
    return norm.mean[key], norm.std[key]


def bench_case(
    backend: str, members: int, args: argparse.Namespace, say: Callable[[str], None]
) -> dict[str, Any]:
    """Best rates and per-round library ÷ hand ratios of one case."""
    from pipekit_train.core import Cycle, NeuralForward

    op, norm = _op(backend, args.device), _normalizer()
    forward = NeuralForward(op, normalizer=norm, residual=True)
    x0 = np.random.default_rng(1).uniform(-1, 1, (members, D))
    steps = args.steps
    host_steps = max(10, steps // 10) if members > 64 or backend == "keras" else steps
    variants: dict[str, tuple[Callable[[], Any], int]] = {
        "library": (lambda: forward.rollout(x0, steps), steps),
        "hand": ((lambda f: lambda: f(x0))(_hand(backend, op, norm, steps)), steps),
        "host loop": (
            lambda: Cycle(forward, host_steps, hook=lambda k, s: None).run(x0),
            host_steps,
        ),
    }
    lib, hand = variants["library"][0](), variants["hand"][0]()
    np.testing.assert_allclose(lib, hand, rtol=1e-3, atol=1e-4)  # the same rollout
    variants["host loop"][0]()
    best = dict.fromkeys(VARIANTS, 0.0)
    ratios: list[float] = []
    for r in range(args.rounds):
        order = VARIANTS[r % 3 :] + VARIANTS[: r % 3]
        rates = {}
        for name in order:
            fn, n = variants[name]
            gc.collect()
            t0 = time.perf_counter()
            fn()
            rates[name] = n / (time.perf_counter() - t0)
            best[name] = max(best[name], rates[name])
        ratios.append(rates["library"] / rates["hand"])
        say(
            f"  {backend:8s} n={members:5d} round {r + 1}: "
            + ", ".join(f"{k} {v:10.0f}" for k, v in rates.items())
            + " steps/s"
        )
    return {"best": best, "ratio": statistics.median(ratios), "host_steps": host_steps}


def case_rows(backend: str, members: int, res: dict[str, Any], args: argparse.Namespace) -> list:
    best, ratio = res["best"], res["ratio"]
    metric = f"ensemble steps/s, {args.steps} steps, best of {args.rounds} rounds"
    target = members in (64, 1024)
    hand_name = "torch no-grad loop" if backend == "torch" else "jitted lax.scan"
    rows = [
        row(
            "rollout",
            f"{backend}, ensemble {members}: NeuralForward.rollout",
            metric + " (ratio: x hand, paired, median of rounds)",
            best["library"],
            "steps/s",
            ratio=ratio,
            target=f">= {TARGET}" if target else None,
            ok=ratio >= TARGET if target else None,
            digits=0,
        ),
        row(
            "rollout",
            f"{backend}, ensemble {members}: hand-written ({hand_name})",
            metric,
            best["hand"],
            "steps/s",
            digits=0,
        ),
        row(
            "rollout",
            f"{backend}, ensemble {members}: host-loop Cycle (per-step hook)",
            f"ensemble steps/s, {res['host_steps']} steps, best of {args.rounds} rounds "
            "(ratio: x hand)",
            best["host loop"],
            "steps/s",
            ratio=best["host loop"] / best["hand"],
            digits=0,
        ),
    ]
    for r, variant in zip(rows, VARIANTS, strict=True):
        r.update(backend=backend, members=members, variant=variant)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table of the run, from its rows (three per case)."""
    lines = [
        "| backend | ensemble | library `rollout` | hand-written | library ÷ hand | "
        "host-loop `Cycle` | host ÷ hand |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for i in range(0, len(rows) - 2, 3):
        lib, hand, host = rows[i : i + 3]
        lines.append(
            f"| {lib['backend']} | {lib['members']} | {lib['value']:,.0f} | {hand['value']:,.0f} "
            f"| {lib['ratio']:.2f}× | {host['value']:,.0f} | {host['ratio']:.2f}× |"
        )
    return "\n".join(lines)


def in_subprocesses(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each backend in a process of its own (jax's and torch's thread pools never meet)."""
    rows: list[dict[str, Any]] = []
    for backend in args.backends:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [sys.executable, __file__, "--backends", backend, "--json", str(out)]
            cmd += ["--steps", str(args.steps), "--rounds", str(args.rounds)]
            cmd += ["--torch-threads", str(args.torch_threads), "--device", args.device]
            cmd += ["--members"]
            cmd += [str(m) for m in args.members]
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=False)
            print("\n".join(line for line in proc.stdout.splitlines() if line.startswith("  ")))
            if proc.returncode:
                raise SystemExit(f"{backend}: exit {proc.returncode}")
            rows += json.loads(out.read_text())
    return rows


def main() -> None:
    parser = make_parser(
        __doc__,
        quick_help="3 rounds of 200 steps",
        device="cpu",
        device_help="torch's device (cuda: the module and the hand loop's tensors on the GPU); "
        "jax and Keras on jax use jax's default device (set JAX_PLATFORMS=cpu for the CPU)",
        markdown_help="also write the table, with the machine and the command, to this file "
        "(benchmarks/rollout.md: run_all puts it on docs/performance.md)",
    )
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--members", nargs="+", type=int, default=list(MEMBERS))
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch's intra-op threads (default 1: steadier on a shared machine)",
    )
    args = parser.parse_args()
    apply_quick(parser, args, QUICK)
    rows: list[dict[str, Any]] = []
    if len(args.backends) > 1:
        rows = in_subprocesses(args)
    else:
        if args.backends[0] == "torch":
            import torch

            torch.set_num_threads(args.torch_threads)
        for members in args.members:
            res = bench_case(args.backends[0], members, args, print)
            rows += case_rows(args.backends[0], members, res, args)
    print()
    print(table(rows))
    if args.json:
        write_rows(args.json, rows)
    if args.markdown:
        Path(args.markdown).write_text(markdown(rows, args))


def markdown(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The table as a page section: what was run, where and when."""
    import datetime as dt

    cpu = cpu_model()
    flags = " ".join(
        [f"--steps {args.steps}", f"--rounds {args.rounds}"] + (["--quick"] if args.quick else [])
    )
    when = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    commit = git_commit()
    load = ", ".join(f"{v:.1f}" for v in LOAD_AT_START)
    where = "CPU only" if args.device == "cpu" else "torch on CUDA, jax on its default device"
    return "\n".join(
        [
            f"Measured with `uv run python benchmarks/bench_rollout.py {flags} --markdown "
            f"benchmarks/rollout.md` on {when} at commit {commit}, on {cpu} ({os.cpu_count()} cores, shared with "
            f"other jobs: load average {load} at the start), {where}. Ensemble steps per second (best of the rounds); "
            "library ÷ hand is paired per round (median); the target is ≥ 0.9× at ensembles "
            "of 64 and 1024. The host loop at 1024 members (and on Keras) ran a tenth of the "
            "steps.",
            "",
            table(rows),
            "",
        ]
    )


if __name__ == "__main__":
    main()
