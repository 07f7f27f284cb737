"""The rollout pieces in core: `RolloutSpec`'s step, `SegmentedRollout`, `NeuralForward.rollout`
on the host, and `Cycle`'s hook at given steps (the device paths are tested per backend
with `pipekit_train.core.testing.check_device_rollout`)."""

from __future__ import annotations

from typing import Any

import array_api_compat.numpy as xp
import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.core.data import Normalizer
from pipekit_train.core.losses import mixture_width
from pipekit_train.core.rollout import (
    AffineMap,
    Cycle,
    NeuralForward,
    NonFiniteStateError,
    RolloutPlan,
    RolloutSpec,
    SegmentedRollout,
    check_hook_steps,
)
from pipekit_train.core.testing import (
    ROLLOUT_HEADS,
    NumpyLinearOp,
    check_stochastic_rollout,
    host_rollout,
)

FACTORY = "pipekit_train.core.testing._numpy_model:linear"


def linear_op(in_size: int, out_size: int, seed: int = 0) -> NumpyLinearOp:
    rng = np.random.default_rng(seed)
    op = NumpyLinearOp(FACTORY, in_size=in_size, out_size=out_size)
    op.model = op.model.replace(
        W=(0.3 * rng.normal(size=(in_size, out_size))).astype(np.float32),
        b=(0.1 * rng.normal(size=out_size)).astype(np.float32),
    )
    return op


def normalizer(d: int = 3) -> Normalizer:
    rng = np.random.default_rng(1)
    return Normalizer(
        {"x": rng.uniform(-1, 1, d), "y": rng.uniform(-0.1, 0.1, d)},
        {"x": rng.uniform(0.5, 2, d), "y": rng.uniform(0.01, 0.1, d)},
    )


@pytest.mark.parametrize("case", ROLLOUT_HEADS, ids=lambda c: f"{c[0]}{c[1]}")
@pytest.mark.parametrize("residual", [False, True])
def test_the_step_on_numpy_is_the_forward_call(case: Any, residual: bool) -> None:
    """`RolloutSpec.bind(numpy)`'s step equals `NeuralForward.__call__` for every head."""
    head, options, width = case
    d = 3
    op = linear_op(d, width(d))
    forward = NeuralForward(op, normalizer=normalizer(d), residual=residual, head=head, **options)
    x = np.random.default_rng(2).uniform(-1, 1, (4, d)).astype(np.float32)
    step = forward.rollout_spec().bind(xp, state_shape=(d,), out_shape=(width(d),))
    np.testing.assert_allclose(step(op, x), forward(x), rtol=1e-5, atol=1e-6)


def test_a_custom_affine_normalizer_is_probed_and_a_non_affine_one_refused() -> None:
    norm = normalizer()

    class Wrapped:  # apply/invert only: the map is read off by probing
        def apply(self, batch: dict) -> dict:
            return norm.apply(batch)

        def invert(self, batch: dict) -> dict:
            return norm.invert(batch)

    probed = AffineMap.probe(Wrapped(), "x", (3,), invert=False)
    np.testing.assert_allclose(probed.mean, norm.mean["x"])
    np.testing.assert_allclose(probed.std, norm.std["x"])
    back = AffineMap.probe(Wrapped(), "y", (3,), invert=True)
    np.testing.assert_allclose(back.std, norm.std["y"])

    class Squashing(Wrapped):
        def apply(self, batch: dict) -> dict:
            return {k: np.tanh(v) for k, v in batch.items()}

    with pytest.raises(ConfigError, match="needs an affine normalizer"):
        AffineMap.probe(Squashing(), "x", (3,), invert=False)


def test_the_segmented_rollout_stores_what_keep_asks_and_cuts_segments() -> None:
    segmented = SegmentedRollout.create(10, keep=3, chunk=6)
    assert segmented.kept_steps.tolist() == [0, 3, 6, 9]
    assert segmented.segments() == [(0, 6, 3), (6, 4, 3)]
    last = SegmentedRollout.create(10, keep="last", chunk=4)
    assert last.kept_steps.tolist() == [10] and [s[1] for s in last.segments()] == [4, 4, 2]
    assert SegmentedRollout.create(5).chunk == 5  # small states: one segment
    bounded = SegmentedRollout.create(100_000, keep="last", batch_bytes=2**20)
    assert bounded.chunk == 64  # SEGMENT_BYTES / batch_bytes states per segment
    with pytest.raises(ConfigError, match=r"Received: keep=0"):
        SegmentedRollout.create(10, keep=0)
    with pytest.raises(ConfigError, match=r"Received: keep='every'"):
        SegmentedRollout.create(10, keep="every")
    with pytest.raises(ConfigError, match=r"Received: chunk=5, keep=3. Use chunk=3"):
        SegmentedRollout.create(10, keep=3, chunk=5)
    with pytest.raises(ConfigError, match=r"Received: n_steps=0"):
        SegmentedRollout.create(0)
    assert RolloutPlan is SegmentedRollout  # the former name still imports


def test_host_rollout_of_an_operator_without_a_device_path() -> None:
    op = linear_op(3, 3)
    forward = NeuralForward(op, normalizer=normalizer(), residual=True)
    assert not forward.on_device and not Cycle(forward, 5).on_device
    x = np.random.default_rng(3).uniform(-1, 1, (4, 3))
    reference = host_rollout(forward, x, 9)
    np.testing.assert_allclose(forward.rollout(x, 9), reference)
    np.testing.assert_allclose(forward.rollout(x, 9, keep=4, chunk=4), reference[::4])
    np.testing.assert_allclose(forward.rollout(x, 9, keep="last", chunk=2), reference[-1:])
    np.testing.assert_allclose(forward.rollout(x[2], 9), reference[:, 2])
    with pytest.raises(ConfigError, match=r"Received: state.shape=\(2, 4, 3\)"):
        forward.rollout(np.zeros((2, 4, 3)), 3)


def test_a_non_finite_host_state_names_step_and_member() -> None:
    def blow_up(x: np.ndarray) -> np.ndarray:
        out = x * 10.0
        out[2] = np.where(np.abs(x[2]) > 50, np.nan, out[2])
        return out

    forward = NeuralForward(blow_up)
    x = np.ones((4, 2))
    x[2] = 6.0  # 60 after one step, NaN after the second
    with pytest.raises(
        NonFiniteStateError, match=r"step 2 \(after `forward`\), first in ensemble member 2"
    ) as info:
        forward.rollout(x, 5)
    assert (info.value.step, info.value.member) == (2, 2)
    with pytest.raises(
        NonFiniteStateError, match=r"step 2 \(after `forward`\), first in ensemble member 2"
    ):
        Cycle(forward, 5).run(x)


# -- the hook at given steps ---------------------------------------------------------------


def test_hook_steps_give_the_per_step_hooks_result_on_the_host_path() -> None:
    def sim(s: np.ndarray) -> np.ndarray:
        return 0.9 * s + 0.1

    steps = [2, 5, 6]
    seen: list[int] = []

    def analysis(step: int, state: np.ndarray) -> np.ndarray:
        seen.append(step)
        return state - 0.5 * step

    def per_step(step: int, state: np.ndarray) -> np.ndarray | None:
        return state - 0.5 * step if step in steps else None

    got = Cycle(sim, 8, hook=analysis, hook_steps=steps).run(np.ones(2))
    assert seen == steps
    np.testing.assert_array_equal(got, Cycle(sim, 8, hook=per_step).run(np.ones(2)))
    seen.clear()
    Cycle(sim, 8, hook=analysis, hook_steps=3).run(np.ones(2))
    assert seen == [3, 6]


@pytest.mark.parametrize(
    ("hook_steps", "match"),
    [
        ([0, 3], r"lie in \[1, n_steps\] = \[1, 10\]. Received: hook_steps=\[0, 3\] with \[0\]"),
        ([3, 11], r"with \[11\] outside"),
        ([5, 3], r"strictly increasing. Received: hook_steps=\[5, 3\]"),
        ([3, 3], r"strictly increasing"),
        ([], r"non-empty sequence of int steps"),
        ([1.5], r"Received: hook_steps=\[1.5\]"),
        (0, r"Received: hook_steps=0"),
        (True, r"Received: hook_steps=True"),
    ],
)
def test_bad_hook_steps_are_refused_before_any_step(hook_steps: Any, match: str) -> None:
    calls: list[int] = []

    def forward(s: np.ndarray) -> np.ndarray:
        calls.append(1)
        return s

    with pytest.raises(ConfigError, match=match):
        Cycle(forward, 10, hook=lambda k, s: None, hook_steps=hook_steps)
    assert calls == []


def test_hook_steps_need_a_hook_and_travel_in_the_config() -> None:
    with pytest.raises(ConfigError, match=r"`hook_steps` needs a `hook`. Received: hook=None"):
        Cycle(lambda s: s, 10, hook_steps=2)
    config = Cycle(
        lambda s: s, 10, hook=lambda k, s: None, hook_steps=np.array([2, 4])
    ).get_config()
    assert config["hook_steps"] == [2, 4]
    assert check_hook_steps(4, 10) == [4, 8]


def test_mixture_width_layout_is_checked_before_a_rollout() -> None:
    spec = RolloutSpec(head="mixture", head_options={"n_components": 2})
    with pytest.raises(ConfigError, match=r"output shape \(7,\)"):
        spec.check_output((2,), (7,))
    spec.check_output((2,), (mixture_width(2, 2),))  # fits
    with pytest.raises(ConfigError, match=r"even-sized last axis\). Received: output shape \(3,\)"):
        RolloutSpec(head="gaussian").check_output((3,), (3,))


def test_seeded_stochastic_rollouts_on_the_host() -> None:
    check_stochastic_rollout(linear_op)
