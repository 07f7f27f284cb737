"""make_batches / BatchIterator: order, resume, shards, remainders, streams, errors."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import (
    ArrayDataset,
    BatchIterator,
    IterableDataset,
    Subset,
    make_batches,
    split,
)
from pipekit_train.core.data.batching._engine import chunked_permutation


def _dataset(n: int = 100) -> ArrayDataset:
    ids = np.arange(n)
    return ArrayDataset(x=np.stack([ids, -ids], axis=1).astype(np.float32), y=ids[:, None])


def _ids(batches: list[dict]) -> list[list[int]]:
    return [b["y"][:, 0].tolist() for b in batches]


def _take(it: BatchIterator, k: int) -> list[dict]:
    return [next(it) for _ in range(k)]


def test_epoch_order_is_a_pure_function_of_seed_and_epoch() -> None:
    ds = _dataset(100)
    it = make_batches(ds, 10, seed=5)
    assert isinstance(it, BatchIterator) and it.steps_per_epoch == 10
    epochs = [sum(_ids(_take(it, 10)), []) for _ in range(3)]
    for e, order in enumerate(epochs):
        assert order == np.random.default_rng([5, e]).permutation(100).tolist()
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    assert it.epoch == 3 and it.index == 0
    same = make_batches(ds, 10, seed=5)
    assert sum(_ids(_take(same, 10)), []) == epochs[0]
    assert sum(_ids(_take(make_batches(ds, 10, seed=6), 10)), []) != epochs[0]
    batch = next(make_batches(ds, 10, seed=5))
    np.testing.assert_array_equal(batch["x"][:, 0], batch["y"][:, 0])  # rows stay aligned
    assert batch["x"].dtype == np.float32 and batch["x"].shape == (10, 2)


def test_shuffle_false_is_sequential() -> None:
    it = make_batches(_dataset(30), 10, shuffle=False, num_epochs=2)
    assert sum(_ids(list(it)), []) == list(range(30)) * 2


class Unblocked(ArrayDataset):
    """An ArrayDataset gathered one batch per pipeline element (no block gathering)."""

    gather_block_rows = None


@pytest.mark.parametrize("prefetch", [0, 3])
@pytest.mark.parametrize("blocked", [True, False])
def test_state_round_trip_resumes_exactly_mid_epoch(prefetch: int, blocked: bool) -> None:
    ds = _dataset(103) if blocked else Unblocked(**_dataset(103).arrays)
    kwargs = dict(seed=11, num_epochs=3, drop_remainder=False, prefetch=prefetch)
    full = list(make_batches(ds, 8, **kwargs))
    assert len(full) == 3 * 13
    first = make_batches(ds, 8, **kwargs)
    taken = _take(first, 17)  # epoch 1, index 4
    state = first.get_state()
    assert (state["epoch"], state["index"]) == (1, 4)
    state = json.loads(json.dumps(state))  # pure JSON
    resumed = make_batches(ds, 8, **kwargs)
    resumed.set_state(state)
    rest = list(resumed)
    assert len(taken) + len(rest) == len(full)
    for got, want in zip(taken + rest, full, strict=True):
        for key in want:
            assert got[key].tobytes() == want[key].tobytes()
    assert resumed.get_state()["epoch"] == 3


def test_block_gathering_gives_the_same_batches() -> None:
    blocked, single = _dataset(1000), Unblocked(**_dataset(1000).arrays)
    assert blocked.gather_block_rows > 32 and single.gather_block_rows is None
    kwargs = dict(seed=9, num_epochs=2, drop_remainder=False, shard=(1, 4))
    a = list(make_batches(blocked, 32, **kwargs))
    b = list(make_batches(single, 32, **kwargs))
    assert len(a) == len(b) == 2 * 32  # 1000 / 32 -> 31 global batches of 32 and one of 8
    assert [len(x["y"]) for x in a[30:33]] == [8, 2, 8]  # this shard's quarter of each
    for x, y in zip(a, b, strict=True):
        assert x["x"].tobytes() == y["x"].tobytes() and x["y"].tobytes() == y["y"].tobytes()


def test_state_at_epoch_boundary_and_end() -> None:
    ds = _dataset(40)
    it = make_batches(ds, 10, seed=1, num_epochs=2)
    _take(it, 4)
    assert (it.epoch, it.index) == (1, 0)
    rest = list(it)
    assert len(rest) == 4
    done = make_batches(ds, 10, seed=1, num_epochs=2)
    done.set_state(it.get_state())
    assert list(done) == []


def test_shards_split_every_global_batch() -> None:
    ds = _dataset(103)
    per_shard = []
    for index in range(4):
        it = make_batches(ds, 20, seed=2, shard=(index, 4), num_epochs=2)
        assert it.steps_per_epoch == 5 and it.local_batch_size == 5  # 103 // 20 global batches
        per_shard.append(_ids(_take(it, 10)))
        with pytest.raises(StopIteration):
            next(it)
    one = _ids(list(make_batches(ds, 20, seed=2, num_epochs=2)))
    for step, whole in enumerate(one):
        # the shards' parts, in shard order, are the one-process batch
        assert sum((shard[step] for shard in per_shard), []) == whole
    for epoch in range(2):
        perm = np.random.default_rng([2, epoch]).permutation(103).tolist()
        assert sum(one[5 * epoch : 5 * epoch + 5], []) == perm[:100]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 4), (4, 2)])
@pytest.mark.parametrize("blocked", [True, False])
def test_state_resumes_with_another_shard_count(before: int, after: int, blocked: bool) -> None:
    """Elastic resume: a state saved by `before` shards continues on `after` shards."""
    ds = _dataset(103) if blocked else Unblocked(**_dataset(103).arrays)
    kwargs = dict(seed=4, num_epochs=3)
    whole = _ids(list(make_batches(ds, 8, **kwargs)))  # the one-process sequence
    assert len(whole) == 3 * 12
    first = [make_batches(ds, 8, shard=(i, before), **kwargs) for i in range(before)]
    parts = [_ids(_take(it, 17)) for it in first]  # into epoch 1
    states = [json.loads(json.dumps(it.get_state())) for it in first]
    assert all(state == states[0] for state in states)  # global: the same on every shard
    assert (states[0]["epoch"], states[0]["index"]) == (1, 5) and "shard" not in states[0]
    resumed = [make_batches(ds, 8, shard=(i, after), **kwargs) for i in range(after)]
    for it in resumed:
        it.set_state(states[0])
    rest = [_ids(list(it)) for it in resumed]
    seen = [sum((p[s] for p in parts), []) for s in range(17)]
    seen += [sum((r[s] for r in rest), []) for s in range(len(rest[0]))]
    assert seen == whole


def test_drop_remainder_and_partial_batches() -> None:
    ds = _dataset(25)
    assert [len(b["y"]) for b in make_batches(ds, 10, num_epochs=1)] == [10, 10]
    val = make_batches(ds, 10, shuffle=False, drop_remainder=False, num_epochs=1)
    assert val.steps_per_epoch == 3
    batches = list(val)
    assert [len(b["y"]) for b in batches] == [10, 10, 5]
    assert sum(_ids(batches), []) == list(range(25))
    small = make_batches(_dataset(3), 10, shuffle=False, drop_remainder=False, num_epochs=1)
    assert [len(b["y"]) for b in small] == [3]


def test_endless_iteration_and_subsets() -> None:
    train, _ = split(_dataset(50), (0.8, 0.2), seed=0)
    it = make_batches(train, 16, seed=0)
    assert it.num_epochs is None and it.steps_per_epoch == 2
    seen = _take(it, 7)
    assert it.epoch == 3
    assert set(sum(_ids(seen), [])) <= set(train.indices.tolist())


def test_datasets_without_get_batch_use_getitem() -> None:
    class Plain:
        def __len__(self) -> int:
            return 12

        def __getitem__(self, i: int) -> dict:
            return {"x": np.array([i], np.int64)}

    batches = list(make_batches(Plain(), 4, shuffle=False, num_epochs=1))
    assert [b["x"][:, 0].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]


def test_batch_size_larger_than_dataset_message() -> None:
    with pytest.raises(ConfigError) as info:
        make_batches(_dataset(100), 512)
    assert str(info.value) == (
        "`batch_size` must not exceed the number of samples when drop_remainder=True. "
        "Received: batch_size=512, but the dataset has 100 samples. "
        "Use batch_size <= 100 or drop_remainder=False."
    )
    with pytest.raises(ConfigError) as info:
        make_batches(_dataset(100), 30, shard=(1, 4))
    assert str(info.value) == (
        "`batch_size` is the global batch and must split evenly over the 4 shards "
        "(processes). Received: batch_size=30, shard=(1, 4). Use a multiple of 4, "
        "e.g. batch_size=32."
    )
    with pytest.raises(ConfigError, match="last batch of every epoch holds 4 samples"):
        make_batches(_dataset(100), 16, shard=(0, 8), drop_remainder=False)
    make_batches(_dataset(100), 24, shard=(0, 4), drop_remainder=False)  # 4 left: 1 each


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"`batch_size` must be a positive int. Received: batch_size=0"),
        ({"batch_size": 2.0}, r"Received: batch_size=2.0"),
        ({"batch_size": True}, r"Received: batch_size=True"),
        ({"seed": -3}, r"`seed` must be a int >= 0|`seed` must be an? .*Received: seed=-3"),
        ({"shard": (2, 2)}, r"`shard` must be \(index, count\).*Received: shard=\(2, 2\)"),
        ({"shard": (0, 0)}, r"Received: shard=\(0, 0\)"),
        ({"shard": 1}, r"Received: shard=1"),
        ({"num_epochs": 0}, r"`num_epochs` must be a positive int"),
        ({"prefetch": -1}, r"`prefetch` must be a int >= 0|Received: prefetch=-1"),
        ({"shuffle": "yes"}, r"`shuffle` must be a bool"),
        ({"shard": (0, 200)}, r"must split evenly over the 200 shards"),
    ],
)
def test_rejects_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"batch_size": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        make_batches(_dataset(100), **args)


def test_rejects_non_datasets_and_foreign_states() -> None:
    with pytest.raises(ConfigError, match="must be indexable .* or an `IterableDataset`"):
        make_batches(iter([1, 2]), 2)
    it = make_batches(_dataset(100), 10, seed=1)
    state = it.get_state()
    other = make_batches(_dataset(100), 20, seed=1)
    with pytest.raises(ConfigError, match="saved by an iterator with batch_size=10"):
        other.set_state(state)
    legacy = {**state, "shard": [1, 2]}  # a per-shard state of an earlier version
    with pytest.raises(ConfigError, match=r"per-shard iterator of an earlier version"):
        it.set_state(legacy)
    it.set_state({**state, "shard": [0, 1]})  # one-process states keep their meaning
    with pytest.raises(ConfigError, match="invalid index"):
        it.set_state({**state, "index": 99})
    with pytest.raises(ConfigError, match="must be a dict returned by `get_state"):
        it.set_state({"foo": 1})
    finite = make_batches(_dataset(100), 10, num_epochs=1)
    with pytest.raises(ConfigError, match="past the end"):
        finite.set_state({"epoch": 2, "index": 0})


def test_chunk_aware_order_is_a_permutation_that_reads_few_chunks() -> None:
    rng = np.random.default_rng(0)
    order = chunked_permutation(1000, 64, 4, rng)
    assert sorted(order.tolist()) == list(range(1000))
    chunks = order // 64
    # every window of 4 chunks is contiguous in the order
    windows = [set(chunks[i : i + 256].tolist()) for i in range(0, 1000, 256)]
    assert all(len(w) <= 4 for w in windows)
    again = chunked_permutation(1000, 64, 4, np.random.default_rng(0))
    assert np.array_equal(order, again)

    class Chunked(ArrayDataset):
        chunk_size = 10
        shuffle_window = 2

    ds = Chunked(y=np.arange(100)[:, None])
    it = make_batches(ds, 20, seed=4)
    assert it.get_state()["order"] == "chunked:10x2"
    first = _ids(_take(it, 5))
    for batch in first:
        assert len({i // 10 for i in batch}) <= 2 * 2


# -- streams -----------------------------------------------------------------------------
def _stream(n: int) -> IterableDataset:
    def source():
        for i in range(n):
            yield {"x": np.full(2, i, np.float32), "y": np.array([i])}

    return IterableDataset(source)


def test_stream_batches_consecutive_samples_and_resumes() -> None:
    stream = _stream(23)
    it = make_batches(stream, 5, num_epochs=2, drop_remainder=False)
    assert it.steps_per_epoch is None
    full = _ids(list(it))
    assert full == [list(range(i, min(i + 5, 23))) for i in range(0, 23, 5)] * 2
    first = make_batches(stream, 5, num_epochs=2, drop_remainder=False)
    head = _ids(_take(first, 7))
    state = json.loads(json.dumps(first.get_state()))
    assert (state["epoch"], state["samples"]) == (1, 10)
    resumed = make_batches(stream, 5, num_epochs=2, drop_remainder=False)
    resumed.set_state(state)
    assert head + _ids(list(resumed)) == full
    assert _ids(list(make_batches(stream, 5, num_epochs=1))) == full[:4]  # remainder dropped


def test_stream_shards_split_every_global_batch() -> None:
    stream = _stream(23)
    shards = [
        _ids(list(make_batches(stream, 6, shard=(i, 2), num_epochs=1, drop_remainder=False)))
        for i in range(2)
    ]
    assert len(shards[0]) == len(shards[1]) == 4
    flat = sum(sum(shards, []), [])
    assert len(flat) == len(set(flat)) == 22  # the odd sample of the last batch is left out
    assert shards[0][0] == [0, 1, 2] and shards[1][0] == [3, 4, 5]


def test_stream_errors() -> None:
    with pytest.raises(ConfigError, match="Received: batch_size=50, but the stream has 23"):
        next(make_batches(_stream(23), 50))
    it = make_batches(_stream(10), 2)
    with pytest.raises(ConfigError, match="needs a non-negative `samples`"):
        it.set_state({"epoch": 0, "index": 0, "samples": -1})
    it.set_state({"epoch": 0, "index": 0, "samples": 50})
    with pytest.raises(ConfigError, match="Cannot resume the stream"):
        next(it)


def test_subset_of_subset_keeps_mapping() -> None:
    ds = _dataset(20)
    inner = Subset(ds, np.arange(10, 20))
    outer = Subset(inner, [9, 0])
    batch = next(make_batches(outer, 2, shuffle=False))
    assert batch["y"][:, 0].tolist() == [19, 10]
