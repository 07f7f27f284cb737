"""The batching engine every adapter uses: `make_batches` and its `BatchIterator`.

`make_batches` (`_engine`) builds a checkpointable `BatchIterator` (`_iterator`): a grain
`MapDataset` pipeline for an indexable dataset (`_map_iterator`, grain imported without
jax by `_grain`), consecutive samples for an `IterableDataset` (`_stream`), each epoch's
order a pure function of the seed and the epoch (`_order`).
"""

from ._engine import make_batches
from ._iterator import BatchIterator

__all__ = ["BatchIterator", "make_batches"]
