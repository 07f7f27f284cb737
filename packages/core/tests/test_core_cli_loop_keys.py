"""The run config's keys come from `TrainingLoop` and `Checkpoint`; the policies they carry.

Every `TrainingLoop` parameter is a top-level key, a table of its own, or excluded for a
stated reason; a parameter added to `TrainingLoop` becomes a key without an edit to the
CLI. Trains on core's numpy reference backend (registered under the
`pipekit_train.backends` entry points like every other backend).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path
from typing import Any

import pytest

from pipekit_train.core import Checkpoint, NonFiniteLossError, NonFinitePolicy, TrainingLoop
from pipekit_train.core.cli import load_run_config, main
from pipekit_train.core.cli._build import build_loop, python_path
from pipekit_train.core.cli._config import (
    CHECKPOINT_EXCLUDED,
    LOOP_ELSEWHERE,
    LOOP_EXCLUDED,
    checkpoint_keys,
    loop_keys,
)

NUMPY = """
backend = "numpy"
max_steps = 12
batch_size = 8
pythonpath = ["."]

[optimizer]
name = "sgd"
lr = 0.05

[model]
factory = "pipekit_train.core.testing._numpy_model:linear"
kwargs = { in_size = 3, out_size = 1 }

[data]
factory = "nanny:make"
"""

# A data factory whose samples 5..7 have a NaN target: any batch holding one has a NaN loss.
NANNY = """
import numpy as np
from pipekit_train.core.data import ArrayDataset

def make(n=64, bad=(5, 6, 7)):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 3)).astype(np.float32)
    y = x @ np.array([[1.0], [-2.0], [0.5]], np.float32)
    y[list(bad)] = np.nan
    return ArrayDataset(x=x, y=y)
"""

# sample values for parameters whose default is None (the others use their default)
_SAMPLES: dict[str, Any] = {
    "metrics": ["mae"],
    "max_steps": 7,
    "max_epochs": 2,
    "validate_every_n_steps": 4,
    "max_consecutive_skips": 3,
    "preemption_signals": ["SIGUSR1"],  # TOML has lists, not the default's tuple
    "max_time": "00:00:01:00",  # Lightning's DD:HH:MM:SS
    "log_grad_norm": True,  # the default (False) would not show that it reaches the loop
}


def _write(tmp_path: Path, text: str, nanny: bool = True) -> Path:
    if nanny:
        (tmp_path / "nanny.py").write_text(NANNY)
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


def _toml(value: Any) -> str:
    return json.dumps(value)  # the JSON of ints, floats, bools, strings, lists is TOML too


def test_every_training_loop_parameter_has_a_cli_key_or_a_reason() -> None:
    params = list(inspect.signature(TrainingLoop).parameters)
    keys = loop_keys()
    for name in params:
        assert (name in keys) + (name in LOOP_ELSEWHERE) + (name in LOOP_EXCLUDED) == 1, name
    assert set(LOOP_ELSEWHERE) | set(LOOP_EXCLUDED) <= set(params)  # no stale entries
    assert all(len(reason) > 20 for reason in (*LOOP_ELSEWHERE.values(), *LOOP_EXCLUDED.values()))
    fields = [f.name for f in dataclasses.fields(Checkpoint)]
    assert set(checkpoint_keys()) | set(CHECKPOINT_EXCLUDED) == set(fields)
    assert set(CHECKPOINT_EXCLUDED) <= set(fields)


@pytest.mark.parametrize("name", loop_keys())
def test_each_loop_key_reaches_the_training_loop(tmp_path: Path, name: str) -> None:
    default = inspect.signature(TrainingLoop).parameters[name].default
    value = _SAMPLES.get(name, default)
    if isinstance(value, NonFinitePolicy):
        value = value.value
    assert value is not None, f"add a sample value for the new TrainingLoop parameter {name!r}"
    top = {"max_steps": 5, "batch_size": 8, name: value}
    if name == "max_consecutive_skips":
        top["on_nonfinite"] = "skip"
    body = NUMPY.replace("max_steps = 12\n", "").replace("batch_size = 8\n", "")
    head = "".join(f"{k} = {_toml(v)}\n" for k, v in top.items())
    config = load_run_config(_write(tmp_path, head + body))
    assert config.loop[name] == value


def test_a_parameter_added_to_training_loop_is_a_key_without_an_edit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipekit_train.core.train import _training_loop as _loop

    class Wider(TrainingLoop):
        def __init__(self, *args: Any, max_widgets: int = 1, **kwargs: Any):
            super().__init__(*args, **kwargs)

    signature = inspect.signature(TrainingLoop.__init__)
    widened = signature.replace(
        parameters=[
            *signature.parameters.values(),
            inspect.Parameter("max_widgets", inspect.Parameter.KEYWORD_ONLY, default=1),
        ]
    )
    Wider.__init__.__signature__ = widened  # type: ignore[attr-defined]  # what inspect reads
    monkeypatch.setattr(_loop, "TrainingLoop", Wider)
    assert "max_widgets" in loop_keys()
    config = load_run_config(_write(tmp_path, "max_widgets = 4\n" + NUMPY))
    assert config.loop["max_widgets"] == 4
    with pytest.raises(Exception, match=r"Unknown key `max_widget`.*Did you mean `max_widgets`"):
        load_run_config(_write(tmp_path, "max_widget = 4\n" + NUMPY))


def test_a_new_checkpoint_field_is_a_checkpoint_key(tmp_path: Path) -> None:
    names = checkpoint_keys()
    assert names[:2] == ("directory", "every_n_steps") and "save_on_end" in names
    assert "storage_options" not in names  # credentials stay out of config files
    text = NUMPY + '\n[checkpoint]\ndirectory = "ck"\nsave_on_end = false\n'
    config = load_run_config(_write(tmp_path, text))
    assert config.checkpoint is not None and config.checkpoint.save_on_end is False
    with pytest.raises(Exception, match=r"Unknown key `checkpoint.storage_options`"):
        load_run_config(_write(tmp_path, text + "storage_options = { anon = true }\n"))


def test_on_nonfinite_skip_trains_from_a_toml_config(tmp_path: Path) -> None:
    text = 'on_nonfinite = "skip"\nmax_consecutive_skips = 4\n' + NUMPY
    config = load_run_config(_write(tmp_path, text))
    assert config.loop["on_nonfinite"] == "skip" and config.loop["max_consecutive_skips"] == 4
    with python_path(config.pythonpath):
        built = build_loop(config)
        plan = built.loop.plan
        assert plan.on_nonfinite is NonFinitePolicy.SKIP and plan.max_consecutive_skips == 4
        assert built.loop.get_config()["on_nonfinite"] == "skip"
        artifact = built.loop.run()
    assert artifact.steps == 12
    steps, skipped = artifact.history.series("nonfinite_skipped")
    assert 1 <= len(steps) < 12 and skipped == list(range(1, len(steps) + 1))
    losses = dict(zip(*artifact.history.series("loss"), strict=True))
    assert all(losses[s] != losses[s] for s in steps)  # exactly the NaN steps were skipped
    assert all(losses[s] == losses[s] for s in set(losses) - set(steps))
    weights = artifact.model.model.parameters()
    assert all(bool((w == w).all()) for w in weights.values())  # no NaN reached the weights


def test_on_nonfinite_stop_from_the_command_line_fails_with_status_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, NUMPY)
    with pytest.raises(NonFiniteLossError):
        config = load_run_config(path)
        with python_path(config.pythonpath):
            build_loop(config).loop.run()
    assert main(["run", str(path), "--set", "on_nonfinite=skip"]) == 0
    assert "done: 12 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        (
            'on_nonfinite = "skipp"\n',
            r"`on_nonfinite` must be one of \['stop', 'skip', 'ignore'\]. Received: on_nonfinite='skipp'",
        ),
        (
            "max_consecutive_skips = 3\n",
            r"`max_consecutive_skips` only applies when skipping.*Received: max_consecutive_skips=3, "
            r"on_nonfinite='stop'. Add on_nonfinite = \"skip\" to the config \(or --set on_nonfinite=skip\)",
        ),
        (
            'on_nonfinite = "skip"\nmax_consecutive_skips = 0\n',
            r"`max_consecutive_skips` must be a positive int. Received: max_consecutive_skips=0",
        ),
    ],
)
def test_bad_policies_are_refused_before_any_work(
    tmp_path: Path, lines: str, expected: str
) -> None:
    with pytest.raises(Exception) as info:
        load_run_config(_write(tmp_path, lines + NUMPY))
    assert re.search(expected, str(info.value), flags=re.S), str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["nanny.py", "run.toml"]
