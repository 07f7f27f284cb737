"""Each distribution builds, and each wheel works when installed alone with core's wheel.

The module fixture builds the five wheels and sdists once with `scripts/build_wheels.sh`
(`uv build --package <dist> --no-sources --out-dir <tmp>/<dist>`). Then
`.github/scripts/wheel_check.py`, which the release workflow also runs, installs each
backend wheel with only core's wheel into a fresh `uv venv`, in parallel threads. It
checks which frameworks came along (equinox pulls no torch, keras or tensorflow;
lightning pulls no jax; keras pulls no backend without its extra; core and sweep pull
none), runs `uv pip check`, and runs the package's quickstart there.

Versions are pinned to the workspace lock (`uv export` as constraints), so uv's cache
serves every download and a repeated torch or jax install takes seconds. The timings are
printed at the end of the module (`pytest -s`) and attached to each test as properties.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
DISTS = ("core", "equinox", "lightning", "keras", "sweep")
# (distribution, extra). Slowest first so that the pool's tail is short.
CASES = [
    ("pipekit-train-lightning", None),
    ("pipekit-train-keras", "jax"),
    ("pipekit-train-equinox", None),
    ("pipekit-train-core", None),
    ("pipekit-train-sweep", None),
    ("pipekit-train-keras", None),
]
WORKERS = 3


def _case_id(case: tuple[str, str | None]) -> str:
    dist, extra = case
    return dist.removeprefix("pipekit-train-") + (f"[{extra}]" if extra else "")


def _load_wheel_check() -> ModuleType:
    path = ROOT / ".github" / "scripts" / "wheel_check.py"
    spec = importlib.util.spec_from_file_location("pipekit_wheel_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _uv() -> list[str]:
    uv = os.environ.get("UV") or shutil.which("uv")
    return [uv] if uv else [sys.executable, "-m", "uv"]


@pytest.fixture(scope="module")
def dist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    t0 = time.perf_counter()
    proc = subprocess.run(
        ["bash", str(ROOT / "scripts" / "build_wheels.sh"), "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"scripts/build_wheels.sh failed:\n{proc.stdout}\n{proc.stderr}"
    (out / "build_seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}")
    return out


@pytest.fixture(scope="module")
def constraints(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """The workspace lock as a constraints file (None if it cannot be exported)."""
    path = tmp_path_factory.mktemp("constraints") / "constraints.txt"
    proc = subprocess.run(
        [
            *_uv(),
            "export",
            "--frozen",
            "--format",
            "requirements-txt",
            "--no-hashes",
            "--all-packages",
            "--all-extras",
            "--no-emit-workspace",
            "--no-dev",
            "--no-header",
            "--no-annotate",
            "--output-file",
            str(path),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return path if proc.returncode == 0 and path.is_file() else None


@pytest.fixture(scope="module")
def reports(
    dist_root: Path, constraints: Path | None, tmp_path_factory: pytest.TempPathFactory
) -> dict[tuple[str, str | None], dict[str, Any]]:
    wheel_check = _load_wheel_check()
    venvs = tmp_path_factory.mktemp("venvs")

    def run(case: tuple[str, str | None]) -> dict[str, Any]:
        dist, extra = case
        try:
            return wheel_check.check(
                dist,
                extra,
                dist_root,
                venvs / _case_id(case).replace("[", "-").rstrip("]"),
                python=sys.executable,
                constraints=constraints,
            )
        except BaseException as exc:  # noqa: BLE001 - reported per case below
            return {
                "dist": dist,
                "extra": extra,
                "ok": False,
                "problems": [f"{type(exc).__name__}: {exc}"],
                "seconds": {},
            }

    t0 = time.perf_counter()
    with ThreadPoolExecutor(WORKERS) as pool:
        results = dict(zip(CASES, pool.map(run, CASES), strict=True))
    wall = time.perf_counter() - t0
    lines = [
        f"packaging: build {(dist_root / 'build_seconds.txt').read_text()} s; "
        f"venv checks {wall:.1f} s wall ({WORKERS} threads)"
    ]
    for case, rep in results.items():
        secs = rep.get("seconds", {})
        lines.append(
            f"  {_case_id(case):<16} install {secs.get('install', '-')} s, quickstart "
            f"{secs.get('quickstart', '-')} s, {rep.get('installed', '?')} packages, ok={rep['ok']}"
        )
    print("\n" + "\n".join(lines))
    shutil.rmtree(venvs, ignore_errors=True)  # several GB of hard links; free them early
    return results


def _pyproject(name: str) -> dict[str, Any]:
    with open(ROOT / "packages" / name / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


@pytest.mark.parametrize("name", DISTS)
def test_wheel_and_sdist_built(dist_root: Path, name: str) -> None:
    project = _pyproject(name)["project"]
    dist, version = project["name"], project["version"]
    stem = f"{dist.replace('-', '_')}-{version}"
    folder = dist_root / dist
    built = sorted(
        p.name for p in folder.iterdir() if p.name.endswith((".whl", ".tar.gz"))
    )  # uv adds a .gitignore
    assert built == [f"{stem}-py3-none-any.whl", f"{stem}.tar.gz"], built

    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl") as whl:
        metadata = whl.read(f"{stem}.dist-info/METADATA").decode()
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    if name != "core":
        # The published range on core, not the workspace source (`--no-sources`).
        core_reqs = [r for r in requires if r.startswith("pipekit-train-core")]
        assert core_reqs and all(">=" in r and "<" in r for r in core_reqs), core_reqs
    for extra in project.get("optional-dependencies", {}):
        assert f"Provides-Extra: {extra}" in metadata, f"{dist} lost its [{extra}] extra"

    with tarfile.open(folder / f"{stem}.tar.gz") as sdist:
        members = set(sdist.getnames())
    for needed in ("pyproject.toml", "README.md", f"src/pipekit_train/{name}/__init__.py"):
        assert f"{stem}/{needed}" in members, f"{needed} missing from the {dist} sdist"
    assert f"{stem}/src/pipekit_train/__init__.py" not in members


def test_dependency_ranges_on_core() -> None:
    core_version = tuple(int(x) for x in _pyproject("core")["project"]["version"].split(".")[:2])
    for name in DISTS[1:]:
        deps = _pyproject(name)["project"]["dependencies"]
        spec = next((d for d in deps if d.replace(" ", "").startswith("pipekit-train-core")), None)
        assert spec is not None, f"{name} does not depend on pipekit-train-core"
        assert "==" not in spec, f"{name}: pin core with a range, not == ({spec})"
        expected = f"pipekit-train-core>={core_version[0]}.{core_version[1]},<{core_version[0]}.{core_version[1] + 1}"
        assert spec.replace(" ", "") == expected, (
            f"{name} depends on {spec!r}; core is {core_version[0]}.{core_version[1]}.x, so use {expected!r}"
        )


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_wheel_alone(
    reports: dict[tuple[str, str | None], dict[str, Any]],
    case: tuple[str, str | None],
    record_property: Any,
) -> None:
    report = reports[case]
    record_property("seconds", json.dumps(report.get("seconds", {})))
    assert report["ok"], f"{_case_id(case)}:\n" + "\n".join(report["problems"])
