"""Smoke tests of the worked examples with few steps (the full runs are documented)."""

from __future__ import annotations

from pathlib import Path

import amortized
import direct
import pytest


@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_direct(backend: str, tmp_path: Path) -> None:
    result = direct.main(["--backend", backend, "--steps", "60", "--out", str(tmp_path)])
    assert result["test_rmse"] < 1.0
    assert (tmp_path / backend / "loss.png").exists()
    assert (tmp_path / backend / "metrics.jsonl").read_text().count("\n") >= 60


@pytest.mark.parametrize("backend", ["equinox", "lightning", "keras"])
def test_amortized(backend: str, tmp_path: Path) -> None:
    result = amortized.main(
        ["--backend", backend, "--steps", "60", "--samples", "1024", "--out", str(tmp_path)]
    )
    assert 0.0 <= result["coverage68"] <= 1.0 and 0.0 <= result["coverage95"] <= 1.0
    assert result["coverage95"] >= result["coverage68"]
    assert (tmp_path / backend / "posterior.png").exists()
