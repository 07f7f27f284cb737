"""`Normalizer`: per-key, per-feature mean/std fitted in one streaming pass."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._json import to_json_value

from .datasets._dataset import IterableDataset, gather_batch, stack_samples

__all__ = ["Normalizer", "normalizer_to_dict"]

_FORMAT = "pipekit_train.Normalizer"
_CONSTANT_RTOL = 1e-7  # std below this fraction of |mean| is float32 rounding: a constant


def _batches(dataset: Any, batch_size: int) -> Iterator[Mapping[str, np.ndarray]]:
    if isinstance(dataset, IterableDataset):
        it = iter(dataset)
        while True:
            chunk = [s for _, s in zip(range(batch_size), it, strict=False)]
            if not chunk:
                return
            yield stack_samples(chunk)
    elif hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__"):
        n = len(dataset)
        for start in range(0, n, batch_size):
            yield gather_batch(dataset, np.arange(start, min(n, start + batch_size)))
    else:
        raise ConfigError(
            "`dataset` must be indexable or an `IterableDataset`. "
            f"Received: dataset={type(dataset).__name__}."
        )


class Normalizer:
    """Standardise chosen keys of samples: `(x - mean) / std`, per feature.

    Statistics are per key and per feature (every position of the per-sample shape),
    over the sample axis. `fit` streams the dataset once in batches and merges batch
    statistics with Chan's parallel update in float64, so it never holds the dataset
    in memory. `std` is the population standard deviation (ddof=0).

    Constant features: where `std == 0` or `std <= 1e-7 * |mean|` (constant up to
    float32 rounding) the stored std is 1, so `apply` only centres that feature and
    `invert(apply(x))` stays finite and exact up to rounding.

    `to_json()` / `from_json()` round-trip exactly (float64 values are written with
    Python's shortest round-trip repr), so a normalizer travels with a model.

    Args:
        mean: per key, the mean per feature (array-like, float64 after conversion).
        std: per key, the std per feature, same shapes; must be positive and finite.
        count: the number of samples fitted on (informative).

    Raises:
        ConfigError: keys or shapes of `mean` and `std` differ, or a value is invalid.
    """

    def __init__(
        self,
        mean: Mapping[str, Any],
        std: Mapping[str, Any],
        *,
        count: int | None = None,
    ) -> None:
        if set(mean) != set(std) or not mean:
            raise ConfigError(
                "`mean` and `std` must have the same, non-empty keys. "
                f"Received: mean keys={sorted(mean)}, std keys={sorted(std)}."
            )
        self._mean: dict[str, np.ndarray] = {}
        self._std: dict[str, np.ndarray] = {}
        for key in mean:
            m = np.asarray(mean[key], dtype=np.float64)
            s = np.asarray(std[key], dtype=np.float64)
            if m.shape != s.shape:
                raise ConfigError(
                    f"`mean` and `std` of key {key!r} must have the same shape. "
                    f"Received: mean shape {m.shape}, std shape {s.shape}."
                )
            if not (np.all(np.isfinite(m)) and np.all(np.isfinite(s)) and np.all(s > 0)):
                raise ConfigError(
                    f"`std` must be positive and finite and `mean` finite. Received: key {key!r} "
                    f"with mean={m.tolist()}, std={s.tolist()}."
                )
            m.setflags(write=False)
            s.setflags(write=False)
            self._mean[key], self._std[key] = m, s
        self.count = None if count is None else int(count)
        self._cast: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] = {}

    # -- fitting -----------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        dataset: Any,
        keys: Iterable[str] = ("x", "y"),
        batch_size: int = 4096,
    ) -> Normalizer:
        """Fit mean and std of `keys` in one streaming pass over `dataset`.

        Args:
            dataset: an indexable dataset or an `IterableDataset`.
            keys: the sample keys to normalise (others pass through `apply`).
            batch_size: samples read per step of the pass.

        Raises:
            ConfigError: a key is missing, not real-valued, or has non-finite values.
        """
        keys = (keys,) if isinstance(keys, str) else tuple(keys)
        if not keys:
            raise ConfigError("`keys` must name at least one key. Received: keys=().")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(
                f"`batch_size` must be a positive int. Received: batch_size={batch_size!r}."
            )
        count = 0
        mean: dict[str, np.ndarray] = {}
        m2: dict[str, np.ndarray] = {}
        for batch in _batches(dataset, batch_size):
            for key in keys:
                if key not in batch:
                    raise ConfigError(
                        f"`keys` names {key!r}, which the dataset does not have. "
                        f"Received: keys={list(keys)}; the samples have keys {sorted(batch)}."
                    )
                arr = np.asarray(batch[key])
                if arr.dtype.kind not in "biuf":
                    raise ConfigError(
                        f"`{key}` must be real-valued to be normalised. Received: "
                        f"{key}.dtype={arr.dtype}. Leave it out of `keys`."
                    )
                x = arr.astype(np.float64)
                if not np.all(np.isfinite(x)):
                    raise ConfigError(
                        f"`{key}` has non-finite values in samples {count}..{count + len(x) - 1}. "
                        "Received: NaN or inf. Clean the data (or drop invalid simulations) "
                        "before fitting."
                    )
                b_mean = x.mean(axis=0)
                b_m2 = np.square(x - b_mean).sum(axis=0)
                if key not in mean:
                    mean[key], m2[key] = b_mean, b_m2
                else:
                    b = len(x)
                    total = count + b
                    delta = b_mean - mean[key]
                    mean[key] = mean[key] + delta * (b / total)
                    m2[key] = m2[key] + b_m2 + np.square(delta) * (count * b / total)
            count += len(next(iter(batch.values())))
        if count == 0:
            raise ConfigError(
                "`dataset` is empty. Received: 0 samples. Fit on a non-empty dataset."
            )
        std: dict[str, np.ndarray] = {}
        for key in keys:
            s = np.sqrt(m2[key] / count)
            constant = (s == 0) | (s <= _CONSTANT_RTOL * np.abs(mean[key]))
            std[key] = np.where(constant, 1.0, s)
        return cls(mean, std, count=count)

    # -- use ---------------------------------------------------------------------------
    @property
    def keys(self) -> tuple[str, ...]:
        """The normalised keys."""
        return tuple(self._mean)

    @property
    def mean(self) -> dict[str, np.ndarray]:
        """Mean per key (float64, read-only)."""
        return dict(self._mean)

    @property
    def std(self) -> dict[str, np.ndarray]:
        """Std per key (float64, read-only; 1 for constant features)."""
        return dict(self._std)

    def _stats(self, key: str, value: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.dtype]:
        mean = self._mean[key]
        feat = mean.shape
        if value.shape[value.ndim - len(feat) :] != feat or value.ndim < len(feat):
            raise ConfigError(
                f"`{key}` must end with the feature shape {feat} the normalizer was fitted on. "
                f"Received: {key} with shape {value.shape}."
            )
        dtype = value.dtype if value.dtype.kind == "f" else np.dtype(np.float64)
        cached = self._cast.get((key, dtype.str))
        if cached is None:
            cached = (mean.astype(dtype), self._std[key].astype(dtype))
            self._cast[(key, dtype.str)] = cached
        return cached[0], cached[1], dtype

    def _map(self, data: Any, key: str | None, forward: bool) -> Any:
        if isinstance(data, Mapping):
            out = dict(data)
            for k in self._mean:
                if k in out:
                    out[k] = self._map(out[k], k, forward)
            return out
        if key is None:
            raise ConfigError(
                "`key` is required when passing a single array. "
                f"Received: key=None. Use one of {list(self._mean)}."
            )
        if key not in self._mean:
            raise ConfigError(
                f"`key` must be a fitted key. Received: key={key!r}. Use one of {list(self._mean)}."
            )
        value = np.asarray(data)
        mean, std, dtype = self._stats(key, value)
        value = value.astype(dtype, copy=False)
        return (value - mean) / std if forward else value * std + mean

    def apply(self, data: Any, key: str | None = None) -> Any:
        """Normalise a sample or batch dict (fitted keys only), or one array of `key`.

        Floating inputs keep their dtype; integer and bool inputs become float64.
        """
        return self._map(data, key, True)

    def invert(self, data: Any, key: str | None = None) -> Any:
        """Undo `apply`: `x * std + mean` for a dict (fitted keys) or one array of `key`.

        Examples:
            >>> import numpy as np
            >>> from pipekit_train.core.data import ArrayDataset, Normalizer
            >>> ds = ArrayDataset(x=np.arange(8.0).reshape(4, 2), y=np.arange(4.0).reshape(4, 1))
            >>> normalizer = Normalizer.fit(ds, keys=("x", "y"))
            >>> y_norm = normalizer.apply(ds.get_batch(np.arange(4)))["y"]  # e.g. a prediction
            >>> normalizer.invert(y_norm, key="y").ravel()  # back in original units
            array([0., 1., 2., 3.])
        """
        return self._map(data, key, False)

    # -- serialisation -----------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-compatible dict; `from_dict` restores it exactly."""
        return {
            "format": _FORMAT,
            "version": 1,
            "count": self.count,
            "keys": {
                k: {
                    "shape": list(self._mean[k].shape),
                    "mean": self._mean[k].ravel().tolist(),
                    "std": self._std[k].ravel().tolist(),
                }
                for k in self._mean
            },
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Normalizer:
        """Rebuild from `to_dict()`."""
        if not isinstance(data, Mapping) or data.get("format") != _FORMAT:
            raise ConfigError(
                f"Not a serialised Normalizer: expected format {_FORMAT!r}. "
                f"Received: format={getattr(data, 'get', lambda _k: None)('format')!r}."
            )
        mean, std = {}, {}
        for key, entry in data["keys"].items():
            shape = tuple(entry["shape"])
            mean[key] = np.asarray(entry["mean"], dtype=np.float64).reshape(shape)
            std[key] = np.asarray(entry["std"], dtype=np.float64).reshape(shape)
        return cls(mean, std, count=data.get("count"))

    def to_json(self) -> str:
        """The normalizer as a JSON string (exact round-trip through `from_json`)."""
        return json.dumps(self.to_dict(), allow_nan=False)

    @classmethod
    def from_json(cls, text: str | bytes | Mapping[str, Any]) -> Normalizer:
        """Rebuild from `to_json()` (a dict from `to_dict()` is accepted too)."""
        if isinstance(text, Mapping):
            return cls.from_dict(text)
        return cls.from_dict(json.loads(text))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Normalizer):
            return NotImplemented
        return self.keys == other.keys and all(
            np.array_equal(self._mean[k], other._mean[k])
            and np.array_equal(self._std[k], other._std[k])
            for k in self._mean
        )

    __hash__ = None  # type: ignore[assignment]  # unhashable: __eq__ compares arrays

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {m.shape}" for k, m in self._mean.items())
        return f"Normalizer({{{shapes}}}, count={self.count})"


def normalizer_to_dict(normalizer: Any) -> dict[str, Any] | None:
    """The JSON dict of a normalizer.

    Accepts `None`, a dict, a JSON string (what `Normalizer.to_json()` returns), or an
    object with `to_dict()` or `to_json()` (returning a dict or a JSON string).

    Raises:
        ConfigError: the result is not a JSON object.
    """
    if normalizer is None:
        return None
    value = normalizer
    if not isinstance(value, (Mapping, str, bytes)):
        to_dict = getattr(value, "to_dict", None)
        to_json = getattr(value, "to_json", None)
        if callable(to_dict):
            value = to_dict()
        elif callable(to_json):
            value = to_json()
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise ConfigError(
                f"`normalizer` given as a string must be JSON. Received: normalizer={value!r:.80}."
            ) from exc
    value = to_json_value(value, field_name="normalizer")
    if not isinstance(value, dict):
        raise ConfigError(
            "`normalizer` must be a JSON object, or have `to_dict()`/`to_json()` returning one. "
            f"Received: normalizer={value!r:.80}."
        )
    return value
