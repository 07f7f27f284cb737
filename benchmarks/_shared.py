"""The plumbing the `benchmarks/bench_*.py` scripts (and `scripts/gpu_check.py`) share.

- Results: `row` and `write_rows` (the run_all JSON schema), `make_data` (the synthetic
  regression data of the adapter-vs-hand-written benchmarks).
- Arguments: `make_parser`, the convention's flags (`--quick`, `--json PATH` and the
  optional `--repeats`, `--device`, `--markdown`); `apply_quick`.
- Backends: `backend_entry` (a benchmark's backend name, e.g. `keras-jax`, to core's
  `BackendEntry`), `build_model_op`, `mlp_op` and `build_adapter` built from it.
- Child processes: `child_env`, `child_main` and `print_result` (in the child),
  `run_child` and `read_result` (in the parent), `cuda_devices`.
- Clocks: `Clock` (the steps `warmup+1 .. total` of one loop, alone or taking turns with
  a `Baton`), `interleaved_round`, `keras_epoch_ticks`.
- Machine: `cpu_model`, `git_commit`.

The schema and the convention are in the docstring of `benchmarks/run_all.py`. This
module is not named `bench_*`, so run_all does not run it as a benchmark. The scripts
run as `python benchmarks/bench_<topic>.py` (run_all runs them the same way), which puts
`benchmarks/` first on `sys.path`, so they import it as `from _shared import row, write_rows`;
`scripts/gpu_check.py` puts `benchmarks/` on `sys.path` itself. Nothing heavy is imported
at module level: `bench_keras.py` sets `KERAS_BACKEND` after importing it.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

#: The exit status of a script (or a child) that was asked for a GPU and sees none.
NO_GPU = 2
#: The line prefixes a `--child` process reports on: its result (JSON), or why it saw no GPU.
RESULT, NOGPU = "RESULT ", "NOGPU "


# -- result rows -------------------------------------------------------------------------------
def _rounded(number: float | None, digits: int | None) -> float | None:
    if number is None or digits is None:
        return number
    return round(float(number), digits)


def row(
    benchmark: str,
    case: str,
    metric: str,
    value: float | None,
    unit: str,
    *,
    ratio: float | None = None,
    target: str | None = None,
    ok: bool | None = None,
    note: str | None = None,
    digits: int | None = 3,
    ratio_digits: int | None = 3,
) -> dict[str, Any]:
    """One result row, with every key of the schema in its order.

    `value` is rounded to `digits` decimals and `ratio` to `ratio_digits` (as floats;
    `None` digits: left as given). A `None` value or ratio stays `None` (null: not
    measured, or no reference). `ok` is a plain bool or `None`; an empty `note` is `None`.
    """
    return {
        "benchmark": benchmark,
        "case": case,
        "metric": metric,
        "value": _rounded(value, digits),
        "unit": unit,
        "ratio": _rounded(ratio, ratio_digits),
        "target": target,
        "ok": None if ok is None else bool(ok),
        "note": note or None,
    }


def write_rows(path: str | Path, rows: Iterable[dict[str, Any]]) -> None:
    """Write `rows` to `path` as a JSON list (indent 2), the file run_all reads."""
    Path(path).write_text(json.dumps(list(rows), indent=2))


def make_data(in_size: int, rows: int) -> Any:
    """A synthetic float32 regression `ArrayDataset`: `y = sum(sin(x)) + 0.1 noise`."""
    import numpy as np

    from pipekit_train.core.data import ArrayDataset

    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, in_size)).astype(np.float32)
    y = (np.sin(x).sum(axis=1, keepdims=True) + 0.1 * rng.standard_normal((rows, 1))).astype(
        np.float32
    )
    return ArrayDataset(x=x, y=y)


# -- arguments ---------------------------------------------------------------------------------
def make_parser(
    doc: str | None,
    *,
    quick_help: str = "a short run: the same cases, fewer repeats or smaller sizes",
    json_help: str = "also write the result rows (run_all's JSON schema) to PATH",
    repeats: int | None = None,
    repeats_help: str = "best of this many runs",
    device: str | None = None,
    device_help: str = "cpu or cuda",
    markdown_help: str | None = None,
) -> argparse.ArgumentParser:
    """An argument parser with the flags of the convention in `benchmarks/run_all.py`.

    Always `--quick` and `--json PATH` (`args.quick`, `args.json`: run_all passes both to a
    script that builds its parser here); the others on request. The script adds its own.

    Args:
        doc: the script's docstring; its first paragraph is the description.
        quick_help: what `--quick` shortens.
        json_help: what `--json PATH` writes.
        repeats: the default of `--repeats N`; None: no `--repeats`.
        repeats_help: what `--repeats` counts.
        device: the default of `--device {cpu,cuda}`; None: no `--device`.
        device_help: what `--device` places.
        markdown_help: what `--markdown PATH` writes; None: no `--markdown`.

    Returns:
        The parser.
    """
    description = " ".join((doc or "").split("\n\n")[0].split()) or None
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help=quick_help)
    parser.add_argument("--json", metavar="PATH", help=json_help)
    if repeats is not None:
        parser.add_argument(
            "--repeats", type=int, default=repeats, help=f"{repeats_help} (default %(default)s)"
        )
    if device is not None:
        parser.add_argument("--device", choices=("cpu", "cuda"), default=device, help=device_help)
    if markdown_help is not None:
        parser.add_argument("--markdown", metavar="PATH", help=markdown_help)
    return parser


def apply_quick(
    parser: argparse.ArgumentParser, args: argparse.Namespace, quick: dict[str, Any]
) -> None:
    """With `--quick`, set each option in `quick` to its short-run value unless given explicitly.

    An option counts as given when its value differs from the parser's default.
    """
    if not getattr(args, "quick", False):
        return
    for name, value in quick.items():
        if getattr(args, name) == parser.get_default(name):
            setattr(args, name, value)


# -- backends ----------------------------------------------------------------------------------
def registered_name(name: str) -> str:
    """The registered backend a benchmark's backend name stands for.

    A benchmark names a backend by its `pipekit_train.backends` name (`equinox`,
    `lightning`, `torch`, `keras`), with a variant after a dash where it runs one
    several ways: `keras-jax` and `keras-torch` (Keras on that `KERAS_BACKEND`),
    `equinox-fused`, `lightning-trainer`.
    """
    return name.partition("-")[0]


def keras_backend(name: str) -> str | None:
    """The `KERAS_BACKEND` a benchmark's backend name asks for (`keras-jax`: jax), or None."""
    registered, _, variant = name.partition("-")
    return variant if registered == "keras" and variant else None


def backend_entry(name: str) -> Any:
    """Core's `BackendEntry` of a benchmark's backend name (see `registered_name`).

    Raises:
        ConfigError: no such backend is installed.
    """
    from pipekit_train.core.utils import load_backend

    return load_backend(registered_name(name))


def backend_package(name: str) -> str:
    """The package of a backend's adapter (`pipekit_train.equinox`), where its
    non-testing factories (`deep_set`) live."""
    return backend_entry(name).adapter.partition(":")[0]


def build_model_op(name: str, factory: str, /, **kwargs: Any) -> Any:
    """The model operator of backend `name` wrapping `factory`.

    Args:
        name: a benchmark's backend name.
        factory: `"module:function"`, or a bare name: that function of the backend's
            testing module (`mlp`, `conv_net`).
        **kwargs: the model operator's keyword arguments (the factory's, and `seed`).
    """
    entry = backend_entry(name)
    path = factory if ":" in factory else f"{entry.testing}:{factory}"
    return entry.model_op_class()(path, **kwargs)


def mlp_op(
    name: str,
    in_size: int,
    width: int,
    depth: int,
    *,
    out_size: int = 1,
    seed: int = 0,
    **options: Any,
) -> Any:
    """The benchmark MLP (`testing:mlp`: in → width × depth → out) of backend `name`.

    `options` go to the factory as they are (`activation`).
    """
    sizes = {"in_size": in_size, "out_size": out_size, "width": width, "depth": depth}
    return build_model_op(name, "mlp", **sizes, seed=seed, **options)


def build_adapter(name: str, /, **options: Any) -> Any:
    """The adapter of backend `name` (`torch`: `Torch()`), built with `options`; without
    options it is the one `TrainingLoop` picks for that backend's model operator."""
    return backend_entry(name).adapter_class()(**options)


# -- child processes ---------------------------------------------------------------------------
def child_env(
    backend: str | None = None, device: str | None = None, *, deterministic: bool = False
) -> dict[str, str]:
    """The environment of a child interpreter that runs one backend.

    This process's environment with unbuffered output, and:

    - `KERAS_BACKEND` where `backend` asks for one (`keras-jax`, `keras-torch`);
    - with `device="cpu"`: jax on the CPU, and no CUDA device visible;
    - with another device and `deterministic`: deterministic GPU kernels (XLA's
      deterministic ops, cuBLAS's fixed workspace), unless the environment already
      sets them; jax takes the GPU by default, the child checks that it did.
    """
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    keras = keras_backend(backend or "")
    if keras is not None:
        env["KERAS_BACKEND"] = keras
    if device == "cpu":
        env["JAX_PLATFORMS"] = "cpu"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif device is not None and deterministic:
        flags = env.get("XLA_FLAGS", "")
        if "xla_gpu_deterministic_ops" not in flags:
            env["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return env


class NoGpu(RuntimeError):
    """Raised in a child whose framework sees no GPU where one was asked for."""


def print_result(result: dict[str, Any]) -> None:
    """Report a child's result: one `RESULT {json}` line on stdout (see `read_result`)."""
    print(RESULT + json.dumps(result), flush=True)


def child_main(measure: Callable[[], dict[str, Any]]) -> int:
    """Run a child's measurement and report it; the child's exit status.

    `print_result` of what `measure()` returns (status 0), or, where it raises `NoGpu`,
    a `NOGPU why` line (status `NO_GPU`).
    """
    try:
        result = measure()
    except NoGpu as exc:
        print(f"{NOGPU}{exc}", flush=True)
        return NO_GPU
    print_result(result)
    return 0


def _last_line(stdout: str, prefix: str) -> str | None:
    lines = [x for x in stdout.splitlines() if x.startswith(prefix)]
    return lines[-1][len(prefix) :] if lines else None


def read_result(stdout: str) -> dict[str, Any] | None:
    """The result a child reported in `stdout` (its last `RESULT` line), or None."""
    line = _last_line(stdout, RESULT)
    return None if line is None else json.loads(line)


def run_child(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: Path) -> dict[str, Any]:
    """Run a child interpreter; its result, or `{"error": why}`.

    The error dict also holds `"no_gpu": True` when the child saw no GPU (`child_main`).
    On any other failure, the child's stderr (its last 3000 characters) goes to stderr.
    """
    try:
        proc = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=cwd
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    result = read_result(proc.stdout)
    if proc.returncode == 0 and result is not None:
        return result
    no_gpu = _last_line(proc.stdout, NOGPU)
    if no_gpu is not None:
        return {"error": no_gpu, "no_gpu": True}
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    print(proc.stderr[-3000:], file=sys.stderr, flush=True)
    return {"error": f"exit {proc.returncode}: {tail}"}


def cuda_devices() -> tuple[list[str], str]:
    """The CUDA devices the driver shows (names) and the driver's CUDA version, via
    libcuda: no framework is imported.

    Returns `([], why)` when there is no driver or no device (`CUDA_VISIBLE_DEVICES`
    is honoured).
    """
    try:
        cuda = ctypes.CDLL("libcuda.so.1" if sys.platform.startswith("linux") else "nvcuda.dll")
    except OSError:
        return [], "no NVIDIA driver (libcuda not found)"
    if cuda.cuInit(0) != 0:
        return [], "the NVIDIA driver found no usable GPU (cuInit failed)"
    count, version = ctypes.c_int(0), ctypes.c_int(0)
    cuda.cuDriverGetVersion(ctypes.byref(version))
    if cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return [], "the NVIDIA driver shows no GPU (check CUDA_VISIBLE_DEVICES)"
    names = []
    for i in range(count.value):
        device, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        cuda.cuDeviceGet(ctypes.byref(device), i)
        cuda.cuDeviceGetName(name, 256, device)
        names.append(name.value.decode(errors="replace"))
    v = version.value
    return names, f"CUDA {v // 1000}.{v % 1000 // 10} driver"


# -- clocks ------------------------------------------------------------------------------------
class Baton:
    """Lets one of `n` loops (each in its own thread) run at a time, round-robin.

    A loop that holds the baton runs alone (the others wait on a condition), so the loops
    never compete for a core; handing it on every few dozen steps spreads the machine's
    slow and fast seconds over all of them alike.
    """

    def __init__(self, n: int):
        self._cond = threading.Condition()
        self._active = list(range(n))
        self._turn = 0

    def wait(self, i: int) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._turn == i)

    def _next(self, i: int) -> None:
        later = [j for j in self._active if j > i]
        self._turn = (later or self._active or [-1])[0]
        self._cond.notify_all()

    def pass_on(self, i: int) -> None:
        with self._cond:
            self._next(i)

    def finish(self, i: int) -> None:
        with self._cond:
            self._active.remove(i)
            if self._turn == i:
                self._next(i)


def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


class Clock:
    """Times the steps `warmup+1 .. total` of one training loop.

    The loop reports its steps to `tick(step)`: a hand-written loop after each step, a
    Lightning or Keras callback, or core's run (a `Clock` is a core callback, whose
    `on_step_end` ticks each step, and a metric writer, whose `write` ticks each flushed
    step). The clock reads itself at its marks: steps `warmup` and `total`, or, with
    `chunk`, every multiple of `chunk` (then both must be multiples of it). Any other
    step, or a mark read already, changes nothing.

    With a `Baton` (`interleaved_round`), the loop hands it on at every mark before
    `total` and waits for its next turn; the waiting is not timed. Call `start()` first.

    Args:
        warmup: the last untimed step.
        total: the last timed step.
        chunk: read at every multiple of it, not only at `warmup` and `total`.
        baton: the loops' `Baton`, when they take turns.
        index: this loop's turn in the baton's round.
        timer: `time.perf_counter` (wall clock, the default) or `time.process_time`.
        sync: called before each reading (e.g. `torch.cuda.synchronize`, so queued device
            work is counted before the mark that queued it).

    Attributes:
        elapsed: `timer` seconds over the timed steps (what `rate` divides by).
        cpu: the process's CPU seconds over the same steps.
        rss: the process's peak RSS (KiB on Linux) at each mark read.
    """

    def __init__(
        self,
        warmup: int,
        total: int,
        *,
        chunk: int | None = None,
        baton: Baton | None = None,
        index: int = 0,
        timer: Callable[[], float] | None = None,
        sync: Callable[[], Any] | None = None,
    ):
        if chunk is not None and (warmup % chunk or total % chunk):
            raise ValueError(
                f"Received: warmup={warmup}, total={total}, but both must be multiples of "
                f"chunk={chunk}."
            )
        self.warmup, self.total, self.chunk = warmup, total, chunk
        self.baton, self.index = baton, index
        self.timer = timer or time.perf_counter
        self.sync = sync
        self.elapsed = self.cpu = 0.0
        self.rss: dict[int, int] = {}
        self._last = 0  # the last mark read (0: none)
        self._t = self._c = 0.0

    def start(self) -> None:
        """Wait for the first turn (set-up runs alone, untimed) and read the clock."""
        if self.baton is not None:
            self.baton.wait(self.index)
        self._c, self._t = time.process_time(), self.timer()

    def reads_at(self, step: int) -> bool:
        """Whether `tick(step)` reads the clock (a loop may wait for its device first)."""
        if step <= self._last or step > self.total:
            return False
        if self.chunk is not None:
            return step % self.chunk == 0
        return step in (self.warmup, self.total)

    def tick(self, step: int) -> None:
        """Report that step `step` has ended; read the clock at a mark."""
        if not self.reads_at(step):
            return
        if self.sync is not None:
            self.sync()
        now, cpu = self.timer(), time.process_time()  # the time first: the rest is untimed
        if self._last >= self.warmup:
            self.elapsed += now - self._t
            self.cpu += cpu - self._c
        self.rss[step] = _peak_rss()
        self._last = step
        if self.baton is not None and step < self.total:
            self.baton.pass_on(self.index)
            self.baton.wait(self.index)
            cpu, now = time.process_time(), self.timer()
        self._t, self._c = now, cpu

    def on_step_end(self, state: Any) -> None:
        """As a core callback: tick each step."""
        self.tick(state.step)

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """As a core metric writer: tick each flushed step."""
        self.tick(step)

    def steps(self) -> int:
        """The timed steps."""
        return self.total - self.warmup

    def rate(self) -> float:
        """Timed steps per `timer` second."""
        return self.steps() / self.elapsed

    def cpu_us(self) -> float:
        """The process's CPU microseconds per timed step."""
        return self.cpu / self.steps() * 1e6


def interleaved_round(
    runs: list[Any],
    warmup: int,
    total: int,
    chunk: int,
    timer: Any = None,
    sync: Any = None,
    init: Any = None,
) -> list[float]:
    """Run every `runs[i](clock)` in its own thread, one at a time, `chunk` steps a turn;
    each calls `clock.tick(step)` after every step. Returns their steps/s, in order.

    `init` runs first in every thread: per-thread settings go there (with OpenMP,
    `torch.set_num_threads` holds for the calling thread only; a new thread would run
    its kernels on every core again, and the idle team's spinning slows the next loop).
    A loop that raises does not stop the others; the first error is re-raised here.
    """
    baton = Baton(len(runs))
    clocks = [
        Clock(warmup, total, chunk=chunk, baton=baton, index=i, timer=timer, sync=sync)
        for i in range(len(runs))
    ]
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            if init is not None:
                init()
            clocks[i].start()
            runs[i](clocks[i])
        except BaseException as error:  # noqa: BLE001 - reported by the caller
            errors.append(error)
        finally:
            baton.finish(i)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(len(runs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return [clock.rate() for clock in clocks]


def keras_epoch_ticks(clock: Clock, steps_per_epoch: int) -> Any:
    """A Keras callback for `model.fit` that ticks `clock` at the end of each epoch
    (step `epochs done × steps_per_epoch`), after fetching a weight: with no per-step
    callback, nothing else waits for the device. Keeps Keras's default batch dispatch."""
    import keras

    class EpochTicks(keras.callbacks.Callback):
        def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
            keras.ops.convert_to_numpy(self.model.trainable_variables[0].value)
            clock.tick((epoch + 1) * steps_per_epoch)

    return EpochTicks()


# -- the machine -------------------------------------------------------------------------------
def cpu_model() -> str:
    """The CPU's model name (`/proc/cpuinfo`), else what `platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """The checkout's short commit, with " (with uncommitted changes)" when tracked files
    changed since, or "unknown" (no git): what a stored table says it measured."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return sha + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
