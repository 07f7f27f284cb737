"""The documentation notebooks execute top to bottom (small settings)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "docs" / "notebooks"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("PIPEKIT_NOTEBOOK_STEPS", "400")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    for leftover in ("quickstart_loss.png",):
        p = NOTEBOOKS / leftover
        if p.exists():
            os.remove(p)
