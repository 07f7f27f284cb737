"""Execute the documentation notebooks; store their outputs, or check the stored ones.

    uv run python scripts/execute_notebooks.py                   # run all, store the outputs
    uv run python scripts/execute_notebooks.py quickstart.ipynb  # one notebook
    uv run python scripts/execute_notebooks.py --check           # exit 1 if any is stale

The docs site renders the notebooks with the outputs stored in them (mkdocs-jupyter,
`execute: false`). `tests-integration/test_notebooks.py` makes the same run as `--check`:
it executes each notebook as written, in a fresh folder outside the repository, and
compares the outputs with the stored ones (`differences`). So a notebook whose code, or
whose library behaviour, changed since its outputs were stored fails until this script
stores them again.

What is compared: per code cell, the kinds of output (text, figure, error); the text
with timings, temporary paths, hashes and addresses masked and numbers rounded to two
significant digits (so another CPU's last-digit rounding is not a change); and each
figure's size and pixels (a figure differs when more than `PIXEL_TOLERANCE` of its
pixels differ, as a new title or axis label does).
"""

from __future__ import annotations

import argparse
import base64
import io
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import nbclient
import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "docs" / "notebooks"
PIXEL_TOLERANCE = 0.002  # fraction of a figure's pixels that may differ

_MASKS = [
    (re.compile(r"\d+(\.\d+)?\s?s\b"), "<time>"),  # "2.0s", "48 s"
    (re.compile(r"\d+(\.\d+)? steps/s"), "<rate>"),
    (re.compile(r"/tmp/[\w./-]+"), "<tmp>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (re.compile(r"0x[0-9a-f]+"), "<address>"),
]
_NUMBER = re.compile(r"-?\d+\.\d+(e-?\d+)?|-?\d+e-?\d+")


def _text(text: str) -> str:
    for pattern, mask in _MASKS:
        text = pattern.sub(mask, text)
    return _NUMBER.sub(lambda m: f"{float(m[0]):.2g}", text).strip()


def _outputs(cell: Any) -> list[tuple[str, Any]]:
    """A cell's outputs in comparable form: (kind, value)."""
    found: list[tuple[str, Any]] = []
    for out in cell.get("outputs", []):
        kind = out.get("output_type")
        if kind == "stream":
            found.append(("text", _text(out.get("text", ""))))
        elif kind == "error":
            found.append(("error", f"{out.get('ename')}: {out.get('evalue')}"))
        else:
            data = out.get("data", {})
            if "image/png" in data:
                found.append(("png", data["image/png"]))
            elif "text/plain" in data:
                found.append(("text", _text(data["text/plain"])))
    return found


def _pixels(png_b64: str) -> Any:
    import matplotlib.image

    return matplotlib.image.imread(io.BytesIO(base64.b64decode(png_b64)), format="png")


def _figure_difference(stored: str, fresh: str) -> str | None:
    if stored == fresh:
        return None
    a, b = _pixels(stored), _pixels(fresh)
    if a.shape != b.shape:
        return f"figure size {a.shape[1]}x{a.shape[0]} is now {b.shape[1]}x{b.shape[0]}"
    changed = float((abs(a - b).max(axis=-1) > 0.1).mean())
    if changed > PIXEL_TOLERANCE:
        return f"{changed:.1%} of the figure's pixels differ"
    return None


def differences(stored: Any, fresh: Any) -> list[str]:
    """What differs between the stored outputs of a notebook and a fresh run's."""
    problems: list[str] = []
    old = [c for c in stored.cells if c.cell_type == "code"]
    new = [c for c in fresh.cells if c.cell_type == "code"]
    if [c.source for c in old] != [c.source for c in new]:
        return ["the code cells differ from the notebook that ran"]
    for number, (a, b) in enumerate(zip(old, new, strict=True), start=1):
        if not a.get("execution_count"):
            problems.append(f"cell {number} has no stored outputs (it was not run)")
        oa, ob = _outputs(a), _outputs(b)
        if [k for k, _ in oa] != [k for k, _ in ob]:
            problems.append(
                f"cell {number}: stored outputs {[k for k, _ in oa]}, now {[k for k, _ in ob]}"
            )
            continue
        for (kind, va), (_, vb) in zip(oa, ob, strict=True):
            if kind == "png":
                why = _figure_difference(va, vb)
                if why:
                    problems.append(f"cell {number}: {why}")
            elif va != vb:
                problems.append(f"cell {number}: stored {va!r}\n  now    {vb!r}")
    return problems


def execute(path: Path, workdir: Path) -> Any:
    """Run a copy of the notebook at `path` top to bottom, in `workdir`."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    for cell in nb.cells:  # keep diffs small: no run-specific metadata
        cell.get("metadata", {}).pop("execution", None)
    return nb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: all)")
    parser.add_argument(
        "--check", action="store_true", help="compare with the stored outputs; write nothing"
    )
    args = parser.parse_args()
    paths = [NOTEBOOKS / n for n in args.names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    stale = []
    for path in paths:
        if not path.is_file():
            sys.exit(f"no such notebook: {path}")
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as workdir:
            nb = execute(path, Path(workdir))
        if args.check:
            problems = differences(nbformat.read(path, as_version=4), nb)
            if problems:
                stale.append(path.name)
                print(f"{path.name}: stale stored outputs:\n  " + "\n  ".join(problems))
        else:
            nbformat.write(nb, path)
        print(f"{path.name}: executed in {time.perf_counter() - t0:.0f} s")
    if stale:
        sys.exit(f"stale: {stale}; run `uv run python scripts/execute_notebooks.py` and commit")


if __name__ == "__main__":
    main()
