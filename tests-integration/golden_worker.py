"""Run the golden-run suite on one backend and write its runs as JSON.

`python golden_worker.py <equinox|lightning|keras> <out.json>` (Keras's backend comes
from `KERAS_BACKEND`). One process per backend: Keras's backend is fixed per process.
"""

from __future__ import annotations

import importlib
import sys
import time
from pathlib import Path


def main(backend: str, out: str) -> None:
    from pipekit_train.core.testing import dump_runs, run_golden

    testing = importlib.import_module(f"pipekit_train.{backend}.testing")
    start = time.perf_counter()
    runs = run_golden(testing.golden_backend())
    Path(out).write_text(dump_runs(runs))
    print(f"{backend}: {len(runs)} cases in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
