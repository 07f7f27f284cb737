"""ArrayDataset, IterableDataset, split/Subset and Normalizer."""

from __future__ import annotations

import json

import numpy as np
import pytest

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.data import (
    ArrayDataset,
    ArraySpec,
    Dataset,
    IterableDataset,
    Normalizer,
    Subset,
    gather_batch,
    split,
)


def _arrays(n: int = 50) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.normal(size=(n, 4)).astype(np.float32), rng.normal(size=(n, 2))


# -- ArrayDataset ------------------------------------------------------------------------
def test_array_dataset_indexing_batch_and_spec() -> None:
    x, y = _arrays()
    ds = ArrayDataset(x=x, y=y)
    assert isinstance(ds, Dataset)
    assert len(ds) == 50 and ds.keys == ("x", "y")
    assert ds.element_spec == {
        "x": ArraySpec((4,), np.dtype(np.float32)),
        "y": ArraySpec((2,), np.dtype(np.float64)),
    }
    np.testing.assert_array_equal(ds[3]["x"], x[3])
    np.testing.assert_array_equal(ds[-1]["y"], y[-1])
    batch = ds.get_batch(np.array([4, 0, 4]))
    np.testing.assert_array_equal(batch["x"], x[[4, 0, 4]])
    assert batch["y"].dtype == np.float64
    with pytest.raises(IndexError):
        ds[50]
    assert ArraySpec.from_json(json.loads(json.dumps(ds.element_spec["x"].to_json()))) == ArraySpec(
        (4,), np.dtype(np.float32)
    )


def test_array_dataset_fingerprint_tracks_content() -> None:
    x, y = _arrays()
    fp = ArrayDataset(x=x, y=y).fingerprint()
    assert fp == ArrayDataset(y=y.copy(), x=x.copy()).fingerprint()
    assert len(fp) == 64 and int(fp, 16) >= 0
    x2 = x.copy()
    x2[7, 1] += 1
    assert ArrayDataset(x=x2, y=y).fingerprint() != fp
    assert ArrayDataset(x=x.astype(np.float64), y=y).fingerprint() != fp


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({}, "at least one array"),
        ({"x": np.zeros(3), "y": np.zeros(4)}, r"y.shape\[0\]=4, but x.shape\[0\]=3"),
        ({"x": np.array(["a", "b"])}, r"`x` must be a numeric or bool array.*x.dtype=<U1"),
        ({"x": np.array([{}, {}], dtype=object)}, r"`x` must be a numeric.*object"),
        ({"x": np.float32(1.0)}, "leading sample axis"),
    ],
)
def test_array_dataset_rejects_bad_input(kwargs: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        ArrayDataset(**kwargs)


def test_gather_batch_falls_back_to_getitem() -> None:
    class Plain:
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> dict:
            return {"x": np.full(2, i, np.float32)}

    batch = gather_batch(Plain(), np.array([3, 1]))
    np.testing.assert_array_equal(batch["x"], [[3, 3], [1, 1]])


# -- IterableDataset ---------------------------------------------------------------------
def test_iterable_dataset_restarts_and_reports_spec() -> None:
    def samples():
        for i in range(5):
            yield {"x": np.full(3, i, np.float32), "y": np.float32(i)}

    stream = IterableDataset(samples)
    assert [int(s["y"]) for s in stream] == [0, 1, 2, 3, 4]
    assert [int(s["y"]) for s in stream] == [0, 1, 2, 3, 4]  # restartable
    assert stream.element_spec["x"] == ArraySpec((3,), np.dtype(np.float32))
    assert stream.keys == ("x", "y")
    assert stream.fingerprint() == IterableDataset(samples).fingerprint()
    assert not hasattr(stream, "__len__")


def test_iterable_dataset_rejects_an_iterator() -> None:
    with pytest.raises(ConfigError, match="`source` must be a zero-argument callable"):
        IterableDataset(iter([{"x": np.zeros(1)}]))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="stream is empty"):
        _ = IterableDataset(lambda: iter([])).element_spec


# -- split / Subset ----------------------------------------------------------------------
def test_split_is_deterministic_disjoint_and_covering() -> None:
    x, y = _arrays(101)
    ds = ArrayDataset(x=x, y=y)
    train, val, test = split(ds, (0.8, 0.1, 0.1), seed=3)
    assert (len(train), len(val), len(test)) == (81, 10, 10)
    all_idx = np.concatenate([train.indices, val.indices, test.indices])
    assert sorted(all_idx.tolist()) == list(range(101))
    again = split(ds, (0.8, 0.1, 0.1), seed=3)
    assert all(
        np.array_equal(a.indices, b.indices) for a, b in zip((train, val, test), again, strict=True)
    )
    assert not np.array_equal(split(ds, (0.8, 0.1, 0.1), seed=4)[0].indices, train.indices)
    batch = val.get_batch(np.array([1, 0]))
    np.testing.assert_array_equal(batch["x"], x[val.indices[[1, 0]]])
    np.testing.assert_array_equal(val[2]["y"], y[val.indices[2]])
    assert val.fingerprint() != test.fingerprint()
    assert val.element_spec == ds.element_spec
    (half,) = split(ds, (0.5,), seed=0)
    assert len(half) == 50


@pytest.mark.parametrize(
    ("fractions", "match"),
    [
        ((0.8, 0.3), r"sum to at most 1.*sum 1\.1"),
        ((0.5, 0.0), "must all be positive"),
        ((0.5, -0.1), "must all be positive"),
        (0.5, "non-empty sequence"),
        ((), "non-empty sequence"),
        ((0.999, 0.001), "empty part"),
    ],
)
def test_split_rejects_bad_fractions(fractions: object, match: str) -> None:
    x, y = _arrays(100)
    with pytest.raises(ConfigError, match=match):
        split(ArrayDataset(x=x, y=y), fractions, seed=0)  # type: ignore[arg-type]


def test_subset_validates_indices() -> None:
    ds = ArrayDataset(x=np.zeros((5, 1)))
    with pytest.raises(ConfigError, match=r"must lie in \[0, 5\)"):
        Subset(ds, [0, 5])
    with pytest.raises(ConfigError, match="1-D array of ints"):
        Subset(ds, np.array([0.5]))


# -- Normalizer --------------------------------------------------------------------------
def test_normalizer_streams_exact_statistics() -> None:
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(1003, 3)) * [1.0, 10.0, 1e-3] + [5.0, -2.0, 0.0]).astype(np.float32)
    y = rng.normal(size=(1003, 2, 2))
    ds = ArrayDataset(x=x, y=y)
    norm = Normalizer.fit(ds, keys=("x", "y"), batch_size=97)
    np.testing.assert_allclose(norm.mean["x"], x.astype(np.float64).mean(0), rtol=1e-12)
    np.testing.assert_allclose(norm.std["x"], x.astype(np.float64).std(0), rtol=1e-10)
    np.testing.assert_allclose(norm.std["y"], y.std(0), rtol=1e-10)
    assert norm.count == 1003
    out = norm.apply(ds.get_batch(np.arange(1003)))
    assert out["x"].dtype == np.float32
    np.testing.assert_allclose(out["x"].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(out["x"].std(0), 1, atol=1e-4)
    sample = norm.apply(ds[0])  # a single sample broadcasts the same way
    np.testing.assert_allclose(sample["x"], out["x"][0], rtol=1e-6)
    back = norm.invert(out)
    np.testing.assert_allclose(back["x"], x, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(norm.invert(out["y"], key="y"), y, rtol=1e-12)


def test_normalizer_json_round_trip_is_exact() -> None:
    rng = np.random.default_rng(2)
    ds = ArrayDataset(x=rng.normal(size=(64, 5)) / 3, y=rng.normal(size=(64, 1)))
    norm = Normalizer.fit(ds, batch_size=10)
    text = norm.to_json()
    json.loads(text)
    again = Normalizer.from_json(text)
    assert again == norm
    for key in ("x", "y"):
        assert again.mean[key].tobytes() == norm.mean[key].tobytes()
        assert again.std[key].tobytes() == norm.std[key].tobytes()
    assert Normalizer.from_dict(norm.to_dict()) == norm


def test_normalizer_guards_constant_features_and_passes_other_keys() -> None:
    x = np.ones((20, 2), np.float32) * [3.0, 0.0]
    x[:, 1] = np.arange(20)
    ds = ArrayDataset(x=x, c=np.full((20, 1), 7.25), label=np.arange(20))
    norm = Normalizer.fit(ds, keys=("x", "c"), batch_size=6)
    assert norm.std["x"][0] == 1.0 and norm.std["c"][0] == 1.0
    out = norm.apply(ds.get_batch(np.arange(20)))
    assert np.all(np.isfinite(out["x"])) and np.all(out["c"] == 0)
    np.testing.assert_array_equal(out["label"], np.arange(20))  # not fitted: unchanged
    np.testing.assert_allclose(norm.invert(out)["x"], x)


def test_normalizer_fits_a_stream() -> None:
    x = np.arange(30, dtype=np.float64).reshape(10, 3)
    stream = IterableDataset(lambda: ({"x": row} for row in x))
    norm = Normalizer.fit(stream, keys="x", batch_size=4)
    np.testing.assert_allclose(norm.mean["x"], x.mean(0))
    np.testing.assert_allclose(norm.std["x"], x.std(0))


def test_normalizer_errors() -> None:
    ds = ArrayDataset(x=np.array([[1.0], [np.nan]]))
    with pytest.raises(ConfigError, match="`x` has non-finite values"):
        Normalizer.fit(ds, keys=("x",))
    with pytest.raises(ConfigError, match="names 'y', which the dataset does not have"):
        Normalizer.fit(ArrayDataset(x=np.zeros((3, 1))))
    norm = Normalizer.fit(ArrayDataset(x=np.arange(6.0).reshape(3, 2)), keys=("x",))
    with pytest.raises(ConfigError, match="`key` is required"):
        norm.apply(np.zeros(2))
    with pytest.raises(ConfigError, match="feature shape"):
        norm.apply({"x": np.zeros((4, 3))})
    with pytest.raises(ConfigError, match="Not a serialised Normalizer"):
        Normalizer.from_dict({"format": "other"})
