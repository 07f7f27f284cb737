"""Checkpoint locations: local folders and fsspec URIs, validated before any work."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from pipekit_train.core import Checkpoint, ConfigError, TrainingLoop
from pipekit_train.core.testing import NumpyLinearOp, regression_task


def _loop(checkpoint: object) -> TrainingLoop:
    train, _ = regression_task(n_train=32)
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=4, out_size=1),
        data=train,
        loss="mse",
        optimizer_config={"name": "sgd", "lr": 0.1},
        batch_size=8,
        max_steps=2,
        checkpoint=checkpoint,
        progress=False,
    )


@pytest.mark.parametrize(
    ("uri", "location"),
    [
        ("s3://bucket/run", "s3://bucket/run"),
        ("S3://Bucket/run/", "s3://Bucket/run"),
        ("memory://run", "memory://run"),
    ],
)
def test_uri_locations_are_accepted_and_nothing_is_created(
    uri: str, location: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    policy = Checkpoint(uri)
    assert policy.is_remote and policy.location == location
    assert policy.step_location(12) == f"{location}/12"
    with pytest.raises(ValueError, match="Checkpoint.location"):
        _ = policy.path  # a URI is never a local folder
    assert _loop(uri).plan.checkpoint == policy
    assert list(tmp_path.iterdir()) == []  # no `s3:` (or any) folder in the working directory


@pytest.mark.parametrize("uri", ["nosuchproto://bucket/run", "hdfsx://namenode/run"])
def test_an_unknown_protocol_is_refused(
    uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="which fsspec does not know") as info:
        Checkpoint(uri)
    assert f"Received: directory={uri!r}" in str(info.value)
    with pytest.raises(ConfigError, match="which fsspec does not know"):
        _loop(uri)
    assert list(tmp_path.iterdir()) == []


def test_a_protocol_whose_implementation_is_missing_names_the_package(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(
        importlib.import_module("fsspec.registry").known_implementations,
        "pkfake",
        {"class": "pipekit_no_such_module.FakeFS", "err": "Install pkfakefs to access pkfake"},
    )
    with pytest.raises(ConfigError, match="not installed") as info:
        Checkpoint("pkfake://bucket/run")
    message = str(info.value)
    assert "Install pkfakefs" in message and "Received: directory='pkfake://bucket/run'" in message


def test_gcs_without_gcsfs_points_at_the_extra() -> None:
    try:
        import gcsfs  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"pipekit-train-core\[gcs\]"):
            Checkpoint("gs://bucket/run")
    else:  # gcsfs installed: the URI is accepted
        assert Checkpoint("gs://bucket/run").location == "gs://bucket/run"


@pytest.mark.parametrize(
    ("directory", "fragment"),
    [
        (Path("s3://bucket/run"), "collapsed"),  # pathlib turns it into "s3:/bucket/run"
        ("memory:/run", "collapsed"),
        ("s3://", "must name a bucket"),
        ("simplecache::s3://bucket/run", "chained"),
    ],
)
def test_malformed_uris_are_refused(
    directory: object, fragment: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=fragment):
        Checkpoint(directory)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_file_uri_is_the_local_path(tmp_path: Path) -> None:
    policy = Checkpoint(f"file://{tmp_path}/run")
    assert not policy.is_remote and policy.path == tmp_path / "run"
    assert policy.location == str(tmp_path / "run")


def test_storage_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="only apply to a URI"):
        Checkpoint(tmp_path / "ck", storage_options={"anon": True})
    with pytest.raises(ConfigError, match="must be a dict"):
        Checkpoint("memory://run", storage_options=[("anon", True)])  # type: ignore[arg-type]
    options = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    policy = Checkpoint("s3://bucket/run", storage_options=options)
    options["client_kwargs"] = {}  # the policy holds its own copy of the top level
    assert policy.storage_options == {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}
    assert "127.0.0.1" not in repr(policy)
    hash(policy)  # still hashable


def test_a_path_that_is_an_existing_file_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "ckpt"
    target.write_text("not a folder")
    with pytest.raises(ConfigError, match="existing file") as info:
        Checkpoint(target)
    assert f"Received: directory={str(target)!r}" in str(info.value)
    with pytest.raises(ConfigError, match="existing file"):
        Checkpoint(f"file://{target}")
    assert target.read_text() == "not a folder"


def test_local_paths_still_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Checkpoint("runs/a").path == tmp_path / "runs" / "a"
    assert Checkpoint("runs/a").location == str(tmp_path / "runs" / "a")
    assert Checkpoint(tmp_path / "existing").path == tmp_path / "existing"
    (tmp_path / "dir").mkdir()
    assert Checkpoint(tmp_path / "dir").path == tmp_path / "dir"
    assert Checkpoint("weird:name").path == tmp_path / "weird:name"  # a colon alone is no URI
    assert not Checkpoint("weird:name").is_remote
    assert list(tmp_path.iterdir()) == [tmp_path / "dir"]  # nothing created at construction
