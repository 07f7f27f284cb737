"""The pure-numpy model operator used by registry tests and the numpy reference adapter."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.model._operators import model_op_from_config
from pipekit_train.core.testing._numpy_model import (
    LinearModel,
    NumpyLinearOp,
    decode_arrays,
    encode_arrays,
    linear,
)

FACTORY = "pipekit_train.core.testing._numpy_model:linear"


def test_linear_factory_is_seeded_float32() -> None:
    a, b = linear(4, 3, key=5), linear(4, 3, key=5)
    assert isinstance(a, LinearModel)
    assert a.W.shape == (4, 3) and a.b.shape == (3,)
    assert a.W.dtype == np.float32 and a.b.dtype == np.float32
    np.testing.assert_array_equal(a.W, b.W)
    assert not np.array_equal(a.W, linear(4, 3, key=6).W)
    x = np.ones((2, 4), dtype=np.float32)
    np.testing.assert_allclose(a(x), x @ a.W + a.b)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"in_size": 0, "out_size": 1},
        {"in_size": 2, "out_size": 1.5},
        {"in_size": True, "out_size": 1},
    ],
)
def test_linear_factory_validates_sizes(kwargs: dict) -> None:
    with pytest.raises(ConfigError, match="must be a positive int"):
        linear(**kwargs)


def test_op_config_round_trip_and_deterministic_weights() -> None:
    op = NumpyLinearOp(FACTORY, seed=3, in_size=4, out_size=2)
    assert op.backend == "numpy"
    config = op.get_config()
    assert config == {
        "type": "pipekit_train.core.testing._numpy_model:NumpyLinearOp",
        "backend": "numpy",
        "factory": FACTORY,
        "kwargs": {"in_size": 4, "out_size": 2},
        "seed": 3,
    }
    rebuilt = model_op_from_config(config)
    assert rebuilt.serialize_weights() == op.serialize_weights()  # same seed, same bytes
    op.model.b[:] = [1.0, 2.0]
    moved = rebuilt.with_weights(op.serialize_weights())
    assert moved.serialize_weights() == op.serialize_weights()
    assert moved.model.W.flags.writeable  # trainable after loading
    x = np.random.default_rng(1).standard_normal((3, 4))
    np.testing.assert_array_equal(moved(x), op(x))
    assert NumpyLinearOp(linear, in_size=1, out_size=1).factory == FACTORY


def test_key_is_reserved_for_the_seed() -> None:
    with pytest.raises(ConfigError, match="`key` is set from `seed`"):
        NumpyLinearOp(FACTORY, in_size=1, out_size=1, key=3)


@pytest.mark.parametrize("seed", [-1, 1.5, "0", True, None])
def test_bad_seeds_are_refused_like_the_loop_does(seed: object) -> None:
    with pytest.raises(ConfigError, match=r"`seed` must be a non-negative int\. Received: seed="):
        NumpyLinearOp(FACTORY, seed=seed, in_size=1, out_size=1)
    assert NumpyLinearOp(FACTORY, seed=np.int64(5), in_size=1, out_size=1).seed == 5


def test_codec_is_byte_stable_and_round_trips() -> None:
    arrays = {
        "b": np.arange(3, dtype=">f8"),  # big-endian input is written little-endian
        "a": np.array([[True, False]]),
        "c": np.zeros((0, 2), dtype=np.int16),
        "d": np.asfortranarray(np.arange(6, dtype=np.complex64).reshape(2, 3)),
    }
    blob = encode_arrays(arrays)
    assert blob == encode_arrays(dict(reversed(list(arrays.items()))))
    out = decode_arrays(blob)
    assert list(out) == ["a", "b", "c", "d"]
    for k, v in arrays.items():
        np.testing.assert_array_equal(out[k], v)
        assert out[k].shape == v.shape
    assert out["b"].dtype == np.dtype("<f8")


def test_codec_rejects_unsafe_and_damaged_input() -> None:
    with pytest.raises(ConfigError, match="numeric arrays"):
        encode_arrays({"o": np.array([object()])})
    blob = encode_arrays({"w": np.ones(4, dtype=np.float32)})
    with pytest.raises(ConfigError, match="magic"):
        decode_arrays(b"\x80\x04pickle" + blob)
    with pytest.raises(ConfigError, match="trailing"):
        decode_arrays(blob + b"\x00")
    with pytest.raises(ConfigError, match="truncated"):
        decode_arrays(blob[:-1])
    header = b'{"arrays":[{"dtype":"|O","name":"o","nbytes":8,"offset":0,"shape":[1]}]}'
    evil = b"PKTNPY1\x00" + struct.pack("<Q", len(header)) + header + b"\x00" * 8
    with pytest.raises(ConfigError, match="unsupported dtype"):
        decode_arrays(evil)


def test_load_weights_validates_shapes_and_dtypes() -> None:
    op = NumpyLinearOp(FACTORY, in_size=2, out_size=2)
    wrong_shape = NumpyLinearOp(FACTORY, in_size=3, out_size=2).serialize_weights()
    with pytest.raises(ConfigError, match=r"`W` should be float32\[2, 2\]"):
        op.with_weights(wrong_shape)
    wrong_dtype = encode_arrays({"W": np.zeros((2, 2)), "b": np.zeros(2, dtype=np.float32)})
    with pytest.raises(ConfigError, match="float64"):
        op.with_weights(wrong_dtype)
    with pytest.raises(ConfigError, match=r"Received: parameters=\['W'\]"):
        op.with_weights(encode_arrays({"W": np.zeros((2, 2), dtype=np.float32)}))
