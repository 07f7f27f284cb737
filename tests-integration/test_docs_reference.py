"""The reference parts of the docs come from the code, and the pages say what the code does.

- The generated regions (`scripts/gen_reference.py`: the optimizer table, the testing
  factories' signatures, the CLI's keys) match what the generator writes now.
- Claims the pages make in prose, checked against the code: the optimizer names and keys
  the Lightning guide says are refused, the default learning rate, the CHANGELOGs' one
  section per kind, the performance page's header.
- `docs/performance.md` is exactly what `benchmarks/run_all.py --from-stored` writes from
  the stored CPU results and the section files in `benchmarks/` (a hand edit fails here).

Only core is imported (the backend modules are read as source), so this runs in seconds.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.adapter import optimizer_spec
from pipekit_train.core.spec import OPTIMIZERS

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen = _load("pipekit_gen_reference", ROOT / "scripts" / "gen_reference.py")


def test_generated_reference_is_up_to_date() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_reference.py"), "--check"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_optimizer_table_lists_every_name_with_its_defaults_and_translations() -> None:
    table = gen.optimizers()
    for name in OPTIMIZERS:
        row = next(line for line in table.splitlines() if line.startswith(f"| `{name}` |"))
        for key, value in optimizer_spec({"name": name}).to_config().items():
            if key in OPTIMIZERS[name] or key == "weight_decay":
                assert f"`{key}={gen._value(value)}`" in row, (name, key, row)
        assert "**missing**" not in row, f"an adapter's _optim.py table has no row for {name}"
    assert "default `1e-3`" in table
    assert (
        optimizer_spec(None).learning_rate == 1e-3 == optimizer_spec({"name": "sgd"}).learning_rate
    )
    assert optimizer_spec({"lr": 0.1}).name == optimizer_spec(None).name == "adam"


def test_training_spec_page_says_the_default_learning_rate() -> None:
    page = (ROOT / "docs" / "training-spec.md").read_text()
    assert "default `1e-3`" in page


def test_testing_factories_table_matches_the_signatures() -> None:
    """The generator reads signatures from the source; check it on the importable one."""
    from pipekit_train.core.testing import linear

    table = gen.testing_factories()
    expected = str(inspect.signature(linear)).replace(": int", "")
    assert "linear(in_size, out_size, *, key=0)" in table
    assert "in_size" in expected and "key" in expected
    keras = (ROOT / "packages/keras/src/pipekit_train/keras/testing.py").read_text()
    fn = next(
        n for n in ast.parse(keras).body if isinstance(n, ast.FunctionDef) and n.name == "mlp"
    )
    assert gen._signature(fn) in table
    assert "batch_norm=False" in gen._signature(fn)


@pytest.mark.parametrize(
    "config",
    [
        {"name": "nadam"},
        {"name": "radam"},
        {"name": "adadelta"},
        {"name": "adamax"},
        {"name": "rmsprop", "alpha": 0.99},
    ],
)
def test_names_and_keys_the_lightning_guide_says_are_refused(config: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="Received"):
        optimizer_spec(config)


def test_lightning_guide_lists_no_optimizer_outside_the_table() -> None:
    page = (ROOT / "docs" / "guides" / "lightning.md").read_text()
    assert "adadelta, adagrad, adam, adamax" not in page
    assert "optax spellings accepted" not in page
    assert optimizer_spec({"name": "adam", "betas": (0.8, 0.9)}).hyper["b1"] == 0.8


def test_keras_and_cli_pages_do_not_hand_write_factory_signatures() -> None:
    assert "width=64, depth=2, dropout=0.0" not in (ROOT / "docs/guides/keras.md").read_text()
    assert "take the same arguments" not in (ROOT / "docs/cli.md").read_text()


@pytest.mark.parametrize("path", sorted(ROOT.glob("packages/*/CHANGELOG.md")), ids=str)
def test_changelog_has_one_section_of_each_kind_per_version(path: Path) -> None:
    text = path.read_text()
    assert "First release." not in text
    for version in re.split(r"^## ", text, flags=re.M)[1:]:
        kinds = re.findall(r"^### (\w+)", version, flags=re.M)
        assert len(kinds) == len(set(kinds)), f"{path}: {version.splitlines()[0]}: {kinds}"


def test_data_guide_shows_the_iterator_state_the_code_has() -> None:
    import numpy as np

    from pipekit_train.core.data import ArrayDataset, make_batches

    it = make_batches(ArrayDataset(x=np.zeros((10, 1))), 2, seed=0)
    assert "shard" not in it.get_state()
    assert '"shard"' not in (ROOT / "docs/guides/data.md").read_text()


def test_performance_page_header_names_its_commit_and_date() -> None:
    run_all = _load("pipekit_run_all", ROOT / "benchmarks" / "run_all.py")
    page = run_all.render(
        [],
        {"Date": "2030-01-02 03:04 UTC", "Commit": "abc1234"},
        quick=True,
        command="uv run python benchmarks/run_all.py",
    )
    assert page.splitlines()[2] == (
        "Generated by `benchmarks/run_all.py` on 2030-01-02 03:04 UTC at commit `abc1234`."
    )
    runner = _load("pipekit_docs_runner_ref", Path(__file__).with_name("docs_runner.py"))
    blocks = [b for b in runner.parse(page) if b.lang == "bash"]
    assert blocks and all(b.skip for b in blocks), "the generated page's shell blocks say why not"
    current = (ROOT / "docs" / "performance.md").read_text().splitlines()[2]
    assert re.fullmatch(r"Generated by `benchmarks/run_all.py` on .+ at commit `.+`\.", current)


def test_performance_page_is_what_run_all_writes_from_its_stored_inputs() -> None:
    run_all = _load("pipekit_run_all_stored", ROOT / "benchmarks" / "run_all.py")
    page = (ROOT / "docs" / "performance.md").read_text()
    assert page == run_all.render_stored(), (
        "docs/performance.md differs from what its inputs render: edit the section files in "
        "benchmarks/ (gpu-check.md, tpu-check.md, rollout.md, rollout-training.md) or measure "
        "again, then run `uv run python benchmarks/run_all.py --from-stored`; never edit the "
        "page by hand"
    )
    # every section measured elsewhere is on the page, as its file says it
    for name in ("gpu-check.md", "tpu-check.md", "rollout.md", "rollout-training.md"):
        text = (ROOT / "benchmarks" / name).read_text()
        body = [x for x in text.splitlines() if x.startswith("| ")]
        assert body and all(x in page.splitlines() for x in body), name
    stored = json.loads((ROOT / "benchmarks" / "cpu-results.json").read_text())
    assert f"at commit `{stored['machine']['Commit']}`." in page.splitlines()[2]


def test_run_all_stores_what_it_renders(tmp_path: Path) -> None:
    run_all = _load("pipekit_run_all_store", ROOT / "benchmarks" / "run_all.py")
    row = {
        "benchmark": "import", "case": "pipekit_train.core", "metric": "import time",
        "value": 0.2451, "unit": "s", "ratio": 1.84, "target": "< 1 s", "ok": True,
        "note": "a | b",
    }  # fmt: skip
    results = [
        {"script": "bench_import.py", "seconds": 12.3, "rows": [row], "stdout": None},
        {"script": "bench_x.py", "seconds": 1.0, "rows": [], "stdout": "plain output"},
    ]
    machine = {"Date": "2030-01-02 03:04 UTC", "Commit": "abc1234", run_all.LOAD_AT_END: "0.1"}
    command = "uv run python benchmarks/run_all.py --quick"
    run_all.store(results, machine, quick=True, command=command, path=tmp_path / "s.json")
    page = run_all.render_stored(tmp_path / "s.json")
    assert page == run_all.render(results, machine, quick=True, command=command)
    assert (
        "| import | pipekit_train.core | import time | 0.245 | s | 1.84 | < 1 s | ✅ | a \\| b |"
        in page
    )
    assert "| Load average (1, 5, 15 min) at the end | 0.1 |" in page
