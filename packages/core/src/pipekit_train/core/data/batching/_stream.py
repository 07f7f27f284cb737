"""Batches of an `IterableDataset`: consecutive samples, state = samples consumed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import Batch, IterableDataset, Sample, stack_samples

from ._iterator import BatchIterator

__all__ = ["StreamBatchIterator"]


class StreamBatchIterator(BatchIterator):
    """Global batches of consecutive stream samples; shard `i` of `c` takes part `i`.

    The stream is read in global batches of `batch_size` samples and shard `i`
    takes samples `[i * b, (i + 1) * b)` of each (`b = batch_size // c`), so every
    shard reads the whole stream and all shards yield the same number of batches.
    At the end of the stream a partial batch is dropped (`drop_remainder=True`) or
    split equally, `len(batch) // c` samples per shard.

    When the source is exhausted the epoch ends; with `num_epochs` not reached the
    source is called again for the next epoch. The state is
    `{"epoch", "samples", "index", ...}`: `samples` read from the source in this
    epoch (all shards' samples, so a resume skips exactly that many) and `index` the
    batches taken; it is the same on every shard, so it resumes any shard count.
    """

    def __init__(
        self,
        dataset: IterableDataset,
        batch_size: int,
        *,
        seed: int,
        shuffle: bool,  # accepted for a uniform signature; streams keep source order
        drop_remainder: bool,
        shard: tuple[int, int],
        num_epochs: int | None,
    ) -> None:
        self._dataset = dataset
        self.batch_size, self.seed = batch_size, seed
        self.shuffle = False  # a stream is batched in source order
        self.drop_remainder, self.shard, self.num_epochs = drop_remainder, shard, num_epochs
        self._epoch = 0
        self._samples = 0
        self._index = 0
        self._source: Iterator[Sample] | None = None

    @property
    def steps_per_epoch(self) -> None:
        """None: a stream has no known length."""
        return None

    def _open(self) -> Iterator[Sample]:
        source = iter(self._dataset)
        if self._samples:
            skipped = sum(1 for _ in itertools.islice(source, self._samples))
            if skipped < self._samples:
                raise ConfigError(
                    f"Cannot resume the stream: the state says {self._samples} samples were "
                    f"consumed in epoch {self._epoch}, but the source now yields only {skipped}. "
                    "Received: a source that changed. Make `source()` replay the same samples."
                )
        return source

    def __next__(self) -> Batch:
        index, count = self.shard
        size, local = self.batch_size, self.local_batch_size
        while self.num_epochs is None or self._epoch < self.num_epochs:
            if self._source is None:
                self._source = self._open()
            chunk = list(itertools.islice(self._source, size))
            if len(chunk) == size:
                self._samples += size
                self._index += 1
                return stack_samples(chunk[index * local : (index + 1) * local])
            per = len(chunk) // count
            if chunk and per and not self.drop_remainder:
                self._samples += len(chunk)
                self._index += 1
                return stack_samples(chunk[index * per : (index + 1) * per])
            if self._index == 0:
                total = self._samples + len(chunk)
                if self.drop_remainder:
                    raise ConfigError(
                        "`batch_size` must not exceed the number of samples when "
                        f"drop_remainder=True. Received: batch_size={self.batch_size}, but the "
                        f"stream has {total} samples per pass. Use "
                        f"batch_size <= {max(1, total)} or drop_remainder=False."
                    )
                raise ConfigError(
                    f"`shard` leaves no samples: the stream has {total} samples per pass for "
                    f"{count} shards. Received: shard={self.shard!r}. Use fewer shards."
                )
            self._epoch += 1
            self._samples = 0
            self._index = 0
            self._source = None
        raise StopIteration

    def get_state(self) -> dict[str, Any]:
        """`{"epoch", "samples", "index", "seed", "batch_size", ...}` (JSON)."""
        return {
            "epoch": self._epoch,
            "index": self._index,
            "samples": self._samples,
            "stream": True,
            **self._identity(),
        }

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Continue after the samples recorded in `state` (the source is replayed and skipped).

        Raises:
            ConfigError: the state is malformed or was saved with other arguments.
        """
        self._check_state(state, {"stream": True, **self._identity()})
        samples = state.get("samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
            raise ConfigError(
                "`state` of a stream needs a non-negative `samples` count. "
                f"Received: samples={samples!r}."
            )
        self._epoch = int(state["epoch"])
        self._samples = samples
        self._index = int(state.get("index", 0))
        self._source = None
