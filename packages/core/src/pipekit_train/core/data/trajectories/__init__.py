"""Trajectories and the training windows cut out of them.

`Trajectories` (`_trajectories`, from any of the three sources in `_sources`), the
per-channel statistics of states and increments as a `Normalizer` (`_stats`), and
`TrajectoryWindows` / `split_trajectories` (`_windows`).
"""

from ._stats import fit_trajectory_normalizer
from ._trajectories import Trajectories, TrajectoryRows
from ._windows import TrajectoryWindows, split_trajectories

__all__ = [
    "Trajectories",
    "TrajectoryRows",
    "TrajectoryWindows",
    "fit_trajectory_normalizer",
    "split_trajectories",
]
