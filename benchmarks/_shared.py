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
