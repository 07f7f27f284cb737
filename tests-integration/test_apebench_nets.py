"""`benchmarks/apebench_nets.py`: the pdequinox -> torch / Keras weight mapping (numpy only,
milliseconds), and, where APEBench's pdequinox is installed (`uv run --with apebench==0.1.1`),
the parity of small networks (skipped in the normal suite)."""

from __future__ import annotations

import importlib.util
import io
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import ConfigError

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def nets() -> Iterator[Any]:
    name = "pipekit_apebench_nets"
    spec = importlib.util.spec_from_file_location(name, BENCH / "apebench_nets.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclass looks its module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(name, None)


def _eqx_bytes(records: list[Any]) -> bytes:
    """Bytes laid out as `eqx.tree_serialise_leaves` writes them: one `.npy` per leaf."""
    buf = io.BytesIO()
    for r in records:
        np.save(buf, np.asarray(r))
    return buf.getvalue()


def test_parse_arch_reads_apebench_strings_and_refuses_others(nets: Any) -> None:
    a = nets.parse_arch("FNO;12;8;4;gelu")
    assert (a.kind, a.modes, a.width, a.depth, a.activation) == ("fno", 12, 8, 4, "gelu")
    assert nets.parse_arch("Conv;26;10;relu").depth == 10
    for bad in ("UNet;8;2;relu", "Conv;26;relu", "Conv;0;10;relu", "Conv;26;10;swish"):
        with pytest.raises(ConfigError, match="Received: arch="):
            nets.parse_arch(bad)


def test_fno_bytes_map_to_torch_and_keras_names_skipping_integer_leaves(nets: Any) -> None:
    arch, rng = "FNO;3;4;1;gelu", np.random.default_rng(0)
    spec = nets.parse_arch(arch).spec(2)
    arrays = [rng.standard_normal(shape).astype(np.float32) for _, shape in spec]
    # pdequinox's FNO block stores num_spatial_dims and num_modes as integer leaves
    records = arrays[:2] + [np.int32(1), np.int32(3)] + arrays[2:]
    named = nets.equinox_arrays(_eqx_bytes(records), arch, channels=2)
    assert list(named) == [name for name, _ in spec]

    state = nets.torch_state(named)
    np.testing.assert_array_equal(state["lifting.bias"], arrays[1].reshape(-1))
    np.testing.assert_array_equal(state["blocks.0.spectral_conv.weights_imag"], arrays[3])
    assert state["blocks.0.by_pass_conv.weight"].shape == (4, 4, 1)
    assert state["projection.weight"].shape == (2, 4, 1)

    paths = [nets._keras_path(name) for name in named]
    assert paths[:4] == [
        "lifting/kernel",
        "lifting/bias",
        "blocks_0_spectral/weights_real",
        "blocks_0_spectral/weights_imag",
    ]
    assert nets._keras_path(".layers[10].weight") == "layers_10/kernel"


def test_bytes_of_another_network_are_refused(nets: Any) -> None:
    spec = nets.parse_arch("Conv;4;2;relu").spec(1)
    blob = _eqx_bytes([np.zeros(shape, np.float32) for _, shape in spec])
    assert len(nets.equinox_arrays(blob, "Conv;4;2;relu")) == 6
    with pytest.raises(ConfigError, match="same arch and channels"):
        nets.equinox_arrays(blob, "Conv;5;2;relu")


def test_cell_config_is_refused_before_any_work(nets: Any) -> None:
    assert nets.rollout_steps("one") == 1 and nets.rollout_steps("sup;5") == 5
    with pytest.raises(ConfigError, match="Received: config='div;5'"):
        nets.rollout_steps("div;5")


def test_small_networks_match_pdequinox(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pdequinox")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.syspath_prepend(str(BENCH))
    import apebench_nets

    for arch in ("Conv;4;2;relu", "FNO;3;4;2;gelu"):
        r = apebench_nets.parity(arch, 0, num_points=16, batch=2)
        assert max(r["torch_out_rel"], r["keras_out_rel"]) < 1e-5, (arch, r)
        assert max(r["torch_grad_rel"], r["keras_grad_rel"]) < 1e-4, (arch, r)
