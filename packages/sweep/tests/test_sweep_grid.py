"""`ParameterGrid`: order, length, indexing, errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pipekit_train.core import ConfigError
from pipekit_train.sweep import ParameterGrid


def test_order_is_insertion_order_with_last_key_fastest() -> None:
    grid = ParameterGrid({"lr": [1e-3, 1e-2], "batch_size": [16, 32, 64], "opt": ["adam", "sgd"]})
    expected = [
        {"lr": lr, "batch_size": bs, "opt": opt}
        for lr, bs, opt in itertools.product([1e-3, 1e-2], [16, 32, 64], ["adam", "sgd"])
    ]
    assert list(grid) == expected
    assert [list(p) for p in grid] == [["lr", "batch_size", "opt"]] * 12  # dict key order kept
    assert len(grid) == 12
    assert grid.keys == ["lr", "batch_size", "opt"]
    # keys are not sorted (unlike scikit-learn): the first key varies slowest
    assert [p["lr"] for p in grid][:6] == [1e-3] * 6


def test_indexing_matches_iteration_including_negative_and_slices() -> None:
    grid = ParameterGrid({"a": [1, 2, 3], "b": ["x", "y"], "c": [True]})
    items = list(grid)
    assert [grid[i] for i in range(len(grid))] == items
    assert [grid[-i] for i in range(1, len(grid) + 1)] == items[::-1]
    assert grid[np.int64(4)] == items[4]
    assert grid[1:5] == items[1:5]
    assert grid[::-2] == items[::-2]
    with pytest.raises(IndexError):
        grid[6]
    with pytest.raises(IndexError):
        grid[-7]
    with pytest.raises(TypeError):
        grid["a"]  # type: ignore[call-overload]


def test_list_of_grids_concatenates_and_empty_grid_is_one_empty_set() -> None:
    grid = ParameterGrid([{"a": [1, 2]}, {"b": [3], "c": [4, 5]}])
    assert list(grid) == [{"a": 1}, {"a": 2}, {"b": 3, "c": 4}, {"b": 3, "c": 5}]
    assert grid[-1] == {"b": 3, "c": 5} and len(grid) == 4
    assert grid.keys == ["a", "b", "c"]
    assert list(ParameterGrid({})) == [{}]


def test_values_become_plain_json() -> None:
    grid = ParameterGrid({"lr": np.array([0.1, 0.2]), "n": range(2), "hidden": [(32, 32), [64]]})
    first = grid[0]
    assert type(first["lr"]) is float and type(first["n"]) is int
    assert first["hidden"] == [32, 32]
    assert ParameterGrid({"k": [np.float32(0.5)]})[0] == {"k": 0.5}
    assert "ParameterGrid({'lr': [0.1, 0.2]" in repr(grid)


@pytest.mark.parametrize(
    ("grid", "match"),
    [
        ({"lr": []}, r"must not be empty. Received: lr=\[\]"),
        ({"lr": 0.1}, r"Received: lr=0.1. Wrap a single value in a list: lr=\[0.1\]"),
        ({"opt": "adam"}, r"Received: opt='adam'"),
        ({"lr": {"a": 1}}, "must be lists of candidate values"),
        ({"f": [object()]}, "must be JSON data"),
        ({"x": [float("nan")]}, "must be finite"),
        ({1: [1]}, "keys must be non-empty strings"),
        ({"a": np.zeros((2, 2))}, "one-dimensional"),
        ([], "needs at least one grid"),
        ("lr", "takes a dict of lists"),
    ],
)
def test_clear_errors(grid: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ParameterGrid(grid)  # type: ignore[arg-type]
