"""Datasets: the dataset contract, the in-memory and simulated datasets, and their views.

`Dataset`, `ArrayDataset`, `IterableDataset` and the sample helpers (`_dataset`),
`SimulationDataset` (`_simulation`), the views `split`/`Subset` (`_split`) and
`as_supervised` (`_supervised`), the fingerprints every dataset's identity rests on
(`_hashing`) and the worker processes that compute blocks of a dataset (`_workers`, for
scans and cache builds).
"""

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
from ._simulation import SimulationDataset, SimulationError, simulator_seed
from ._split import Subset, split
from ._supervised import Supervised, as_supervised

__all__ = [
    "ArrayDataset",
    "ArraySpec",
    "Batch",
    "Dataset",
    "IterableDataset",
    "Sample",
    "SimulationDataset",
    "SimulationError",
    "Subset",
    "Supervised",
    "as_supervised",
    "gather_batch",
    "is_core_dataset",
    "simulator_seed",
    "split",
]
