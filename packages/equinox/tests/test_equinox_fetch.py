"""`fetch`: one transfer per device, the same values as `jax.device_get`."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pipekit_train.equinox._fetch import fetch


@pytest.mark.parametrize("n", [1, 2, 3, 50, 100])
def test_same_bytes_shapes_and_order_as_device_get(n: int) -> None:
    step = jax.jit(lambda i: (i * 1.1, jnp.stack([i, -i]), (i * 3).astype(jnp.int32)))
    values: list = []
    for i in range(n):
        loss, pair, count = step(jnp.float32(i) / 7)
        values += [loss, pair, count]
    values.append(np.float32(2.5))  # a host value passes through
    got = fetch(values)
    want = jax.device_get(values)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype
        assert g.tobytes() == w.tobytes()


def test_non_finite_values_come_back_as_they_are() -> None:
    values = [jnp.float32(x) + 0 for x in (np.nan, np.inf, -np.inf, 1.0)]
    got = [float(v) for v in fetch(values)]
    assert np.isnan(got[0]) and got[1:] == [np.inf, -np.inf, 1.0]
