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
printed at the end of the module (`pytest -n 0 -s`) and attached to each test as properties.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
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


LICENSE_TEXT = (ROOT / "LICENSE").read_text()
# Markdown links `[text](target)`, `<target>` autolinks and `src="target"` / `href="target"`.
_LINK = re.compile(
    r"\]\(\s*<?([^)\s>]+)|<((?:[a-z]+:)?[^<>\s]*[/.][^<>\s]*)>|(?:src|href)=\"([^\"]+)\""
)
# Releases PyPI marks as yanked that a floor must exclude: zarr 3.0.0-3.0.7 ("zarr.load()
# deletes data", zarr-developers/zarr-python#3061).
YANKED = {"zarr": [f"3.0.{i}" for i in range(8)]}


def _metadata_headers(metadata: str) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for line in metadata.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(": ")
        headers.setdefault(key, []).append(value.strip())
    return headers


def _relative_links(markdown: str) -> list[str]:
    """Link targets that do not resolve on PyPI (anything but an absolute URL or mailto)."""
    found = [next(g for g in m.groups() if g) for m in _LINK.finditer(markdown)]
    return [t for t in found if not t.startswith(("https://", "http://", "mailto:"))]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text))


@pytest.mark.parametrize("name", DISTS)
def test_license_readme_and_metadata_sources(name: str) -> None:
    """Fast checks on the sources (no build): what the wheel checks below see built."""
    assert "Apache License" in LICENSE_TEXT and "Version 2.0, January 2004" in LICENSE_TEXT
    member = ROOT / "packages" / name
    assert (member / "LICENSE").read_text() == LICENSE_TEXT, f"packages/{name}/LICENSE differs"
    project = _pyproject(name)["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert project.get("authors"), f"{name}: no authors"
    classifiers = project.get("classifiers", [])
    assert classifiers and not [c for c in classifiers if c.startswith("License ::")], (
        f"{name}: classifiers missing, or a License :: classifier next to a PEP 639 license"
    )
    urls = project.get("urls", {})
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(urls), urls
    readme = (member / project["readme"]).read_text()
    assert len(readme.strip().splitlines()) > 2, f"packages/{name}/README.md is too short"
    assert not _relative_links(readme), f"{name} README: relative links {_relative_links(readme)}"


def test_relative_link_detector() -> None:
    text = "[a](../../README.md) [b](https://x.org/y) <https://x.org> <docs/x.md> [c](#anchor)"
    assert _relative_links(text) == ["../../README.md", "docs/x.md", "#anchor"]


def test_dependency_floors_exclude_yanked_releases() -> None:
    for name in DISTS:
        project = _pyproject(name)["project"]
        deps = list(project["dependencies"])
        deps += [d for extra in project.get("optional-dependencies", {}).values() for d in extra]
        for dep in deps:
            match = re.match(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*(.*)", dep)
            assert match is not None, dep
            dist, spec = match.group(1).lower(), match.group(2)
            floors = re.findall(r">=\s*([0-9][0-9.]*)", spec)
            for yanked in YANKED.get(dist, []):
                assert floors and _version(floors[0]) > _version(yanked), (
                    f"{name}: {dep!r} admits the yanked {dist} {yanked}"
                )
    # The floor still admits what the lock resolved.
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    locked = [p["version"] for p in lock["package"] if p["name"] == "zarr"]
    core_zarr = next(
        d for d in _pyproject("core")["project"]["dependencies"] if d.startswith("zarr")
    )
    floor = _version(re.findall(r">=\s*([0-9.]+)", core_zarr)[0])
    assert locked and all(_version(v) >= floor for v in locked), (core_zarr, locked)


@pytest.mark.slow  # builds the wheels (module fixture), ~40 s
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
        names = set(whl.namelist())
        license_path = f"{stem}.dist-info/licenses/LICENSE"
        wheel_license = whl.read(license_path).decode() if license_path in names else None
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
        assert f"{stem}/LICENSE" in members, f"LICENSE missing from the {dist} sdist"
        sdist_license = sdist.extractfile(f"{stem}/LICENSE")
        assert sdist_license is not None and sdist_license.read().decode() == LICENSE_TEXT
    for needed in (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        f"src/pipekit_train/{name}/__init__.py",
    ):
        assert f"{stem}/{needed}" in members, f"{needed} missing from the {dist} sdist"
    assert f"{stem}/src/pipekit_train/__init__.py" not in members

    # The license travels in the wheel (PEP 639) and the metadata says what PyPI shows.
    assert wheel_license == LICENSE_TEXT, f"{dist} wheel lacks dist-info/licenses/LICENSE"
    headers = _metadata_headers(metadata)
    assert headers.get("License-Expression") == ["Apache-2.0"], headers.get("License-Expression")
    assert headers.get("License-File") == ["LICENSE"], headers.get("License-File")
    assert headers.get("Author"), f"{dist} has no Author"
    urls = dict(u.split(", ", 1) for u in headers.get("Project-URL", []))
    assert {"Homepage", "Documentation", "Repository", "Issues"} <= set(urls), urls
    assert all(u.startswith("https://") for u in urls.values()), urls
    classifiers = headers.get("Classifier", [])
    assert "Programming Language :: Python :: 3" in classifiers, classifiers
    assert any(c.startswith("Development Status ::") for c in classifiers), classifiers
    description = metadata.split("\n\n", 1)[1]  # the README, as PyPI renders it
    assert description.strip() and not _relative_links(description), _relative_links(description)


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


@pytest.mark.parametrize("name", ["equinox", "lightning"])
def test_ray_comes_only_with_the_ray_extra(name: str) -> None:
    project = _pyproject(name)["project"]
    assert not [d for d in project["dependencies"] if d.replace(" ", "").startswith("ray")]
    assert project["optional-dependencies"]["ray"] == ["ray[train]>=2.40"]


@pytest.mark.slow  # builds the wheels (module fixture), ~40 s
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_wheel_alone(
    reports: dict[tuple[str, str | None], dict[str, Any]],
    case: tuple[str, str | None],
    record_property: Any,
) -> None:
    report = reports[case]
    record_property("seconds", json.dumps(report.get("seconds", {})))
    assert report["ok"], f"{_case_id(case)}:\n" + "\n".join(report["problems"])
