"""On an accelerator: batches put on the device ahead of the step, and an unrolled K-step scan.

Both switch on by device (`jax.default_backend() != "cpu"`); here, on the CPU, the tests
switch them on by hand and check what holds on any device: the same batches in the same
order, the same weights, and exact resume.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import Checkpoint, TrainingLoop
from pipekit_train.equinox import Equinox, _compiled, _step_backend


def _prefetch_two(patch: pytest.MonkeyPatch) -> None:
    """Every `EquinoxStepBackend` built now prefetches two groups ahead (as on a GPU)."""
    init = _step_backend.EquinoxStepBackend.__init__

    def patched(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.prefetch = 2

    patch.setattr(_step_backend.EquinoxStepBackend, "__init__", patched)


@pytest.fixture
def prefetching(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    _prefetch_two(monkeypatch)
    yield


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"accumulate_grad_batches": 3},
        {"adapter": Equinox(steps_per_execution=10)},
        {"adapter": Equinox(steps_per_execution=10), "accumulate_grad_batches": 2},
    ],
    ids=["k1", "k1-accumulate", "k10", "k10-accumulate"],
)
def test_prefetching_trains_on_the_same_batches(
    make_loop: Callable[..., TrainingLoop], options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    plain = make_loop(max_steps=30, **options).run()
    with monkeypatch.context() as patch:
        _prefetch_two(patch)
        ahead = make_loop(max_steps=30, **options).run()
    assert ahead.weights_sha256 == plain.weights_sha256
    assert ahead.history["loss"] == plain.history["loss"]
    assert ahead.history["val_loss"] == plain.history["val_loss"]


def test_a_prefetching_run_resumes_exactly(
    make_loop: Callable[..., TrainingLoop], prefetching: None, tmp_path: Path
) -> None:
    whole = make_loop(max_steps=40).run()
    policy = dict(every_n_steps=10, async_save=False)
    first = make_loop(max_steps=25, checkpoint=Checkpoint(tmp_path / "ck", **policy)).run()
    assert first.steps == 25
    rest = make_loop(max_steps=40, checkpoint=Checkpoint(tmp_path / "ck", **policy)).run()
    assert rest.resumed_from_step == 25
    assert rest.weights_sha256 == whole.weights_sha256


@pytest.mark.slow
def test_the_unrolled_scan_runs_the_same_steps(
    make_loop: Callable[..., TrainingLoop], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    fused = {"adapter": Equinox(steps_per_execution=10), "accumulate_grad_batches": 2}
    loop_scan = make_loop(max_steps=30, **fused).run()
    monkeypatch.setattr(_compiled, "scan_unroll", lambda: True)
    unrolled = make_loop(max_steps=30, **fused).run()
    # the same updates; XLA may fuse an unrolled body differently: equal to float rounding
    np.testing.assert_allclose(
        unrolled.history["loss"], loop_scan.history["loss"], rtol=1e-5, atol=1e-6
    )
    # an unrolled run resumes exactly: the resumed run fuses the same groups of steps as an
    # uninterrupted one with the same checkpoint policy (the schedule decides them)
    policy = dict(every_n_steps=10, async_save=False)
    whole = make_loop(max_steps=30, checkpoint=Checkpoint(tmp_path / "w", **policy), **fused)
    reference = whole.run()
    first = make_loop(max_steps=20, checkpoint=Checkpoint(tmp_path / "u", **policy), **fused)
    assert first.run().steps == 20
    rest = make_loop(max_steps=30, checkpoint=Checkpoint(tmp_path / "u", **policy), **fused).run()
    assert rest.resumed_from_step == 20 and rest.weights_sha256 == reference.weights_sha256


def test_large_fused_groups_are_stacked_on_the_device(
    make_loop: Callable[..., TrainingLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipekit_train.core.train import _step_loop

    fused = {"adapter": Equinox(steps_per_execution=10), "accumulate_grad_batches": 2}
    plain = make_loop(max_steps=30, **fused).run()
    _prefetch_two(monkeypatch)
    monkeypatch.setattr(_step_loop, "_DEVICE_STACK_BYTES", 0)  # every group counts as large
    stacked = []
    stack = _step_backend.EquinoxStepBackend.stack

    def counting(self: Any, batches: Any) -> Any:
        stacked.append(len(batches))
        return stack(self, batches)

    monkeypatch.setattr(_step_backend.EquinoxStepBackend, "stack", counting)
    ahead = make_loop(max_steps=30, **fused).run()
    assert stacked and all(n % 2 == 0 for n in stacked)  # whole updates of 2 batches
    assert ahead.weights_sha256 == plain.weights_sha256
