"""Run every side-by-side benchmark and write `docs/performance.md`.

    uv run python benchmarks/run_all.py            # full runs (minutes to tens of minutes)
    uv run python benchmarks/run_all.py --quick    # short runs
    uv run python benchmarks/run_all.py --only bench_import bench_checkpoint --output /tmp/perf.md
    uv run python benchmarks/run_all.py --from-stored   # rebuild the page, measuring nothing

The page is made of the CPU run's results and the sections measured elsewhere, each kept
in a file of its own that says where its numbers come from (commit, date, machine,
command) and shown on the page as it is: `benchmarks/rollout.md` (`bench_rollout.py
--markdown`), `benchmarks/rollout-training.md` (`bench_rollout_training.py --markdown`),
`benchmarks/gpu-check.md` (`scripts/gpu_check.py --output`) and `benchmarks/tpu-check.md`
(written by hand on a TPU). A run that writes the page also stores its results, machine
and command in `benchmarks/cpu-results.json`; `--from-stored` renders the page from that
file and the section files, so a changed section reaches the page without measuring
again. `tests-integration/test_docs_reference.py` fails while the page differs from what
`--from-stored` writes: never edit the page by hand, edit its inputs.

Convention for `benchmarks/bench_*.py` (every script follows it; run_all relies on it):

- Runs standalone: `python benchmarks/bench_<topic>.py`, and prints a human-readable
  summary on stdout. Its parser comes from `_shared.make_parser(__doc__, ...)`, which
  adds `--quick` and `--json PATH` (and, on request, `--repeats`, `--device` and
  `--markdown`); the script adds its own flags.
- `--quick`: a short run, seconds to about a minute on a 2-core machine, with the same
  cases and fewer repeats or smaller sizes. run_all passes it when run with `--quick`.
- `--json PATH`: also write the results to PATH as a JSON list of rows:

      {"benchmark": "equinox",            # the topic (usually the script's suffix)
       "case": "adapter, steps_per_execution=10",   # what was measured
       "metric": "steps/s (best of 3)",   # what the value is
       "value": 1234.5,                   # number or null (not measured / failed)
       "unit": "steps/s",
       "ratio": 0.97,                     # value relative to the reference case (e.g. the
                                          # hand-written loop), null if none; say which
                                          # reference in `metric`, `case` or `note`
       "target": ">= 0.95",               # the quality bar as text, null if none
       "ok": true,                        # whether the target is met; null if no target
       "note": "optional free text"}      # optional

  Rows are reported in the order given. A missed target is `"ok": false`, not a
  non-zero exit status. Exit non-zero only if the benchmark could not run.
- Measurements that are compared run interleaved in one process, so that machine noise
  hits both sides. The times are wall-clock times on whatever machine runs them.

run_all runs each script with this interpreter and the flags the script supports: both
`--quick` and `--json` when the script imports `make_parser` from `_shared`, else those of
the two strings its source names. A script without `--json` still runs, and its stdout
goes into the page verbatim. A script
that fails or times out gets a row saying so. The page has one results table plus the
machine it ran on: CPU model, cores, RAM, load, OS, Python, library versions, date and
git commit.
"""

from __future__ import annotations

import argparse
import ast
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # `_shared`, also when loaded by path
from _shared import cpu_model, git_commit  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
#: The tables `scripts/gpu_check.py --output benchmarks/gpu-check.md` wrote on a GPU machine.
GPU_RESULTS = HERE / "gpu-check.md"
#: The ensemble-rollout table `bench_rollout.py --markdown benchmarks/rollout.md` wrote.
ROLLOUT_RESULTS = HERE / "rollout.md"
#: The rollout-training reference `bench_rollout_training.py --markdown ...` wrote.
ROLLOUT_TRAINING_RESULTS = HERE / "rollout-training.md"
#: The tables measured by hand on a TPU (no script writes them).
TPU_RESULTS = HERE / "tpu-check.md"
#: The page, and the stored results of the run that wrote it (`--from-stored` reads them).
PAGE = ROOT / "docs" / "performance.md"
STORED = HERE / "cpu-results.json"
#: The machine table's last load average, taken when the scripts have run.
LOAD_AT_END = "Load average (1, 5, 15 min) at the end"
FIELDS = ("benchmark", "case", "metric", "value", "unit", "ratio", "target", "ok")
LIBRARIES = (
    "pipekit-train-core",
    "pipekit-train-equinox",
    "pipekit-train-lightning",
    "pipekit-train-keras",
    "pipekit-train-sweep",
    "numpy",
    "grain",
    "zarr",
    "xarray",
    "jax",
    "jaxlib",
    "equinox",
    "optax",
    "orbax-checkpoint",
    "torch",
    "lightning",
    "keras",
    "optuna",
    "ray",
)


# -- machine -----------------------------------------------------------------------------------
def _ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 1024**2
    except OSError:
        pass
    return None


def _load() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg())
    except (OSError, AttributeError):
        return "n/a"


def machine_info() -> dict[str, str]:
    """What the page reports about the machine and the software."""
    ram = _ram_gb()
    versions = []
    for name in LIBRARIES:
        try:
            versions.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return {
        "CPU": cpu_model(),
        "Cores": str(os.cpu_count()),
        "RAM": f"{ram:.0f} GB" if ram else "unknown",
        "OS": platform.platform(),
        "Python": platform.python_version(),
        "Libraries": ", ".join(versions),
        "Date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "Load average (1, 5, 15 min) at the start": _load(),
        "Commit": git_commit(),
    }


# -- running the scripts -----------------------------------------------------------------------
def discover(only: list[str] | None, skip: list[str]) -> list[Path]:
    """`benchmarks/bench_*.py`, sorted, filtered by name (with or without `.py`)."""
    scripts = sorted(HERE.glob("bench_*.py"))
    names = lambda items: {i.removesuffix(".py") for i in items}  # noqa: E731
    if only:
        wanted = names(only)
        unknown = wanted - {p.stem for p in scripts}
        if unknown:
            raise SystemExit(
                f"unknown benchmark(s) {sorted(unknown)}; have {[p.stem for p in scripts]}"
            )
        scripts = [p for p in scripts if p.stem in wanted]
    return [p for p in scripts if p.stem not in names(skip)]


def _tail(text: str, lines: int = 3) -> str:
    return " / ".join(line.strip() for line in text.strip().splitlines()[-lines:] if line.strip())


def _uses_shared_parser(source: str) -> bool:
    """Whether a script imports `make_parser` from `_shared` (which adds `--quick` and
    `--json`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    return any(
        isinstance(node, ast.ImportFrom)
        and node.module == "_shared"
        and any(alias.name == "make_parser" for alias in node.names)
        for node in ast.walk(tree)
    )


def supported_flags(source: str) -> tuple[bool, bool]:
    """`(takes --json, takes --quick)` of a script, from its source (see the docstring)."""
    if _uses_shared_parser(source):
        return True, True
    return "--json" in source, "--quick" in source


def run_script(script: Path, *, quick: bool, timeout: float) -> dict[str, Any]:
    """Run one benchmark; return its rows (or its stdout when it has no `--json`)."""
    has_json, has_quick = supported_flags(script.read_text())
    topic = script.stem.removeprefix("bench_")
    cmd = [sys.executable, str(script)]
    if quick and has_quick:
        cmd.append("--quick")
    json_path = None
    if has_json:
        fd, json_path = tempfile.mkstemp(prefix=f"{script.stem}-", suffix=".json")
        os.close(fd)
        cmd += ["--json", json_path]
    env = {
        **os.environ,
        "KERAS_BACKEND": os.environ.get("KERAS_BACKEND", "jax"),
        "PYTHONUNBUFFERED": "1",
    }
    print(f"== {script.name} {' '.join(cmd[2:])}", flush=True)
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env, check=False
        )
        stdout, stderr, code = proc.stdout, proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as exc:
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr, code = f"timed out after {timeout:.0f} s", None
    seconds = time.perf_counter() - t0
    print(stdout, end="" if stdout.endswith("\n") else "\n", flush=True)
    result: dict[str, Any] = {
        "script": script.name,
        "seconds": seconds,
        "rows": [],
        "stdout": None,
        "quick": quick and has_quick,
    }
    try:
        if json_path is not None and code == 0:
            with open(json_path) as fh:
                rows = json.load(fh)
            if not isinstance(rows, list):
                raise ValueError(
                    f"{script.name} wrote {type(rows).__name__}, expected a list of rows"
                )
            result["rows"] = [_normalise(r, topic) for r in rows]
        elif code == 0:
            result["stdout"] = stdout.strip()
        else:
            why = stderr if code is None else f"exit {code}: {_tail(stderr or stdout)}"
            result["rows"] = [_failure(topic, why)]
            print(f"   failed: {why}", flush=True)
    except (OSError, ValueError) as exc:
        result["rows"] = [_failure(topic, f"unreadable --json output: {exc}")]
    finally:
        if json_path is not None:
            Path(json_path).unlink(missing_ok=True)
    return result


def _failure(topic: str, why: str) -> dict[str, Any]:
    return {
        "benchmark": topic,
        "case": "(the script)",
        "metric": "did not complete",
        "value": None,
        "unit": "",
        "ratio": None,
        "target": None,
        "ok": False,
        "note": why,
    }


def _normalise(row: Any, topic: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise ValueError(f"a row must be a JSON object, got {row!r}")
    out = {key: row.get(key) for key in FIELDS}
    out["benchmark"] = out["benchmark"] or topic
    if row.get("note"):
        out["note"] = row["note"]
    return out


# -- the page ----------------------------------------------------------------------------------
def _num(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        if not math.isfinite(value):
            return str(value)
        if value == 0:
            return "0"
        magnitude = abs(value)
        if magnitude >= 1000:
            return f"{value:,.0f}"
        if magnitude >= 0.01:
            return f"{value:.3g}"
        return f"{value:.2e}"
    return str(value)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ") if text is not None else ""


def _ok(ok: Any) -> str:
    return {True: "✅", False: "❌"}.get(ok, "")


def render(
    results: list[dict[str, Any]], machine: dict[str, str], *, quick: bool, command: str
) -> str:
    """The whole `docs/performance.md`."""
    rows = [r for res in results for r in res["rows"]]
    raw = [res for res in results if res["stdout"]]
    missed = [r for r in rows if r["ok"] is False]
    lines = [
        "# Performance",
        "",
        f"Generated by `benchmarks/run_all.py` on {machine.get('Date', 'an unknown date')} at "
        f"commit `{machine.get('Commit', 'unknown')}`.",
        "",
        "Side-by-side benchmarks from `benchmarks/`: each pipekit-train code path is timed next",
        "to the hand-written code it replaces (a plain `eqx.filter_jit` + optax loop, plain",
        "`Trainer.fit`, plain `model.fit`, a numpy batching loop), in the same process and on",
        "the same data. The page is generated; do not edit it by hand. Measure again and",
        "regenerate it with:",
        "",
        "<!-- docs: skip (the full benchmark run, minutes long) -->",
        "```bash",
        command,
        "```",
        "",
        "The sections after Machine were measured elsewhere; each comes from a file of its own",
        "in `benchmarks/` that says where its numbers come from, shown as it is. After editing",
        "one, rebuild the page from them and the CPU run's stored results",
        "(`benchmarks/cpu-results.json`), measuring nothing:",
        "",
        "<!-- docs: skip (rewrites this page) -->",
        "```bash",
        "uv run python benchmarks/run_all.py --from-stored",
        "```",
        "",
        "Absolute times depend on the machine and on whatever else it was running. The ratios",
        "are the numbers to compare. A ratio is the case's value divided by its reference (named",
        "in the metric or the note). **OK** says whether the quality bar in **Target** is met.",
        "",
        '!!! note "' + ("Quick run" if quick else "Full run") + '"',
        "    "
        + (
            "These numbers come from `--quick` runs: fewer repeats and smaller sizes than"
            " a full run, so they are noisier."
            if quick
            else "These numbers come from full runs (no `--quick`)."
        ),
        "",
        "## Results",
        "",
        "| Benchmark | Case | Metric | Value | Unit | Ratio | Target | OK | Note |",
        "| --- | --- | --- | ---: | --- | ---: | --- | :---: | --- |",
    ]
    for r in rows:
        lines.append(
            "| "
            + " | ".join(
                [
                    _cell(r["benchmark"]),
                    _cell(r["case"]),
                    _cell(r["metric"]),
                    _num(r["value"]),
                    _cell(r["unit"]),
                    _num(r["ratio"]),
                    _cell(r["target"]),
                    _ok(r["ok"]),
                    _cell(r.get("note")),
                ]
            )
            + " |"
        )
    if not rows:
        lines.append("| – | no results | | | | | | | |")
    lines += [
        "",
        f"{len(rows)} rows; {len([r for r in rows if r['ok'] is True])} targets met, {len(missed)} missed.",
        "",
    ]
    timing = ", ".join(f"`{res['script']}` {res['seconds']:.0f} s" for res in results)
    lines += ["## Machine", "", "| | |", "| --- | --- |"]
    for key, value in machine.items():
        lines.append(f"| {key} | {_cell(value)} |")
    lines.append(f"| Run time | {timing} |")
    lines.append("")
    lines += rollout_section()
    lines += rollout_training_section()
    lines += gpu_section()
    lines += tpu_section()
    if raw:
        lines += ["## Output of scripts without `--json`", ""]
        for res in raw:
            lines += [f"### `{res['script']}`", "", "```text", res["stdout"], "```", ""]
    return "\n".join(lines).rstrip() + "\n"


def rollout_section() -> list[str]:
    """The page's "Ensemble rollouts" section: `benchmarks/rollout.md` when it exists."""
    if not ROLLOUT_RESULTS.exists():
        return []
    return [
        "## Ensemble rollouts",
        "",
        "`NeuralForward.rollout` (what `Cycle` runs when no per-step hook needs the host)",
        "against a hand-written rollout of the same 8 → 64 → 64 → 8 MLP emulator on each",
        "backend, and the host loop (`Cycle` with a per-step hook), from",
        "`benchmarks/bench_rollout.py` (see its docstring):",
        "",
        ROLLOUT_RESULTS.read_text().strip(),
        "",
    ]


def rollout_training_section() -> list[str]:
    """The page's "Rollout training" section: `benchmarks/rollout-training.md` (its title
    and notes marker left out) when it exists."""
    if not ROLLOUT_TRAINING_RESULTS.exists():
        return []
    text = ROLLOUT_TRAINING_RESULTS.read_text()
    body = "\n".join(x for x in text.splitlines() if not x.startswith(("# ", "<!-- notes")))
    return [
        "## Rollout training",
        "",
        "The library's rollout training (k = 4) on each backend against a hand-written one on",
        "the Lorenz-96 example, from `benchmarks/bench_rollout_training.py` (see its",
        "docstring):",
        "",
        body.strip(),
        "",
    ]


def gpu_section() -> list[str]:
    """The page's "On a GPU" section: how to run `scripts/gpu_check.py`, and its last tables."""
    lines = [
        "## On a GPU",
        "",
        "The results above come from the CPU machine described under Machine.",
        "`scripts/gpu_check.py` trains on every backend on a CUDA GPU (where the parameters",
        'live, `bfloat16-mixed`, exact resume), checks `Torch(compile="cuda-graphs")` (captured',
        "without falling back to eager, exact resume, final loss within 1% of eager's; the",
        "CUDA tests' verdict) and runs the GPU cases of `bench_equinox.py`,",
        "`bench_lightning.py`, `bench_torch.py` (with `Torch()`'s compile modes: eager,",
        '`compile=True` and `"cuda-graphs"` at K=1 and K=10) and `bench_keras.py`, then',
        "`bench_compute.py`: the compute-bound MLP (64 → 4096 ×3 → 64, batch 4096, 0.84 TFLOP",
        "per step) on every backend in float32 and bf16 against its hand loop (Keras:",
        "`model.fit`), with TFLOP/s and the share of the bf16 peak. On a Linux x86-64 machine",
        "with an NVIDIA GPU (a driver for CUDA 13), from the repository root, in a few minutes:",
        "",
        "<!-- docs: skip (needs a CUDA GPU) -->",
        "```bash",
        "uv run --group gpu python scripts/gpu_check.py --output benchmarks/gpu-check.md",
        "```",
        "",
        "`--group gpu` installs jax's CUDA plugin; torch's PyPI wheels for Linux are CUDA builds.",
        "On a GPU node without a package registry whose python3 already holds torch and jax",
        "with CUDA, `scripts/gpu_bundle.sh` (on a connected machine: the project's wheels and",
        "the few missing dependencies, for the node's Python) and `scripts/gpu_run.sh OUTDIR`",
        "(on the node: installs them beside its packages and runs the check with its python)",
        'do the same; see "Running the GPU check on an offline node" in `CONTRIBUTING.md`.',
        "Without a CUDA GPU the script stops with exit status 2;",
        "`python scripts/gpu_check.py --device cpu --quick` runs the same checks on the CPU.",
        "This page shows the tables of `benchmarks/gpu-check.md` when it exists.",
        "",
    ]
    if GPU_RESULTS.exists():
        lines += [GPU_RESULTS.read_text().strip(), ""]
    else:
        lines += ["No GPU run has been recorded yet.", ""]
    return lines


def tpu_section() -> list[str]:
    """The page's "On a TPU" section: `benchmarks/tpu-check.md` when it exists."""
    if not TPU_RESULTS.exists():
        return []
    return [
        "## On a TPU",
        "",
        "Measured by hand on a Google TPU v5e chip, with the project's wheels installed as on",
        "an offline GPU node (`scripts/gpu_bundle.sh`); from `benchmarks/tpu-check.md`:",
        "",
        TPU_RESULTS.read_text().strip(),
        "",
    ]


# -- the stored results ------------------------------------------------------------------------
def store(
    results: list[dict[str, Any]],
    machine: dict[str, str],
    *,
    quick: bool,
    command: str,
    path: Path = STORED,
) -> None:
    """Keep what `render` needs of a run, so that `--from-stored` writes the same page."""
    stored = {"command": command, "quick": quick, "machine": machine, "results": results}
    path.write_text(json.dumps(stored, indent=1, ensure_ascii=False) + "\n")


def render_stored(path: Path = STORED) -> str:
    """The page from the stored results and the section files, measuring nothing."""
    stored = json.loads(path.read_text())
    return render(
        stored["results"], stored["machine"], quick=stored["quick"], command=stored["command"]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="pass --quick to every script that supports it"
    )
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only these scripts (e.g. bench_import)"
    )
    parser.add_argument("--skip", nargs="+", default=[], help="skip these scripts")
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds per script (default: 900 with --quick, 7200 without)",
    )
    parser.add_argument("--output", type=Path, default=PAGE)
    parser.add_argument("--json-out", type=Path, default=None, help="also write every row here")
    parser.add_argument(
        "--from-stored",
        action="store_true",
        help=f"run nothing: write the page from {STORED.relative_to(ROOT)} and the section files",
    )
    args = parser.parse_args(argv)
    timeout = args.timeout or (900.0 if args.quick else 7200.0)
    if args.from_stored:
        if args.quick or args.only or args.skip or args.json_out:
            parser.error(
                "--from-stored measures nothing, so it takes only --output. Received: "
                + " ".join(argv if argv is not None else sys.argv[1:])
            )
        args.output.write_text(render_stored())
        print(f"wrote {args.output} from {STORED.relative_to(ROOT)} and the section files")
        return 0

    scripts = discover(args.only, args.skip)
    if not scripts:
        raise SystemExit("no benchmarks to run")
    machine = machine_info()
    results = [run_script(s, quick=args.quick, timeout=timeout) for s in scripts]
    machine[LOAD_AT_END] = _load()
    command = "uv run python benchmarks/run_all.py" + (" --quick" if args.quick else "")
    if args.only:
        command += " --only " + " ".join(s.stem for s in scripts)
    args.output.write_text(render(results, machine, quick=args.quick, command=command))
    if args.output.resolve() == PAGE:  # the page and its stored inputs change together
        store(results, machine, quick=args.quick, command=command)
    if args.json_out:
        args.json_out.write_text(json.dumps({"machine": machine, "results": results}, indent=2))
    rows = [r for res in results for r in res["rows"]]
    print(
        f"wrote {args.output} ({len(rows)} rows; {sum(r['ok'] is False for r in rows)} targets missed)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
