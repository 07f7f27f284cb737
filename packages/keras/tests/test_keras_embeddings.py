"""`deep_set` on keras: core's `DeepSetSuite` (the checks every backend's embedding passes)."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import DeepSetSuite
from pipekit_train.keras import KerasModelOp


class TestKerasDeepSet(DeepSetSuite):
    def make_op(self, **options: Any) -> KerasModelOp:
        return KerasModelOp("pipekit_train.keras:deep_set", **options)
