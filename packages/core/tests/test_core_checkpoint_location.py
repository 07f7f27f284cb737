"""Checkpoint locations: a URI is never a local path, and a file is not a directory."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.testing import NumpyLinearOp, regression_task

URIS = [
    "s3://bucket/run",
    "gs://bucket/run",
    "memory://run",
    "file:///tmp/run",
    "S3://Bucket/run",
    "az://container/run",
    "hdfs://namenode/run",
]


@pytest.mark.parametrize("uri", URIS)
def test_uri_locations_are_refused_and_nothing_is_created(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="not supported yet") as info:
        Checkpoint(uri)
    message = str(info.value)
    assert f"Received: directory={uri!r}" in message
    assert "local" in message
    with pytest.raises(ConfigError, match="not supported yet"):
        Checkpoint(Path(uri))  # a Path("s3://b") is "s3:/b": still refused, never a folder
    train, _ = regression_task(n_train=32)
    with pytest.raises(ConfigError, match="not supported yet"):
        TrainingLoop(
            model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
            data=train,
            loss="mse",
            optimizer_config={"name": "sgd", "lr": 0.1},
            batch_size=8,
            max_steps=2,
            checkpoint=uri,
            progress=False,
        )
    assert list(tmp_path.iterdir()) == []  # no `s3:` (or any) folder in the working directory


def test_file_uri_points_at_the_local_path() -> None:
    with pytest.raises(ConfigError, match="Use the local path '/tmp/run'"):
        Checkpoint("file:///tmp/run")


def test_a_path_that_is_an_existing_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.write_text("not a folder")
    with pytest.raises(ConfigError, match="existing file") as info:
        Checkpoint(target)
    assert f"Received: directory={str(target)!r}" in str(info.value)
    assert target.read_text() == "not a folder"


def test_local_paths_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Checkpoint("runs/a").path == tmp_path / "runs" / "a"
    assert Checkpoint(tmp_path / "existing").path == tmp_path / "existing"
    (tmp_path / "dir").mkdir()
    assert Checkpoint(tmp_path / "dir").path == tmp_path / "dir"
    assert Checkpoint("weird:name").path == tmp_path / "weird:name"  # a colon alone is no URI
    assert list(tmp_path.iterdir()) == [tmp_path / "dir"]  # nothing created at construction
