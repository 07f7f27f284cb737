"""Registry handoff per backend: TrainingLoop → artifact → registry → load, bytes identical;
a Gaussian head comes back as a distribution in original units."""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import toymodels

from pipekit_train.core import LocalModelRegistry, NeuralForward, S3ModelRegistry, TrainingLoop
from pipekit_train.core.data import Normalizer
from pipekit_train.core.testing import regression_task

BACKENDS = ("equinox", "lightning", "keras")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint(monkeypatch_module: pytest.MonkeyPatch) -> Iterator[str]:
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    for key, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }.items():
        monkeypatch_module.setenv(key, value)
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    fs = s3fs.S3FileSystem(
        key="testing", secret="testing", client_kwargs={"endpoint_url": endpoint}
    )
    fs.mkdir("models")
    yield endpoint
    server.stop()


@pytest.fixture(scope="module")
def monkeypatch_module() -> Iterator[pytest.MonkeyPatch]:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.fixture(scope="module", params=BACKENDS)
def trained(request: pytest.FixtureRequest) -> tuple[str, object]:
    backend = request.param
    train, val = regression_task()
    loop = TrainingLoop(
        model=toymodels.model_op(backend, in_size=4, out_size=1, width=16, seed=0),
        data=train,
        validation=val,
        loss="mse",
        metrics=["mae"],
        optimizer_config={"name": "adam", "lr": 1e-2},
        batch_size=32,
        max_steps=40,
        seed=0,
        sweep_id="sweep-handoff",
        progress=False,
    )
    return backend, loop.run()


def _check_round_trip(registry: object, artifact: object) -> dict:
    record = artifact.register(registry, "regressor")
    loaded_record, loaded = registry.load_record_and_model("regressor")
    blob = artifact.model.serialize_weights()
    assert (
        hashlib.sha256(loaded.serialize_weights()).hexdigest()
        == hashlib.sha256(blob).hexdigest()
        == record.weights_sha256
    )
    x = regression_task()[1].get_batch(np.arange(32))["x"]
    np.testing.assert_array_equal(np.asarray(loaded(x)), np.asarray(artifact.model(x)))
    assert loaded_record.version == record.version
    return loaded_record.lineage


def test_local_registry_round_trip(trained: tuple[str, object], tmp_path: Path) -> None:
    backend, artifact = trained
    lineage = _check_round_trip(LocalModelRegistry(tmp_path / "registry"), artifact)
    assert lineage["sweep_id"] == "sweep-handoff"
    assert lineage["backend"] == backend and lineage["plan"]["batch_size"] == 32
    assert "numpy" in lineage["versions"] and "pipekit-train-core" in lineage["versions"]
    manifest = json.loads(next((tmp_path / "registry").rglob("manifest.json")).read_text())
    assert manifest["config"]["factory"].startswith("toymodels:")


def test_s3_registry_round_trip(trained: tuple[str, object], s3_endpoint: str) -> None:
    backend, artifact = trained
    registry = S3ModelRegistry(
        f"s3://models/{backend}",
        key="testing",
        secret="testing",
        client_kwargs={"endpoint_url": s3_endpoint},
    )
    lineage = _check_round_trip(registry, artifact)
    assert lineage["sweep_id"] == "sweep-handoff"


@pytest.mark.parametrize("backend", BACKENDS)
def test_gaussian_head_round_trip(backend: str, tmp_path: Path) -> None:
    """A `gaussian_nll` model from any backend is registered with its Gaussian head and
    loads back as a distribution in the target's original units."""
    train, val = regression_task(n_train=128, n_val=32)
    norm = Normalizer.fit(train, keys=("x", "y"))
    artifact = TrainingLoop(
        model=toymodels.model_op(backend, in_size=4, out_size=2, width=16, seed=0),
        data=train,
        normalizer=norm,
        loss="gaussian_nll",
        optimizer_config={"name": "adam", "lr": 1e-2},
        batch_size=32,
        max_steps=30,
        seed=0,
        progress=False,
    ).run()
    registry = LocalModelRegistry(tmp_path / "registry")
    assert artifact.register(registry, "posterior").head == "gaussian"  # from the loss
    record, loaded = registry.load_record_and_model("posterior")
    assert record.head == "gaussian" and record.backend == backend
    dist = NeuralForward.from_record(record, loaded).distribution(val.get_batch(np.arange(32))["x"])

    x = val.get_batch(np.arange(32))["x"]
    raw = np.asarray(artifact.model(norm.apply({"x": x})["x"]), dtype=np.float64)
    scale, offset = norm.std["y"], norm.mean["y"]
    np.testing.assert_allclose(dist.mean, raw[:, :1] * scale + offset, rtol=1e-5)
    np.testing.assert_allclose(dist.std, np.exp(0.5 * raw[:, 1:]) * scale, rtol=1e-5)
    assert dist.mean.shape == dist.std.shape == (32, 1) and np.all(dist.std > 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixture_head_round_trip(backend: str, tmp_path: Path) -> None:
    """A `mixture_nll` model from any backend is registered with its mixture head and its
    options, and loads back as a `Mixture` in the target's original units."""
    from pipekit_train.core import Mixture, losses

    train, val = regression_task(n_train=128, n_val=32)
    norm = Normalizer.fit(train, keys=("x", "y"))
    width = losses.mixture_width(3, 1, "full")
    artifact = TrainingLoop(
        model=toymodels.model_op(backend, in_size=4, out_size=width, width=16, seed=0),
        data=train,
        normalizer=norm,
        loss=losses.mixture_nll(n_components=3, covariance="full"),
        optimizer_config={"name": "adam", "lr": 1e-2},
        batch_size=32,
        max_steps=30,
        seed=0,
        progress=False,
    ).run()
    assert np.isfinite(artifact.final_metrics["loss"])
    registry = LocalModelRegistry(tmp_path / "registry")
    registered = artifact.register(registry, "posterior")  # head and options from the loss
    assert registered.head == "mixture"
    assert registered.head_options == {"n_components": 3, "covariance": "full"}
    record, loaded = registry.load_record_and_model("posterior")
    assert record.head_options == registered.head_options and record.backend == backend
    x = val.get_batch(np.arange(32))["x"]
    dist = NeuralForward.from_record(record, loaded).distribution(x)
    assert isinstance(dist, Mixture) and dist.means.shape == (32, 3, 1)

    raw = Mixture.from_output(
        np.asarray(artifact.model(norm.apply({"x": x})["x"]), dtype=np.float64), 3, "full"
    )
    scale, offset = norm.std["y"], norm.mean["y"]
    np.testing.assert_allclose(dist.weights, raw.weights, rtol=1e-5)
    np.testing.assert_allclose(dist.means, raw.means * scale + offset, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(dist.scale_tril, raw.scale_tril * scale, rtol=1e-5)
    y = val.get_batch(np.arange(32))["y"]
    np.testing.assert_allclose(
        dist.log_prob(y), raw.log_prob((y - offset) / scale) - np.log(scale).sum(), rtol=1e-4
    )


def test_mixture_width_is_checked_before_any_work(tmp_path: Path) -> None:
    """A model whose output width does not fit `mixture_nll`'s layout is refused by
    `TrainingLoop` itself, naming the width it needs."""
    from pipekit_train.core import ConfigError, losses

    train, _ = regression_task(n_train=64, n_val=8, out_size=2)
    with pytest.raises(ConfigError, match=r"2 target values need 15 outputs.*out_size=15"):
        TrainingLoop(
            model=toymodels.model_op("equinox", in_size=4, out_size=14, width=8, seed=0),
            data=train,
            loss=losses.mixture_nll(n_components=3),
            optimizer_config={"name": "adam", "lr": 1e-2},
            batch_size=16,
            max_steps=5,
            checkpoint=str(tmp_path / "ckpt"),
            progress=False,
        )
    assert not (tmp_path / "ckpt").exists()  # nothing on disk
