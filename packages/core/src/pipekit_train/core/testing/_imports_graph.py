"""The import graph of a package, read from its source (nothing is imported).

Used by the layering tests: every `import` and `from ... import` statement counts, in a
function body too, except those under `if TYPE_CHECKING:` (they never run).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["ImportGraph", "import_graph"]


class ImportGraph:
    """Module → the modules of the same package it imports (dotted names).

    Attributes:
        edges: `{module: {imported module: first line number}}`.
    """

    def __init__(self, edges: Mapping[str, Mapping[str, int]]):
        self.edges = {m: dict(t) for m, t in edges.items()}

    @property
    def modules(self) -> list[str]:
        """Every module of the package, sorted."""
        return sorted(self.edges)

    def cycles(self) -> list[list[str]]:
        """The strongly connected components with more than one module (or a self-import)."""
        index: dict[str, int] = {}
        low: dict[str, int] = {}
        stack: list[str] = []
        on: set[str] = set()
        out: list[list[str]] = []

        def visit(v: str) -> None:  # Tarjan, recursive (packages have a few hundred modules)
            index[v] = low[v] = len(index)
            stack.append(v)
            on.add(v)
            for w in self.edges.get(v, {}):
                if w not in index:
                    visit(w)
                    low[v] = min(low[v], low[w])
                elif w in on:
                    low[v] = min(low[v], index[w])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in self.edges.get(v, {}):
                    out.append(sorted(comp))

        for v in self.modules:
            if v not in index:
                visit(v)
        return sorted(out)


def _module_name(root: Path, path: Path, package: str) -> tuple[str, bool]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts = parts[:-1]
    return ".".join([package, *parts]) if parts else package, is_pkg


def _type_checking_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If):
            test = node.test
            name = test.id if isinstance(test, ast.Name) else getattr(test, "attr", None)
            if name == "TYPE_CHECKING":
                for child in node.body:
                    for sub in ast.walk(child):
                        if hasattr(sub, "lineno"):
                            lines.add(sub.lineno)
    return lines


def _resolve(module: str, is_pkg: bool, level: int, name: str | None) -> str:
    if level == 0:
        return name or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join([*base, *([name] if name else [])])


def import_graph(source: str | Path, package: str) -> ImportGraph:
    """The import graph of `package`, whose `__init__.py` is in the folder `source`."""
    root = Path(source)
    paths = sorted(root.rglob("*.py"))
    names = {_module_name(root, p, package)[0] for p in paths}
    edges: dict[str, dict[str, int]] = {}
    for path in paths:
        module, is_pkg = _module_name(root, path, package)
        tree = ast.parse(path.read_text(), str(path))
        skip = _type_checking_lines(tree)
        found: dict[str, int] = {}
        for node in ast.walk(tree):
            if getattr(node, "lineno", None) in skip:
                continue
            targets: Iterable[str]
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(module, is_pkg, node.level, node.module)
                # `from pkg import sub` imports the submodule `pkg.sub` when there is one
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in names]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            else:
                continue
            for target in targets:
                while target and target not in names:
                    target = target.rpartition(".")[0]  # `import a.b.c` imports `a.b.c`
                if target and target != module:
                    found.setdefault(target, node.lineno)
        edges[module] = found
    return ImportGraph(edges)
