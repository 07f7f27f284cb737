"""pipekit-train-equinox: the Equinox/JAX adapter of pipekit-train.

```python
from pipekit_train.core import TrainingLoop
from pipekit_train.equinox import Equinox, EquinoxModelOp

loop = TrainingLoop(
    model=EquinoxModelOp("pipekit_train.equinox.testing:mlp", in_size=2, out_size=1, seed=0),
    data=train, validation=val, loss="mse", optimizer_config={"name": "adam", "lr": 1e-3},
    batch_size=64, max_steps=2_000, adapter=Equinox(steps_per_execution=10),
)
artifact = loop.run()
```

- `EquinoxModelOp`: an `eqx.Module` factory as a model operator (jitted numpy inference,
  `eqx.tree_serialise_leaves` weights).
- `Equinox`: the adapter (compiled step with buffer donation, fused steps, mixed
  precision, Orbax checkpoints, sharding).
- `TrainState`: model, optimizer state, step, PRNG key, layer state, loss scale.
- `ShardingSpec`: mesh + model/data partition specs.
- `deep_set` / `DeepSet`: a permutation-invariant embedding for sets of i.i.d. points,
  usable with any head (a model factory: `"pipekit_train.equinox:deep_set"`).
"""

import importlib.metadata as _metadata

from ._adapter import Equinox as Equinox
from ._embeddings import DeepSet as DeepSet
from ._embeddings import deep_set as deep_set
from ._model import EquinoxModelOp as EquinoxModelOp
from ._sharding import ShardingSpec as ShardingSpec
from ._state import TrainState as TrainState

__version__ = _metadata.version("pipekit-train-equinox")

__all__ = [
    "DeepSet",
    "Equinox",
    "EquinoxModelOp",
    "ShardingSpec",
    "TrainState",
    "__version__",
    "deep_set",
]
