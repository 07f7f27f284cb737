"""`OptunaSearch`: shorthand spaces, ask/tell, pruning through a real SQLite study, resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

optuna = pytest.importorskip("optuna")

from pipekit_train.core import ConfigError  # noqa: E402
from pipekit_train.sweep import HyperSweep, OptunaSearch  # noqa: E402
from pipekit_train.sweep.testing import numpy_trial  # noqa: E402

States = optuna.trial.TrialState
# Two good learning rates, then two hopeless ones (adam with lr=1e-5 barely moves).
ENQUEUED = [{"lr": 0.05}, {"lr": 0.03}, {"lr": 1e-5}, {"lr": 2e-5}]
SPACE = {"lr": ("float", 1e-5, 1e-1, {"log": True}), "max_steps": ("categorical", [60])}


def _study_with_queue(directory: Path, name: str) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{directory / 'study.db'}"
    study = optuna.create_study(storage=storage, study_name=name, direction="minimize")
    for params in ENQUEUED:
        study.enqueue_trial(params)
    return storage


def test_shorthand_and_distribution_objects() -> None:
    search = OptunaSearch(
        {
            "lr": ("float", 1e-4, 1e-1, {"log": True}),
            "dropout": ("float", 0.0, 0.5, {"step": 0.1}),
            "width": ("int", 16, 128, {"step": 16}),
            "depth": ("int", 1, 4),
            "act": ("categorical", ["relu", "tanh"]),
            "wd": optuna.distributions.FloatDistribution(1e-6, 1e-2, log=True),
        },
        n_trials=3,
    )
    d = search.distributions
    assert d["lr"] == optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True)
    assert d["dropout"].step == 0.1 and d["width"] == optuna.distributions.IntDistribution(
        16, 128, step=16
    )
    assert d["act"].choices == ("relu", "tanh") and d["wd"].log
    assert search.describe()["n_trials"] == 3


@pytest.mark.parametrize(
    ("space", "match"),
    [
        ({"lr": (1e-4, 1e-1)}, r"must be an optuna distribution or a tuple such as"),
        ({"lr": ("float", 1e-4)}, r"must be \('float', low, high\)"),
        ({"lr": ("float", 1e-1, 1e-4)}, "is not a valid distribution"),
        ({"lr": ("float", 0.0, 1.0, {"log": True})}, "is not a valid distribution"),
        ({"lr": ("float", 1e-4, 1e-1, {"logg": True})}, r"options may be 'log' and 'step'"),
        ({"act": ("categorical", [])}, "non-empty list of choices"),
        ({"act": [16, 32]}, r"\('categorical', \[16, 32, 64\]\)"),
        ({}, "non-empty dict"),
    ],
)
def test_bad_spaces(space: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        OptunaSearch(space, n_trials=2)


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="`n_trials` must be a positive int"):
        OptunaSearch(SPACE, n_trials=0)
    with pytest.raises(ConfigError, match="`pruner` must be an optuna pruner"):
        OptunaSearch(SPACE, n_trials=1, pruner="median")
    with pytest.raises(ConfigError, match="`sampler` must be an optuna sampler"):
        OptunaSearch(SPACE, n_trials=1, sampler=object())
    search = OptunaSearch(
        SPACE,
        n_trials=1,
        pruner=optuna.pruners.MedianPruner(),
        storage=optuna.storages.InMemoryStorage(),
    )
    with pytest.raises(ConfigError, match="needs a storage every worker can open"):
        HyperSweep(numpy_trial, search, "val_loss", executor="process").run()


def test_serial_sweep_prunes_through_a_sqlite_study(tmp_path: Path) -> None:
    storage = _study_with_queue(tmp_path, "prune-serial")
    search = OptunaSearch(
        SPACE,
        n_trials=4,
        sampler=optuna.samplers.RandomSampler(seed=0),
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0),
        storage=storage,
        study_name="prune-serial",
    )
    result = HyperSweep(
        numpy_trial, search, "val_loss", directory=tmp_path / "sweep", sweep_id="opt"
    ).run()
    assert [t.params["lr"] for t in result] == [p["lr"] for p in ENQUEUED]
    assert [t.index for t in result] == [0, 1, 2, 3]  # Optuna trial numbers
    assert result[0].status == "ok" and result[0].summary["steps"] == 60
    assert result[2].status == result[3].status == "pruned"
    for t in result.by_status("pruned"):
        assert t.summary["steps"] < 60 and t.summary["stop_reason"].startswith(
            "pruned by the Optuna pruner"
        )
        assert t.value == t.final_metrics["val_loss"]
        assert t.artifact.sweep_id == "opt"
    assert result.best.params["lr"] in (0.05, 0.03)
    study = optuna.load_study(study_name="prune-serial", storage=storage)
    states = [ft.state for ft in study.trials]
    assert states == [{"ok": States.COMPLETE, "pruned": States.PRUNED}[t.status] for t in result]
    assert study.trials[0].value == result[0].value
    assert study.trials[2].intermediate_values  # reported every validation
    assert {ft.user_attrs["pipekit_sweep_id"] for ft in study.trials} == {"opt"}
    assert "pruned at step" in result.to_table()


@pytest.mark.slow
def test_process_workers_open_the_study_by_url_and_prune(tmp_path: Path) -> None:
    storage = _study_with_queue(tmp_path, "prune-process")
    search = OptunaSearch(
        SPACE,
        n_trials=4,
        pruner=optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=0),
        storage=storage,
        study_name="prune-process",
    )
    result = HyperSweep(
        "pipekit_train.sweep.testing:numpy_trial",
        search,
        "val_loss",
        executor="process",
        max_concurrent=2,
        directory=tmp_path / "sweep",
    ).run()
    assert sorted(t.params["lr"] for t in result) == sorted(p["lr"] for p in ENQUEUED)
    assert {t.params["lr"]: t.status for t in result}[1e-5] == "pruned"
    assert result.best.params["lr"] in (0.05, 0.03)
    study = optuna.load_study(study_name="prune-process", storage=storage)
    for t in result:
        frozen = study.trials[t.index]
        assert frozen.params["lr"] == t.params["lr"]
        assert frozen.intermediate_values  # written by the worker process
        assert frozen.state == {"ok": States.COMPLETE, "pruned": States.PRUNED}[t.status]


def test_default_storage_resume_and_orphans(tmp_path: Path) -> None:
    sampler = optuna.samplers.RandomSampler(seed=1)
    space = {"lr": ("float", 1e-3, 1e-1, {"log": True})}
    first = HyperSweep(
        numpy_trial,
        OptunaSearch(space, n_trials=2, sampler=sampler),
        "val_loss",
        directory=tmp_path,
    ).run()
    assert (tmp_path / "optuna.db").exists() and len(first) == 2
    url = f"sqlite:///{(tmp_path / 'optuna.db').resolve()}"
    study = optuna.load_study(study_name=f"pipekit-{first.sweep_id}", storage=url)
    # a trial left RUNNING by a killed run of this sweep (asked, never journaled)
    orphan = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)})
    orphan.set_user_attr("pipekit_sweep_dir", str(tmp_path.resolve()))
    search = OptunaSearch(space, n_trials=4, sampler=optuna.samplers.RandomSampler(seed=2))
    resumed = HyperSweep(numpy_trial, search, "val_loss", directory=tmp_path).run()
    assert resumed.sweep_id == first.sweep_id and len(resumed) == 4
    assert [t.from_journal for t in resumed] == [True, True, False, False]
    states = {ft.number: ft.state for ft in search.study.trials}
    assert states[orphan.number] == States.FAIL
    assert resumed[2].params["lr"] == orphan.params["lr"]  # the orphan's params ran again first
    assert all(t.status == "ok" for t in resumed)


def test_direction_follows_mode_and_a_mismatch_is_refused(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    optuna.create_study(storage=storage, study_name="maxi", direction="maximize")
    search = OptunaSearch(SPACE, n_trials=1, storage=storage, study_name="maxi")
    with pytest.raises(ConfigError, match=r"optimizes \['maximize'\], but the sweep's mode='min'"):
        HyperSweep(numpy_trial, search, "val_loss", directory=tmp_path / "s").run()
    result = HyperSweep(numpy_trial, search, "val_loss", "max", directory=tmp_path / "s2").run()
    assert (
        result[0].status == "ok" and search.study.direction == optuna.study.StudyDirection.MAXIMIZE
    )
