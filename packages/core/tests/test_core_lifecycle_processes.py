"""Multi-process runs agree where they start and wait for each other at the end.

Two threads stand in for the two processes of one run: each runs the numpy reference
backend, and their `agree` is an element-wise "any" across both (a barrier), as an
all-reduce would be. Each keeps its own checkpoint folder, so each can be made to see a
different latest checkpoint (as a process that starts its next run before the chief's
last checkpoint is complete would).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pipekit_train.core import Checkpoint, CheckpointError, TrainingLoop
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp, regression_task


class _Group:
    """`agree` for `n` threads of one run: the element-wise "any" of their flags."""

    def __init__(self, n: int) -> None:
        self.barrier = threading.Barrier(n, timeout=30)
        self.flags: dict[int, list[bool]] = {}
        self.calls = 0

    def member(self, k: int) -> Callable[[Sequence[bool]], list[bool]]:
        def agree(flags: Sequence[bool]) -> list[bool]:
            self.flags[k] = [bool(f) for f in flags]
            self.barrier.wait()
            out = [any(f[i] for f in self.flags.values()) for i in range(len(flags))]
            if k == 0:
                self.calls += 1
            self.barrier.wait()
            return out

        return agree


class _GroupAdapter(NumpyAdapter):
    """The numpy adapter as process `k` of a run whose processes agree through `group`."""

    def __init__(self, group: _Group, k: int) -> None:
        super().__init__()
        self._agree = group.member(k)

    def step_backend(self, plan: Any) -> Any:
        backend = super().step_backend(plan)
        backend.agree = self._agree
        return backend


def _loop(folder: Path, max_steps: int, adapter: Any) -> TrainingLoop:
    train, val = regression_task(n_train=128, in_size=2)
    return TrainingLoop(
        model=NumpyLinearOp("pipekit_train.core.testing:linear", in_size=2, out_size=1),
        data=train,
        validation=val,
        loss="mse",
        optimizer_config={"name": "adam", "lr": 0.05},
        batch_size=16,
        max_steps=max_steps,
        checkpoint=Checkpoint(folder, every_n_steps=4, async_save=False),
        adapter=adapter,
        progress=False,
    )


def _run_group(folders: Sequence[Path], max_steps: int) -> list[Any]:
    group = _Group(len(folders))
    outcomes: list[Any] = [None] * len(folders)

    def target(k: int) -> None:
        try:
            outcomes[k] = _loop(folders[k], max_steps, _GroupAdapter(group, k)).run()
        except BaseException as exc:  # the test inspects what each "process" raised
            outcomes[k] = exc

    threads = [threading.Thread(target=target, args=(k,)) for k in range(len(folders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    return outcomes


def test_processes_that_restored_different_steps_all_raise_before_training(
    tmp_path: Path,
) -> None:
    _loop(tmp_path / "a", 4, NumpyAdapter()).run()  # process 0 sees a checkpoint at 4
    outcomes = _run_group([tmp_path / "a", tmp_path / "b"], 12)  # process 1 sees none
    for k, outcome in enumerate(outcomes):
        assert isinstance(outcome, CheckpointError), (k, outcome)
        assert "another process of the run starts at a different step" in str(outcome)
    assert "starts at step 4" in str(outcomes[0])
    assert "starts at step 0" in str(outcomes[1])
    assert sorted(p.name for p in (tmp_path / "b").iterdir() if p.name.isdigit()) == []


def test_processes_at_the_same_step_train_together_to_the_end(tmp_path: Path) -> None:
    for folder in (tmp_path / "a", tmp_path / "b"):
        _loop(folder, 4, NumpyAdapter()).run()
    outcomes = _run_group([tmp_path / "a", tmp_path / "b"], 12)
    for outcome in outcomes:
        assert not isinstance(outcome, BaseException), outcome
        assert outcome.resumed_from_step == 4 and outcome.steps == 12
