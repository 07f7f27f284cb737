"""C2ST: the classifier two-sample test (Lopez-Paz and Oquab 2017), with sbibm's settings.

A classifier learns to tell sample set `a` (label 0) from sample set `b` (label 1); its
cross-validated accuracy is the score. 0.5: the classifier does no better than chance,
the two sets look alike; 1.0: it tells them apart every time.

The settings are sbibm's (Lueckmann et al. 2021, `sbibm/metrics/c2st.py`), which sbi's
`c2st` keeps: both sets z-scored with `a`'s mean and standard deviation; scikit-learn's
`MLPClassifier` with two hidden layers of `10 * dim` ReLU units, Adam, `max_iter=10000`;
5-fold cross-validation, shuffled, seeded; the mean accuracy over the folds. The folds are
stratified (each holds both sets in their proportion, as in sbi; sbibm uses plain
`KFold`, which is the same for two sets of equal size up to the shuffling).

scikit-learn is an optional dependency: `pip install 'pipekit-train-core[diagnostics]'`.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from pipekit_train.core._checks import check_seed, is_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import optional_import

__all__ = ["c2st"]


def _two_dim(name: str, value: Any) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if array.ndim == 1:
        array = array[:, None]
    if array.ndim != 2:
        raise ConfigError(
            f"`{name}` must be samples (num_samples, dim). Received: {name}.shape={array.shape}."
        )
    if not np.all(np.isfinite(array)):
        raise ConfigError(
            f"`{name}` must hold finite numbers. Received: "
            f"{int(np.size(array) - np.count_nonzero(np.isfinite(array)))} NaN/inf values."
        )
    return array


def c2st(
    a: Any,
    b: Any,
    *,
    seed: int = 0,
    folds: int = 5,
    z_score: bool = True,
    max_iter: int = 10_000,
) -> float:
    """The classifier two-sample test: mean cross-validated accuracy telling `a` from `b`.

    Args:
        a: samples `(n_a, dim)`, e.g. reference posterior draws (its mean and standard
            deviation z-score both sets).
        b: samples `(n_b, dim)`, e.g. the network's posterior draws.
        seed: seeds the classifier's initialisation and the fold shuffling.
        folds: the number of cross-validation folds (sbibm: 5).
        z_score: z-score both sets with `a`'s mean and standard deviation first.
        max_iter: the classifier's iteration cap (sbibm: 10000; not converging is not an
            error, the accuracy is still read).

    Returns:
        The accuracy in [0, 1]: about 0.5 when `a` and `b` come from one distribution.

    Raises:
        ConfigError: samples of different dimension, fewer samples in a set than `folds`,
            `folds < 2`, non-finite values.
        ImportError: scikit-learn is not installed (the `[diagnostics]` extra).
    """
    x_a, x_b = _two_dim("a", a), _two_dim("b", b)
    seed = check_seed(seed)
    if x_a.shape[1] != x_b.shape[1]:
        raise ConfigError(
            "`a` and `b` must hold samples of the same dimension. Received: "
            f"a.shape={x_a.shape}, b.shape={x_b.shape}."
        )
    if not is_int(folds) or folds < 2:
        raise ConfigError(f"`folds` must be an int >= 2. Received: folds={folds!r}. Use 5.")
    if not is_int(max_iter) or max_iter < 1:
        raise ConfigError(f"`max_iter` must be a positive int. Received: max_iter={max_iter!r}.")
    smallest = min(len(x_a), len(x_b))
    if smallest < 2 * folds:
        raise ConfigError(
            f"C2ST with {folds} folds needs at least {2 * folds} samples in each set (two per "
            f"fold). Received: len(a)={len(x_a)}, len(b)={len(x_b)}. Draw more samples "
            "(sbibm uses 10000 per set; 1000 give a score to about ±0.02) or pass fewer folds."
        )
    optional_import("sklearn", extra="diagnostics", package="pipekit-train-core")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.neural_network import MLPClassifier

    if z_score:
        mean, std = x_a.mean(axis=0), x_a.std(axis=0)
        std = np.where(std > 0, std, 1.0)
        x_a, x_b = (x_a - mean) / std, (x_b - mean) / std
    data = np.concatenate([x_a, x_b])
    labels = np.concatenate([np.zeros(len(x_a)), np.ones(len(x_b))])
    width = 10 * data.shape[1]
    classifier = MLPClassifier(
        hidden_layer_sizes=(width, width),
        activation="relu",
        solver="adam",
        max_iter=int(max_iter),
        random_state=seed,
    )
    cv = StratifiedKFold(n_splits=int(folds), shuffle=True, random_state=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", category=ConvergenceWarning)
        scores = cross_val_score(classifier, data, labels, cv=cv, scoring="accuracy")
    return float(np.mean(scores))
