"""`RunContext` and its parts: grouped metric fetching, fused steps, schedules."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipekit_train.core import Checkpoint
from pipekit_train.core.adapter import Plan
from pipekit_train.core.run._context import RunContext
from pipekit_train.core.testing import NumpyAdapter, NumpyLinearOp


class CountingFetch:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, values: list[Any]) -> list[np.ndarray]:
        self.calls += 1
        return [np.asarray(v) for v in values]


class Recorder:
    def __init__(self) -> None:
        self.rows: list[tuple[int, dict]] = []

    def write(self, step: int, metrics: dict) -> None:
        self.rows.append((step, dict(metrics)))


def _plan(**kw: Any) -> Plan:
    base: dict[str, Any] = dict(
        model=NumpyLinearOp(
            "pipekit_train.core.testing._numpy_model:linear", in_size=2, out_size=1
        ),
        data=None,
        validation=None,
        loss=lambda p, t: 0.0,
        metrics={},
        optimizer_config={"name": "sgd", "learning_rate": 0.1},
        batch_size=4,
        max_steps=20,
        max_epochs=None,
        total_steps=20,
        steps_per_epoch=None,
        callbacks=(),
        writers=(),
        checkpoint=None,
        seed=0,
        adapter=NumpyAdapter(),
        log_every_n_steps=5,
        progress=False,
    )
    base.update(kw)
    return Plan(**base)


def test_metrics_are_fetched_in_groups() -> None:
    fetch, writer = CountingFetch(), Recorder()
    ctx = RunContext(_plan(writers=(writer,)), fetch=fetch)
    ctx.begin()
    for i in range(12):
        ctx.metrics.record_step({"loss": np.float32(i)})
    assert fetch.calls == 2 and [s for s, _ in writer.rows] == list(range(1, 11))
    art = ctx.finish(ctx.plan.model)
    assert fetch.calls == 3
    assert [s for s, _ in writer.rows] == list(range(1, 13))
    assert art.history["loss"] == [float(i) for i in range(12)]


def test_a_callback_that_reads_metrics_forces_a_fetch_per_step() -> None:
    fetch = CountingFetch()
    seen: list[float] = []

    class Reader:
        def on_step_end(self, state: Any) -> None:
            seen.append(state.metrics["loss"])

    ctx = RunContext(_plan(callbacks=(Reader(),)), fetch=fetch)
    for i in range(3):
        ctx.metrics.record_step({"loss": np.float32(i)})
    assert seen == [0.0, 1.0, 2.0] and fetch.calls == 3


def test_a_callback_that_ignores_metrics_costs_no_fetch() -> None:
    fetch = CountingFetch()
    steps: list[int] = []

    class Counter:
        def on_step_end(self, state: Any) -> None:
            steps.append(state.step)

    ctx = RunContext(_plan(callbacks=(Counter(),)), fetch=fetch)
    for i in range(4):
        ctx.metrics.record_step({"loss": np.float32(i)})
    assert steps == [1, 2, 3, 4] and fetch.calls == 0


def test_fused_steps_deliver_every_step() -> None:
    fetch, writer = CountingFetch(), Recorder()
    seen: list[tuple[int, float]] = []

    class Reader:
        def on_step_end(self, state: Any) -> None:
            seen.append((state.step, state.metrics["loss"]))

    ctx = RunContext(_plan(writers=(writer,), callbacks=(Reader(),)), fetch=fetch)
    ctx.metrics.record_steps({"loss": np.arange(4, dtype=np.float32)}, 4)
    assert seen == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]
    assert fetch.calls == 1  # one fetch for the whole fused group
    ctx.metrics.flush()
    assert [(s, m["loss"]) for s, m in writer.rows] == [(1, 0.0), (2, 1.0), (3, 2.0), (4, 3.0)]


def test_steps_until_event_aligns_groups_with_checkpoints(tmp_path: Any) -> None:
    ctx = RunContext(_plan(checkpoint=Checkpoint(tmp_path, every_n_steps=6), total_steps=20))
    sizes = []
    while not ctx.progress.done:
        k = ctx.checkpoints.steps_until_event(4)
        sizes.append(k)
        ctx.metrics.record_steps({"loss": np.zeros(k, np.float32)}, k)
    assert sizes == [4, 2, 4, 2, 4, 2, 2]
    assert ctx.progress.step == 20


def test_validation_records_best_and_prefixes() -> None:
    ctx = RunContext(_plan())
    ctx.progress.step = 5
    ctx.validation.record({"loss": 0.5, "mae": 0.1})
    ctx.progress.step = 10
    ctx.validation.record({"loss": 0.7})
    assert (ctx.validation.best_metric, ctx.validation.best_step) == (0.5, 5)
    assert (
        ctx.metrics.latest_metrics()["val_loss"] == 0.7
        and ctx.metrics.latest_metrics()["val_mae"] == 0.1
    )


def test_checkpoint_meta_round_trip() -> None:
    class Stateful:
        def __init__(self) -> None:
            self.value = 0

        def on_step_end(self, state: Any) -> None:
            self.value += 1

        def state_dict(self) -> dict:
            return {"value": self.value}

        def load_state_dict(self, d: dict) -> None:
            self.value = d["value"]

    cb = Stateful()
    ctx = RunContext(_plan(callbacks=(cb,)))
    for i in range(3):
        ctx.metrics.record_step({"loss": np.float32(i)})
    meta = ctx.checkpoints.meta({"epoch": 0, "index": 3})
    cb2 = Stateful()
    ctx2 = RunContext(_plan(callbacks=(cb2,)))
    ctx2.restore(meta)
    assert (
        ctx2.progress.step == 3
        and cb2.value == 3
        and ctx2.metrics.history["loss"] == [0.0, 1.0, 2.0]
    )
    assert meta["data_iter"] == {"epoch": 0, "index": 3}
