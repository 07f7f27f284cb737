"""The house: core in layers without import circles, adapters that mirror each other.

Read from the source (nothing is imported): every `import` counts, inside functions too,
except those under `if TYPE_CHECKING:`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipekit_train.core.testing._imports_graph import ImportGraph, import_graph

ROOT = Path(__file__).resolve().parents[3]
PACKAGES = ("core", "equinox", "lightning", "keras", "sweep")
ADAPTERS = ("equinox", "lightning", "keras")

# The rooms of core, lowest first. A module may import from its own rank or below, never
# from above (the package docstring of `pipekit_train.core` draws the same layers), and
# the rooms' own graph has no circle, so a shared rank hides none
# (`test_rooms_import_each_other_one_way`).
RANKS: dict[str, int] = {
    "_errors": 0,
    "_atomic": 0,
    "_imports": 0,
    "_checks": 0,
    "_json": 0,
    "checkpoint": 1,
    "data": 1,
    "distributions": 1,
    "diagnostics": 1,
    "writers": 1,
    "losses": 2,
    "metrics": 2,
    "spec": 3,
    "contract": 4,
    "model": 5,
    "rollout": 6,
    "callbacks": 7,  # above rollout: RolloutMonitor and CalibrationMonitor roll a model out
    "artifact": 7,
    "run": 8,
    "train": 9,
    "": 10,  # pipekit_train.core itself
    "adapter": 10,
    "utils": 10,
    "registry": 10,
    "cli": 11,
    "testing": 11,
}


def _graph(name: str) -> ImportGraph:
    return import_graph(
        ROOT / "packages" / name / "src" / "pipekit_train" / name, f"pipekit_train.{name}"
    )


def _room(module: str) -> str:
    parts = module.split(".")[2:]
    return parts[0] if parts else ""


@pytest.mark.parametrize("name", PACKAGES)
def test_no_import_circles(name: str) -> None:
    assert _graph(name).cycles() == []


def test_the_walk_sees_a_circle() -> None:
    graph = ImportGraph({"p.a": {"p.b": 1}, "p.b": {"p.c": 1}, "p.c": {"p.a": 3}, "p.d": {}})
    assert graph.cycles() == [["p.a", "p.b", "p.c"]]


def test_the_walk_skips_type_checking_and_reads_function_bodies(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import X\n"
        "def f():\n    from .c import Y\n"
    )
    (pkg / "b.py").write_text("from .a import f\n")
    (pkg / "c.py").write_text("")
    graph = import_graph(pkg, "pkg")
    assert graph.edges["pkg.a"] == {"pkg.c": 5}
    assert graph.cycles() == []


def test_core_imports_run_down_the_layers() -> None:
    graph = _graph("core")
    assert {_room(m) for m in graph.modules} <= set(RANKS), "a new room needs a rank here"
    upward = [
        f"{module}:{line} imports {target}"
        for module, targets in graph.edges.items()
        for target, line in targets.items()
        if RANKS[_room(target)] > RANKS[_room(module)]
    ]
    assert upward == []


def _room_graph(graph: ImportGraph) -> ImportGraph:
    edges: dict[str, dict[str, int]] = {}
    for module, targets in graph.edges.items():
        room = edges.setdefault(_room(module) or "<core>", {})
        for target, line in targets.items():
            if _room(target) != _room(module):
                room.setdefault(_room(target) or "<core>", line)
    return ImportGraph(edges)


def test_rooms_import_each_other_one_way() -> None:
    # a module-level walk misses two rooms that import each other through different
    # modules (model._ensemble -> rollout._cycle -> model._heads); the rooms' graph does not
    assert _room_graph(_graph("core")).cycles() == []


def test_the_room_walk_sees_a_circle_between_modules() -> None:
    graph = ImportGraph(
        {"p.core.a._x": {"p.core.b._y": 1}, "p.core.b._z": {"p.core.a._w": 2}, "p.core.a._w": {}}
    )
    assert graph.cycles() == []
    assert _room_graph(graph).cycles() == [["a", "b"]]


def test_model_and_rollout_have_ranks_of_their_own() -> None:
    assert RANKS["model"] < RANKS["rollout"]
    assert RANKS["contract"] < RANKS["model"]


def test_core_root_holds_only_public_modules_and_leaves() -> None:
    root = ROOT / "packages/core/src/pipekit_train/core"
    files = sorted(p.name for p in root.glob("*.py"))
    assert files == [
        "__init__.py",
        "_atomic.py",
        "_checks.py",
        "_errors.py",
        "_imports.py",
        "_json.py",
        "adapter.py",
        "utils.py",
    ]


# -- adapters ------------------------------------------------------------------------------

# One file set: the same name means the same role in every adapter package.
SHARED_FILES = (
    "__init__.py",
    "_adapter.py",  # the Adapter subclass
    "_model.py",  # the model operator
    "_step_backend.py",  # the StepBackend (the step loop's, or OnlineTrainer's)
    "_state.py",  # the train state a checkpoint holds
    "_checkpoint.py",  # the checkpoint engine
    "_weights.py",  # weights as bytes
    "_precision.py",  # core's precision names → the framework's
    "_optim.py",  # the canonical optimizer spec → the framework's optimizer
    "_ema.py",  # the moving average of the weights
    "_data.py",  # batches onto the device, native loaders
    "_grad_norm.py",  # the grad_norm metric
    "_fetch.py",  # device values to the host
    "_entry.py",  # the pipekit_train.backends entry point
    "_rollout.py",  # the device rollout (model_op.rollout)
    "_embeddings.py",  # embedding networks (deep_set), one architecture on every backend
    "testing.py",  # factories for tests and examples
)


@pytest.mark.parametrize("name", ADAPTERS)
def test_adapter_packages_share_one_file_set(name: str) -> None:
    src = ROOT / "packages" / name / "src" / "pipekit_train" / name
    missing = [f for f in SHARED_FILES if not (src / f).exists()]
    assert missing == []


# One shape per shared file: the names each one exports (in its `__all__`) for its role,
# the same in every adapter package (each may export more of its own).
SHARED_NAMES: dict[str, tuple[str, ...]] = {
    "_state.py": ("TrainState",),  # the state a checkpoint holds
    "_checkpoint.py": ("checkpointer",),  # builds the run's checkpoint engine
    "_weights.py": ("encode_weights", "decode_weights"),  # the model's weights as bytes
    "_precision.py": ("native_precision",),  # core's `Precision` → the framework's
    "_optim.py": ("build_optimizer", "build_schedule"),
    "_ema.py": ("with_ema", "has_ema"),  # the optimizer keeping the average; has one?
    "_data.py": ("is_native_loader", "native_batches", "native_eval_batches"),
    "_grad_norm.py": ("grad_norm",),  # the step's grad_norm metric
    "_fetch.py": ("fetch",),  # device values to the host
    "_rollout.py": ("device_rollout", "RolloutLoss"),  # model_op.rollout; rollout training
    "_entry.py": ("BACKEND",),
    "_embeddings.py": ("deep_set",),
}
# Files whose one class is named for its framework: `<Framework><suffix>`.
SHARED_SUFFIXES: dict[str, str] = {
    "_step_backend.py": "StepBackend",
    "_model.py": "ModelOp",
}


def _exported(path: Path) -> list[str]:
    """The names in a module's `__all__` (read from the source, nothing imported)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"{path.relative_to(ROOT)} has no __all__")


def _aliases(path: Path) -> set[str]:
    """The names a module binds as aliases of another (`Old = New`), kept for old code."""
    return {
        target.id
        for node in ast.parse(path.read_text()).body
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def test_the_name_table_covers_shared_files_only() -> None:
    assert set(SHARED_NAMES) | set(SHARED_SUFFIXES) <= set(SHARED_FILES)
    assert not set(SHARED_NAMES) & set(SHARED_SUFFIXES)


@pytest.mark.parametrize("name", ADAPTERS)
def test_shared_files_export_the_same_names(name: str) -> None:
    src = ROOT / "packages" / name / "src" / "pipekit_train" / name
    missing = {
        file: sorted(set(names) - set(_exported(src / file)))
        for file, names in SHARED_NAMES.items()
    }
    assert {file: names for file, names in missing.items() if names} == {}


@pytest.mark.parametrize("name", ADAPTERS)
def test_shared_files_name_their_one_class_for_the_framework(name: str) -> None:
    src = ROOT / "packages" / name / "src" / "pipekit_train" / name
    found = {
        file: [
            n for n in _exported(src / file) if n.endswith(suffix) and n not in _aliases(src / file)
        ]
        for file, suffix in SHARED_SUFFIXES.items()
    }
    wrong = {
        file: names
        for file, names in found.items()
        if len(names) != 1
        or not re.fullmatch(rf"[A-Z][A-Za-z0-9]*{SHARED_SUFFIXES[file]}", names[0])
    }
    assert wrong == {}


# -- the contract ---------------------------------------------------------------------------

CONTRACT = "pipekit_train.core.adapter"


def _contract_users() -> list[Path]:
    """The adapters' non-testing sources and the plain-torch example: what the contract serves."""
    sources = [
        p
        for name in ADAPTERS
        for p in sorted((ROOT / "packages" / name / "src").rglob("*.py"))
        if p.name != "testing.py" and "testing" not in p.parts
    ]
    return [*sources, ROOT / "examples" / "plain_torch_adapter.py"]


def _core_imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, module, name) of each import of core in `path`, function bodies included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "pipekit_train.core"
        ):
            found += [(node.lineno, node.module or "", alias.name) for alias in node.names]
        elif isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name, "*")
                for alias in node.names
                if alias.name.startswith("pipekit_train.core")
            ]
    return found


def _contract_names() -> list[str]:
    tree = ast.parse((ROOT / "packages/core/src/pipekit_train/core/adapter.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "__all__":
            return [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    raise AssertionError("core/adapter.py has no __all__")


def test_adapters_take_core_only_through_the_contract() -> None:
    sources = _contract_users()
    assert len(sources) > 60
    offenders = [
        f"{path.relative_to(ROOT)}:{line} imports {module}"
        for path in sources
        for line, module, _ in _core_imports(path)
        if module != CONTRACT and not module.startswith("pipekit_train.core.testing")
    ]
    assert offenders == []


def test_every_contract_name_has_a_user() -> None:
    used = {
        name
        for p in _contract_users()
        for _, module, name in _core_imports(p)
        if module == CONTRACT
    }
    names = _contract_names()
    assert len(names) == len(set(names))
    assert sorted(set(names) - used) == []
    assert sorted(used - set(names)) == []


def _adapter_sources() -> list[Path]:
    return [
        *(p for name in ADAPTERS for p in (ROOT / "packages" / name / "src").rglob("*.py")),
        ROOT / "examples" / "plain_torch_adapter.py",
        ROOT / "packages/core/src/pipekit_train/core/testing/_numpy_adapter.py",
    ]


def _attribute_reads(path: Path, owners: tuple[str, ...]) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            value = node.value
            owner = value.id if isinstance(value, ast.Name) else getattr(value, "attr", None)
            if owner in owners:
                found.add(node.attr)
    return found


def _calls(path: Path, names: tuple[str, ...]) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in names:
                out.append(f"{path.name}:{node.lineno} {name}")
    return out


def test_adapters_leave_the_run_to_the_lifecycle() -> None:
    sources = _adapter_sources()
    assert len(sources) > 20
    # no adapter reaches into the run's context, composes checkpoint metadata or saves
    # a checkpoint itself: the lifecycle does, with the state the adapter binds
    contexts = {p.name: _attribute_reads(p, ("ctx", "_ctx", "context")) for p in sources}
    assert {k: v for k, v in contexts.items() if v} == {}
    glue = [c for p in sources for c in _calls(p, ("checkpoint_meta", "record_checkpoint"))]
    assert glue == []
    saves = [
        f"{p.name}: {line}"
        for p in sources
        for line in p.read_text().splitlines()
        if "ckpt.save(" in line or "checkpointer.save(" in line
    ]
    assert saves == []


def test_the_scan_sees_a_context_read(tmp_path: Path) -> None:
    path = tmp_path / "x.py"
    path.write_text("def f(run):\n    run.ctx.epoch = 3\n    ctx.step\n")
    assert _attribute_reads(path, ("ctx",)) == {"epoch", "step"}
