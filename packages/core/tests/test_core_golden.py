"""The golden-run suite's own parts: cases, weights and the comparison."""

from __future__ import annotations

import numpy as np

from pipekit_train.core.adapter import optimizer_spec
from pipekit_train.core.spec import SCHEDULES
from pipekit_train.core.testing import (
    GOLDEN_CASES,
    GoldenRun,
    compare_golden,
    dump_runs,
    golden_weights,
    load_runs,
)


def test_cases_cover_the_spec() -> None:
    names = {c.name for c in GOLDEN_CASES}
    assert len(names) == len(GOLDEN_CASES)
    specs = [optimizer_spec(c.optimizer_config) for c in GOLDEN_CASES]
    assert {s.name for s in specs} >= {"adam", "adamw", "sgd", "rmsprop", "adagrad"}
    schedules = {s.learning_rate["schedule"] for s in specs if s.scheduled}  # type: ignore[index]
    assert schedules == set(SCHEDULES)  # every schedule core accepts
    assert any(s.weight_decay and s.name == "sgd" for s in specs)
    assert any(s.clip_norm for s in specs) and any(s.clip_value for s in specs)
    assert any(c.accumulate_grad_batches == 2 for c in GOLDEN_CASES)
    assert any(c.precision != "float32" for c in GOLDEN_CASES)
    assert all(c.rtol <= 1e-3 for c in GOLDEN_CASES if c.precision == "float32")


def test_weights_are_canonical_and_deterministic() -> None:
    w = golden_weights((4, 32, 2))
    assert [a.shape for a in w] == [(4, 32), (32,), (32, 2), (2,)]
    assert all(a.dtype == np.float32 for a in w)
    assert np.abs(w[0]).max() <= 0.5 and np.abs(w[2]).max() <= 1 / np.sqrt(32)
    np.testing.assert_array_equal(w[0], golden_weights((4, 32, 2))[0])


def _runs(backend: str, scale: float = 1.0) -> dict[str, GoldenRun]:
    return {c.name: GoldenRun(c.name, backend, [1.0, 0.5 * scale, 0.25], 0.2) for c in GOLDEN_CASES}


def test_compare_reports_each_disagreement_and_nothing_else() -> None:
    ref = _runs("a")
    assert compare_golden(ref, load_runs(dump_runs(_runs("b", 1.0 + 1e-5)))) == []
    problems = compare_golden(ref, _runs("b", 1.01))
    assert len(problems) == sum(c.rtol < 0.01 for c in GOLDEN_CASES)
    assert "step 2 differs by 1.00e-02" in problems[0]
    short = _runs("b")
    short["adam"].losses = short["adam"].losses[:2]
    del short["adamw"]
    problems = compare_golden(ref, short)
    assert any("adam: b recorded 2 steps" in p for p in problems)
    assert any("adamw: missing" in p for p in problems)
    nan = _runs("b")
    nan["adam"].val_loss = float("nan")
    assert any("val_loss" in p for p in compare_golden(ref, nan))
