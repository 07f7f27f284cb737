"""What the `benchmarks/bench_*.py` scripts share: result rows of the run_all JSON schema
and the synthetic regression data of the adapter-vs-hand-written benchmarks.

The schema and the convention are in the docstring of `benchmarks/run_all.py`. This
module is not named `bench_*`, so run_all does not run it as a benchmark. The scripts
run as `python benchmarks/bench_<topic>.py` (run_all runs them the same way), which puts
`benchmarks/` first on `sys.path`, so they import it as `from _shared import row, write_rows`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any


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


# -- interleaved timing ------------------------------------------------------------------------
class Baton:
    """Lets one of `n` loops (each in its own thread) run at a time, round-robin.

    A loop that holds the baton runs alone (the others wait on a condition), so the loops
    never compete for a core; handing it on every few dozen steps spreads the machine's
    slow and fast seconds over all of them alike.
    """

    def __init__(self, n: int):
        import threading

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


class ChunkClock:
    """Times steps `warmup+1 .. total` of one loop in chunks of `chunk` steps, handing the
    `Baton` on after each chunk. Call `tick(step)` after every step (a multiple of `chunk`
    is a hand-over point); the time the loop waits for the baton is not counted.

    `timer`: `time.perf_counter` (wall clock) or `time.process_time` (CPU time);
    `sync`: called before each reading (e.g. `torch.cuda.synchronize`, so queued device
    work is counted in the chunk that queued it).
    """

    def __init__(
        self,
        baton: Baton,
        index: int,
        warmup: int,
        total: int,
        chunk: int,
        timer: Any = None,
        sync: Any = None,
    ):
        import time

        if warmup % chunk or total % chunk:
            raise ValueError(
                f"Received: warmup={warmup}, total={total}, but both must be multiples of "
                f"chunk={chunk}."
            )
        self.baton, self.index, self.chunk = baton, index, chunk
        self.warmup, self.total = warmup, total
        self.timer = timer or time.perf_counter
        self.sync = sync
        self.elapsed = 0.0
        self._t = 0.0

    def start(self) -> None:
        """Wait for the first turn (set-up runs alone, untimed)."""
        self.baton.wait(self.index)
        self._t = self.timer()

    def tick(self, step: int) -> None:
        if step % self.chunk:
            return
        if self.sync is not None:
            self.sync()
        now = self.timer()
        if step - self.chunk >= self.warmup:
            self.elapsed += now - self._t
        if step < self.total:
            self.baton.pass_on(self.index)
            self.baton.wait(self.index)
            self._t = self.timer()

    def rate(self) -> float:
        return (self.total - self.warmup) / self.elapsed


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
    import threading

    baton = Baton(len(runs))
    clocks = [ChunkClock(baton, i, warmup, total, chunk, timer, sync) for i in range(len(runs))]
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
