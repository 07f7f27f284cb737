"""`benchmarks/bench_apebench.py` without APEBench (an optional peer, never installed in
the project's environment): it says so in one row and exits 0, so `run_all.py` runs; its
flags choose the cells. Nothing here imports jax or apebench."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location(
        "pipekit_bench_apebench", ROOT / "benchmarks" / "bench_apebench.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_apebench_one_row_says_how_to_install_it(
    bench: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(bench, "apebench_missing", lambda: "apebench is not installed")
    out = tmp_path / "rows.json"
    assert bench.main(["--quick", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert len(rows) == 1
    assert rows[0]["benchmark"] == "apebench" and rows[0]["value"] is None
    assert "uv run --with apebench==0.1.1" in rows[0]["note"]
    assert "skipped" in capsys.readouterr().out


def test_run_all_passes_it_quick_and_json(bench: Any) -> None:
    spec = importlib.util.spec_from_file_location(
        "pipekit_run_all_ape", ROOT / "benchmarks" / "run_all.py"
    )
    assert spec is not None and spec.loader is not None
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    source = (ROOT / "benchmarks" / "bench_apebench.py").read_text()
    assert run_all.supported_flags(source) == (True, True)


def _cells(bench: Any, *argv: str) -> list[tuple]:
    return bench.planned_cells(bench._parser().parse_args(list(argv)))


def test_the_full_run_covers_every_cell_with_the_issue_seeds(bench: Any) -> None:
    cells = _cells(bench)
    assert len(cells) == 2 * 3 * 4  # networks x scenarios x (one@10k, one/sup;5/div;5@2k)
    assert cells[0] == ("diff_ks", "Conv", "one", 10_000, 2_000, (0, 1, 2))
    adv = {c[5] for c in cells if c[0] == "diff_adv"}
    assert adv == {(0, 1, 2, 3, 4)}
    assert {(c[2], c[3], c[4]) for c in cells} == {
        ("one", 10_000, 2_000),
        ("one", 2_000, 400),
        ("sup;5", 2_000, 400),
        ("div;5", 2_000, 400),
    }


def test_flags_choose_one_cell(bench: Any) -> None:
    cells = _cells(
        bench, "--scenario", "diff_adv", "--network", "FNO", "--config", "sup;5", "--seeds", "3"
    )
    assert cells == [("diff_adv", "FNO", "sup;5", 2_000, 400, (3,))]
    assert _cells(bench, "--scenario", "diff_ks", "--network", "Conv", "--updates", "10000") == [
        ("diff_ks", "Conv", "one", 10_000, 2_000, (0, 1, 2))
    ]
    quick = _cells(bench, "--quick")
    assert [c[2] for c in quick] == ["one", "sup;5", "div;5"]
    assert {(c[0], c[1], c[3], c[5]) for c in quick} == {("diff_ks", "Conv", 200, (0,))}


def test_the_optimizer_is_apebenchs_warmup_cosine(bench: Any) -> None:
    from pipekit_train.core.spec import learning_rate_at

    config = bench.optimizer_config(2_000, 400)
    schedule = config["learning_rate"]
    assert config["name"] == "adam"
    # optax.warmup_cosine_decay_schedule(0.0, 1e-3, 400, 2000): 0 at 0, the peak at 400
    assert learning_rate_at(schedule, 0) == 0.0
    assert learning_rate_at(schedule, 400) == pytest.approx(1e-3)
    assert learning_rate_at(schedule, 2_000) == pytest.approx(0.0, abs=1e-12)
