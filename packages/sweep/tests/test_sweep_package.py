"""Package rules: the public API, and that importing the sweep pulls no heavy optional dependency."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pipekit_train.sweep as sweep

SRC = Path(__file__).resolve().parents[1] / "src"


def test_public_api() -> None:
    assert set(sweep.__all__) >= {
        "ParameterGrid",
        "HyperSweep",
        "SweepResult",
        "TrialResult",
        "OptunaSearch",
    }
    for name in sweep.__all__:
        assert getattr(sweep, name) is not None
        if name != "__version__":
            assert getattr(sweep, name).__doc__, name
    assert not (SRC / "pipekit_train" / "__init__.py").exists()
    assert (SRC / "pipekit_train" / "sweep" / "py.typed").exists()


def test_import_pulls_no_optional_or_backend_package() -> None:
    heavy = (
        "optuna",
        "ray",
        "matplotlib",
        "jax",
        "torch",
        "keras",
        "equinox",
        "lightning",
        "tensorflow",
    )
    code = (
        "import sys, json\n"
        "import pipekit_train.sweep, pipekit_train.sweep.testing\n"
        f"print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
