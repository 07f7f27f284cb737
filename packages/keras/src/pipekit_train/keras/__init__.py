"""pipekit-train-keras: train Keras 3 models with `model.fit` (jax or torch backend).

- `Keras`: the adapter (`jit_compile`, `steps_per_execution`, `precision`).
- `KerasModelOp`: a `keras.Model` factory as a pipekit model operator (byte-stable
  safetensors weights).
- `deep_set`: a permutation-invariant embedding for sets of i.i.d. points, usable with
  any head (a model factory: `"pipekit_train.keras:deep_set"`).

Importing this package does not import keras. If neither `KERAS_BACKEND` nor
`~/.keras/keras.json` names an installed jax/torch backend, it sets `KERAS_BACKEND` to
`jax` (or `torch`), because Keras would otherwise default to tensorflow.
"""

import importlib.metadata as _metadata

from ._keras_backend import configure as _configure

_configure()

from ._adapter import Keras  # noqa: E402
from ._embeddings import deep_set  # noqa: E402
from ._model import KerasModelOp  # noqa: E402

__version__ = _metadata.version("pipekit-train-keras")

__all__ = ["Keras", "KerasModelOp", "__version__", "deep_set"]
