"""Issue 13's exploit on a real backend: an edited manifest cannot run a command on load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipekit_train.core import ConfigError, IntegrityError, UntrustedFactoryError
from pipekit_train.core.registry import LocalModelRegistry
from pipekit_train.core.registry._record import record_digest
from pipekit_train.lightning import TorchModelOp

LINEAR = "pipekit_train.lightning.testing:linear"


def test_a_manifest_naming_subprocess_run_runs_nothing(tmp_path: Path) -> None:
    registry = LocalModelRegistry(tmp_path / "models")
    op = TorchModelOp(LINEAR, in_size=3, out_size=1, seed=2)
    registry.register("victim", op)
    assert registry.load("victim").serialize_weights() == op.serialize_weights()

    marker = tmp_path / "marker"
    path = tmp_path / "models" / "victim" / "1" / "manifest.json"
    manifest = json.loads(path.read_text())
    manifest["config"]["factory"] = "subprocess:run"
    manifest["config"]["kwargs"] = {"args": ["touch", str(marker)]}

    # The payload is real: the operator class calls `factory(**kwargs)` ...
    with pytest.raises(ConfigError, match="torch.nn.Module"):
        TorchModelOp.from_config(manifest["config"])
    assert marker.exists()
    marker.unlink()

    # ... but load() refuses it before anything runs, edited naively or not.
    path.write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError):
        registry.load("victim")
    manifest["record_sha256"] = record_digest(manifest)
    path.write_text(json.dumps(manifest))
    with pytest.raises(UntrustedFactoryError, match="subprocess:run"):
        registry.load("victim", trusted=["subprocess"])
    assert not marker.exists()
