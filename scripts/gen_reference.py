"""Write the reference tables of the docs from the code they describe.

    uv run python scripts/gen_reference.py          # rewrite the generated regions
    uv run python scripts/gen_reference.py --check  # exit 1 if a page is out of date

A generated region of a page sits between `<!-- generated: NAME -->` and
`<!-- end generated: NAME -->`; everything between the two lines is replaced. The
regions:

- `optimizers` (docs/training-spec.md): core's optimizer table with every default
  filled in (`pipekit_train.core.adapter.optimizer_spec`), the default learning rate, and
  what each backend builds from a name (the translation table of each adapter's
  `_optim.py`).
- `testing-factories` (docs/cli.md): the signature of every `@model_factory` in
  `pipekit_train.<backend>.testing`.
- `cli-keys` (docs/cli.md): the keys a run config accepts, per table.

Only core is imported; the backend modules are read with `ast`, so no framework loads.
`tests-integration/test_docs_reference.py` runs the check.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = {"equinox": "Equinox (optax)", "lightning": "Lightning (torch)", "keras": "Keras"}
TESTING = {
    "core (numpy)": "packages/core/src/pipekit_train/core/testing/_numpy_model.py",
    "equinox": "packages/equinox/src/pipekit_train/equinox/testing.py",
    "lightning": "packages/lightning/src/pipekit_train/lightning/testing.py",
    "keras": "packages/keras/src/pipekit_train/keras/testing.py",
}
MODULES = {
    "core (numpy)": "pipekit_train.core.testing",
    "equinox": "pipekit_train.equinox.testing",
    "lightning": "pipekit_train.lightning.testing",
    "keras": "pipekit_train.keras.testing",
}


def _value(v: object) -> str:
    """A default as the docs write it: `1e-8`, not Python's `1e-08`."""
    if v is None:
        return "none"
    if isinstance(v, float) and v and abs(v) < 1e-2 and float(f"{v:.0e}") == v:
        return f"{v:.0e}".replace("e-0", "e-")
    return repr(v)


def _translation_table(backend: str) -> dict[str, str]:
    """The `| spec | <framework> |` table of a backend's `_optim.py` docstring, by name."""
    path = ROOT / f"packages/{backend}/src/pipekit_train/{backend}/_optim.py"
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    rows: dict[str, str] = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or not cells[0].startswith("`"):
            continue
        names = [n.strip(" `") for n in cells[0].split("/")]
        targets = [t.strip() for t in cells[1].split(" / ", len(names) - 1)]
        if len(names) > 1 and len(targets) == len(names):  # `adam` / `adamw` | A / B (...)
            tail = targets[-1][targets[-1].find(" ") :] if " " in targets[-1] else ""
            for name, target in zip(names, targets, strict=True):
                rows[name] = target if name == names[-1] else target + tail
        else:
            for name in names:
                rows[name] = cells[1]
    return rows


def optimizers() -> str:
    from pipekit_train.core.adapter import optimizer_spec
    from pipekit_train.core.spec import OPTIMIZERS

    default = optimizer_spec(None)
    tables = {b: _translation_table(b) for b in BACKENDS}
    head = "| `name` | hyperparameters (defaults) | " + " | ".join(BACKENDS.values()) + " |"
    lines = [head, "|---" * (2 + len(BACKENDS)) + "|"]
    for name in OPTIMIZERS:
        config = optimizer_spec({"name": name}).to_config()
        hyper = ", ".join(
            f"`{k}={_value(v)}`"
            for k, v in config.items()
            if k not in ("name", "learning_rate", "clip_norm", "clip_value")
        )
        built = [tables[b].get(name, "**missing**") for b in BACKENDS]
        lines.append(f"| `{name}` | {hyper} | " + " | ".join(built) + " |")
    lines += [
        "",
        f"Every optimizer also takes `learning_rate` (or `lr`; default "
        f"`{_value(default.learning_rate)}`, a number or a [schedule](#learning-rate-schedules)), "
        f"`clip_norm`, `clip_value` and `ema` (default: none; see "
        f"[the moving average](#moving-average-of-the-weights-ema)). Without `optimizer_config` (or "
        f"without `name`) the optimizer is `{default.name}` with learning rate "
        f"`{_value(default.learning_rate)}`.",
    ]
    return "\n".join(lines)


def _signature(fn: ast.FunctionDef) -> str:
    args = fn.args
    parts: list[str] = []
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    for arg, default in zip(positional, defaults, strict=True):
        parts.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
    if args.vararg:
        parts.append(f"*{args.vararg.arg}")
    elif args.kwonlyargs:
        parts.append("*")
    for arg, default in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        parts.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
    if args.kwarg:
        parts.append(f"**{args.kwarg.arg}")
    return f"{fn.name}({', '.join(parts)})"


def _is_factory(fn: ast.FunctionDef) -> bool:
    names = {ast.unparse(d) for d in fn.decorator_list}
    return "model_factory" in names or fn.name == "linear"


def testing_factories() -> str:
    lines = ["| backend | factory | signature | builds |", "|---|---|---|---|"]
    for backend, rel in TESTING.items():
        tree = ast.parse((ROOT / rel).read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and _is_factory(node):
                doc = (ast.get_docstring(node) or "").split("\n\n")[0].replace("\n", " ")
                lines.append(
                    f"| {backend} | `{MODULES[backend]}:{node.name}` | `{_signature(node)}` "
                    f"| {doc.replace('|', '&#124;')} |"
                )
    lines += [
        "",
        "`key` (Equinox) is supplied by the operator from its `seed`; do not pass it in `kwargs`.",
    ]
    return "\n".join(lines)


def cli_keys() -> str:
    from pipekit_train.core.cli import _config as cfg
    from pipekit_train.core.utils import backend_names

    tables = {
        "top level": cfg._top_keys(),
        "`[model]`": cfg._MODEL_KEYS,
        "`[data]`": cfg._DATA_KEYS,
        "`[validation]`": cfg._VALIDATION_KEYS,
        "`[normalizer]`": cfg._NORMALIZER_KEYS,
        "`[rollout]`": cfg.ROLLOUT_KEYS,
        "`[rollout.schedule]`": (*cfg._SCHEDULE_KEYS, '"<update> = <k>"'),
        "`[checkpoint]`": cfg.checkpoint_keys(),
        "`[registry]`": cfg._REGISTRY_KEYS,
        "`[[writers]]` `type`": (*cfg.WRITERS, '"module:Class"'),
        "`[[callbacks]]` `type`": (*cfg.CALLBACKS, '"module:Class"'),
        "`progress`": cfg.PROGRESS,
        "`backend`": backend_names(),
    }
    lines = ["| where | accepted |", "|---|---|"]
    for where, keys in tables.items():
        lines.append(f"| {where} | " + ", ".join(f"`{k}`" for k in keys) + " |")
    return "\n".join(lines)


REGIONS: dict[str, tuple[str, Callable[[], str]]] = {
    "optimizers": ("docs/training-spec.md", optimizers),
    "testing-factories": ("docs/cli.md", testing_factories),
    "cli-keys": ("docs/cli.md", cli_keys),
}


def render(text: str, name: str, body: str) -> str:
    """`text` with the region `name` replaced by `body`."""
    pattern = re.compile(
        rf"(<!-- generated: {re.escape(name)} .*?-->\n)(.*?)(<!-- end generated: {re.escape(name)} -->)",
        re.S,
    )
    if not pattern.search(text):
        raise SystemExit(f"no generated region {name!r}")
    return pattern.sub(lambda m: m[1] + body + "\n" + m[3], text, count=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a page is out of date")
    args = parser.parse_args()
    stale = []
    for name, (rel, make) in REGIONS.items():
        path = ROOT / rel
        text = path.read_text(encoding="utf-8")
        new = render(text, name, make())
        if new != text:
            stale.append(f"{rel} ({name})")
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        sys.exit(
            "generated reference out of date: "
            + ", ".join(stale)
            + ". Run `uv run python scripts/gen_reference.py` and commit the result."
        )
    print("up to date" if not stale else "rewrote: " + ", ".join(stale))


if __name__ == "__main__":
    main()
