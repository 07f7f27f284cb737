"""`deep_set` on equinox: core's `DeepSetSuite`, and the embedding under a mixture head."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core import Normalizer, TrainingLoop, losses
from pipekit_train.core.testing import DEEP_SET_SIZES, DeepSetSuite, point_sets
from pipekit_train.equinox import EquinoxModelOp


class TestEquinoxDeepSet(DeepSetSuite):
    def make_op(self, **options: Any) -> EquinoxModelOp:
        return EquinoxModelOp("pipekit_train.equinox:deep_set", **options)


def test_deep_set_feeds_a_mixture_head_too() -> None:
    # one backend is enough: the embedding does not know which head follows it
    train, val = point_sets(3000, 0), point_sets(300, 1)
    sizes = {**DEEP_SET_SIZES, "out_size": losses.mixture_width(2, 2, "full")}
    artifact = TrainingLoop(
        model=EquinoxModelOp("pipekit_train.equinox:deep_set", **sizes, seed=0),
        data=train,
        loss=losses.mixture_nll(n_components=2, covariance="full"),
        normalizer=Normalizer.fit(train, keys=("y",)),
        optimizer_config={"name": "adam", "lr": 3e-3},
        batch_size=64,
        max_steps=400,
        progress=False,
        seed=0,
    ).run()
    dist = artifact.posterior(state_ndim=2).distribution(val.arrays["x"])
    assert dist.n_components == 2
    exact_mean = val.arrays["x"].sum(axis=1) / 11.0
    assert np.sqrt(np.mean((dist.mean - exact_mean) ** 2)) < 0.1
