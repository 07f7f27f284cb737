"""The documentation notebooks execute top to bottom (small settings)."""

from __future__ import annotations

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
    # Run it where a downloaded notebook would run: a folder outside the repository.
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    errors = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if o.get("output_type") == "error"
    ]
    assert not errors
    assert not [p.name for p in NOTEBOOKS.iterdir() if p.suffix != ".ipynb"], "files left behind"
    assert not list(tmp_path.iterdir()), "files left behind in the working directory"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_is_self_contained(name: str) -> None:
    """A notebook downloaded from the site runs: it imports nothing from the repository."""
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for needle in ("sys.path", "examples", "toymodels", "../"):
        assert needle not in code, f"{name} uses {needle!r}: define what it needs inline"


@pytest.mark.parametrize("name", ["quickstart.ipynb", "cycle_handoff.ipynb"])
def test_notebook_stores_its_outputs(name: str) -> None:
    """The docs render the stored outputs: every code cell ran, none failed, a figure shows.

    Refresh them with `uv run python scripts/execute_notebooks.py` after editing a notebook.
    """
    nbformat = pytest.importorskip("nbformat")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in code), f"{name} has cells that were not run"
    outputs = [o for c in code for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs), f"{name} shows no figure"
