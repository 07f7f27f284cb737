"""The worked examples' pictures: axes, units and legends read from the matplotlib objects."""

from __future__ import annotations

import emulator
import numpy as np
import pytest
import toymodels

from pipekit_train.core import Cycle

pytest.importorskip("matplotlib")


def _legend(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_rollout_figure_has_time_units_and_a_phase_space_legend() -> None:
    x0 = np.array([[0.5, 0.0], [-0.3, 0.4]])
    simulated = Cycle(toymodels.oscillator_step, 20).run(x0)
    emulated = simulated * 1.01  # a slightly wrong emulator
    fig = emulator.rollout_figure(simulated, emulated, "keras", 0.01)
    position, phase, error = fig.axes
    assert position.get_xlabel() == "time t [s]" and position.get_ylabel() == "position x [m]"
    # the time axis is the simulator's time, Δt = 0.1 s per step
    line = position.get_lines()[0]
    assert line.get_xdata()[-1] == pytest.approx(20 * toymodels.DT)
    assert phase.get_xlabel() == "position x [m]" and phase.get_ylabel() == "velocity v [m/s]"
    assert _legend(phase) == ["simulator", "emulator (keras)", "initial state $(x_0, v_0)$"]
    assert _legend(position) == ["simulator", "emulator (keras)"]
    # both trajectories of each state, plus its start marker, in the same colour
    assert len(phase.get_lines()) == 3 * 2
    assert error.get_xlabel() == "time t [s]" and error.get_yscale() == "log"
    assert error.get_ylabel().endswith("[m]")
    expected = np.hypot(
        emulated[1:, 0, 0] - simulated[1:, 0, 0],
        (emulated[1:, 0, 1] - simulated[1:, 0, 1]) / toymodels.OMEGA,
    )
    np.testing.assert_allclose(error.get_lines()[0].get_ydata(), expected)
    title = fig._suptitle.get_text()
    assert "2 held-out initial states" in title and "Δt = 0.1 s" in title and "1.00%" in title
