"""Execute the documentation notebooks and save their outputs in place.

    uv run python scripts/execute_notebooks.py                 # every notebook in docs/notebooks
    uv run python scripts/execute_notebooks.py quickstart.ipynb

The docs site renders the notebooks with the outputs stored in them (mkdocs-jupyter,
`execute: false`), so run this after editing a notebook and commit the result.
`tests-integration/test_notebooks.py` executes a copy of each with fewer steps and checks
that the stored outputs are there and free of errors.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "docs" / "notebooks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="notebook file names (default: all)")
    args = parser.parse_args()
    paths = [NOTEBOOKS / n for n in args.names] or sorted(NOTEBOOKS.glob("*.ipynb"))
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.pop("PIPEKIT_NOTEBOOK_STEPS", None)  # the notebooks' own (full) settings
    for path in paths:
        if not path.is_file():
            sys.exit(f"no such notebook: {path}")
        t0 = time.perf_counter()
        nb = nbformat.read(path, as_version=4)
        client = nbclient.NotebookClient(
            nb,
            timeout=1200,
            kernel_name="python3",
            resources={"metadata": {"path": str(NOTEBOOKS)}},
        )
        client.execute()
        for cell in nb.cells:  # keep diffs small: no run-specific metadata
            cell.get("metadata", {}).pop("execution", None)
        nbformat.write(nb, path)
        print(f"{path.name}: executed in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
