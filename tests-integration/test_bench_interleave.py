"""`benchmarks/_shared.interleaved_round`: loops take turns, one at a time, and only the
steps after the warm-up, between hand-overs, are timed."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _shared() -> Any:
    spec = importlib.util.spec_from_file_location(
        "pipekit_bench_shared", ROOT / "benchmarks" / "_shared.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class FakeTimer:
    """A clock that advances only when a loop does work."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_loops_take_turns_every_chunk_and_only_timed_steps_count() -> None:
    shared = _shared()
    timer = FakeTimer()
    trace: list[tuple[str, int]] = []
    inits: list[str] = []

    def loop(name: str, cost: float) -> Any:
        def run(clock: Any) -> None:
            for step in range(1, 41):
                timer.now += cost  # one step's work
                trace.append((name, step))
                clock.tick(step)
            timer.now += 100.0  # after the last step: not timed

        return run

    rates = shared.interleaved_round(
        [loop("a", 1.0), loop("b", 0.5)],
        warmup=10,
        total=40,
        chunk=10,
        timer=timer,
        init=lambda: inits.append("x"),
    )
    assert inits == ["x", "x"]
    # a runs steps 1-10, then b 1-10, then a 11-20, ...: never two at once
    turns = [trace[i][0] for i in range(0, len(trace), 10)]
    assert turns == ["a", "b"] * 4
    assert [s for n, s in trace if n == "a"] == list(range(1, 41))
    # 30 timed steps each at 1.0 and 0.5 a step: the shared clock also ran while each
    # waited for its turn, and that time is not counted
    assert rates == pytest.approx([1.0, 2.0])


def test_a_failing_loop_does_not_hang_the_others() -> None:
    shared = _shared()
    done: list[int] = []

    def bad(clock: Any) -> None:
        clock.tick(5)
        raise RuntimeError("boom")

    def good(clock: Any) -> None:
        for step in range(1, 21):
            clock.tick(step)
        done.append(20)

    with pytest.raises(RuntimeError, match="boom"):
        shared.interleaved_round([bad, good], warmup=5, total=20, chunk=5)
    assert done == [20]


def test_steps_must_be_whole_chunks() -> None:
    shared = _shared()
    with pytest.raises(
        ValueError, match=r"warmup=7, total=20, but both must be multiples of chunk=5"
    ):
        shared.interleaved_round([lambda clock: None], warmup=7, total=20, chunk=5)
