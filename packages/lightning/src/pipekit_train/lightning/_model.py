"""`TorchModelOp`: a `torch.nn.Module` built by an importable factory, as a model operator.

`LightningModelOp` is the same class under its earlier name: code that imports it keeps
working, and its configs still name `pipekit_train.lightning._model:LightningModelOp`
(`STORED_TYPE`), so checkpoints and registry records read as before.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np
import torch

from pipekit_train.core.adapter import LAYOUTS as _LAYOUTS
from pipekit_train.core.adapter import (
    ConfigError,
    ModelOpBase,
    RolloutSpec,
    check_seed,
    object_path,
    to_channels_first_axes,
    to_channels_last_axes,
)
from pipekit_train.core.adapter import check_layout as _check_layout

from ._rollout import device_rollout
from ._weights import decode_weights, encode_weights

__all__ = ["LightningModelOp", "TorchModelOp", "is_lightning_module"]

STORED_TYPE = "pipekit_train.lightning._model:LightningModelOp"
"""The `type` a `TorchModelOp` config names: the class's earlier name, still importable."""

LAYOUTS = _LAYOUTS
"""The layouts a `TorchModelOp` takes its inputs in (core's, the same for every backend)."""


def _to_channels_first(module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """Forward pre-hook: a channels-last batch `(N, *spatial, C)` becomes `(N, C, *spatial)`."""
    if args and isinstance(args[0], torch.Tensor):
        axes = to_channels_first_axes(args[0].ndim)
        if axes is not None:
            return (args[0].permute(*axes), *args[1:])
    return None


def _to_channels_last(module: torch.nn.Module, args: tuple[Any, ...], out: Any) -> Any:
    """Forward hook: a channels-first prediction `(N, C, *spatial)` becomes `(N, *spatial, C)`."""
    if isinstance(out, torch.Tensor):
        axes = to_channels_last_axes(out.ndim)
        if axes is not None:
            return out.permute(*axes)
    return None


def check_layout(layout: Any) -> str:
    """`layout` if it is one of `LAYOUTS`, else the `ConfigError` naming the choices."""
    return _check_layout(layout, owner="TorchModelOp")


def set_layout(module: torch.nn.Module, layout: str) -> None:
    """Attach the boundary permutes of `layout="channels_last"` to `module` (idempotent).

    Hooks change no parameter, buffer or state-dict key, so the weights are the module's own.
    """
    if layout != "channels_last" or getattr(module, "_pipekit_channels_last", False):
        return
    module.register_forward_pre_hook(_to_channels_first)
    module.register_forward_hook(_to_channels_last)
    module._pipekit_channels_last = True  # type: ignore[assignment]  # a marker attribute on a torch module


def is_lightning_module(obj: Any) -> bool:
    """Whether `obj` is a `LightningModule` (checked without importing lightning)."""
    return any(
        cls.__name__ == "LightningModule"
        and cls.__module__.split(".")[0] in ("lightning", "pytorch_lightning")
        for cls in type(obj).__mro__
    )


def _to_numpy(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        value = value.detach()
        if value.dtype in (torch.bfloat16, torch.float16):
            value = value.float()
        return value.cpu().numpy()
    if isinstance(value, Mapping):
        return {k: _to_numpy(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_to_numpy(v) for v in value)
    return value


def module_dtype(module: torch.nn.Module) -> tuple[torch.dtype, torch.device]:
    """The dtype of the first floating parameter (float32 if none) and the module's device."""
    device = torch.device("cpu")
    for p in module.parameters():
        device = p.device
        if p.is_floating_point():
            return p.dtype, device
    return torch.float32, device


def as_input(x: Any, dtype: torch.dtype, device: torch.device) -> Any:
    """A numpy array (or a dict of them) as tensors; floating arrays take the model's dtype."""
    if isinstance(x, Mapping):
        return {k: as_input(v, dtype, device) for k, v in x.items()}
    if isinstance(x, torch.Tensor):
        return x.to(device)
    arr = np.asarray(x)
    t = torch.from_numpy(np.ascontiguousarray(arr))
    if t.is_floating_point():
        t = t.to(dtype)
    return t.to(device)


def predict(module: torch.nn.Module, inputs: Any) -> Any:
    """Batched inference in eval mode under `torch.no_grad()`; the training mode is restored."""
    dtype, device = module_dtype(module)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            out = module(as_input(inputs, dtype, device))
    finally:
        module.train(was_training)
    return _to_numpy(out)


def load_module_weights(
    module: torch.nn.Module, state: Mapping[str, torch.Tensor], *, strict_shapes: bool = True
) -> None:
    """Load a state dict, with a `ConfigError` naming the mismatch instead of torch's."""
    current = module.state_dict()
    missing = sorted(set(current) - set(state))
    unexpected = sorted(set(state) - set(current))
    if missing or unexpected:
        raise ConfigError(
            "The weights do not fit this model. "
            f"Received: missing={missing[:8]}, unexpected={unexpected[:8]}. "
            "Load weights saved from the same model config."
        )
    for name, ref in current.items():
        got = state[name]
        if strict_shapes and tuple(got.shape) != tuple(ref.shape):
            raise ConfigError(
                f"The weights do not fit this model: `{name}` should have shape {list(ref.shape)}. "
                f"Received: {name}.shape={list(got.shape)}. Load weights saved from the same model config."
            )
    module.load_state_dict(dict(state), strict=True)


class TorchModelOp(ModelOpBase):
    """A PyTorch model operator, trained by `Lightning()` and `Torch()`.

    Its `backend` is `"lightning"`: a `TrainingLoop` without `adapter=` trains it with
    `Lightning()`. `LightningModelOp` is this class under its earlier name.

    The factory is called as `factory(**kwargs)` under `torch.manual_seed(seed)` inside a
    forked RNG (the caller's global torch RNG is left untouched) and must return a
    `torch.nn.Module` (a `LightningModule` works too). Weights travel as safetensors bytes
    of the state dict: the same weights give the same bytes, tied weights are stored once,
    and loading never unpickles.

    **Layout.** pipekit-train datasets hold fields channels-last, `(N, *spatial, C)`;
    torch's convolutions are channels-first, `(N, C, *spatial)`. With
    `layout="channels_last"` the operator moves the last axis of inputs of rank >= 3 to
    position 1 before the module and axis 1 of outputs of rank >= 3 back to the end after
    it (1-D, 2-D and 3-D fields alike; forward hooks on the module, so its state dict,
    weights and native training loop are unchanged), and records `"layout"` in its config
    and registry record. The default `"channels_first"` hands inputs to the module as they
    are. The option means the same on every backend's operator
    (`pipekit_train.core.adapter`: `LAYOUTS`, `check_layout`).

    Args:
        factory: `"package.module:function"` or the function itself (importable by name).
        seed: the seed the module's parameters are initialised under.
        layout: `"channels_first"` (default: the module's own layout) or
            `"channels_last"` (permute inputs and outputs of rank >= 3 at the boundary).
        **kwargs: JSON keyword arguments for the factory.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.lightning import TorchModelOp
        >>> op = TorchModelOp("pipekit_train.lightning.testing:mlp", in_size=2, out_size=1, seed=0)
        >>> op(np.zeros((4, 2), np.float32)).shape
        (4, 1)
    """

    backend: ClassVar[str] = "lightning"
    framework: ClassVar[str | None] = "torch"
    framework_label: ClassVar[str] = "PyTorch"
    framework_model: ClassVar[str] = "a `torch.nn.Module`"
    layout: str = "channels_first"

    def __init__(
        self,
        factory: str | Callable[..., Any],
        *,
        seed: int = 0,
        layout: str = "channels_first",
        **kwargs: Any,
    ):
        self.layout = check_layout(layout)
        super().__init__(factory, seed=seed, **kwargs)

    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = factory(**kwargs)
        self.check_model(module)  # a Keras model on torch is a torch.nn.Module too
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(
                "A TorchModelOp factory must return a torch.nn.Module. "
                f"Received: {type(module).__name__} from factory={self.factory!r}."
            )
        set_layout(module, self.layout)
        return module

    def get_config(self) -> dict[str, Any]:
        """`ModelOpBase.get_config()`, plus `"layout"` when it is `"channels_last"`.

        The `type` of this class is `STORED_TYPE`, the path its configs have always
        named, so a checkpoint's resume key and a registry record written before the
        class took the name `TorchModelOp` equal one written now (a subclass names itself).
        """
        config = super().get_config()
        if type(self) is TorchModelOp:
            config["type"] = STORED_TYPE
        if self.layout != "channels_first":
            config["layout"] = self.layout
        return config

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> TorchModelOp:
        """Rebuild the operator (freshly initialised, with its layout) from `get_config()`."""
        return cls(
            config["factory"],
            seed=config.get("seed", 0),
            layout=config.get("layout", "channels_first"),
            **config.get("kwargs", {}),
        )

    @classmethod
    def wrap(
        cls, module: torch.nn.Module, *, seed: int = 0, layout: str = "channels_first"
    ) -> TorchModelOp:
        """An operator around an existing module (e.g. a user `LightningModule` after training).

        `layout="channels_last"` attaches the boundary permutes to `module` itself. Its config names the module's class as the factory and its JSON `hparams` as the
        keyword arguments, so `from_config` can rebuild it when the class is importable
        and takes those arguments.
        """
        seed = check_seed(seed)
        try:
            factory = object_path(type(module))
        except ConfigError:
            factory = f"{type(module).__module__}:{type(module).__qualname__}"
        hparams = dict(getattr(module, "hparams", {}) or {})
        try:
            import json

            kwargs = json.loads(json.dumps(hparams, allow_nan=False))
        except (TypeError, ValueError):
            kwargs = {}
        layout = check_layout(layout)
        op = object.__new__(cls)
        op.factory, op.seed, op.kwargs, op.layout = factory, int(seed), kwargs, layout
        op._factory_fn = type(module)
        set_layout(module, layout)
        op.model = module
        return op

    def __call__(self, inputs: Any) -> Any:
        """Run the module on a numpy batch (eval mode, no autograd) and return numpy.

        With `layout="channels_last"`, field inputs and outputs are `(N, *spatial, C)`.
        """
        return predict(self.model, inputs)

    def rollout(
        self,
        state: Any,
        n_steps: int,
        *,
        spec: RolloutSpec | None = None,
        keep: str | int = "all",
        chunk: int | None = None,
        stochastic: bool = False,
        seed: int = 0,
    ) -> np.ndarray:
        """Advance a batch of states `n_steps` steps without leaving the module's device.

        A `torch.inference_mode()` (no-grad) loop of the core rollout step (`spec.bind`
        on torch tensors: normalise → model → head mean → de-normalise → residual) in
        eval mode, in segments of at most `chunk` steps; each segment's finiteness check and stored
        states come back to the host once. `NeuralForward(op, ...).rollout(...)` calls
        this with its spec.

        Args:
            state: one state or a batch `(n, *state)` (numpy or a tensor).
            n_steps: the number of steps.
            spec: the step's normalizer, residual and head (None: `next = model(state)`).
            keep: `"all"` (steps `0..n`), an int `k` (steps `0, k, 2k, ...`) or `"last"`.
            chunk: the most steps per segment (None: bounded by memory).
            stochastic: draw each step from the predicted distribution (Gaussian and
                mixture heads) instead of taking its mean.
            seed: the seed of the `torch.Generator` of the draws (the same seed gives
                the same rollout, whatever `chunk`).

        Returns:
            The stored states in the module's dtype, `(len(kept), n, *state)` (no `n`
            axis for one state).

        Raises:
            ConfigError: bad arguments, or a model output that does not fit the state
                (before any step).
            NonFiniteStateError: a state became NaN/inf (names the first step and member).
        """
        dtype, device = module_dtype(self.model)
        return device_rollout(
            self.model,
            state,
            n_steps,
            dtype=dtype,
            device=device,
            spec=spec,
            keep=keep,
            chunk=chunk,
            stochastic=stochastic,
            seed=seed,
        )

    def serialize_weights(self) -> bytes:
        """The state dict as safetensors bytes (deterministic, tied weights stored once)."""
        try:
            return encode_weights(self.model.state_dict())
        except TypeError as exc:
            raise ConfigError(
                f"The module's state dict cannot be stored as safetensors: {exc}. "
                "Received: a non-tensor entry (e.g. from get_extra_state). Keep state in buffers."
            ) from exc

    def _load_weights(self, blob: bytes) -> None:
        try:
            state = decode_weights(blob)
        except ValueError as exc:
            raise ConfigError(
                f"The weights are not a valid safetensors blob: {exc}. Received: {len(blob)} bytes."
            ) from exc
        load_module_weights(self.model, state)

    def with_model(self, model: Any) -> TorchModelOp:
        """A shallow copy of this operator holding `model`."""
        return super().with_model(model)  # type: ignore[return-value]  # the base copies `type(self)`

    def copy(self) -> TorchModelOp:
        """A deep copy (independent module) with the same config."""
        return self.with_model(copy.deepcopy(self.model))


LightningModelOp = TorchModelOp
"""`TorchModelOp` under its earlier name (existing code and registry records use it)."""
