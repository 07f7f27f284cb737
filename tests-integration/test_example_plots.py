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


def test_field_rollout_figure_shows_fields_differences_and_error_growth() -> None:
    import field_emulator

    x0 = field_emulator.held_out_states(2)
    simulated = Cycle(field_emulator.gray_scott, 6).run(x0)
    emulated = simulated * 1.01  # a slightly wrong emulator
    fig = field_emulator.rollout_figure(simulated, emulated, "lightning", 0.01, 0.2)
    images = [ax for ax in fig.axes if ax.get_images()]
    # 3 rows (simulator, emulator, difference) × 4 times, one colour bar per row
    assert len(images) == 12
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_images() and ax.get_ylabel()]
    assert labels == ["simulator v", "emulator v (lightning)", "emulator − simulator"]
    titles = [ax.get_title() for ax in fig.axes if ax.get_images() and ax.get_title()]
    assert titles[0] == "step 0 (t = 0)"
    assert titles[-1] == f"step 6 (t = {6 * field_emulator.INNER * field_emulator.DT:g})"
    growth = fig.axes[-1]
    assert growth.get_yscale() == "log" and "persistence" in growth.get_title()
    assert growth.get_xlabel().startswith("emulator step")
    emulator_line, persistence_line = growth.get_lines()[:2]
    np.testing.assert_allclose(emulator_line.get_ydata(), 0.01, rtol=1e-5)
    expected = field_emulator.error_growth(
        np.broadcast_to(simulated[:1], simulated.shape), simulated
    )
    np.testing.assert_allclose(persistence_line.get_ydata(), expected[1:, 0])
    assert "relative trajectory error 1.00% (persistence 20.0%)" in fig._suptitle.get_text()
