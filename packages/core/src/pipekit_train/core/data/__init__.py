"""Layer 0, data: datasets, caches, splits, normalisation and the batching engine.

A *sample* is a `dict[str, np.ndarray]` (inputs under `"x"`, targets under `"y"`;
`as_supervised` renames other keys to those); a *batch* is the same dict with a leading batch axis. `make_batches` turns any
dataset here into a checkpointable `BatchIterator` built on grain.

Importing this package is cheap: zarr and grain are imported on first use.
"""

from ._batching import make_batches
from ._cached import CachedDataset
from ._dataset import (
    ArrayDataset,
    ArraySpec,
    Batch,
    Dataset,
    IterableDataset,
    Sample,
    gather_batch,
    is_core_dataset,
)
from ._iterator import BatchIterator
from ._normalizer import Normalizer
from ._ray_build import RayBuildExecutor
from ._simulation import SimulationDataset, SimulationError, simulator_seed
from ._split import Subset, split
from ._supervised import Supervised, as_supervised
from ._trajectories import Trajectories, TrajectoryRows
from ._trajectory_stats import fit_trajectory_normalizer
from ._windows import TrajectoryWindows, split_trajectories

__all__ = [
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "BatchIterator",
    "CachedDataset",
    "Dataset",
    "IterableDataset",
    "Normalizer",
    "RayBuildExecutor",
    "Sample",
    "SimulationDataset",
    "SimulationError",
    "Subset",
    "Supervised",
    "Trajectories",
    "TrajectoryRows",
    "TrajectoryWindows",
    "as_supervised",
    "fit_trajectory_normalizer",
    "gather_batch",
    "is_core_dataset",
    "make_batches",
    "simulator_seed",
    "split",
    "split_trajectories",
]
