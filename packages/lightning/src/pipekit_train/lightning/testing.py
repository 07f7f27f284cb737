"""Model factories for tests, examples and benchmarks (importable by name).

`TorchModelOp("pipekit_train.lightning.testing:linear", in_size=4, out_size=1)` is the
model the conformance suite trains.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from pipekit_train.core import model_factory

__all__ = [
    "GRAPHS_LOSS_RTOL",
    "conv_from_weights",
    "conv_net",
    "golden_backend",
    "graphs_check",
    "graphs_failures",
    "linear",
    "mlp",
    "mlp_from_weights",
    "mlp_weights",
    "tied",
    "torch_golden_backend",
]

_ACTIVATIONS = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}


@model_factory
def linear(in_size: int, out_size: int) -> torch.nn.Linear:
    """A dense affine map `in_size → out_size` (`torch.nn.Linear`)."""
    return torch.nn.Linear(int(in_size), int(out_size))


@model_factory
def mlp(
    in_size: int,
    out_size: int,
    width: int = 32,
    depth: int = 1,
    activation: str = "tanh",
    dropout: float = 0.0,
) -> torch.nn.Sequential:
    """An MLP: `depth` hidden layers of `width` with `activation`, optional dropout.

    The same architecture and initialisation family (torch's default, uniform
    `±1/sqrt(fan_in)`) as `mlp` in `pipekit_train.equinox.testing` and
    `pipekit_train.keras.testing`.
    """
    layers: list[torch.nn.Module] = []
    size = int(in_size)
    for _ in range(int(depth)):
        layers += [torch.nn.Linear(size, int(width)), _ACTIVATIONS[activation]()]
        if dropout:
            layers.append(torch.nn.Dropout(float(dropout)))
        size = int(width)
    layers.append(torch.nn.Linear(size, int(out_size)))
    return torch.nn.Sequential(*layers)


@model_factory
def conv_net(
    in_channels: int,
    out_channels: int,
    width: int = 16,
    depth: int = 2,
    kernel_size: int = 3,
    activation: str = "tanh",
) -> torch.nn.Sequential:
    """A periodic conv net, channels-first as torch is: `(N, C_in, H, W) -> (N, C_out, H, W)`.

    `depth` hidden `Conv2d` layers of `width` with `activation`, each padded periodically
    (`padding_mode="circular"`). Train it on pipekit-train's channels-last datasets with
    `TorchModelOp(..., layout="channels_last")`, which permutes at the boundary. The
    same architecture and initialisation family (torch's default, uniform `±1/sqrt(fan_in)`
    with `fan_in = in_channels * kernel_size**2`) as `conv_net` in
    `pipekit_train.equinox.testing` and `pipekit_train.keras.testing`.
    """
    sizes = [int(in_channels)] + [int(width)] * int(depth) + [int(out_channels)]
    layers: list[torch.nn.Module] = []
    for i, (c_in, c_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        k = int(kernel_size)
        layers.append(torch.nn.Conv2d(c_in, c_out, k, padding=k // 2, padding_mode="circular"))
        if i < len(sizes) - 2:
            layers.append(_ACTIVATIONS[activation]())
    return torch.nn.Sequential(*layers)


def conv_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A channels-last `TorchModelOp` of `conv_net` holding canonical weights `[K0, b0, ...]`.

    `K` has shape `(kh, kw, c_in, c_out)` (see `pipekit_train.core.testing.golden_conv_weights`).
    """
    from pipekit_train.core.testing import conv_sizes
    from pipekit_train.lightning import TorchModelOp

    op = TorchModelOp(
        "pipekit_train.lightning.testing:conv_net",
        layout="channels_last",
        activation=activation,
        **conv_sizes(weights),
    )
    convs = [m for m in op.model.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        for i, layer in enumerate(convs):
            kernel = np.transpose(weights[2 * i], (3, 2, 0, 1))
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(kernel)))
            assert layer.bias is not None  # conv_net's convolutions have biases
            layer.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
    return op


class _Tied(torch.nn.Module):
    def __init__(self, size: int):
        super().__init__()
        self.encode = torch.nn.Linear(size, size, bias=False)
        self.decode = torch.nn.Linear(size, size, bias=False)
        self.decode.weight = self.encode.weight  # tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(torch.tanh(self.encode(x)))


@model_factory
def tied(size: int) -> torch.nn.Module:
    """A two-layer model whose layers share one weight matrix (tests tied-weight storage)."""
    return _Tied(int(size))


def mlp_from_weights(weights: Sequence[np.ndarray], activation: str = "tanh") -> Any:
    """A `TorchModelOp` of `mlp` holding canonical weights `[W0, b0, W1, b1, ...]`.

    `W` has shape `(fan_in, fan_out)` (see `pipekit_train.core.testing.golden_weights`).
    """
    from pipekit_train.core.testing import mlp_sizes
    from pipekit_train.lightning import TorchModelOp

    op = TorchModelOp(
        "pipekit_train.lightning.testing:mlp", activation=activation, **mlp_sizes(weights)
    )
    linears = [m for m in op.model.modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for i, layer in enumerate(linears):
            layer.weight.copy_(torch.from_numpy(np.ascontiguousarray(weights[2 * i].T)))
            layer.bias.copy_(torch.from_numpy(weights[2 * i + 1]))
    return op


def mlp_weights(op: Any) -> list[np.ndarray]:
    """The canonical weights `[W0, b0, W1, b1, ...]` of an `mlp` operator (`W`: `(in, out)`)."""
    out: list[np.ndarray] = []
    for layer in (m for m in op.model.modules() if isinstance(m, torch.nn.Linear)):
        out += [layer.weight.detach().numpy().T.copy(), layer.bias.detach().numpy().copy()]
    return out


def golden_backend() -> Any:
    """The Lightning backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.lightning import Lightning

    return GoldenBackend(
        name="lightning",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Lightning(accelerator="cpu", precision=p),
        conv_from_weights=conv_from_weights,
        weights_of=mlp_weights,
    )


def torch_golden_backend(steps_per_execution: int = 1) -> Any:
    """The `Torch()` backend of the cross-backend golden-run suite."""
    from pipekit_train.core.testing import GoldenBackend
    from pipekit_train.lightning import Torch

    return GoldenBackend(
        name="torch" if steps_per_execution == 1 else f"torch-k{steps_per_execution}",
        model_from_weights=mlp_from_weights,
        adapter=lambda p: Torch(precision=p, steps_per_execution=steps_per_execution),
        weights_of=mlp_weights,
    )


def graphs_check(
    device: str = "cuda",
    *,
    steps: int = 60,
    stop_at: int = 30,
    width: int = 64,
    batch: int = 64,
    optimizer: dict[str, Any] | None = None,
    accumulate: int = 1,
    **torch_options: Any,
) -> dict[str, Any]:
    """`Torch(compile="cuda-graphs")` against itself resumed and against eager `Torch()`.

    Trains an MLP 8 → width → width → 1 (Adam, mse, the given `Torch` options, e.g.
    `steps_per_execution=10`, `precision="bfloat16-mixed"`) for `steps` updates three
    times in a temporary folder: graphed and uninterrupted, graphed stopped at `stop_at`
    and resumed, and eagerly. `optimizer` replaces the default optimizer config (a
    schedule, clipping, `ema`), `accumulate` is `TrainingLoop(accumulate_grad_batches=)`.
    The GPU check and the CUDA tests read the result.

    Returns:
        `{"stop_at", "resume_bit_exact", "resumed_from_step", "graphed_loss", "eager_loss",
        "loss_rel_diff", "report"}` (`report`: the graphed run's `compile_report`).
        `graphs_failures` judges it.
    """
    import tempfile
    from pathlib import Path

    from pipekit_train.core import Checkpoint, TrainingLoop
    from pipekit_train.core.data import ArrayDataset

    from ._model import TorchModelOp
    from .torch import Torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch * 16, 8)).astype(np.float32)
    y = np.sin(x).sum(axis=1, keepdims=True).astype(np.float32)
    data = ArrayDataset(x=x, y=y)
    work = Path(tempfile.mkdtemp(prefix="pipekit-graphs-"))

    def run(name: str | None, n: int, compile: Any) -> Any:
        adapter = Torch(compile=compile, device=device, **torch_options)
        loop = TrainingLoop(
            model=TorchModelOp(
                "pipekit_train.lightning.testing:mlp", in_size=8, out_size=1, width=width, seed=0
            ),
            data=data,
            loss="mse",
            optimizer_config=optimizer or {"name": "adam", "lr": 1e-3},
            batch_size=batch,
            accumulate_grad_batches=accumulate,
            max_steps=n,
            checkpoint=None
            if name is None
            else Checkpoint(work / name, every_n_steps=stop_at, async_save=False),
            adapter=adapter,
            progress=False,
        )
        return loop.run(), adapter

    whole, adapter = run("whole", steps, "cuda-graphs")
    run("resumed", stop_at, "cuda-graphs")
    resumed, _ = run("resumed", steps, "cuda-graphs")
    eager, _ = run("eager", steps, False)
    graphed_loss = float(whole.final_metrics["loss"])
    eager_loss = float(eager.final_metrics["loss"])
    return {
        "stop_at": stop_at,
        "resume_bit_exact": resumed.weights_sha256 == whole.weights_sha256,
        "resumed_from_step": resumed.resumed_from_step,
        "graphed_loss": graphed_loss,
        "eager_loss": eager_loss,
        "loss_rel_diff": abs(graphed_loss - eager_loss) / max(abs(eager_loss), 1e-12),
        "report": adapter.compile_report,
    }


#: How far a graphed run's final loss may be from eager `Torch()`'s, relative to eager's:
#: the captured update is the eager one replayed, so the two differ by float rounding only.
GRAPHS_LOSS_RTOL = 1e-2


def graphs_failures(result: Mapping[str, Any]) -> dict[str, str]:
    """Which checks a `graphs_check` result fails: `{check: why}`, empty when it passes.

    The verdict of the CUDA tests and of `scripts/gpu_check.py`, one for both:

    - `"capture"`: the graphed run really ran as a CUDA graph: its `compile_report` says
      `cuda_graphs`, records the update it was captured at, and did not fall back to
      eager (a fallback only warns, and an eager run would pass the other two checks);
    - `"resume"`: the run stopped at `stop_at` resumed there, bit for bit equal to the
      uninterrupted graphed run;
    - `"loss"`: the graphed run's final loss is within `GRAPHS_LOSS_RTOL` (relative) of
      eager `Torch()`'s.

    Args:
        result: what `graphs_check` returned (a JSON round trip of it too).

    Returns:
        The failed checks, each with the values that failed it.

    Examples:
        >>> from pipekit_train.lightning.testing import graphs_failures
        >>> graphs_failures({
        ...     "stop_at": 30, "resumed_from_step": 30, "resume_bit_exact": True,
        ...     "loss_rel_diff": 0.2,
        ...     "report": {"cuda_graphs": True, "captured_at_update": None,
        ...                "fell_back": "RuntimeError: capture failed"},
        ... })  # doctest: +NORMALIZE_WHITESPACE
        {'capture': 'fell back to eager: RuntimeError: capture failed',
         'loss': 'graphed vs eager final loss: relative difference 0.2, not below 0.01'}
    """
    failed: dict[str, str] = {}
    report = result.get("report") or {}
    if report.get("fell_back") is not None:
        failed["capture"] = f"fell back to eager: {report['fell_back']}"
    elif not report.get("cuda_graphs") or report.get("captured_at_update") is None:
        failed["capture"] = f"never captured as a CUDA graph (compile_report: {report or None})"
    stop_at = result.get("stop_at", 30)
    if result.get("resumed_from_step") != stop_at or not result.get("resume_bit_exact"):
        failed["resume"] = (
            f"resumed from step {result.get('resumed_from_step')} (expected {stop_at}), "
            f"{'bit-exact' if result.get('resume_bit_exact') else 'weights differ'} from the "
            "uninterrupted graphed run"
        )
    rel = result.get("loss_rel_diff")
    if not (isinstance(rel, int | float) and rel < GRAPHS_LOSS_RTOL):  # NaN fails too
        failed["loss"] = (
            f"graphed vs eager final loss: relative difference {rel}, not below {GRAPHS_LOSS_RTOL}"
        )
    return failed
