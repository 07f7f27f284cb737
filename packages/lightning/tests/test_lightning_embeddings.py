"""`deep_set` on torch, trained with `Torch()`: core's `DeepSetSuite`."""

from __future__ import annotations

from typing import Any

from pipekit_train.core.testing import DeepSetSuite
from pipekit_train.lightning import Torch, TorchModelOp


class TestTorchDeepSet(DeepSetSuite):
    adapter = Torch()

    def make_op(self, **options: Any) -> TorchModelOp:
        return TorchModelOp("pipekit_train.lightning:deep_set", **options)
