"""Import grain lazily without letting it pull in jax or orbax.

`import grain` (0.2.x) tries `from jax import profiler` to hook its trace
annotations into the JAX profiler, and its checkpoint module tries
`import orbax.checkpoint`. Where those are installed this imports jax and orbax
(3-10 s and a few hundred MB) into processes that never use them — a Lightning or
Keras-torch run, a test, a cache build — against the rule that
`pipekit_train.core` never imports a backend. When jax is not imported yet, grain
is therefore imported with `jax` and `orbax` masked in `sys.modules` (grain falls
back to its no-op profiler hooks and skips its orbax handler, which only affects
grain's annotations in JAX profiler traces and `grain.checkpoint`); the masks are
removed right after, so a later `import jax` or `import orbax.checkpoint` works
normally. When jax is already imported (an Equinox run) grain is imported plainly.
"""

from __future__ import annotations

import importlib
import sys
import threading
from types import ModuleType

__all__ = ["import_grain"]

_LOCK = threading.Lock()
_MASKED = ("jax", "orbax")


def import_grain() -> ModuleType:
    """Return the `grain` module, importing it without importing jax when possible."""
    module = sys.modules.get("grain")
    if module is not None:
        return module
    with _LOCK:
        if "grain" in sys.modules or "jax" in sys.modules:
            return importlib.import_module("grain")
        absl_logging = importlib.import_module("absl.logging")
        verbosity = absl_logging.get_verbosity()
        absl_logging.set_verbosity(absl_logging.ERROR)  # silence "Failed to load jax profiler"
        masked = [name for name in _MASKED if name not in sys.modules]
        for name in masked:
            sys.modules[name] = None  # type: ignore[assignment]  # `import name` fails fast
        try:
            return importlib.import_module("grain")
        except ImportError:
            # A grain version that needs jax at import time: drop the partial import and
            # import it plainly.
            for name in [m for m in sys.modules if m == "grain" or m.startswith("grain.")]:
                del sys.modules[name]
            _unmask(masked)
            return importlib.import_module("grain")
        finally:
            _unmask(masked)
            absl_logging.set_verbosity(verbosity)


def _unmask(names: list[str]) -> None:
    for name in names:
        if name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]
