"""Install one built wheel alone (with core's wheel) into a fresh venv and check it.

Used by `tests-integration/test_packaging.py` (every test run) and by the release
workflow (before publishing). For one distribution, and optionally one extra, it:

1. checks the wheel's file list: only `pipekit_train/<name>/...` and its `.dist-info`,
   never `pipekit_train/__init__.py` (the PEP 420 namespace root), and a `py.typed`;
2. creates a venv (`uv venv`) and `uv pip install`s the wheel plus, for the backends
   and sweep, the core wheel built from the same commit (core is not on an index
   during development). `--core-from-index` resolves core from the index instead, as a
   user's install would; the release workflow uses it;
3. checks what got installed: for example, equinox pulls no torch, keras or tensorflow,
   and lightning pulls no jax (`RULES` below);
4. runs `uv pip check`;
5. runs the package's quickstart in the venv (`SMOKES` below), a tiny `TrainingLoop`
   with the package's public names, from a neutral working directory, and asserts that
   the code came from the venv and not from the workspace.

It prints a JSON report on stdout and exits non-zero if any check failed.

    python .github/scripts/wheel_check.py --dist-root dist --package pipekit-train-keras --extra jax

`--constraints FILE` pins versions (the test passes the workspace lock exported with
`uv export`, so that uv's cache serves every download); the release workflow resolves
fresh, as users do.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

CORE = "pipekit-train-core"
DISTS = (
    "pipekit-train-core",
    "pipekit-train-equinox",
    "pipekit-train-lightning",
    "pipekit-train-keras",
    "pipekit-train-sweep",
)
_BACKENDS = {
    "jax",
    "jaxlib",
    "torch",
    "keras",
    "equinox",
    "optax",
    "orbax-checkpoint",
    "lightning",
    "pytorch-lightning",
}
_TF = re.compile(r"^(tensorflow.*|tf-keras|tf-nightly.*|tb-nightly)$")

# (dist, extra) -> packages that must not / must be installed. Names are normalised
# (PEP 503: lowercase, runs of -_. become -). Any tensorflow distribution is always
# forbidden (`_TF`).
RULES: dict[tuple[str, str | None], dict[str, set[str]]] = {
    (CORE, None): {"forbid": set(_BACKENDS), "require": {"numpy", "grain", "zarr", "fsspec"}},
    ("pipekit-train-equinox", None): {
        "forbid": {"torch", "keras", "lightning", "pytorch-lightning"},
        "require": {"jax", "jaxlib", "equinox", "optax", "orbax-checkpoint", CORE},
    },
    ("pipekit-train-lightning", None): {
        "forbid": {"jax", "jaxlib", "keras", "equinox", "optax", "orbax-checkpoint"},
        "require": {"torch", "lightning", "safetensors", CORE},
    },
    ("pipekit-train-keras", None): {
        "forbid": {"jax", "jaxlib", "torch", "equinox", "lightning", "pytorch-lightning"},
        "require": {"keras", CORE},
    },
    ("pipekit-train-keras", "jax"): {
        "forbid": {"torch", "equinox", "lightning", "pytorch-lightning"},
        "require": {"keras", "jax", "jaxlib", CORE},
    },
    ("pipekit-train-keras", "torch"): {
        "forbid": {"jax", "jaxlib", "equinox", "lightning", "pytorch-lightning"},
        "require": {"keras", "torch", CORE},
    },
    ("pipekit-train-sweep", None): {"forbid": set(_BACKENDS), "require": {CORE}},
}

# -- quickstarts ---------------------------------------------------------------------------
# Each runs `python -c` inside the venv, from an empty temporary directory. `{model}` is a
# model-operator expression; the same toy task and loop run on every backend.
_PRELUDE = """
import importlib.util, os, sys, tempfile
import numpy as np
import pipekit_train
assert getattr(pipekit_train, "__file__", None) is None, "pipekit_train must be a PEP 420 namespace package"
import pipekit_train.core as core
venv = os.path.realpath(sys.prefix)
assert os.path.realpath(core.__file__).startswith(venv), f"core imported from {core.__file__}, not from {venv}"
from pipekit_train.core import Checkpoint, TrainingLoop, model_op_from_config
from pipekit_train.core.testing import regression_task
"""

_LOOP = """
train, val = regression_task()
model = {model}
batch = val.get_batch(np.arange(len(val)))
before = float(np.mean((np.asarray(model(batch["x"])) - batch["y"]) ** 2))
with tempfile.TemporaryDirectory() as d:
    loop = TrainingLoop(model=model, data=train, validation=val, loss="mse",
                        optimizer_config={{"name": "adam", "lr": 0.05}}, batch_size=32, max_steps=60,
                        checkpoint=Checkpoint(d, every_n_steps=30), seed=0, progress=False{adapter})
    art = loop.run()
after = art.final_metrics["val_loss"]
assert after < 0.5 * before, f"val_loss did not fall: {{before:.4g}} -> {{after:.4g}}"
rebuilt = model_op_from_config(art.model.get_config()).with_weights(art.model.serialize_weights())
assert rebuilt.serialize_weights() == art.model.serialize_weights()
np.testing.assert_allclose(np.asarray(rebuilt(batch["x"])), np.asarray(art.model(batch["x"])), rtol=1e-6, atol=1e-6)
print(f"quickstart ok: backend={{art.backend}} val_loss {{before:.4g}} -> {{after:.4g}}, {{art.steps}} steps")
"""


def _backend_smoke(module: str, op: str) -> str:
    model = f'{op}("pipekit_train.{module}.testing:linear", in_size=4, out_size=1)'
    return (
        _PRELUDE
        + f"import pipekit_train.{module} as pkg\n"
        + f"from pipekit_train.{module} import {op}\n"
        + "assert os.path.realpath(pkg.__file__).startswith(venv)\n"
        + _LOOP.format(model=model, adapter="")
    )


_CORE_SMOKE = (
    _PRELUDE
    + "from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp\n"
    + "for banned in ('jax', 'torch', 'keras', 'tensorflow', 'equinox', 'lightning'):\n"
    + "    assert banned not in sys.modules, f'import pipekit_train.core imported {banned}'\n"
    + _LOOP.format(
        model='NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1)',
        adapter=", adapter=NumpyAdapter()",
    )
)

_SWEEP_SMOKE = (
    _PRELUDE
    + """
import pipekit_train.sweep as pkg
assert os.path.realpath(pkg.__file__).startswith(venv)
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp
from pipekit_train.sweep import HyperSweep, ParameterGrid

def trial(params):
    train, val = regression_task()
    return TrainingLoop(NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
                        train, val, loss="mse", optimizer_config={"name": "adam", "lr": params["lr"]},
                        batch_size=32, max_steps=30, seed=0, progress=False, adapter=NumpyAdapter())

with tempfile.TemporaryDirectory() as d:
    result = HyperSweep(trial, ParameterGrid({"lr": [1e-3, 5e-2]}), metric="val_loss", directory=d).run()
assert len(result) == 2 and all(t.ok for t in result), result
assert result.best.params == {"lr": 5e-2}, result.best
print(f"quickstart ok: sweep of {len(result)} trials, best {result.best.params}")
"""
)

_FIND_ONLY = """
import importlib.metadata, importlib.util, os, sys
spec = importlib.util.find_spec("pipekit_train.{module}")
assert spec is not None and os.path.realpath(spec.origin).startswith(os.path.realpath(sys.prefix)), spec
print("installed:", importlib.metadata.version("{dist}"), "(no backend extra: import not attempted)")
"""

SMOKES: dict[tuple[str, str | None], tuple[str, dict[str, str]]] = {
    (CORE, None): (_CORE_SMOKE, {}),
    ("pipekit-train-equinox", None): (_backend_smoke("equinox", "EquinoxModelOp"), {}),
    ("pipekit-train-lightning", None): (_backend_smoke("lightning", "LightningModelOp"), {}),
    ("pipekit-train-keras", None): (
        _FIND_ONLY.format(module="keras", dist="pipekit-train-keras"),
        {},
    ),
    ("pipekit-train-keras", "jax"): (
        _backend_smoke("keras", "KerasModelOp"),
        {"KERAS_BACKEND": "jax"},
    ),
    ("pipekit-train-keras", "torch"): (
        _backend_smoke("keras", "KerasModelOp"),
        {"KERAS_BACKEND": "torch"},
    ),
    ("pipekit-train-sweep", None): (_SWEEP_SMOKE, {}),
}


# -- helpers ---------------------------------------------------------------------------
def normalise(name: str) -> str:
    """PEP 503 name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def find_wheel(dist_root: Path, dist: str) -> Path:
    """The one wheel of `dist` in `dist_root/<dist>/`."""
    folder = dist_root / dist
    wheels = sorted(folder.glob("*.whl"))
    if len(wheels) != 1:
        raise SystemExit(
            f"expected exactly one wheel in {folder}, found {[w.name for w in wheels]}"
        )
    return wheels[0]


def check_wheel_files(wheel: Path, dist: str) -> list[str]:
    """Problems with the wheel's file list (empty when fine)."""
    module = dist.removeprefix("pipekit-train-")
    names = zipfile.ZipFile(wheel).namelist()
    problems = []
    if "pipekit_train/__init__.py" in names:
        problems.append("the wheel ships pipekit_train/__init__.py (breaks the PEP 420 namespace)")
    for name in names:
        if name == "pipekit_train/":  # a directory entry for the namespace root is fine
            continue
        if not (name.startswith(f"pipekit_train/{module}/") or ".dist-info/" in name):
            problems.append(f"unexpected file in the wheel: {name}")
    for needed in (f"pipekit_train/{module}/__init__.py", f"pipekit_train/{module}/py.typed"):
        if needed not in names:
            problems.append(f"missing from the wheel: {needed}")
    return problems


def _run(
    cmd: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    timeout: float = 900,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout, check=False
    )


def _uv() -> list[str]:
    # `uv run` exports the path of its own binary as $UV.
    uv = os.environ.get("UV") or shutil.which("uv")
    return [uv] if uv else [sys.executable, "-m", "uv"]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.setdefault("PYTHONHASHSEED", "0")
    env.update(extra or {})
    return env


def check(
    dist: str,
    extra: str | None,
    dist_root: Path,
    venv: Path,
    *,
    python: str,
    constraints: Path | None = None,
    core_from_index: bool = False,
    smoke: bool = True,
) -> dict[str, Any]:
    """Run every check for `dist[extra]`; return a JSON-able report (`ok`, `problems`, timings)."""
    key = (dist, extra)
    if key not in RULES:
        raise SystemExit(f"no rules for {dist}[{extra}]; known: {sorted(map(str, RULES))}")
    report: dict[str, Any] = {"dist": dist, "extra": extra, "problems": [], "seconds": {}}
    problems: list[str] = report["problems"]
    wheel = find_wheel(dist_root, dist)
    report["wheel"] = wheel.name
    problems += check_wheel_files(wheel, dist)

    uv = _uv()
    env = _clean_env()
    workdir = tempfile.mkdtemp(prefix="wheel-check-")
    try:
        t0 = time.perf_counter()
        proc = _run([*uv, "venv", "--quiet", "--python", python, str(venv)], env=env, cwd=workdir)
        if proc.returncode:
            problems.append(f"uv venv failed: {proc.stderr.strip()}")
            report["ok"] = False
            return report
        vpy = str(venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python"))
        requirement = f"{wheel.resolve()}[{extra}]" if extra else str(wheel.resolve())
        cmd = [*uv, "pip", "install", "--python", vpy, requirement]
        if dist != CORE and not core_from_index:
            cmd.append(str(find_wheel(dist_root, CORE).resolve()))
        if constraints is not None:
            cmd += ["--constraints", str(constraints.resolve())]
        proc = _run(cmd, env=env, cwd=workdir)
        report["seconds"]["install"] = round(time.perf_counter() - t0, 1)
        if proc.returncode:
            problems.append(f"uv pip install failed:\n{proc.stderr.strip()[-4000:]}")
            report["ok"] = False
            return report

        proc = _run([*uv, "pip", "list", "--python", vpy, "--format", "json"], env=env, cwd=workdir)
        installed = {normalise(p["name"]): p["version"] for p in json.loads(proc.stdout or "[]")}
        report["installed"] = len(installed)
        rule = RULES[key]
        bad = sorted(n for n in installed if n in rule["forbid"] or _TF.match(n))
        if bad:
            problems.append(
                f"{dist}{f'[{extra}]' if extra else ''} pulled forbidden packages: "
                + ", ".join(f"{n}=={installed[n]}" for n in bad)
            )
        missing = sorted(n for n in rule["require"] if n not in installed)
        if missing:
            problems.append(f"expected packages not installed: {missing}")
        report["versions"] = {
            n: installed[n] for n in sorted(rule["require"] | {normalise(dist)}) if n in installed
        }

        proc = _run([*uv, "pip", "check", "--python", vpy], env=env, cwd=workdir)
        if proc.returncode:
            problems.append(f"uv pip check failed:\n{(proc.stdout + proc.stderr).strip()[-2000:]}")

        if smoke:
            code, smoke_env = SMOKES[key]
            t1 = time.perf_counter()
            proc = _run([vpy, "-c", code], env=_clean_env(smoke_env), cwd=workdir, timeout=600)
            report["seconds"]["quickstart"] = round(time.perf_counter() - t1, 1)
            report["quickstart"] = (proc.stdout.strip().splitlines() or [""])[-1]
            if proc.returncode:
                problems.append(
                    f"quickstart failed:\n{(proc.stdout + proc.stderr).strip()[-4000:]}"
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    report["seconds"]["total"] = round(time.perf_counter() - t0, 1)
    report["ok"] = not problems
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dist-root", type=Path, default=Path("dist"), help="folder holding <dist>/*.whl"
    )
    parser.add_argument("--package", required=True, choices=DISTS)
    parser.add_argument("--extra", default=None, help="one extra to install, e.g. jax")
    parser.add_argument(
        "--venv", type=Path, default=None, help="venv path (default: a temporary one)"
    )
    parser.add_argument(
        "--python", default=sys.executable, help="interpreter for the venv (default: this one)"
    )
    parser.add_argument("--constraints", type=Path, default=None)
    parser.add_argument(
        "--core-from-index",
        action="store_true",
        help="resolve pipekit-train-core from the package index, as users will (release)",
    )
    parser.add_argument("--no-smoke", action="store_true", help="skip the quickstart")
    args = parser.parse_args(argv)
    tmp = None
    venv = args.venv
    if venv is None:
        tmp = tempfile.mkdtemp(prefix="wheel-venv-")
        venv = Path(tmp) / "venv"
    try:
        report = check(
            args.package,
            args.extra,
            args.dist_root,
            venv,
            python=args.python,
            constraints=args.constraints,
            core_from_index=args.core_from_index,
            smoke=not args.no_smoke,
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(report, indent=2))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
