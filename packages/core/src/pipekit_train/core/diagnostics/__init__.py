"""Calibration diagnostics for amortized posteriors, in numpy, for any head or backend.

Array functions take posterior draws samples first, `samples (S, N, D)`, and the true
parameters `theta (N, D)` the `N` observations were simulated from:

- `sbc_ranks` / `check_sbc`: simulation-based calibration (Talts et al. 2018): ranks per
  parameter, chi-squared and KS uniformity tests, the ECDF difference with its
  simultaneous band (Säilynoja, Bürkner and Vehtari 2022).
- `central_coverage` / `hpd_coverage` / `check_coverage`: expected coverage over
  credibility levels (central intervals per parameter; highest-density regions from
  `log_prob`).
- `tarp`: TARP's expected coverage probability with random reference points (Lemos et al.
  2023), its area to the curve and a KS test.
- `c2st`: the classifier two-sample test with sbibm's settings (scikit-learn: the
  `[diagnostics]` extra).

`run_calibration(posterior, theta, x)` draws from a posterior (a `NeuralForward` with a
Gaussian or mixture head, or any `x -> distribution` callable) and runs all of them;
its report's `metrics()` go to a metric writer and `plot(directory)` writes the PNGs
(the `[plot]` extra).

>>> import numpy as np
>>> from pipekit_train.core import Gaussian, diagnostics
>>> rng = np.random.default_rng(0)
>>> theta = rng.normal(size=(500, 2))
>>> x = theta + rng.normal(size=(500, 2))       # x | θ ~ N(θ, 1), θ ~ N(0, 1)
>>> posterior = lambda x: Gaussian(x / 2, np.full_like(x, np.sqrt(0.5)))
>>> report = diagnostics.run_calibration(posterior, theta, x, num_samples=100)
>>> report.passed
True
"""

from ._c2st import c2st
from ._coverage import (
    CoverageCheck,
    CoverageCurve,
    central_coverage,
    check_coverage,
    hpd_coverage,
)
from ._inputs import MIN_POSTERIOR_SAMPLES, MIN_SIMULATIONS
from ._posterior import CalibrationReport, posterior_samples, run_calibration
from ._sbc import SBCCheck, check_sbc, sbc_ranks
from ._tarp import TARPResult, tarp

__all__ = [
    "MIN_POSTERIOR_SAMPLES",
    "MIN_SIMULATIONS",
    "CalibrationReport",
    "CoverageCheck",
    "CoverageCurve",
    "SBCCheck",
    "TARPResult",
    "c2st",
    "central_coverage",
    "check_coverage",
    "check_sbc",
    "hpd_coverage",
    "posterior_samples",
    "run_calibration",
    "sbc_ranks",
    "tarp",
]
