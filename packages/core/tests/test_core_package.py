"""Package-level rules: namespace layout, the backend ban, what the import loads, public API."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import pipekit_train.core as core

ROOT = Path(__file__).resolve().parents[3]
BACKENDS = (
    "jax",
    "jaxlib",
    "torch",
    "keras",
    "equinox",
    "lightning",
    "tensorflow",
    "optax",
    "orbax",
)


def test_no_namespace_init_in_any_member() -> None:
    members = sorted((ROOT / "packages").iterdir())
    assert {m.name for m in members} >= {"core", "equinox", "lightning", "keras", "sweep"}
    for member in members:
        src = member / "src" / "pipekit_train"
        assert src.is_dir(), member
        assert not (src / "__init__.py").exists(), f"{src}/__init__.py breaks the namespace"
        assert (src / member.name / "__init__.py").exists()


def _fresh(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_core_imports_no_backend_in_a_fresh_interpreter() -> None:
    code = (
        "import sys, json\n"
        "import pipekit_train.core, pipekit_train.core.losses, pipekit_train.core.metrics\n"
        "import pipekit_train.core.callbacks, pipekit_train.core.writers, pipekit_train.core.data\n"
        "import pipekit_train.core.registry, pipekit_train.core.testing\n"
        f"print(json.dumps(sorted(m for m in {BACKENDS!r} if m in sys.modules)))"
    )
    assert json.loads(_fresh(code)) == []


def test_core_batching_does_not_pull_a_backend() -> None:
    # grain opportunistically imports jax; the batching engine keeps it out.
    code = (
        "import sys, json, numpy as np\n"
        "from pipekit_train.core.data import ArrayDataset, make_batches\n"
        "it = make_batches(ArrayDataset(x=np.zeros((8, 2)), y=np.zeros((8, 1))), 4, seed=0)\n"
        "next(it)\n"
        f"print(json.dumps(sorted(m for m in {BACKENDS!r} if m in sys.modules)))"
    )
    assert json.loads(_fresh(code)) == []


def test_core_import_loads_only_numpy_and_the_array_api_shim() -> None:
    # What keeps `import pipekit_train.core` well under a second: besides the standard
    # library it loads numpy and array_api_compat, nothing else (matplotlib, zarr, grain,
    # fsspec, mlflow ... are imported where they are used). The time itself is measured
    # by benchmarks/bench_import.py, as a ratio to `import numpy`.
    code = (
        "import sys, json\n"
        "before = set(sys.modules)\n"
        "import pipekit_train.core\n"
        "names = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(json.dumps(sorted(n for n in names if n not in sys.stdlib_module_names)))"
    )
    assert json.loads(_fresh(code)) == ["array_api_compat", "numpy", "pipekit_train"]


def test_public_api_is_declared() -> None:
    for name in core.__all__:
        assert hasattr(core, name), name
    assert core.ConfigError.__mro__[1] is core.PipekitError
    assert issubclass(core.ConfigError, ValueError)
    assert core.__version__ == "0.1.0"


def test_ruff_bans_backend_imports_in_core() -> None:
    config = (ROOT / "packages" / "core" / "pyproject.toml").read_text()
    for name in ("jax", "torch", "keras", "equinox", "lightning", "tensorflow"):
        assert f'"{name}".msg' in config


@pytest.mark.parametrize(
    ("module", "name", "home"),
    [
        ("pipekit_train.core.adapter", "OPTIMIZERS", "pipekit_train.core.spec"),
        ("pipekit_train.core.adapter", "CheckpointStore", "pipekit_train.core.checkpoint"),
        ("pipekit_train.core.adapter", "NotSupportedError", "pipekit_train.core"),
        ("pipekit_train.core.utils", "fit_with_ray_trainer", "pipekit_train.core.adapter"),
    ],
)
def test_names_that_left_a_public_module_still_import_with_a_warning(
    module: str, name: str, home: str
) -> None:
    import importlib

    old = importlib.import_module(module)
    assert name not in old.__all__
    with pytest.warns(DeprecationWarning, match=f"import it from `{home}`"):
        value = getattr(old, name)
    assert value is getattr(importlib.import_module(home), name)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        old.no_such_name  # noqa: B018
