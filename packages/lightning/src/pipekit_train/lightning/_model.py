"""`LightningModelOp`: a `torch.nn.Module` built by an importable factory, as a model operator."""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from pipekit_train.core import ConfigError, ModelOpBase

from ._weights import decode_state_dict, encode_state_dict

if TYPE_CHECKING:
    from ._adapter import Lightning

__all__ = ["LightningModelOp"]


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


class LightningModelOp(ModelOpBase):
    """A PyTorch model operator (`backend = "lightning"`).

    The factory is called as `factory(**kwargs)` under `torch.manual_seed(seed)` inside a
    forked RNG (the caller's global torch RNG is left untouched) and must return a
    `torch.nn.Module` (a `LightningModule` works too). Weights travel as safetensors bytes
    of the state dict: the same weights give the same bytes, tied weights are stored once,
    and loading never unpickles.

    Args:
        factory: `"package.module:function"` or the function itself (importable by name).
        seed: the seed the module's parameters are initialised under.
        **kwargs: JSON keyword arguments for the factory.

    Examples:
        >>> import numpy as np
        >>> from pipekit_train.lightning import LightningModelOp
        >>> op = LightningModelOp("pipekit_train.lightning.testing:mlp", in_size=2, out_size=1, seed=0)
        >>> op(np.zeros((4, 2), np.float32)).shape
        (4, 1)
    """

    backend: ClassVar[str] = "lightning"
    framework: ClassVar[str | None] = "torch"

    def _build(self, factory: Callable[..., Any], kwargs: dict[str, Any], seed: int) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            module = factory(**kwargs)
        self.check_model(module)  # a Keras model on torch is a torch.nn.Module too
        if not isinstance(module, torch.nn.Module):
            raise ConfigError(
                "A LightningModelOp factory must return a torch.nn.Module. "
                f"Received: {type(module).__name__} from factory={self.factory!r}."
            )
        return module

    @classmethod
    def wrap(cls, module: torch.nn.Module, *, seed: int = 0) -> LightningModelOp:
        """An operator around an existing module (e.g. a user `LightningModule` after training).

        Its config names the module's class as the factory and its JSON `hparams` as the
        keyword arguments, so `from_config` can rebuild it when the class is importable
        and takes those arguments.
        """
        from pipekit_train.core.adapter import check_seed, object_path

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
        op = object.__new__(cls)
        op.factory, op.seed, op.kwargs = factory, int(seed), kwargs
        op._factory_fn = type(module)
        op.model = module
        return op

    def __call__(self, inputs: Any) -> Any:
        """Run the module on a numpy batch (eval mode, no autograd) and return numpy."""
        return predict(self.model, inputs)

    def serialize_weights(self) -> bytes:
        """The state dict as safetensors bytes (deterministic, tied weights stored once)."""
        try:
            return encode_state_dict(self.model.state_dict())
        except TypeError as exc:
            raise ConfigError(
                f"The module's state dict cannot be stored as safetensors: {exc}. "
                "Received: a non-tensor entry (e.g. from get_extra_state). Keep state in buffers."
            ) from exc

    def _load_weights(self, blob: bytes) -> None:
        try:
            state = decode_state_dict(blob)
        except ValueError as exc:
            raise ConfigError(
                f"The weights are not a valid safetensors blob: {exc}. Received: {len(blob)} bytes."
            ) from exc
        load_module_weights(self.model, state)

    def with_model(self, model: Any) -> LightningModelOp:
        """A shallow copy of this operator holding `model`."""
        return super().with_model(model)  # type: ignore[return-value]  # the base copies `type(self)`

    def copy(self) -> LightningModelOp:
        """A deep copy (independent module) with the same config."""
        return self.with_model(copy.deepcopy(self.model))

    def default_adapter(self) -> Lightning:
        """`Lightning()` with default Trainer arguments."""
        from ._adapter import Lightning

        return Lightning()
