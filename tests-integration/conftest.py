"""Shared set-up for the cross-package tests.

Keras's backend is fixed at import: these tests run Keras on jax (set before anything
imports keras). The examples folder goes on `sys.path` so `toymodels:...` factories
resolve, as they do when an example runs as a script.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
if str(EXAMPLES) not in sys.path:
    sys.path.insert(0, str(EXAMPLES))

BACKENDS = ("equinox", "lightning", "keras")
