"""GPU check: train on every backend on a CUDA GPU, then run the benchmarks' GPU cases.

On a Linux x86-64 machine with an NVIDIA GPU and a driver for CUDA 13 (580 or newer),
from the repository root, one command (a few minutes on one H200):

    uv run --group gpu python scripts/gpu_check.py --output benchmarks/gpu-check.md

`--group gpu` adds jax's CUDA 13 plugin from PyPI (`jax[cuda13]`, the version of the
locked jaxlib; see the workspace `pyproject.toml`); torch's Linux x86-64 wheels on PyPI
are CUDA 13 builds already and share the same `nvidia-*` libraries. Without a CUDA GPU
the script stops at once with exit status 2. The same checks run on CPU, in seconds,
with small sizes (this is what `tests-integration/test_gpu_check.py` runs):

    uv run python scripts/gpu_check.py --device cpu --quick --backends equinox --skip-bench

Per backend (Equinox, Lightning, Keras on jax; `--backends` also takes `keras-torch`),
in a fresh interpreter each, on the same MLP 8->256->256->1 regression (batch 256, Adam):

- **placement**: where the trained parameters live (jax: the arrays' devices; Lightning:
  the module's parameters during `fit`, read by a Lightning callback). Passes when every
  parameter is on the GPU (`--device cpu`: on the CPU).
- **bf16**: the run with `precision="bfloat16-mixed"` (the spec's name; every adapter
  translates it) trains (finite, lower final loss than its first step) and differs
  from the float32 run (a float32 run in disguise would match it bit for bit), with the
  framework's own evidence (Equinox's jmp policy, the dtype a Lightning layer computes
  in under autocast, the Keras dtype policy).
- **resume**: a float32 run stopped after `k` steps (checkpoint) and resumed to `n`,
  compared with an uninterrupted run of `n` steps with the same checkpoint policy, and
  a second uninterrupted run (is the backend deterministic on this device at all?):
  "bit-exact" (same `weights_sha256`) or the largest absolute weight difference. The
  children ask for deterministic kernels (`XLA_FLAGS=--xla_gpu_deterministic_ops=true`,
  `CUBLAS_WORKSPACE_CONFIG=:4096:8`, `Lightning(deterministic=True)`). Resume passes when
  it is bit-exact, or when the repeated uninterrupted run differs too (the backend is
  not deterministic there) and the resumed run is as close as the repeat.

Then `Torch(compile="cuda-graphs")` (`--skip-graphs` leaves it out; CUDA only), per case
(K=1, K=10, bf16-mixed, and K=10 with accumulation, a schedule, clipping and EMA):
`pipekit_train.lightning.testing.graphs_check` trains a graphed run, the same stopped and
resumed, and an eager one, and `graphs_failures` judges it as the CUDA tests
(`packages/lightning/tests/test_lightning_graphs.py`) do: the update was captured as a
CUDA graph and did not fall back to eager (a fallback only warns), the resumed run is
bit-exact, and the final loss is within `GRAPHS_LOSS_RTOL` (1e-2, relative) of eager's.

Then the side-by-side benchmarks, on the GPU: `benchmarks/bench_equinox.py --quick
--skip-rss`, `bench_lightning.py --quick --accelerator gpu`, `bench_torch.py --quick
--device cuda` and `bench_keras.py --quick` (jax): the adapter's steps/s against the
hand-written loops (`ratio`); from bench_torch's rows, a table of `Torch()`'s compile
modes (eager, `compile=True`, `"cuda-graphs"`, at K=1 and K=10). Then the ensemble
rollouts (`bench_rollout.py --quick --members 64 1024 --device cuda`): the library's
`NeuralForward.rollout` against a hand-written rollout of the same emulator per backend
(Equinox and Keras on jax: a jitted `lax.scan`; torch: a no-grad loop on tensors on the
GPU) and the host loop, in a table of their own ("Ensemble rollouts"). Last (`--skip-compute`
leaves it out), `bench_compute.py --device cuda`: the compute-bound MLP (64 → 4096 ×3 →
64, batch 4096, 0.84 TFLOP per step) per backend in float32 and bf16 against its hand
loop (Keras: `model.fit`), K=10 against K=1, and TFLOP/s with the share of the bf16 peak
(a "Compute-bound" table). The output is Markdown (a machine line and the tables);
`--output benchmarks/gpu-check.md` keeps it where `benchmarks/run_all.py` puts it on
`docs/performance.md` ("On a GPU").

On a GPU node without a package registry whose python3 already holds torch and jax with
CUDA: `scripts/gpu_bundle.sh` (on a connected machine) builds the project's wheels and
downloads the few missing dependencies into `.gpu/`, and `scripts/gpu_run.sh OUTDIR`
(on the node) installs them beside the node's packages and runs this script with that
python (CONTRIBUTING.md, "Running the GPU check on an offline node").

Exit status: 0 all checks pass, 1 a check failed (the tables mark it ❌, and stderr names
each failed check), 2 no CUDA GPU (or a framework that cannot see it).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the plumbing the benchmarks share (`_shared`)

from _shared import (  # noqa: E402
    NO_GPU,
    NoGpu,
    build_adapter,
    child_env,
    child_main,
    cuda_devices,
    git_commit,
    make_data,
    make_parser,
    mlp_op,
    run_child,
)

BACKENDS = ("equinox", "lightning", "keras-jax", "keras-torch")
DEFAULT_BACKENDS = ("equinox", "lightning", "keras-jax")
INSTALL = "uv run --group gpu python scripts/gpu_check.py"


# -- one backend, in a child process -----------------------------------------------------------
def _probe() -> Any:
    """A Lightning callback: parameter devices and a layer's output dtype during `fit`."""
    import lightning as L
    import torch

    class Probe(L.Callback):
        def __init__(self) -> None:
            self.devices: set[str] = set()
            self.dtypes: set[str] = set()

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            layer = next(m for m in pl_module.modules() if isinstance(m, torch.nn.Linear))
            layer.register_forward_hook(lambda m, i, out: self.dtypes.add(str(out.dtype)))

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if not self.devices:
                self.devices = {p.device.type for p in pl_module.parameters()}

    return Probe()


def _adapter(backend: str, device: str, precision: str, probe: Any) -> Any:
    """The backend's adapter in `precision`; Lightning's on `device`, deterministic, with
    the `probe`."""
    options: dict[str, Any] = {"precision": precision}
    if backend == "lightning":
        accelerator = "gpu" if device == "cuda" else "cpu"
        options.update(accelerator=accelerator, devices=1, deterministic=True, callbacks=[probe])
    return build_adapter(backend, **options)


def _placement(backend: str, op: Any, probe: Any) -> set[str]:
    """Where the parameters live: `"gpu"`/`"cuda"` or `"cpu"` per parameter, as a set."""
    if backend == "lightning":
        return set(probe.devices)
    if backend == "equinox":
        import equinox as eqx
        import jax

        leaves = jax.tree.leaves(eqx.filter(op.model, eqx.is_array))
        return {d.platform for leaf in leaves for d in leaf.devices()}
    if backend == "keras-jax":
        return {d.platform for v in op.model.weights for d in v.value.devices()}
    return {v.value.device.type for v in op.model.weights}


def _weights(backend: str, op: Any) -> list[Any]:
    import numpy as np

    if backend == "equinox":
        import equinox as eqx
        import jax

        return [np.asarray(x) for x in jax.tree.leaves(eqx.filter(op.model, eqx.is_array))]
    if backend == "lightning":
        return [t.detach().float().cpu().numpy() for t in op.model.state_dict().values()]
    import keras

    return [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in op.model.weights]


def _max_abs_diff(a: list[Any], b: list[Any]) -> float:
    import numpy as np

    return max(float(np.max(np.abs(x.astype(np.float64) - y))) for x, y in zip(a, b, strict=True))


def _bf16_evidence(backend: str, adapter: Any, probe: Any) -> str:
    if backend == "equinox":
        return f"jmp policy {adapter.policy}"
    if backend == "lightning":
        return f"Linear output dtype under autocast: {', '.join(sorted(probe.dtypes)) or '?'}"
    return f"Keras dtype policy {adapter.precision}"


def child(args: argparse.Namespace) -> dict[str, Any]:
    """Train `args.child` four times and check placement, bf16 and resume (see the docstring)."""
    backend, device = args.child, args.device
    t_start = time.perf_counter()
    from pipekit_train.core import Checkpoint, TrainingLoop

    data = make_data(8, args.rows)
    if device == "cpu":
        expected = {"cpu"}
    else:  # jax names the platform "gpu", torch the device type "cuda"
        expected = {"gpu"} if backend in ("equinox", "keras-jax") else {"cuda"}
    out: dict[str, Any] = {"backend": backend, "device": device}
    seen = _framework_devices(backend, device)
    out["framework_device"] = seen
    work = Path(tempfile.mkdtemp(prefix=f"gpu-check-{backend}-"))

    def train(precision: str, steps: int, ckpt: str | None) -> tuple[Any, Any, Any, float]:
        probe = _probe() if backend == "lightning" else None
        adapter = _adapter(backend, device, precision, probe)
        loop = TrainingLoop(
            model=mlp_op(backend, 8, args.width, 2),
            data=data,
            loss="mse",
            optimizer_config={"name": "adam", "lr": 1e-3},
            batch_size=args.batch,
            max_steps=steps,
            seed=0,
            checkpoint=None
            if ckpt is None
            else Checkpoint(work / ckpt, every_n_steps=args.stop_at, async_save=False),
            adapter=adapter,
            progress=False,
        )
        t0 = time.perf_counter()
        artifact = loop.run()
        return artifact, adapter, probe, time.perf_counter() - t0

    n, k = args.steps, args.stop_at
    first, _, probe, first_s = train("float32", n, "uninterrupted")
    out["placement"] = sorted(_placement(backend, first.model, probe))
    out["placement_ok"] = set(out["placement"]) == expected
    out["float32_loss"] = first.final_metrics["loss"]
    out["first_run_s"] = first_s
    again, _, _, _ = train("float32", n, "repeat")
    stopped, _, _, _ = train("float32", k, "resumed")
    resumed, _, _, _ = train("float32", n, "resumed")
    out["resumed_from_step"] = resumed.resumed_from_step
    w_first = _weights(backend, first.model)
    out["repeat_bit_exact"] = again.weights_sha256 == first.weights_sha256
    out["repeat_max_abs_diff"] = _max_abs_diff(w_first, _weights(backend, again.model))
    out["resume_bit_exact"] = resumed.weights_sha256 == first.weights_sha256
    out["resume_max_abs_diff"] = _max_abs_diff(w_first, _weights(backend, resumed.model))
    out["resume_ok"] = resumed.resumed_from_step == k and (
        out["resume_bit_exact"]
        or (
            not out["repeat_bit_exact"]
            and out["resume_max_abs_diff"] <= 10 * max(out["repeat_max_abs_diff"], 1e-7)
        )
    )
    del stopped
    bf16, adapter, probe, _ = train("bfloat16-mixed", n, None)
    loss = bf16.final_metrics["loss"]
    start_loss = bf16.history["loss"][0]
    out["bf16_loss"] = loss
    out["bf16_rel_diff"] = abs(loss - out["float32_loss"]) / max(abs(out["float32_loss"]), 1e-12)
    out["bf16_evidence"] = _bf16_evidence(backend, adapter, probe)
    if backend == "lightning":
        out["bf16_placement"] = sorted(probe.devices)
    out["bf16_ok"] = (
        math.isfinite(loss)
        and loss < start_loss
        and bf16.weights_sha256 != first.weights_sha256
        and out["bf16_rel_diff"] < 0.25
    )
    out["child_s"] = time.perf_counter() - t_start
    return out


def _framework_devices(backend: str, device: str) -> str:
    """What the framework sees; raises `NoGpu` when it sees no GPU and one was asked for."""
    if backend in ("equinox", "keras-jax"):
        import jax

        try:
            devices = jax.devices()
        except RuntimeError as exc:  # e.g. a broken CUDA plugin
            raise NoGpu(
                f"jax cannot start its CUDA backend ({exc}). Install it: {INSTALL}"
            ) from exc
        if device == "cuda" and devices[0].platform != "gpu":
            raise NoGpu(
                f"jax sees no GPU (devices: {devices}). Install jax's CUDA plugin: {INSTALL}"
            )
        return f"jax {jax.__version__}: {devices[0].device_kind} ({devices[0].platform})"
    import torch

    if device == "cuda":
        if not torch.cuda.is_available():
            raise NoGpu(
                f"torch {torch.__version__} sees no GPU (a CPU-only build?). Install the CUDA "
                f"build from PyPI: {INSTALL}"
            )
        return f"torch {torch.__version__}: {torch.cuda.get_device_name(0)} (cuda)"
    return f"torch {torch.__version__}: cpu"


def run_backend(backend: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run the checks of one backend in a fresh interpreter; its result, or the error."""
    cmd = [sys.executable, __file__, "--child", backend, "--device", args.device]
    cmd += ["--steps", str(args.steps), "--stop-at", str(args.stop_at), "--width", str(args.width)]
    cmd += ["--batch", str(args.batch), "--rows", str(args.rows)]
    print(f"== {backend}: {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    env = child_env(backend, args.device, deterministic=True)
    result = run_child(cmd, env=env, timeout=args.timeout, cwd=ROOT)
    if "error" in result:
        return {"backend": backend, **result}
    print(f"   {backend}: {result['child_s']:.0f} s", file=sys.stderr, flush=True)
    return result


# -- Torch(compile="cuda-graphs"): resume and agreement with eager ---------------------------
GRAPH_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("K=1", {}),
    ("K=10", {"steps_per_execution": 10}),
    ("bf16-mixed", {"precision": "bfloat16-mixed"}),
    (
        "K=10, accumulate 2, cosine schedule, clip, EMA",
        {
            "steps_per_execution": 10,
            "accumulate": 2,
            "optimizer": {
                "name": "adamw",
                "lr": {"schedule": "cosine", "init_value": 1e-3, "decay_steps": 60},
                "clip_norm": 1.0,
                "ema": 0.99,
            },
        },
    ),
)


def run_graphs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """`pipekit_train.lightning.testing.graphs_check` per case, in one fresh interpreter."""
    code = (
        "import json, sys\n"
        "from pipekit_train.lightning.testing import graphs_check\n"
        "for name, opts in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        out = graphs_check('cuda', **opts)\n"
        "    except Exception as exc:\n"
        "        out = {'error': f'{type(exc).__name__}: {exc}'[:300]}\n"
        "    print('GRAPHS ' + json.dumps({'case': name, **out}, default=str), flush=True)\n"
    )
    cases = [list(case) for case in GRAPH_CASES]
    print("== torch cuda-graphs checks", file=sys.stderr, flush=True)
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code, json.dumps(cases)],
            env=child_env("lightning", "cuda", deterministic=True),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=args.timeout,
        )
    except subprocess.TimeoutExpired:
        return [{"case": "(all)", "error": f"timed out after {args.timeout:.0f} s"}]
    rows = [
        json.loads(x[len("GRAPHS ") :]) for x in proc.stdout.splitlines() if x.startswith("GRAPHS ")
    ]
    if not rows:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        rows = [{"case": "(all)", "error": f"exit {proc.returncode}: {tail}"}]
    return rows


def graph_failures(row: dict[str, Any]) -> dict[str, str]:
    """The failed checks of one cuda-graphs row: the CUDA tests' verdict
    (`pipekit_train.lightning.testing.graphs_failures`), or the error the case raised."""
    if "error" in row:
        return {"error": str(row["error"])}
    from pipekit_train.lightning.testing import graphs_failures

    return graphs_failures(row)


def graphs_table(rows: list[dict[str, Any]]) -> list[str]:
    from pipekit_train.lightning.testing import GRAPHS_LOSS_RTOL

    out = [
        "| case | capture | resumed at 30 of 60 vs uninterrupted "
        "| final loss graphed / eager (rel. diff) | OK |",
        "|---|---|---|---|:---:|",
    ]
    for r in rows:
        failed = graph_failures(r)
        if "error" in failed:
            out.append(f"| {r['case']} | ❌ {failed['error']} | | | ❌ |")
            continue
        report = r.get("report") or {}
        if report.get("fell_back") is not None:
            capture = f"fell back to eager: {report['fell_back']}"
        elif report.get("captured_at_update") is None:
            capture = "never captured"
        else:
            capture = f"captured at update {report['captured_at_update']}"
        resume = (
            "bit-exact"
            if r.get("resume_bit_exact")
            else f"differs (resumed from {r.get('resumed_from_step')})"
        )
        loss = (
            f"{_fmt(r.get('graphed_loss'))} / {_fmt(r.get('eager_loss'))} "
            f"({_fmt(r.get('loss_rel_diff'))})"
        )
        out.append(
            f"| {r['case']} | {capture} {_mark('capture' not in failed)} | "
            f"{resume} {_mark('resume' not in failed)} | {loss} {_mark('loss' not in failed)} | "
            f"{_mark(not failed)} |"
        )
    out += [
        "",
        "Passes when the update was captured as a CUDA graph and never fell back to eager, "
        "the resumed run is bit-exact, and the final loss is within "
        f"{GRAPHS_LOSS_RTOL:g} (relative) of eager's (`graphs_failures`, the CUDA tests' "
        "verdict).",
    ]
    return out


def failures(
    results: list[dict[str, Any]],
    bench: list[dict[str, Any]] | None,
    graphs: list[dict[str, Any]] | None,
) -> list[str]:
    """Every failed check, named (`backend: check`, `cuda-graphs case: check: why`, ...);
    empty when the run passes. Any entry makes the exit status 1."""
    out = []
    for r in results:
        if "error" in r:
            out.append(f"{r['backend']}: {r['error']}")
            continue
        out += [f"{r['backend']}: {c}" for c in ("placement", "bf16", "resume") if not r[f"{c}_ok"]]
    for r in bench or []:
        if r.get("value") is None and r.get("ok") is False:
            out.append(f"benchmark {r.get('benchmark')}, {r.get('case')}: {r.get('note')}")
    for r in graphs or []:
        out += [f"cuda-graphs {r['case']}: {c}: {why}" for c, why in graph_failures(r).items()]
    return out


# -- the benchmarks ----------------------------------------------------------------------------
def bench_commands(
    device: str, *, compute: bool = True
) -> list[tuple[str, list[str], dict[str, str]]]:
    """The benchmark scripts to run on `device`, with their flags and environment."""
    jax_env = {"JAX_PLATFORMS": "cpu"} if device == "cpu" else {}  # else jax's default: the GPU
    accelerator = "cpu" if device == "cpu" else "gpu"
    commands = [
        ("bench_equinox", ["--quick", "--skip-rss"], jax_env),
        ("bench_lightning", ["--quick", "--accelerator", accelerator], {}),
        # Torch(): K=1, K=10, fused optimizer, compile=True; on CUDA also compile=True at
        # K=1 and compile="cuda-graphs" at K=1 and K=10
        ("bench_torch", ["--quick", "--device", "cpu" if device == "cpu" else "cuda"], {}),
        ("bench_keras", ["--quick", "--backend", "jax"], jax_env),
        # ensemble rollouts (issue 33): NeuralForward.rollout against a hand-written
        # rollout per backend (jax lax.scan, torch no-grad loop, Keras on jax), 64 and 1024
        (
            "bench_rollout",
            [
                "--quick",
                "--members",
                "64",
                "1024",
                "--device",
                "cpu" if device == "cpu" else "cuda",
            ],
            jax_env,
        ),
    ]
    if compute:
        # the compute-bound MLP (full sizes on the GPU; each backend in its own child,
        # which sets its own environment)
        flags = ["--device", "cpu", "--quick"] if device == "cpu" else ["--device", "cuda"]
        commands.append(("bench_compute", flags, {}))
    return commands


def run_benchmarks(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the benchmark scripts (run_all's `--json` convention); their rows."""
    rows: list[dict[str, Any]] = []
    for name, flags, extra in bench_commands(args.device, compute=not args.skip_compute):
        fd, path = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        cmd = [sys.executable, str(BENCHMARKS / f"{name}.py"), *flags, "--json", path]
        print(f"== {name} {' '.join(flags)}", file=sys.stderr, flush=True)
        env = {**child_env(), **extra}
        try:
            proc = subprocess.run(
                cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=args.bench_timeout
            )
            ok = proc.returncode == 0
            why = f"exit {proc.returncode}: {(proc.stderr.strip().splitlines() or [''])[-1]}"
        except subprocess.TimeoutExpired:
            ok, why = False, f"timed out after {args.bench_timeout:.0f} s"
        try:
            if ok:
                rows += json.loads(Path(path).read_text())
            else:
                rows.append(
                    {
                        "benchmark": name.removeprefix("bench_"),
                        "case": "(the script)",
                        "value": None,
                        "unit": "",
                        "ratio": None,
                        "ok": False,
                        "note": why,
                    }
                )
        finally:
            Path(path).unlink(missing_ok=True)
    return rows


# -- the report --------------------------------------------------------------------------------
def _fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        if x == 0:
            return "0"
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}g}"
    return str(x)


def _mark(ok: Any) -> str:
    return {True: "✅", False: "❌"}.get(ok, "")


def machine_line(device: str, gpus: list[str], driver: str) -> str:
    versions = []
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "torch", "lightning", "keras"):
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    where = (
        f"{gpus[0]} ({driver})"
        if device == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})"
    )
    return (
        f"{where}; {os.cpu_count()} CPUs; Python {platform.python_version()}; "
        f"{', '.join(versions)}; {_dt.datetime.now(_dt.UTC):%Y-%m-%d %H:%M UTC}"
    )


def commit() -> str:
    """The checkout's commit (`git`, see `_shared.git_commit`), or the one
    `scripts/gpu_bundle.sh` built the bundle at (`.gpu/MANIFEST.txt`, on a node without
    git), or `unknown`."""
    sha = git_commit()
    if sha != "unknown":
        return sha
    manifest = ROOT / ".gpu" / "MANIFEST.txt"
    if manifest.exists():
        for line in manifest.read_text().splitlines():
            if line.startswith("commit "):
                return line.split()[1].rstrip(",") + " (the bundle's)"
    return "unknown"


def backend_table(results: list[dict[str, Any]], args: argparse.Namespace) -> list[str]:
    lines = [
        f"| backend | framework sees | params on | bf16-mixed: loss vs float32 | resume at {args.stop_at} of {args.steps} | "
        "repeat run | first run s | all runs s | OK |",
        "| --- | --- | --- | --- | --- | --- | ---: | ---: | :---: |",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['backend']} | {r['error']} | | | | | | | ❌ |")
            continue
        bf16 = (
            f"{_fmt(r['bf16_loss'], 4)} vs {_fmt(r['float32_loss'], 4)} "
            f"(rel. diff {_fmt(r['bf16_rel_diff'], 2)}); {r['bf16_evidence']}"
        )
        resume = (
            "bit-exact"
            if r["resume_bit_exact"]
            else f"max abs diff {_fmt(r['resume_max_abs_diff'], 2)}"
        )
        repeat = (
            "bit-exact"
            if r["repeat_bit_exact"]
            else f"max abs diff {_fmt(r['repeat_max_abs_diff'], 2)}"
        )
        ok = r["placement_ok"] and r["bf16_ok"] and r["resume_ok"]
        lines.append(
            f"| {r['backend']} | {r['framework_device']} | {', '.join(r['placement'])} "
            f"{_mark(r['placement_ok'])} | {bf16} {_mark(r['bf16_ok'])} | {resume} "
            f"{_mark(r['resume_ok'])} | {repeat} | {r['first_run_s']:.1f} | {r['child_s']:.0f} | "
            f"{_mark(ok)} |"
        )
    return lines


def _rate(r: dict[str, Any] | None, *, tflops: bool = False) -> str:
    if r is None:
        return "–"
    if r.get("value") is None:
        return "failed"
    text = f"{r['value']:,.1f}"
    if tflops and r.get("tflops") is not None:
        text += f" ({_fmt(r['tflops'])})"
    return text


def compute_table(rows: list[dict[str, Any]]) -> list[str]:
    """`bench_compute.py`'s rows, one line per backend and precision."""
    lines = [
        "| backend | precision | reference: steps/s (TFLOP/s) | library K=1 | K=1 ÷ reference | "
        "library K=10 | K=10 ÷ K=1 | bf16: TFLOP/s, share of peak | OK |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | :---: |",
    ]
    groups: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r.get("backend"), r.get("precision")), {})[str(r.get("loop"))] = r
    for (backend, precision), loops in groups.items():
        if precision is None:  # the backend's child failed
            r = next(iter(loops.values()))
            note = str(r.get("note") or "").replace("|", "\\|")
            lines.append(f"| {backend} | failed: {note} | | | | | | | ❌ |")
            continue
        hand, k1, k10, peak = (loops.get(k) for k in ("hand", "k1", "k10", "peak"))
        reference = str((hand or {}).get("case", "")).rsplit(": ", 1)[-1]
        reference = reference.removesuffix(" (reference)")
        share = "–"
        if peak is not None and peak.get("value") is not None:
            share = f"{_fmt(peak['value'])}, {peak['ratio']:.1%}"
            if peak.get("target"):
                share += f" (target {peak['target']})"
        oks = [r.get("ok") for r in (k1, k10, peak) if r is not None and r.get("ok") is not None]
        lines.append(
            f"| {backend} | {precision} | {reference}: {_rate(hand, tflops=True)} | "
            f"{_rate(k1, tflops=True)} | {_fmt((k1 or {}).get('ratio'))} | "
            f"{_rate(k10, tflops=True)} | {_fmt((k10 or {}).get('ratio'))} | {share} | "
            f"{_mark(all(oks)) if oks else ''} |"
        )
    return lines


#: the `Torch()` loops of `bench_torch.py` by compile mode and K (its rows' `loop` keys)
COMPILE_MODES = (
    ("k1", "eager, K=1"),
    ("k1c", "compile=True, K=1"),
    ("k1g", '"cuda-graphs", K=1'),
    ("k10", "eager, K=10"),
    ("k10c", "compile=True, K=10 (fused optimizer)"),
    ("k10g", '"cuda-graphs", K=10'),
)


def compile_table(rows: list[dict[str, Any]]) -> list[str]:
    """`Torch()`'s compile modes from `bench_torch.py`'s rows: steps/s (÷ eager K=1)."""
    cases: dict[str, dict[str, dict[str, Any]]] = {}
    for r in rows:
        if r.get("benchmark") == "torch" and r.get("loop"):
            title = str(r.get("case", "")).split(": ", 1)[0]
            cases.setdefault(title, {})[str(r["loop"])] = r
    if not cases:
        return []
    lines = [
        "| case | " + " | ".join(label for _, label in COMPILE_MODES) + " |",
        "| --- |" + " ---: |" * len(COMPILE_MODES),
    ]
    failures = []
    for title, loops in cases.items():
        eager = (loops.get("k1") or {}).get("value")
        cells = []
        for key, label in COMPILE_MODES:
            r = loops.get(key)
            if r is None:
                cells.append("–")
            elif r.get("value") is None:
                cells.append("failed ❌")
                failures.append(f"{title}, {label}: {r.get('note') or 'no value'}")
            else:
                times = f" ({r['value'] / eager:.2f}×)" if eager else ""
                cells.append(f"{r['value']:,.0f}{times}")
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "steps/s (÷ eager `Torch()` K=1 in the same run); – : not run (the CUDA-only modes "
        "on the CPU, or `--no-compile`)."
    )
    for failure in failures:
        lines.append(f"- {failure}")
    return lines


def rollout_table(rows: list[dict[str, Any]]) -> list[str]:
    """bench_rollout's rows (library, hand, host loop per backend and ensemble), one line each
    case; a failed script's row as it is."""
    lines = [
        "| backend | ensemble | library `rollout` | hand-written | library ÷ hand | OK "
        "| host-loop `Cycle` | host ÷ hand |",
        "| --- | ---: | ---: | ---: | ---: | :---: | ---: | ---: |",
    ]
    cases: dict[tuple[Any, Any], dict[str, dict[str, Any]]] = {}
    for r in rows:
        if "variant" not in r:  # the script failed: its one row says why
            lines.append(f"| (bench_rollout) | | | | | ❌ | | {r.get('note') or ''} |")
            continue
        cases.setdefault((r["backend"], r["members"]), {})[r["variant"]] = r
    for (backend, members), case in cases.items():
        lib, hand, host = (case.get(v, {}) for v in ("library", "hand", "host loop"))
        lines.append(
            f"| {backend} | {members} | {_fmt(lib.get('value'))} | {_fmt(hand.get('value'))} | "
            f"{_fmt(lib.get('ratio'))} | {_mark(lib.get('ok'))} | {_fmt(host.get('value'))} | "
            f"{_fmt(host.get('ratio'))} |"
        )
    return lines


def bench_table(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| benchmark | case | steps/s | ratio | target | OK | note |",
        "| --- | --- | ---: | ---: | --- | :---: | --- |",
    ]
    for r in rows:
        note = str(r.get("note") or "").replace("|", "\\|")
        lines.append(
            f"| {r.get('benchmark')} | {r.get('case')} | {_fmt(r.get('value'))} | "
            f"{_fmt(r.get('ratio'))} | {r.get('target') or ''} | {_mark(r.get('ok'))} | {note} |"
        )
    return lines


def report(
    results: list[dict[str, Any]],
    bench: list[dict[str, Any]] | None,
    args: argparse.Namespace,
    machine: str,
    graphs: list[dict[str, Any]] | None = None,
) -> str:
    title = "GPU" if args.device == "cuda" else "CPU (--device cpu)"
    lines = [
        f"### Backends on the {title}",
        "",
        f"Command: `{' '.join(['python', 'scripts/gpu_check.py', *args.argv])}`  ",
        f"Commit: `{commit()}`  ",
        f"Machine: {machine}",
        "",
        f"MLP 8→{args.width}→{args.width}→1, batch {args.batch}, Adam 1e-3, {args.steps} steps; "
        f"resume: stopped after {args.stop_at} steps and resumed, against an uninterrupted run "
        '("repeat run": a second uninterrupted run against the first).',
        "",
        *backend_table(results, args),
        "",
    ]
    if graphs is not None:
        lines += [
            '### `Torch(compile="cuda-graphs")`: the whole update as one CUDA graph',
            "",
            "`pipekit_train.lightning.testing.graphs_check`: MLP 8→64→64→1, batch 64, Adam "
            "1e-3, 60 updates: a graphed run stopped after 30 and resumed against an "
            "uninterrupted graphed run, and the graphed run's final loss against eager "
            "`Torch()`'s.",
            "",
            *graphs_table(graphs),
            "",
        ]
    if bench is not None:
        rollout = [r for r in bench if r.get("benchmark") == "rollout"]
        bench = [r for r in bench if r.get("benchmark") != "rollout"]
        overhead = [r for r in bench if r.get("benchmark") != "compute"]
        compute = [r for r in bench if r.get("benchmark") == "compute"]
        lines += [
            f"### Benchmarks on the {title}",
            "",
            "`benchmarks/bench_equinox.py --quick --skip-rss`, `bench_lightning.py --quick "
            f"--accelerator {'gpu' if args.device == 'cuda' else 'cpu'}`, `bench_torch.py "
            f"--quick --device {args.device}`, `bench_keras.py --quick` (ratio: the case's "
            "steps/s ÷ its reference loop, see each script).",
            "",
            *bench_table(overhead),
            "",
        ]
        modes = compile_table(overhead)
        if modes:
            lines += ["#### `Torch()` compile modes", "", *modes, ""]
        if rollout:
            lines += [
                "#### Ensemble rollouts",
                "",
                "`benchmarks/bench_rollout.py --quick --members 64 1024 --device "
                f"{args.device}`: `NeuralForward.rollout` against the hand-written rollout of "
                "the same 8→64→64→8 MLP emulator (jax: a jitted `lax.scan`; torch: a no-grad "
                "loop on tensors) and the host loop (`Cycle` with a per-step hook); ensemble "
                "steps per second, best of 3 rounds of 200 steps; library ÷ hand paired per "
                "round (median). Target (issue 33): ≥ 0.9× at 64 and 1024 members.",
                "",
                *rollout_table(rollout),
                "",
            ]
        if compute:
            sizes = (
                "the CPU sizes (`--device cpu --quick`: MLP 64→128×3→64, batch 256; "
                "targets not judged)"
                if args.device == "cpu"
                else "MLP 64→4096×3→64 (ReLU), batch 4096, 34.1M parameters, 0.84 TFLOP per "
                "step (6 × parameters × batch)"
            )
            lines += [
                "#### Compute-bound",
                "",
                f"`benchmarks/bench_compute.py`: {sizes}; Adam, mse; steady state (steps 11–110 "
                "on the GPU), synchronised. The reference is the hand loop with its batches on "
                "the device (Keras: `model.fit`); the library feeds from host arrays. Targets "
                "(issue 38): K=1 ≥ 0.95× the reference, K=10 ≥ 0.95× K=1, bf16 ≥ 60% (Equinox, "
                "Keras-jax) or 50% (`Torch()`) of the peak.",
                "",
                *compute_table(compute),
                "",
            ]
    return "\n".join(lines)


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = make_parser(
        __doc__,
        quick_help="small sizes: 20 steps, width 32",
        json_help="also write every result as JSON to PATH",
        device="cuda",
        device_help="cuda, or cpu: the same checks on the CPU",
    )
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(DEFAULT_BACKENDS))
    p.add_argument("--skip-bench", action="store_true", help="only the backend checks")
    p.add_argument(
        "--skip-graphs", action="store_true", help='skip the Torch(compile="cuda-graphs") checks'
    )
    p.add_argument(
        "--skip-compute",
        action="store_true",
        help="skip benchmarks/bench_compute.py (the compute-bound MLP)",
    )
    p.add_argument("--steps", type=int, default=None, help="steps per run (default 200)")
    p.add_argument(
        "--stop-at", type=int, default=None, help="where the resumed run stops (steps/2)"
    )
    p.add_argument("--width", type=int, default=None, help="MLP width (default 256)")
    p.add_argument("--batch", type=int, default=None, help="batch size (default 256)")
    p.add_argument("--rows", type=int, default=None, help="training samples (default 16384)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per backend")
    p.add_argument("--bench-timeout", type=float, default=600.0, help="seconds per benchmark")
    p.add_argument("--output", type=Path, default=None, help="also write the Markdown here")
    p.add_argument("--child", choices=BACKENDS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    small = {"steps": 20, "width": 32, "batch": 32, "rows": 1024}
    large = {"steps": 200, "width": 256, "batch": 256, "rows": 16384}
    for name, value in (small if args.quick else large).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.stop_at is None:
        args.stop_at = args.steps // 2
    for name in ("steps", "width", "batch", "rows"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be positive. Received: {getattr(args, name)}.")
    if not 0 < args.stop_at < args.steps:
        p.error(
            f"--stop-at must be between 1 and --steps - 1. Received: --stop-at {args.stop_at}, "
            f"--steps {args.steps}."
        )
    if args.batch > args.rows:
        p.error(
            f"--batch must not exceed --rows. Received: --batch {args.batch}, --rows {args.rows}."
        )
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.child:
        return child_main(lambda: child(args))
    gpus, driver = cuda_devices() if args.device == "cuda" else ([], "")
    if args.device == "cuda" and not gpus:
        print(
            f"gpu_check: no CUDA GPU: {driver}. This script checks training on a CUDA GPU; run "
            f"it on a machine with one ({INSTALL}), or `--device cpu --quick` to try its logic "
            "on the CPU.",
            file=sys.stderr,
        )
        return NO_GPU
    machine = machine_line(args.device, gpus, driver)
    t0 = time.perf_counter()
    results = [run_backend(b, args) for b in args.backends]
    no_gpu = [r for r in results if r.get("no_gpu")]
    if no_gpu:
        for r in no_gpu:
            print(f"gpu_check: {r['backend']}: {r['error']}", file=sys.stderr)
        return NO_GPU
    graphs = run_graphs(args) if args.device == "cuda" and not args.skip_graphs else None
    bench = None if args.skip_bench else run_benchmarks(args)
    text = report(results, bench, args, machine, graphs)
    print(text)
    print(f"gpu_check: {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    failed = failures(results, bench, graphs)
    for check in failed:
        print(f"gpu_check: FAILED {check}", file=sys.stderr)
    if args.output:
        args.output.write_text(text)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "machine": machine,
                    "backends": results,
                    "graphs": graphs,
                    "benchmarks": bench,
                    "failed": failed,
                },
                indent=2,
            )
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
