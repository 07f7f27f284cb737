"""`benchmarks/sbi_tasks`: the symmetries the sbibm benchmark may use (`--symmetry`) are
symmetries of the simulator, of the prior and of sbibm's reference posteriors."""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sbi_tasks() -> Any:
    path = ROOT / "benchmarks" / "sbi_tasks" / "__init__.py"
    spec = importlib.util.spec_from_file_location("pipekit_bench_sbi_tasks", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve the module by name
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["two_moons", "slcp"])
def test_symmetries_leave_the_simulator_and_the_prior_unchanged(sbi_tasks: Any, name: str) -> None:
    task = sbi_tasks.get_task(name)
    group = task.group()
    assert len(group) > 1 and np.array_equal(group[0], np.eye(task.dim_theta))
    theta, _ = task.simulate(64, seed=3)
    for g in group:
        # the same noise at θ and at G θ gives the same data, bit for bit
        x = task.simulator(theta, np.random.default_rng(7))
        x_g = task.simulator(theta @ g.T, np.random.default_rng(7))
        np.testing.assert_array_equal(x, x_g)
        assert task.inside(theta @ g.T).all()  # the prior's box maps onto itself
    for a, b in itertools.product(group, repeat=2):  # a group: closed under products
        assert any(np.array_equal(a @ b, g) for g in group)


def test_slcp_reference_posteriors_carry_the_sign_symmetry(sbi_tasks: Any) -> None:
    task = sbi_tasks.get_task("slcp")
    for k in (1, 4):
        draws = task.reference(k)
        for g in task.group()[1:]:  # each mirror image lands on another mode of equal mass
            flipped = np.diag(g) < 0
            share = (draws[:, flipped] > 0).all(axis=1).mean()
            assert abs(share - 0.5 ** flipped.sum()) < 0.03, (k, np.diag(g), share)


def test_a_symmetry_that_is_not_one_breaks_the_simulator(sbi_tasks: Any) -> None:
    """The check above can fail: flipping θ₁ (a mean) changes slcp's data."""
    task = sbi_tasks.get_task("slcp")
    theta, _ = task.simulate(8, seed=3)
    wrong = np.diag([-1.0, 1.0, 1.0, 1.0, 1.0])
    x = task.simulator(theta, np.random.default_rng(7))
    assert not np.allclose(x, task.simulator(theta @ wrong.T, np.random.default_rng(7)))
