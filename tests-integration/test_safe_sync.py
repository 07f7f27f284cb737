"""`uv sync --all-extras` on a machine without a GPU gives a working workspace.

jax's CUDA plugin (`jax[cuda13]` → `jax-cuda13-plugin`, `jax-cuda13-pjrt`) makes every jax
program on a machine without a CUDA GPU die with a segmentation fault at its first array.
So no extra of any workspace member (nor the default dependency groups) may pull it: it
lives in the root's `gpu` dependency group, which only `scripts/gpu_check.py`'s command
(`uv run --group gpu ...`) asks for. Checked three ways: the declared requirements, the
locked resolution of every extra, and what `uv sync --all-extras` would install here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
CUDA_PLUGIN = re.compile(r"^jax-cuda\d+-(plugin|pjrt)$")


def _is_cuda_jax(req: Requirement) -> bool:
    name = req.name.lower().replace("_", "-")
    return bool(CUDA_PLUGIN.match(name)) or (
        name in ("jax", "jaxlib") and any(e.startswith("cuda") for e in req.extras)
    )


def _pyprojects() -> dict[str, dict[str, Any]]:
    files = [ROOT / "pyproject.toml", *sorted(ROOT.glob("packages/*/pyproject.toml"))]
    return {str(p.relative_to(ROOT)): tomllib.loads(p.read_text()) for p in files}


def test_no_extra_of_any_member_declares_a_cuda_plugin() -> None:
    found = [
        f"{path} [{extra}]: {spec}"
        for path, data in _pyprojects().items()
        for extra, specs in data.get("project", {}).get("optional-dependencies", {}).items()
        for spec in specs
        if _is_cuda_jax(Requirement(spec))
    ]
    assert found == [], (
        "an extra pulls jax's CUDA plugin, so `uv sync --all-extras` breaks jax on CPU "
        "machines; put it in the root's `gpu` dependency group instead:\n" + "\n".join(found)
    )
    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "gpu" not in root["tool"]["uv"].get("default-groups", [])
    assert any(_is_cuda_jax(Requirement(s)) for s in root["dependency-groups"]["gpu"])


def _lock_closure(lock: dict[str, Any], roots: list[tuple[str, str | None]]) -> set[str]:
    """Every locked package name reachable from `roots` (name, extra), markers ignored."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for pkg in lock["package"]:
        by_name.setdefault(pkg["name"], []).append(pkg)
    seen: set[tuple[str, str | None]] = set()
    todo = list(roots)
    while todo:
        name, extra = todo.pop()
        if (name, extra) in seen:
            continue
        seen.add((name, extra))
        for pkg in by_name.get(name, []):
            deps = (
                pkg.get("dependencies", [])
                if extra is None
                else (pkg.get("optional-dependencies", {}).get(extra, []))
            )
            for dep in deps:
                todo.append((dep["name"], None))
                todo.extend((dep["name"], e) for e in dep.get("extra", []))
    return {name for name, _ in seen}


def _workspace(lock: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        p
        for p in lock["package"]
        if "editable" in p.get("source", {}) or "virtual" in p.get("source", {})
    ]


def _all_extras_roots(lock: dict[str, Any], groups: list[str]) -> list[tuple[str, str | None]]:
    roots: list[tuple[str, str | None]] = []
    for pkg in _workspace(lock):
        roots.append((pkg["name"], None))
        roots.extend((pkg["name"], extra) for extra in pkg.get("optional-dependencies", {}))
        for group in groups:
            for dep in pkg.get("dev-dependencies", {}).get(group, []):
                roots.append((dep["name"], None))
                roots.extend((dep["name"], e) for e in dep.get("extra", []))
    return roots


def test_the_locked_resolution_of_all_extras_has_no_cuda_plugin() -> None:
    lock = tomllib.loads((ROOT / "uv.lock").read_text())
    default_groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"][
        "default-groups"
    ]
    reached = _lock_closure(lock, _all_extras_roots(lock, default_groups))
    assert "jax" in reached and "torch" in reached  # the walk does reach the frameworks
    assert sorted(n for n in reached if CUDA_PLUGIN.match(n)) == []
    # ...and the `gpu` group, which the GPU check names, does reach the plugin.
    with_gpu = _lock_closure(lock, _all_extras_roots(lock, [*default_groups, "gpu"]))
    assert {"jax-cuda13-plugin", "jax-cuda13-pjrt"} <= with_gpu


def test_uv_sync_all_extras_would_install_no_cuda_plugin() -> None:
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "the workspace is run with uv (`uv run pytest`); uv is not on PATH"
    proc = subprocess.run(
        [uv, "sync", "--all-extras", "--dry-run", "--locked", "--offline"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert "Resolved" in out  # uv did plan the sync
    assert [line for line in out.splitlines() if re.match(r"\s*\+ jax-cuda", line)] == []
