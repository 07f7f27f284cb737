"""Trajectories and the training windows cut out of them.

`Trajectories` (`_trajectories`, from any of the three sources in `_sources`), the
per-channel statistics of states and increments as a `Normalizer` (`_stats`), and
`TrajectoryWindows` / `split_trajectories` (`_windows`), and `ModelInputs` (`_inputs`):
the one layout in which history, forcings and static inputs reach a model.
"""

from ._inputs import ModelInputs
from ._stats import fit_trajectory_normalizer
from ._trajectories import Trajectories, TrajectoryRows
from ._windows import FORCING_KEY, TrajectoryWindows, split_trajectories

__all__ = [
    "FORCING_KEY",
    "ModelInputs",
    "Trajectories",
    "TrajectoryRows",
    "TrajectoryWindows",
    "fit_trajectory_normalizer",
    "split_trajectories",
]
