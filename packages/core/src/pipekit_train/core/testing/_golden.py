"""The cross-backend golden-run suite: the same description trains the same everywhere.

Every backend gets the same initial weights (supplied here), the same data order (core's
batching), the same loss and the same canonical optimizer spec; the suite records the
per-step training loss and the final validation loss of each case, and
`compare_golden` checks two backends' runs against each other.

```python
from pipekit_train.core.testing import compare_golden, run_golden
from pipekit_train.equinox.testing import golden_backend as equinox_backend
from pipekit_train.lightning.testing import golden_backend as lightning_backend

reference = run_golden(equinox_backend())
other = run_golden(lightning_backend())
assert not compare_golden(reference, other)
```

A user runs it on their own model: a `GoldenBackend` needs `model_from_weights`
(canonical weights → a model operator) and `adapter` (precision → adapter). The
canonical weights of an MLP are `[W0, b0, W1, b1, ...]` with `W` of shape
`(fan_in, fan_out)`, drawn uniform in `±1/sqrt(fan_in)`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from pipekit_train.core import TrainingLoop
from pipekit_train.core.adapter import GRAD_NORM
from pipekit_train.core.data import ArrayDataset

__all__ = [
    "GOLDEN_CASES",
    "GOLDEN_EMA_CASES",
    "GOLDEN_FIELD_CASES",
    "GOLDEN_FIELD_STEPS",
    "GoldenBackend",
    "GoldenCase",
    "GoldenRun",
    "GOLDEN_STEPS",
    "compare_golden",
    "conv_forward",
    "conv_sizes",
    "dump_runs",
    "golden_conv_weights",
    "golden_field_task",
    "max_norm_differences",
    "golden_task",
    "golden_weights",
    "load_runs",
    "max_differences",
    "mlp_sizes",
    "run_golden",
    "run_golden_field",
]

GOLDEN_STEPS = 120
"""Optimizer steps per case."""

_WARMUP_COSINE = {
    "schedule": "warmup_cosine",
    "init_value": 0.0,
    "peak_value": 0.02,
    "warmup_steps": 20,
    "decay_steps": GOLDEN_STEPS,
    "end_value": 0.001,
}


@dataclass(frozen=True)
class GoldenCase:
    """One training description of the suite.

    Attributes:
        name: the case's name.
        optimizer_config: the canonical optimizer config.
        accumulate_grad_batches: gradient accumulation.
        precision: the canonical precision name.
        rtol: the largest relative difference allowed per step (and for the final
            validation loss).
    """

    name: str
    optimizer_config: Mapping[str, Any]
    accumulate_grad_batches: int = 1
    precision: str = "float32"
    rtol: float = 1e-3


GOLDEN_CASES: tuple[GoldenCase, ...] = (
    GoldenCase("adam", {"name": "adam", "lr": 0.01}),
    GoldenCase("adamw", {"name": "adamw", "lr": 0.01, "weight_decay": 0.1}),
    GoldenCase("adam_weight_decay", {"name": "adam", "lr": 0.01, "weight_decay": 0.1}),
    GoldenCase(
        "sgd_momentum_weight_decay",
        {"name": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.1},
    ),
    GoldenCase("sgd_nesterov", {"name": "sgd", "lr": 0.05, "momentum": 0.9, "nesterov": True}),
    GoldenCase("rmsprop", {"name": "rmsprop", "lr": 0.003}),
    GoldenCase("adagrad", {"name": "adagrad", "lr": 0.05, "weight_decay": 0.01}),
    GoldenCase("warmup_cosine_clip_norm", {"name": "adam", "lr": _WARMUP_COSINE, "clip_norm": 0.5}),
    GoldenCase("clip_value", {"name": "sgd", "lr": 0.05, "clip_value": 0.05}),
    GoldenCase(
        "schedule_constant", {"name": "adam", "lr": {"schedule": "constant", "value": 0.01}}
    ),
    GoldenCase(
        "schedule_cosine",
        {
            "name": "adam",
            "lr": {"schedule": "cosine", "init_value": 0.02, "decay_steps": 100, "alpha": 0.1},
        },
    ),
    GoldenCase("schedule_warmup_cosine", {"name": "adam", "lr": _WARMUP_COSINE}),
    GoldenCase(
        "schedule_exponential",
        {
            "name": "adam",
            "lr": {
                "schedule": "exponential",
                "init_value": 0.02,
                "transition_steps": 10,
                "decay_rate": 0.8,
                "staircase": True,
                "end_value": 0.002,
            },
        },
    ),
    GoldenCase(
        "schedule_linear",
        {
            "name": "adam",
            "lr": {
                "schedule": "linear",
                "init_value": 0.02,
                "end_value": 0.001,
                "transition_steps": 100,
            },
        },
    ),
    GoldenCase(
        "accumulate_2",
        {"name": "adamw", "lr": _WARMUP_COSINE, "weight_decay": 0.05, "clip_norm": 0.5},
        accumulate_grad_batches=2,
    ),
    # bfloat16 keeps ~3 significant digits: measured within 5e-3 per step, checked at 2e-2
    GoldenCase(
        "bfloat16_mixed", {"name": "adam", "lr": 0.01}, precision="bfloat16-mixed", rtol=0.02
    ),
    # the moving average of the weights: validation (and the artifact) use the average
    GoldenCase("ema", {"name": "adam", "lr": 0.01, "ema": 0.9}),
    GoldenCase(
        "ema_accumulate_2",
        {
            "name": "adamw",
            "lr": _WARMUP_COSINE,
            "weight_decay": 0.05,
            "clip_norm": 0.5,
            "ema": {"decay": 0.95},
        },
        accumulate_grad_batches=2,
    ),
)
"""The suite's cases: optimizers, decoupled weight decay, clipping, every schedule,
gradient accumulation, mixed precision and the moving average of the weights (`ema`)."""

GOLDEN_EMA_CASES: tuple[GoldenCase, ...] = tuple(
    c for c in GOLDEN_CASES if "ema" in c.optimizer_config
)
"""The cases that keep a moving average of the weights (their runs record the artifact's
canonical weights, for a comparison with a hand-written loop)."""


@dataclass(frozen=True)
class GoldenBackend:
    """What the suite needs from a backend.

    Attributes:
        name: a label for reports (e.g. `"keras-torch"`).
        model_from_weights: canonical MLP weights → a model operator holding them.
        adapter: precision name → the backend's adapter for that precision.
        conv_from_weights: canonical conv-net weights (`golden_conv_weights`) → a model
            operator taking channels-last fields `(N, H, W, C)`; None when the backend
            has no conv net (`run_golden_field` then refuses it).
        weights_of: a model operator of `model_from_weights` → its canonical weights
            (recorded for `GOLDEN_EMA_CASES`); None: not recorded.
    """

    name: str
    model_from_weights: Callable[[Sequence[np.ndarray]], Any]
    adapter: Callable[[str], Any]
    conv_from_weights: Callable[[Sequence[np.ndarray]], Any] | None = None
    weights_of: Callable[[Any], Sequence[np.ndarray]] | None = None


@dataclass
class GoldenRun:
    """One case's result on one backend.

    Attributes:
        case: the case name.
        backend: the backend label.
        losses: the training loss of every step.
        val_loss: the validation loss after the last step.
        grad_norms: the `grad_norm` of every step (`TrainingLoop(log_grad_norm=True)`),
            empty when the backend does not record it.
        weights: the artifact's canonical weights (nested lists) for `GOLDEN_EMA_CASES`
            when the backend has `weights_of`, else None.
    """

    case: str
    backend: str
    losses: list[float] = field(default_factory=list)
    val_loss: float = math.nan
    grad_norms: list[float] = field(default_factory=list)
    weights: list[Any] | None = None

    def to_json(self) -> dict[str, Any]:
        """JSON (for runs made in another process)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GoldenRun:
        """The inverse of `to_json`."""
        return cls(**dict(data))


def golden_task(
    n_train: int = 512, n_val: int = 128, in_size: int = 4, out_size: int = 2, seed: int = 0
) -> tuple[ArrayDataset, ArrayDataset]:
    """A smooth nonlinear regression task, float32: `(train, validation)`."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1.5, 1.5, (n_train + n_val, in_size))
    w = rng.standard_normal((in_size, out_size))
    y = np.sin(x @ w) + 0.3 * x[:, :1] * x[:, 1:2]
    x, y = x.astype(np.float32), y.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


def golden_weights(sizes: Sequence[int] = (4, 32, 2), seed: int = 0) -> list[np.ndarray]:
    """Canonical MLP weights `[W0, b0, W1, b1, ...]`, `W` of shape `(fan_in, fan_out)`.

    Uniform in `±1/sqrt(fan_in)` (PyTorch's and Equinox's default family), float32.
    """
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=True):
        bound = 1.0 / math.sqrt(fan_in)
        out.append(rng.uniform(-bound, bound, (fan_in, fan_out)).astype(np.float32))
        out.append(rng.uniform(-bound, bound, (fan_out,)).astype(np.float32))
    return out


def mlp_sizes(weights: Sequence[np.ndarray]) -> dict[str, Any]:
    """`in_size`, `out_size`, `width`, `depth` of canonical MLP weights (factory kwargs)."""
    sizes = [w.shape[0] for w in weights[::2]] + [weights[-1].shape[0]]
    return {
        "in_size": int(sizes[0]),
        "out_size": int(sizes[-1]),
        "width": int(sizes[1]),
        "depth": len(sizes) - 2,
    }


def run_golden(
    backend: GoldenBackend,
    cases: Iterable[GoldenCase] = GOLDEN_CASES,
    *,
    steps: int = GOLDEN_STEPS,
    batch_size: int = 32,
    sizes: Sequence[int] = (4, 32, 2),
) -> dict[str, GoldenRun]:
    """Train every case on `backend` from the canonical weights; return the runs by case."""
    train, val = golden_task(in_size=sizes[0], out_size=sizes[-1])
    runs: dict[str, GoldenRun] = {}
    for case in cases:
        adapter = backend.adapter(case.precision)
        norms = bool(getattr(getattr(adapter, "capabilities", None), "grad_norm", False))
        loop = TrainingLoop(
            model=backend.model_from_weights(golden_weights(sizes)),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config=dict(case.optimizer_config),
            batch_size=batch_size,
            max_steps=steps,
            accumulate_grad_batches=case.accumulate_grad_batches,
            validate_every_n_steps=steps,
            log_every_n_steps=steps,
            seed=0,
            adapter=adapter,
            progress=False,
            log_grad_norm=norms,
        )
        artifact = loop.run()
        weights = None
        if backend.weights_of is not None and case in GOLDEN_EMA_CASES:
            weights = [np.asarray(w).tolist() for w in backend.weights_of(artifact.model)]
        runs[case.name] = GoldenRun(
            case=case.name,
            backend=backend.name,
            losses=[float(v) for v in artifact.history["loss"]],
            val_loss=float(artifact.final_metrics["val_loss"]),
            grad_norms=[float(v) for v in artifact.history[GRAD_NORM]] if norms else [],
            weights=weights,
        )
    return runs


def _relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-12)


def compare_golden(
    reference: Mapping[str, GoldenRun],
    other: Mapping[str, GoldenRun],
    cases: Iterable[GoldenCase] = GOLDEN_CASES,
) -> list[str]:
    """Every disagreement beyond a case's `rtol`, as readable lines (empty: they agree)."""
    problems: list[str] = []
    for case in cases:
        ref, got = reference.get(case.name), other.get(case.name)
        if ref is None or got is None:
            problems.append(f"{case.name}: missing on {'reference' if ref is None else 'other'}")
            continue
        if len(ref.losses) != len(got.losses):
            problems.append(
                f"{case.name}: {got.backend} recorded {len(got.losses)} steps, "
                f"{ref.backend} {len(ref.losses)}"
            )
            continue
        worst = max(
            (
                (_relative(g, r), i + 1)
                for i, (g, r) in enumerate(zip(got.losses, ref.losses, strict=True))
            ),
            default=(0.0, 0),
        )
        if not worst[0] <= case.rtol:
            problems.append(
                f"{case.name}: {got.backend} vs {ref.backend}: step {worst[1]} differs by "
                f"{worst[0]:.2e} relative (rtol {case.rtol:g})"
            )
        val = _relative(got.val_loss, ref.val_loss)
        if not val <= case.rtol:
            problems.append(
                f"{case.name}: {got.backend} vs {ref.backend}: final val_loss differs by "
                f"{val:.2e} relative (rtol {case.rtol:g})"
            )
        if ref.grad_norms and got.grad_norms:
            problems += _compare_norms(case, ref, got)
    return problems


def _compare_norms(case: GoldenCase, ref: GoldenRun, got: GoldenRun) -> list[str]:
    if len(ref.grad_norms) != len(got.grad_norms):
        return [
            f"{case.name}: {got.backend} recorded {len(got.grad_norms)} grad norms, "
            f"{ref.backend} {len(ref.grad_norms)}"
        ]
    worst = max(
        (_relative(g, r), i + 1)
        for i, (g, r) in enumerate(zip(got.grad_norms, ref.grad_norms, strict=True))
    )
    if not worst[0] <= case.rtol:
        return [
            f"{case.name}: {got.backend} vs {ref.backend}: grad_norm of step {worst[1]} "
            f"differs by {worst[0]:.2e} relative (rtol {case.rtol:g})"
        ]
    return []


def max_norm_differences(
    reference: Mapping[str, GoldenRun], other: Mapping[str, GoldenRun]
) -> dict[str, float]:
    """Per case recorded on both: the largest per-step relative `grad_norm` difference."""
    out = {}
    for name, ref in reference.items():
        got = other.get(name)
        if got is None or not ref.grad_norms or len(got.grad_norms) != len(ref.grad_norms):
            continue
        out[name] = max(
            _relative(g, r) for g, r in zip(got.grad_norms, ref.grad_norms, strict=True)
        )
    return out


def max_differences(
    reference: Mapping[str, GoldenRun], other: Mapping[str, GoldenRun]
) -> dict[str, tuple[float, float]]:
    """Per case: `(largest per-step relative difference, final val_loss difference)`."""
    out = {}
    for name, ref in reference.items():
        got = other.get(name)
        if got is None or len(got.losses) != len(ref.losses):
            continue
        steps = max(_relative(g, r) for g, r in zip(got.losses, ref.losses, strict=True))
        out[name] = (steps, _relative(got.val_loss, ref.val_loss))
    return out


def dump_runs(runs: Mapping[str, GoldenRun]) -> str:
    """The JSON text of a backend's runs."""
    return json.dumps({k: v.to_json() for k, v in runs.items()})


def load_runs(text: str) -> dict[str, GoldenRun]:
    """The inverse of `dump_runs`."""
    return {k: GoldenRun.from_json(v) for k, v in json.loads(text).items()}


# -- the field case: a periodic conv net on channels-last 2-D fields -------------------------

GOLDEN_FIELD_STEPS = 60
"""Optimizer steps per field case."""

GOLDEN_FIELD_CASES: tuple[GoldenCase, ...] = (
    GoldenCase("field_adam", {"name": "adam", "lr": 0.01}),
    GoldenCase(
        "field_adamw_warmup_cosine_clip_norm",
        {"name": "adamw", "lr": _WARMUP_COSINE, "weight_decay": 0.05, "clip_norm": 0.5},
    ),
)
"""The field cases: the conv nets of every backend (`conv_from_weights`) on channels-last
fields, one plain and one with decoupled weight decay, warm-up cosine and clipping."""


def golden_field_task(
    n_train: int = 128, n_val: int = 32, size: int = 12, channels: int = 2, seed: int = 0
) -> tuple[ArrayDataset, ArrayDataset]:
    """A nonlinear periodic field map, channels-last float32 `(N, size, size, channels)`.

    `x` is a smooth random periodic field; `y` one explicit step of diffusion with a
    cubic reaction and a cross-channel coupling (periodic 5-point Laplacian).
    """
    rng = np.random.default_rng(seed)
    n = n_train + n_val
    grid = np.arange(size) * (2 * np.pi / size)
    gx, gy = np.meshgrid(grid, grid, indexing="ij")
    x = np.zeros((n, size, size, channels))
    for kx, ky in ((1, 0), (0, 1), (1, 1), (2, 1), (1, 2)):
        amp = rng.normal(0.0, 0.5, (n, 1, 1, channels))
        phase = rng.uniform(0.0, 2 * np.pi, (n, 1, 1, channels))
        x += amp * np.cos(kx * gx[None, :, :, None] + ky * gy[None, :, :, None] + phase)
    lap = sum(np.roll(x, s, axis=a) for s in (-1, 1) for a in (1, 2)) - 4 * x
    y = x + 0.2 * lap + 0.3 * (x - x**3) + 0.2 * np.roll(x, 1, axis=3)
    x, y = x.astype(np.float32), y.astype(np.float32)
    return ArrayDataset(x=x[:n_train], y=y[:n_train]), ArrayDataset(x=x[n_train:], y=y[n_train:])


def golden_conv_weights(
    channels: Sequence[int] = (2, 8, 2), kernel_size: int = 3, seed: int = 0
) -> list[np.ndarray]:
    """Canonical conv-net weights `[K0, b0, K1, b1, ...]`, `K` of shape `(kh, kw, c_in, c_out)`.

    Uniform in `±1/sqrt(fan_in)` with `fan_in = c_in * kernel_size**2` (PyTorch's and
    Equinox's default family for convolutions), float32. `(kh, kw, c_in, c_out)` is
    Keras's kernel layout; torch and Equinox hold `(c_out, c_in, kh, kw)`.
    """
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for c_in, c_out in zip(channels[:-1], channels[1:], strict=True):
        bound = 1.0 / math.sqrt(c_in * kernel_size * kernel_size)
        shape = (kernel_size, kernel_size, c_in, c_out)
        out.append(rng.uniform(-bound, bound, shape).astype(np.float32))
        out.append(rng.uniform(-bound, bound, (c_out,)).astype(np.float32))
    return out


def conv_forward(
    weights: Sequence[np.ndarray], x: np.ndarray, activation: str = "tanh"
) -> np.ndarray:
    """The canonical conv net in numpy (float64): the reference every backend's matches.

    Periodic cross-correlations with the `(kh, kw, c_in, c_out)` kernels of `weights` on
    channels-last fields `x` `(N, H, W, C)`, `activation` (`"tanh"` or `"relu"`) after
    every layer but the last.
    """
    h = np.asarray(x, dtype=np.float64)
    n_layers = len(weights) // 2
    for i in range(n_layers):
        kernel, bias = np.asarray(weights[2 * i], np.float64), weights[2 * i + 1]
        kh, kw = kernel.shape[:2]
        out = np.zeros((*h.shape[:3], kernel.shape[3]))
        for di in range(kh):
            for dj in range(kw):
                shifted = np.roll(h, (kh // 2 - di, kw // 2 - dj), axis=(1, 2))
                out += shifted @ kernel[di, dj]
        h = out + bias
        if i < n_layers - 1:
            h = np.tanh(h) if activation == "tanh" else np.maximum(h, 0.0)
    return h


def conv_sizes(weights: Sequence[np.ndarray]) -> dict[str, Any]:
    """`in_channels`, `out_channels`, `width`, `depth`, `kernel_size` of canonical conv weights."""
    kernels = weights[::2]
    return {
        "in_channels": int(kernels[0].shape[2]),
        "out_channels": int(kernels[-1].shape[3]),
        "width": int(kernels[0].shape[3]),
        "depth": len(kernels) - 1,
        "kernel_size": int(kernels[0].shape[0]),
    }


def run_golden_field(
    backend: GoldenBackend,
    cases: Iterable[GoldenCase] = GOLDEN_FIELD_CASES,
    *,
    steps: int = GOLDEN_FIELD_STEPS,
    batch_size: int = 16,
    channels: Sequence[int] = (2, 8, 2),
) -> dict[str, GoldenRun]:
    """Train every field case on `backend`'s conv net from the canonical conv weights.

    The same data order, loss and optimizer description on every backend; the datasets
    are channels-last, so each backend's `conv_from_weights` must take `(N, H, W, C)`.

    Raises:
        ConfigError: `backend` has no `conv_from_weights`.
    """
    from pipekit_train.core import ConfigError

    if backend.conv_from_weights is None:
        raise ConfigError(
            f"`backend` needs `conv_from_weights` for the field cases. Received: "
            f"GoldenBackend(name={backend.name!r}, conv_from_weights=None). Pass a function "
            "from canonical conv weights to a channels-last model operator."
        )
    train, val = golden_field_task(channels=channels[0])
    runs: dict[str, GoldenRun] = {}
    for case in cases:
        loop = TrainingLoop(
            model=backend.conv_from_weights(golden_conv_weights(channels)),
            data=train,
            validation=val,
            loss="mse",
            optimizer_config=dict(case.optimizer_config),
            batch_size=batch_size,
            max_steps=steps,
            accumulate_grad_batches=case.accumulate_grad_batches,
            validate_every_n_steps=steps,
            log_every_n_steps=steps,
            seed=0,
            adapter=backend.adapter(case.precision),
            progress=False,
        )
        artifact = loop.run()
        runs[case.name] = GoldenRun(
            case=case.name,
            backend=backend.name,
            losses=[float(v) for v in artifact.history["loss"]],
            val_loss=float(artifact.final_metrics["val_loss"]),
        )
    return runs
