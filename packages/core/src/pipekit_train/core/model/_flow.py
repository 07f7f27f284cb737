"""Kept so that `pipekit_train.core.model._flow` still imports: `Flow` moved to
`pipekit_train.core.distributions._flow` (beside its mathematics).

`benchmarks/bench_flow.py` reads `_CHUNK` from here.
"""

from pipekit_train.core.distributions._flow import _CHUNK as _CHUNK
from pipekit_train.core.distributions._flow import (
    Flow,
    RejectionError,
    flow_dim,
    flow_from_output,
)

__all__ = ["Flow", "RejectionError", "flow_dim", "flow_from_output"]
