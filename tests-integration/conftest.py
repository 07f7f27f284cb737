"""Shared set-up for the cross-package tests.

Keras's backend is fixed at import: these tests run Keras on jax (set before anything
imports keras). The examples folder goes on `sys.path` so `toymodels:...` factories
resolve, as they do when an example runs as a script.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

BACKENDS = ("equinox", "lightning", "keras")


# -- the golden suites: one worker process per backend for every suite a session needs ---------
import subprocess  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402

import pytest  # noqa: E402

GOLDEN_WORKER = Path(__file__).resolve().parent / "golden_worker.py"
# label -> (backend package, the process it runs in, the suites it runs). One process per
# KERAS_BACKEND value runs its setups one after another: the torch-based setups share one
# torch import, Equinox and Keras-on-jax one jax import (the same bytes as a process each).
GOLDEN_SETUPS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "equinox": ("equinox", "jax", ("mlp", "plateau", "field", "flow", "rollout")),
    "lightning": ("lightning", "torch", ("mlp", "plateau", "field", "flow", "rollout")),
    "torch": ("torch", "torch", ("mlp", "plateau", "flow", "rollout")),
    "torch-k10": ("torch_k10", "torch", ("mlp", "rollout")),
    "keras-jax": ("keras", "jax", ("mlp", "plateau", "field", "flow", "rollout")),
    "keras-torch": ("keras", "torch", ("mlp", "plateau", "field", "flow", "rollout")),
    "plain-torch": ("plain_torch", "torch", ("mlp", "plateau")),
}
# the test file of each suite (the root conftest keeps them in one xdist work unit)
GOLDEN_FILES = {
    "mlp": "test_golden_runs.py",
    "plateau": "test_golden_plateau.py",
    "field": "test_golden_fields.py",
    "flow": "test_golden_flow.py",
    "rollout": "test_golden_rollout.py",
}


def golden_labels(suite: str) -> list[str]:
    """The setups that run `suite` (adding a backend to a suite is one line above)."""
    return [label for label, (_, _, suites) in GOLDEN_SETUPS.items() if suite in suites]


@pytest.fixture(scope="session")
def golden_outputs(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str, str], str]:
    """`outputs(label, suite) -> JSON text` of the golden worker's run.

    Every suite whose test file this session collected runs at the first request: the
    jax-based setups in one process and the torch-based ones in another, side by side (a
    framework import costs 5–15 s).
    """
    collected = {Path(str(item.fspath)).name for item in request.session.items}
    wanted = {suite for suite, name in GOLDEN_FILES.items() if name in collected}
    out = tmp_path_factory.mktemp("golden_suites")
    results: dict[tuple[str, str], str] = {}

    def run(process: str) -> None:
        todo = {
            label: [s for s in suites if s in wanted]
            for label, (_, in_process, suites) in GOLDEN_SETUPS.items()
            if in_process == process and wanted.intersection(suites)
        }
        if not todo:
            return
        # one thread each, or torch's intra-op threads oversubscribe two cores
        env = {**os.environ, "OMP_NUM_THREADS": "1", "KERAS_BACKEND": process}
        args = []
        for label, suites in todo.items():
            args += [GOLDEN_SETUPS[label][0], str(out / label), ",".join(suites) + ","]
        proc = subprocess.run(
            [sys.executable, str(GOLDEN_WORKER), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=1800,
        )
        assert proc.returncode == 0, f"{process}:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        for label, suites in todo.items():
            for suite in suites:
                results[label, suite] = Path(f"{out / label}.{suite}.json").read_text()

    with ThreadPoolExecutor(max_workers=2) as pool:
        list(pool.map(run, sorted({process for _, process, _ in GOLDEN_SETUPS.values()})))

    def outputs(label: str, suite: str) -> str:
        return results[label, suite]

    outputs.labels = golden_labels  # type: ignore[attr-defined]
    return outputs
