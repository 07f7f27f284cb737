"""Trial functions for tests, examples and benchmarks of `pipekit_train.sweep`.

They live in an importable module so the process and Ray executors can import them by
name in their workers: `numpy_trial` trains the pure-numpy reference model of
`pipekit_train.core.testing`; `backend_trial` trains the same toy regression on the
Equinox, Lightning or Keras backend (imported only when asked for); `placement_trial`
records where each trial ran (process, Ray node, visible GPUs) and how many ran beside
it, which `read_placements` and `most_at_once` read back.
"""

from ._placement import most_at_once, placement_trial, read_placements
from ._trials import backend_trial, numpy_trial

__all__ = ["backend_trial", "most_at_once", "numpy_trial", "placement_trial", "read_placements"]
