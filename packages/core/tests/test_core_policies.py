"""Typed policies of the canonical spec, and capabilities checked by core before any work."""

from __future__ import annotations

import json

import pytest

from pipekit_train.core import NonFinitePolicy, NotSupportedError, Precision, TrainingLoop
from pipekit_train.core.adapter import Capabilities, canonical_precision, resolve_precision
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task


def _loop(adapter: NumpyAdapter, **kwargs: object) -> TrainingLoop:
    train, _ = regression_task()
    model = NumpyLinearOp("pipekit_train.core.testing._numpy_model:linear", in_size=4, out_size=1)
    return TrainingLoop(model, train, adapter=adapter, max_steps=3, progress=False, **kwargs)


def test_policies_are_typed_and_still_strings() -> None:
    loop = _loop(NumpyAdapter(), on_nonfinite="skip")
    assert loop.plan.on_nonfinite is NonFinitePolicy.SKIP and loop.plan.on_nonfinite == "skip"
    assert loop.get_config()["on_nonfinite"] == "skip"
    assert json.dumps(Precision.BFLOAT16_MIXED) == '"bfloat16-mixed"'
    assert _loop(NumpyAdapter(), on_nonfinite=NonFinitePolicy.IGNORE).plan.on_nonfinite == "ignore"
    for spelling in ("bf16-mixed", "mixed_bfloat16", "bfloat16-mixed"):
        assert resolve_precision(spelling) is Precision.BFLOAT16_MIXED
        assert canonical_precision(spelling) is Precision.BFLOAT16_MIXED
    assert resolve_precision(None) is Precision.FLOAT32
    assert canonical_precision("bfloat16") is None  # a framework-only name


class _Fusing(NumpyAdapter):
    def __init__(self, steps_per_execution: int = 1, precision: Precision | None = None):
        super().__init__()
        self.steps_per_execution = steps_per_execution
        self.spec_precision = precision


def test_undeclared_fused_steps_are_refused_before_work() -> None:
    with pytest.raises(
        NotSupportedError,
        match=r"Fusing optimizer steps is not supported by the 'numpy' backend. "
        r"Received: steps_per_execution=4. Use steps_per_execution=1",
    ):
        _loop(_Fusing(steps_per_execution=4))

    class Declared(_Fusing):
        capabilities = Capabilities(online=True, fused_steps=True)

    assert Declared(steps_per_execution=4).capabilities.fused_steps
    _loop(Declared(steps_per_execution=4))  # declared: accepted by the check


def test_an_undeclared_precision_is_refused_before_work() -> None:
    with pytest.raises(
        NotSupportedError,
        match=r"Precision 'bfloat16-mixed' is not supported by the 'numpy' backend. "
        r"Received: precision='bfloat16-mixed'. Use one of \['float32'\]",
    ):
        _loop(_Fusing(precision=Precision.BFLOAT16_MIXED))
    _loop(_Fusing(precision=Precision.FLOAT32))
    _loop(_Fusing(precision=None))  # a framework-only precision: the adapter checks it
