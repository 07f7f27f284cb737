"""Import time of `pipekit_train.core` and of the adapters, each in a fresh interpreter.

    uv run python benchmarks/bench_import.py [--quick] [--repeats 5] [--json PATH]

`import pipekit_train.core` must stay well under a second and must not import any
backend framework (DESIGN.md §2). Each import runs in a new `python -c` process. The
time is measured inside that process around the `import` statement, so interpreter
start-up is excluded, and the best of `--repeats` runs is kept. The adapters are listed
for reference, next to a bare import of the frameworks they wrap, measured interleaved.
The note lists the frameworks that the adapter's import loads. An adapter that imports
its framework lazily is cheaper than the framework. Core's reference is `import numpy`, which it
needs anyway. That ratio holds up on a busy machine, where absolute times do not.

Rows follow the convention in `benchmarks/run_all.py`.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Any

from _shared import make_parser, write_rows
from _shared import row as row_of

BACKENDS = (
    "jax",
    "jaxlib",
    "torch",
    "keras",
    "tensorflow",
    "equinox",
    "optax",
    "orbax",
    "lightning",
)

# (case, statement to time, reference statement or None, environment)
CASES: list[tuple[str, str, str | None, dict[str, str]]] = [
    ("pipekit_train.core", "import pipekit_train.core", "import numpy", {}),
    (
        "pipekit_train.equinox",
        "import pipekit_train.equinox",
        "import jax, equinox, optax, orbax.checkpoint",
        {},
    ),
    ("pipekit_train.lightning", "import pipekit_train.lightning", "import torch, lightning", {}),
    (
        "pipekit_train.keras (jax)",
        "import pipekit_train.keras",
        "import keras",
        {"KERAS_BACKEND": "jax"},
    ),
    ("pipekit_train.sweep", "import pipekit_train.sweep", None, {}),
]

_PROBE = """
import json, sys, time
t0 = time.perf_counter()
{stmt}
dt = time.perf_counter() - t0
loaded = sorted(m for m in {backends!r} if m in sys.modules)
print(json.dumps({{"seconds": dt, "backends": loaded}}))
"""


def _probe(stmt: str, env: dict[str, str]) -> tuple[float | None, list[str], str | None]:
    """Time `stmt` once in a fresh interpreter: `(seconds, backends loaded, error)`."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE.format(stmt=stmt, backends=BACKENDS)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=600,
        check=False,
    )
    if proc.returncode:
        return None, [], (proc.stderr.strip().splitlines() or ["failed"])[-1]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    return out["seconds"], out["backends"], None


def time_imports(
    stmts: list[str], env: dict[str, str], repeats: int
) -> list[tuple[float | None, list[str], str | None]]:
    """Best time of each statement over `repeats` rounds, interleaved round by round.

    Interleaving puts the case and its reference under the same machine load.
    """
    best: list[float | None] = [None] * len(stmts)
    loaded: list[list[str]] = [[] for _ in stmts]
    errors: list[str | None] = [None] * len(stmts)
    for _ in range(repeats):
        for i, stmt in enumerate(stmts):
            if errors[i] is not None:
                continue
            seconds, mods, error = _probe(stmt, env)
            if error is not None:
                errors[i] = error
                continue
            loaded[i] = mods
            best[i] = seconds if best[i] is None else min(best[i], seconds)  # type: ignore[type-var]
    return list(zip(best, loaded, errors, strict=True))


# One result row of this benchmark (see _shared.row); value and ratio as measured.
row = functools.partial(row_of, "import", digits=None, ratio_digits=None)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = make_parser(
        __doc__, quick_help="best of 5 for core, best of 2 for the adapters", repeats=5
    )
    args = parser.parse_args(argv)

    rows: list[dict[str, Any]] = []
    for case, stmt, reference, env in CASES:
        core = case == "pipekit_train.core"
        repeats = args.repeats if core or not args.quick else 2
        measured = time_imports([stmt] + ([reference] if reference else []), env, repeats)
        seconds, loaded, error = measured[0]
        metric = f"import time, best of {repeats}"
        if error is not None or seconds is None:
            rows.append(
                row(
                    case,
                    metric,
                    None,
                    "s",
                    ok=False if core else None,
                    note=f"import failed: {error}",
                )
            )
            print(f"{case:<28} import failed: {error}")
            continue
        ratio = None
        notes = []
        if reference is not None:
            ref_seconds, _, ref_error = measured[1]
            if ref_seconds:
                ratio = seconds / ref_seconds
                notes.append(f"ratio vs `{reference}` ({ref_seconds:.2f} s)")
            elif ref_error:
                notes.append(f"reference failed: {ref_error}")
        if not core:
            notes.append("loads " + (", ".join(loaded) if loaded else "no framework at import"))
        note = "; ".join(notes) or None
        if core:
            rows.append(
                row(
                    case,
                    metric,
                    seconds,
                    "s",
                    ratio=ratio,
                    target="< 1 s",
                    ok=seconds < 1.0,
                    note=note,
                )
            )
            rows.append(
                row(
                    case,
                    "backend modules imported",
                    float(len(loaded)),
                    "modules",
                    target="0",
                    ok=not loaded,
                    note=", ".join(loaded) or None,
                )
            )
        else:
            rows.append(row(case, metric, seconds, "s", ratio=ratio, note=note))
        print(f"{case:<28} {seconds * 1e3:8.1f} ms" + (f"   ({note})" if note else ""))

    if args.json:
        write_rows(args.json, rows)
    return rows


if __name__ == "__main__":
    main()
