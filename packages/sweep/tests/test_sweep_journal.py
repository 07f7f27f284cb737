"""The sweep journal: stable keys, fsync'd appends, torn last lines."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from pipekit_train.sweep._journal import Journal, params_key


def test_params_key_is_stable_and_order_independent() -> None:
    a = params_key({"lr": 0.01, "batch_size": 32, "hidden": [32, 32]})
    b = params_key({"hidden": [32, 32], "batch_size": 32, "lr": 0.01})
    assert a == b and len(a) == 16
    assert a == "f160487adcaa4d9e"  # pinned: a changed hash would orphan existing journals
    assert params_key({"lr": 0.01}) != params_key({"lr": 0.010000001})
    assert params_key({"n": 1}) != params_key({"n": 1.0})


def test_append_read_roundtrip_with_non_finite_values(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.jsonl")
    assert journal.read() == []
    journal.append(
        {"key": "a", "index": 0, "value": 0.5, "summary": {"final_metrics": {"loss": 1.0}}}
    )
    journal.append(
        {
            "key": "b",
            "index": 1,
            "value": math.nan,
            "summary": {"final_metrics": {"loss": math.inf}},
        }
    )
    records = journal.read()
    assert [r["key"] for r in records] == ["a", "b"]
    assert records[0]["value"] == 0.5 and records[0]["v"] == 1
    assert math.isnan(records[1]["value"])
    assert records[1]["summary"]["final_metrics"]["loss"] == math.inf
    text = (tmp_path / "journal.jsonl").read_text()
    assert "NaN" not in text and "Infinity" not in text  # strict JSON on disk


def test_torn_last_line_is_ignored_and_cut_before_the_next_append(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    journal.append({"key": "a", "index": 0})
    with open(path, "ab") as fh:
        fh.write(b'{"key": "b", "ind')  # killed mid-write
    assert [r["key"] for r in journal.read()] == ["a"]
    journal.repair()
    journal.append({"key": "c", "index": 2})
    assert [r["key"] for r in journal.read()] == ["a", "c"]
    assert path.read_text().count("\n") == 2


def test_unreadable_middle_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text('{"key": "a", "index": 0}\nnot json\n{"key": "b", "index": 1}\n')
    with pytest.warns(RuntimeWarning, match="unreadable line 2"):
        assert [r["key"] for r in Journal(path).read()] == ["a", "b"]
