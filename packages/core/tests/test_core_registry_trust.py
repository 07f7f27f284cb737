"""Safe loading: the record digest covers the whole manifest, and only trusted code is called."""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import textwrap
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest

from pipekit_train.core import (
    ConfigError,
    IntegrityError,
    UntrustedFactoryError,
    is_model_factory,
    model_factory,
    model_op_from_config,
)
from pipekit_train.core.registry import LocalModelRegistry, UnverifiedRecordWarning
from pipekit_train.core.registry._record import record_digest
from pipekit_train.core.testing import NumpyLinearOp, linear

FACTORY = "pipekit_train.core.testing._numpy_model:linear"

# A user's model operator that calls its factory as `factory(**kwargs)` (as the Lightning
# and Keras operators do), so an edited factory would really run.
USER_OPS = """
import numpy as np
from pipekit_train.core import ModelOpBase
from pipekit_train.core.testing import decode_arrays, encode_arrays


class PlainOp(ModelOpBase):
    backend = "numpy"

    def _build(self, factory, kwargs, seed):
        return factory(**kwargs)

    def serialize_weights(self):
        return encode_arrays({"w": np.zeros(1, np.float32)})

    def _load_weights(self, blob):
        decode_arrays(blob)
"""

USER_MODELS = """
import subprocess

from numpy import zeros as reexported

from pipekit_train.core import model_factory
from pipekit_train.core.testing import linear as _linear


def unmarked(in_size, out_size, *, key=0):
    return _linear(in_size, out_size, key=key)


@model_factory
def marked(in_size, out_size, *, key=0):
    return _linear(in_size, out_size, key=key)


def returns_none(**kwargs):
    return None
"""


def _module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, stem: str) -> str:
    """Write a real user module into a folder on sys.path; return its (unique) name."""
    name = f"{stem}_{uuid.uuid4().hex[:8]}"
    (tmp_path / "src").mkdir(exist_ok=True)
    (tmp_path / "src" / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    importlib.invalidate_caches()
    return name


def _manifest_path(registry: LocalModelRegistry, name: str, version: int = 1) -> Path:
    return Path(registry.root) / name / str(version) / "manifest.json"


def _edit(path: Path, change, *, redigest: bool) -> None:
    """Edit a manifest as someone with write access to the store would."""
    manifest = json.loads(path.read_text())
    change(manifest)
    if redigest:  # an attacker who knows the format recomputes the digest
        manifest["record_sha256"] = record_digest(manifest)
    path.write_text(json.dumps(manifest))


@pytest.fixture
def registry(tmp_path: Path) -> LocalModelRegistry:
    return LocalModelRegistry(tmp_path / "models")


# -- untrusted code is never called ------------------------------------------------------


@pytest.mark.parametrize(
    "factory, kwargs",
    [
        ("subprocess:run", lambda m: {"args": ["touch", str(m)]}),
        ("subprocess.run", lambda m: {"args": ["touch", str(m)]}),
        ("os:system", lambda m: {"command": f"touch {m}"}),
        ("builtins:exec", lambda m: {"source": f"open({str(m)!r}, 'w')"}),
    ],
)
def test_an_edited_factory_is_refused_before_anything_runs(
    registry: LocalModelRegistry,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    factory: str,
    kwargs,
) -> None:
    ops = importlib.import_module(_module(tmp_path, monkeypatch, USER_OPS, "userops"))
    control = tmp_path / "control"
    ops.PlainOp("subprocess:run", args=["touch", str(control)])  # the payload is real ...
    assert control.exists()  # ... when a user constructs the operator in their own code

    op = ops.PlainOp(FACTORY, in_size=2, out_size=1)
    registry.register("victim", op)
    marker = tmp_path / "marker"

    def to_payload(manifest: dict) -> None:
        manifest["config"]["factory"] = factory
        manifest["config"]["kwargs"] = kwargs(marker)

    # A naive edit breaks the record digest.
    _edit(_manifest_path(registry, "victim"), to_payload, redigest=False)
    with pytest.raises(IntegrityError, match="record_sha256"):
        registry.load("victim")
    assert not marker.exists()

    # Someone who recomputes the digest still cannot make load() call it, even when the
    # user trusts the module or the exact path: the standard library is always refused.
    _edit(_manifest_path(registry, "victim"), lambda m: None, redigest=True)
    for trusted in (None, ["subprocess", "os", "builtins"], [factory.replace(".", ":")]):
        with pytest.raises(UntrustedFactoryError, match="standard library") as info:
            registry.load("victim", trusted=trusted)
        assert f"Received: factory={factory!r}" in str(info.value)
        assert not marker.exists()


def test_an_edited_type_is_refused(
    registry: LocalModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry.register("victim", NumpyLinearOp(FACTORY, in_size=2, out_size=1))
    path = _manifest_path(registry, "victim")
    _edit(path, lambda m: m["config"].update(type="subprocess:Popen"), redigest=True)
    with pytest.raises(UntrustedFactoryError, match="type='subprocess:Popen'"):
        registry.load("victim")
    models = _module(tmp_path, monkeypatch, USER_MODELS, "usermodels")
    importlib.import_module(models)
    _edit(path, lambda m: m["config"].update(type=f"{models}:marked"), redigest=True)
    with pytest.raises(UntrustedFactoryError, match="ModelOpBase"):
        registry.load("victim")  # a marked factory is no operator class


def test_a_module_that_is_not_imported_is_not_imported(
    registry: LocalModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    source = f"open({str(marker)!r}, 'w').close()\n" + USER_MODELS
    fresh = _module(tmp_path, monkeypatch, source, "freshmodels")
    registry.register("victim", NumpyLinearOp(FACTORY, in_size=2, out_size=1))
    _edit(
        _manifest_path(registry, "victim"),
        lambda m: m["config"].update(factory=f"{fresh}:marked"),
        redigest=True,
    )
    with pytest.raises(UntrustedFactoryError, match="not imported yet") as info:
        registry.load("victim")
    assert "trusted=" in str(info.value) and "@pipekit_train.core.model_factory" in str(info.value)
    assert not marker.exists() and fresh not in sys.modules
    # Trusting the module lets it be imported (and its marked factory called).
    op = registry.load("victim", trusted=[fresh])
    assert marker.exists() and op.factory == f"{fresh}:marked"


# -- trusted factories load --------------------------------------------------------------


def test_allow_listed_and_marked_user_factories_load(
    registry: LocalModelRegistry, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _module(tmp_path, monkeypatch, USER_MODELS, "usermodels")
    models = importlib.import_module(name)
    plain = NumpyLinearOp(f"{name}:unmarked", seed=3, in_size=3, out_size=2)
    plain.model.b[:] = [0.5, -0.5]
    registry.register("plain", plain)
    registry.register("marked", NumpyLinearOp(models.marked, seed=1, in_size=3, out_size=2))

    with pytest.raises(UntrustedFactoryError, match="not a model factory marked") as info:
        registry.load("plain")
    assert "trusted=['mypkg.models']" in str(info.value)
    for trusted in ([name], f"{name}:unmarked", [models.unmarked], [models]):
        loaded = registry.load("plain", trusted=trusted)
        assert loaded.serialize_weights() == plain.serialize_weights()
    with pytest.raises(UntrustedFactoryError):
        registry.load("plain", trusted=[name[:-1]])  # a prefix is a module, not a string prefix

    # A module prefix trusts what is defined there, not what it imported.
    config = plain.get_config()
    for reached in ("subprocess.run", "subprocess.Popen"):
        with pytest.raises(UntrustedFactoryError, match="standard library"):
            model_op_from_config({**config, "factory": f"{name}:{reached}"}, trusted=[name])
    with pytest.raises(UntrustedFactoryError, match="not a model factory marked"):
        model_op_from_config({**config, "factory": f"{name}:reexported"}, trusted=[name])

    assert is_model_factory(models.marked) and not is_model_factory(models.unmarked)
    x = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(
        registry.load("marked")(x), NumpyLinearOp(models.marked, seed=1, in_size=3, out_size=2)(x)
    )


def test_model_op_from_config_checks_stored_configs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = _module(tmp_path, monkeypatch, USER_MODELS, "usermodels")
    config = NumpyLinearOp(f"{name}:unmarked", in_size=2, out_size=1).get_config()
    with pytest.raises(UntrustedFactoryError):
        model_op_from_config(config)
    assert model_op_from_config(config, trusted=[name]).factory == f"{name}:unmarked"
    testing = NumpyLinearOp(FACTORY, in_size=2, out_size=1).get_config()
    assert model_op_from_config(testing).get_config() == testing  # the testing factory is marked
    assert is_model_factory(linear)
    with pytest.raises(UntrustedFactoryError, match="standard library"):
        model_op_from_config({**testing, "factory": "builtins:eval"}, trusted=["builtins"])
    with pytest.raises(UntrustedFactoryError, match="malformed"):
        model_op_from_config({**testing, "factory": "os:system; rm"})


@pytest.mark.parametrize("bad", [["a b"], [3], "mod:", [":x"], 7])
def test_bad_trusted_entries_are_config_errors(bad: object) -> None:
    config = NumpyLinearOp(FACTORY, in_size=2, out_size=1).get_config()
    with pytest.raises(ConfigError, match="trusted"):
        model_op_from_config(config, trusted=bad)


def test_model_factory_needs_a_callable() -> None:
    with pytest.raises(ConfigError, match="model_factory"):
        model_factory(3)  # type: ignore[arg-type]


# -- the whole record is integrity-checked -----------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda m: m["metrics"].update(val_loss=0.0001),
        lambda m: m["normalizer"]["x"].update(mean=[9.0, 9.0]),
        lambda m: m["config"]["kwargs"].update(out_size=3),
        lambda m: m["config"].update(seed=5),
        lambda m: m["lineage"].update(plan="forged"),
        lambda m: m.update(created="1999-01-01T00:00:00+00:00"),
        lambda m: m.update(normalizer=None),
    ],
    ids=["metric", "normalizer", "kwargs", "seed", "lineage", "created", "dropped-normalizer"],
)
def test_an_edited_manifest_fails_the_integrity_check(registry: LocalModelRegistry, change) -> None:
    normalizer = {"x": {"mean": [0.0, 1.0], "std": [1.0, 2.0]}}
    registry.register(
        "m",
        NumpyLinearOp(FACTORY, in_size=2, out_size=2),
        metrics={"val_loss": 0.5},
        normalizer=normalizer,
    )
    assert registry.record("m").record_sha256 == registry.record("m").digest()
    _edit(_manifest_path(registry, "m"), change, redigest=False)
    for read in (
        lambda: registry.load("m"),
        lambda: registry.record("m"),
        lambda: registry.record("m", version=1),
        lambda: registry.load_record_and_model("m"),
    ):
        with pytest.raises(IntegrityError, match="does not match its digest"):
            read()


def test_swapping_weights_and_their_hash_fails_the_integrity_check(
    registry: LocalModelRegistry,
) -> None:
    registry.register("m", NumpyLinearOp(FACTORY, seed=0, in_size=2, out_size=2))
    other = NumpyLinearOp(FACTORY, seed=9, in_size=2, out_size=2).serialize_weights()
    (Path(registry.root) / "m" / "1" / "weights.bin").write_bytes(other)

    sha = hashlib.sha256(other).hexdigest()
    _edit(_manifest_path(registry, "m"), lambda m: m.update(weights_sha256=sha), redigest=False)
    with pytest.raises(IntegrityError, match="does not match its digest"):
        registry.load("m")


def test_old_records_without_a_digest_load_with_a_warning(registry: LocalModelRegistry) -> None:
    op = NumpyLinearOp(FACTORY, seed=2, in_size=2, out_size=2)
    registry.register("old", op)
    _edit(_manifest_path(registry, "old"), lambda m: m.pop("record_sha256"), redigest=False)
    with pytest.warns(UnverifiedRecordWarning, match="older pipekit-train"):
        loaded = registry.load("old")
    assert loaded.serialize_weights() == op.serialize_weights()
    with pytest.warns(UnverifiedRecordWarning):
        assert registry.record("old").record_sha256 is None
    # Its weights are still verified, and its factory still has to be trusted.
    (Path(registry.root) / "old" / "1" / "weights.bin").write_bytes(b"x")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnverifiedRecordWarning)
        with pytest.raises(IntegrityError, match="do not match the manifest"):
            registry.load("old")
        _edit(
            _manifest_path(registry, "old"),
            lambda m: m["config"].update(factory="subprocess:run"),
            redigest=False,
        )
        with pytest.raises(UntrustedFactoryError):
            model_op_from_config(registry.record("old").config)
