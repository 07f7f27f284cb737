"""`BatchIterator`: the checkpointable batch iterator every adapter consumes."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data.datasets._dataset import Batch

__all__ = ["BatchIterator"]


class BatchIterator(Iterator[Batch]):
    """An iterator of numpy batch dicts with a JSON state for exact resume.

    Returned by `make_batches`; do not construct it directly.

    - `next(it)` returns the next batch (`dict[str, np.ndarray]`).
    - `get_state()` returns a pure-JSON dict; `set_state(state)` on an iterator made
      with the same `make_batches` arguments continues exactly after the last batch
      taken before `get_state()`, also mid-epoch.
    - `epoch` is the epoch of the next batch (after the last batch of epoch `e` it
      is `e + 1`); `index` the batches already taken in that epoch.
    - `steps_per_epoch` is the number of batches per epoch (None for streams); the
      same on every shard.

    The order and the state are global: `batch_size` is the global batch, shard
    `(i, c)` takes rows `[i * batch_size // c, (i + 1) * batch_size // c)` of each
    global batch, and the state (epoch, position) holds no shard. A state saved by
    an iterator with `c` shards resumes an iterator with any other shard count
    (elastic resume) and continues the same global sample sequence.

    Attributes:
        batch_size: the global batch size (all shards together).
        seed: the shuffle seed.
        shuffle: whether epochs are shuffled.
        drop_remainder: whether a final partial batch is dropped.
        shard: `(index, count)` of this process's shard.
        num_epochs: the number of epochs, None for endless.
    """

    batch_size: int
    seed: int
    shuffle: bool
    drop_remainder: bool
    shard: tuple[int, int]
    num_epochs: int | None

    def __iter__(self) -> BatchIterator:
        return self

    def __next__(self) -> Batch:  # pragma: no cover - implemented by subclasses
        raise NotImplementedError

    @property
    def steps_per_epoch(self) -> int | None:
        """Batches per epoch (the same on every shard), or None for a stream."""
        raise NotImplementedError

    @property
    def local_batch_size(self) -> int:
        """Rows of a full batch on this shard (`batch_size // shard count`)."""
        return self.batch_size // self.shard[1]

    @property
    def epoch(self) -> int:
        """The epoch of the next batch."""
        return int(self.get_state()["epoch"])

    @property
    def index(self) -> int:
        """Batches already taken in the current epoch."""
        return int(self.get_state()["index"])

    def get_state(self) -> dict[str, Any]:
        """The position as a JSON dict (see the subclass for the keys)."""
        raise NotImplementedError

    def set_state(self, state: Mapping[str, Any]) -> None:
        """Move to the position recorded by `get_state()`."""
        raise NotImplementedError

    # -- shared helpers ----------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_remainder": self.drop_remainder,
        }

    def _check_state(self, state: Any, identity: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping) or "epoch" not in state:
            raise ConfigError(
                "`state` must be a dict returned by `get_state()` of a batch iterator. "
                f"Received: state={state!r}."
            )
        epoch = state["epoch"]
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise ConfigError(f"`state` has an invalid epoch. Received: epoch={epoch!r}.")
        shard = state.get("shard")
        if isinstance(shard, (list, tuple)) and len(shard) == 2 and shard[1] != 1:
            # states of earlier versions counted per-shard batches of per-shard orders
            raise ConfigError(
                "`state` was saved by a per-shard iterator of an earlier version, whose "
                "position cannot be mapped onto the global sample order. "
                f"Received: shard={list(shard)!r} in state={dict(state)!r}. Start the run "
                "afresh (a new checkpoint directory)."
            )
        if self.num_epochs is not None and epoch > self.num_epochs:
            raise ConfigError(
                f"`state` is past the end: this iterator runs num_epochs={self.num_epochs}. "
                f"Received: epoch={epoch}. Use num_epochs=None or a larger num_epochs."
            )
        for key, mine in identity.items():
            if key in state:
                theirs = state[key]
                if theirs != mine:
                    raise ConfigError(
                        f"`state` was saved by an iterator with {key}={theirs!r}, but this "
                        f"iterator has {key}={mine!r}. Received: state={dict(state)!r}. Resume "
                        "with the same make_batches arguments and dataset."
                    )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(batch_size={self.batch_size}, seed={self.seed}, "
            f"shard={self.shard}, steps_per_epoch={self.steps_per_epoch}, "
            f"state={self.get_state()})"
        )
