"""Data: datasets, trajectories and windows, the cache, normalisation and the batching engine.

A *sample* is a `dict[str, np.ndarray]` (inputs under `"x"`, targets under `"y"`;
`as_supervised` renames other keys to those); a *batch* is the same dict with a leading batch axis. `make_batches` turns any
dataset here into a checkpointable `BatchIterator` built on grain.

The room is grouped by idea: `datasets/` (the dataset contract, in-memory and simulated
datasets, splits and views, fingerprints), `trajectories/` (trajectories and the windows
cut out of them), `readers/` (trajectory sources over field data stored by other tools:
The Well's HDF5 layout, xarray), `cache/` (`CachedDataset` in zarr, its builds),
`batching/` (the batching engine), and the `Normalizer` (`_normalizer`). Every public
name is re-exported here; import from `pipekit_train.core.data`.

Importing this package is cheap: zarr and grain are imported on first use.
"""

from ._normalizer import Normalizer
from .batching import BatchIterator, make_batches
from .cache import CachedDataset, RayBuildExecutor
from .datasets import (
    ArrayDataset,
    ArraySpec,
    Batch,
    Dataset,
    IterableDataset,
    Sample,
    SimulationDataset,
    SimulationError,
    Subset,
    Supervised,
    as_supervised,
    gather_batch,
    is_core_dataset,
    simulator_seed,
    split,
)
from .readers import WellSource, XarraySource, read_well, read_xarray
from .trajectories import (
    FORCING_KEY,
    ModelInputs,
    Trajectories,
    TrajectoryRows,
    TrajectoryWindows,
    fit_trajectory_normalizer,
    split_trajectories,
)

__all__ = [
    "FORCING_KEY",
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "BatchIterator",
    "CachedDataset",
    "Dataset",
    "IterableDataset",
    "ModelInputs",
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
    "WellSource",
    "XarraySource",
    "as_supervised",
    "fit_trajectory_normalizer",
    "gather_batch",
    "is_core_dataset",
    "make_batches",
    "read_well",
    "read_xarray",
    "simulator_seed",
    "split",
    "split_trajectories",
]
