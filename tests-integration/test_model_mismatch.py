"""A model operator handed another framework's factory fails at construction, clearly.

Each operator class (`EquinoxModelOp`, `TorchModelOp`, `KerasModelOp`) is given the
other backends' testing factories: the `ConfigError` names the framework the factory
builds, the operator class, the operator that holds such a model, and the operator's own
testing factory of the same name — never a raw `TypeError` from inside the build.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap

import equinox as eqx
import jax
import numpy as np
import pytest

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.data import ArrayDataset
from pipekit_train.equinox import EquinoxModelOp
from pipekit_train.keras import KerasModelOp
from pipekit_train.lightning import TorchModelOp

OPS = {"equinox": EquinoxModelOp, "lightning": TorchModelOp, "keras": KerasModelOp}
BUILDS = {
    "equinox": "an Equinox model (an `eqx.Module`: it takes a PRNG `key`)",
    "lightning": "a PyTorch model (a `torch.nn.Module`)",
    "keras": "a Keras model (a `keras.Model`)",
}
HOLDS = {
    "equinox": "an `eqx.Module`",
    "lightning": "a `torch.nn.Module`",
    "keras": "a `keras.Model`",
}
PAIRS = [(a, b) for a, b in itertools.product(OPS, OPS) if a != b]


@pytest.mark.parametrize("name", ["linear", "mlp"])
@pytest.mark.parametrize(("op_backend", "factory_backend"), PAIRS)
def test_other_backends_factory_is_refused_naming_both_and_the_match(
    op_backend: str, factory_backend: str, name: str
) -> None:
    op_cls = OPS[op_backend]
    factory = f"pipekit_train.{factory_backend}.testing:{name}"
    with pytest.raises(ConfigError) as info:
        op_cls(factory, in_size=4, out_size=1, seed=0)
    assert str(info.value) == (
        f"Received: factory={factory!r} with `{op_cls.__name__}`, but the factory builds "
        f"{BUILDS[factory_backend]} and `{op_cls.__name__}` holds {HOLDS[op_backend]}. "
        f"Use `{OPS[factory_backend].__name__}` for this factory, or the matching factory "
        f"'pipekit_train.{op_backend}.testing:{name}' with `{op_cls.__name__}`."
    )
    # The suggested factory does work with this operator.
    op = op_cls(f"pipekit_train.{op_backend}.testing:{name}", in_size=4, out_size=1, seed=0)
    assert op(np.zeros((2, 4), np.float32)).shape == (2, 1)


def test_readme_quickstart_with_only_the_operator_swapped_fails_before_training(tmp_path) -> None:
    x = np.random.default_rng(0).uniform(-1, 1, (64, 4)).astype(np.float32)
    with pytest.raises(ConfigError, match=r"builds an Equinox model .*Use `EquinoxModelOp`"):
        TrainingLoop(
            model=TorchModelOp(
                "pipekit_train.equinox.testing:linear", in_size=4, out_size=1, seed=0
            ),
            data=ArrayDataset(x=x, y=x.sum(1, keepdims=True)),
            loss="mse",
            batch_size=16,
            max_steps=5,
        )
    assert list(tmp_path.iterdir()) == []


def keyless_equinox_linear(in_size: int, out_size: int) -> eqx.nn.Linear:
    return eqx.nn.Linear(in_size, out_size, key=jax.random.PRNGKey(0))


def test_a_factory_of_the_right_framework_without_key_still_gets_the_key_error() -> None:
    with pytest.raises(ConfigError, match=r"An Equinox factory must take a keyword argument `key`"):
        EquinoxModelOp(keyless_equinox_linear, in_size=2, out_size=1)


@pytest.mark.slow  # a fresh interpreter importing torch and Keras on torch (~20 s)
def test_keras_model_on_torch_is_refused_by_the_lightning_operator() -> None:
    # On the torch backend a `keras.Model` *is* a `torch.nn.Module`; the operator must
    # still refuse it (its weights and training loop are Keras's, not Lightning's).
    code = textwrap.dedent(
        """
        from pipekit_train.core import ConfigError
        from pipekit_train.lightning import TorchModelOp
        import pipekit_train.keras
        try:
            TorchModelOp("pipekit_train.keras.testing:linear", in_size=4, out_size=1)
        except ConfigError as exc:
            print(exc)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "KERAS_BACKEND": "torch"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "but the factory builds a Keras model (a `keras.Model`) and `TorchModelOp` holds "
        "a `torch.nn.Module`. Use `KerasModelOp` for this factory"
    ) in proc.stdout
