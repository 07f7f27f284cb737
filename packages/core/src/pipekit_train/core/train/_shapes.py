"""Shape checks before any work: probe the model with the data's shapes.

`TrainingLoop` calls `check_shapes` after `adapter.validate`: for core datasets with a
length it asks the adapter for the model's output shape on a batch of the data's input
shape (`Adapter.output_shape`, an abstract evaluation where the backend has one) and
raises a `ConfigError` naming the dataset, the key and the shapes when the model cannot
take the inputs or its predictions cannot meet the targets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from pipekit_train.core._errors import ConfigError
from pipekit_train.core.losses._ensemble import ensemble_params

if TYPE_CHECKING:
    from pipekit_train.core.contract._adapter import Adapter
    from pipekit_train.core.spec._plan import Plan

__all__ = ["check_shapes"]


_CHANNEL_KWARGS = ("in_channels", "input_channels", "n_channels", "channels")


def _layout_error(model: Any, name: str, x_shape: tuple[int, ...]) -> ConfigError | None:
    """A `ConfigError` when a field's channel axis and the model's layout disagree, else None.

    pipekit-train datasets hold fields channels-last: a sample of a 2-D field is
    `(H, W, C)`. Checked only for a model whose factory names its input channels
    (`in_channels=...`): for samples of rank 3, data stored channels-first `(C, H, W)` is
    refused for every backend, and channels-last data is refused for a model operator that
    declares `layout="channels_first"` (a channels-first network without the boundary
    permute); for samples of rank >= 2, a model operator with `layout="channels_last"`
    whose input channels are not the data's last axis is refused.
    """
    size = _size_kwarg(model, _CHANNEL_KWARGS)
    if size is None or len(x_shape) < 2:
        return None
    field, channels = size
    layout = getattr(model, "layout", None)
    described = _describe_model(model, size)
    received = f"Received: {name}['x'] with samples of shape {x_shape}"
    if layout == "channels_last" and x_shape[-1] == channels:
        return None
    channels_first_field = len(x_shape) == 3 and x_shape[0] == channels
    if layout == "channels_last" and not channels_first_field:
        fix = (
            "The data looks channels-first: store it as (N, *spatial, C), e.g. "
            "np.moveaxis(x, 1, -1) on the (N, C, *spatial) array."
            if x_shape[0] == channels
            else f"Make the data's last axis the model's {channels} input channels, or build "
            f"the model with {field}={x_shape[-1]}."
        )
        return ConfigError(
            f"`{name}` does not fit the model's channels: with layout='channels_last' the "
            f"operator hands the model each sample's last axis as its channel axis, so the "
            f"model ({described}) would read {x_shape[-1]} channels where it takes {channels}. "
            f"{received}. {fix}"
        )
    if len(x_shape) != 3:
        return None
    if x_shape[-1] != channels and x_shape[0] == channels:
        return ConfigError(
            f"`{name}` holds fields channels-first (C, H, W), but pipekit-train datasets are "
            f"channels-last (H, W, C) and the model ({described}) reads {channels} channels "
            f"on the last axis. {received}. Store x as (N, H, W, C), e.g. "
            "np.moveaxis(x, 1, -1) on the (N, C, H, W) array."
        )
    if layout == "channels_first" and x_shape[-1] == channels and x_shape[0] != channels:
        return ConfigError(
            f"`{name}` is channels-last (H, W, C), but the model ({described}) declares "
            f"layout='channels_first' and would read axis 0 (size {x_shape[0]}) as its "
            f"{channels} channels. {received}. Build the operator with "
            "layout='channels_last' (it permutes to channels-first at the model's boundary)."
        )
    return None


_IN_KWARGS = ("in_size", "in_features", "input_size", "input_dim", "in_dim", "n_inputs")
_OUT_KWARGS = ("out_size", "out_features", "output_size", "output_dim", "out_dim", "n_outputs")


def _same_shape_loss(loss: Any) -> bool:
    """Whether `loss` certainly needs pred and target of the same shape.

    True for the built-in `mse`, `mae`, `huber` and `binary_cross_entropy` (and weighted
    sums of them only); False for the losses that change shapes (`cross_entropy` with
    integer labels, `gaussian_nll` with 2x the target's width), per-key losses and any
    user callable (its shape rules are its own).
    """
    from pipekit_train.core.losses import Loss, PerKeyLoss, WeightedLoss
    from pipekit_train.core.losses import _losses as builtin

    if isinstance(loss, PerKeyLoss):
        return False
    if isinstance(loss, WeightedLoss):
        return bool(loss.terms) and all(_same_shape_loss(term) for _, term in loss.terms)
    if isinstance(loss, Loss):
        return loss.fn in (
            builtin._mse,
            builtin._mae,
            builtin._huber,
            builtin._binary_cross_entropy,
        )
    return False


def _size_kwarg(model: Any, names: tuple[str, ...]) -> tuple[str, int] | None:
    kwargs = getattr(model, "kwargs", None)
    if not isinstance(kwargs, Mapping):
        return None
    for name in names:
        value = kwargs.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return name, value
    return None


def _describe_model(model: Any, size: tuple[str, int] | None) -> str:
    factory = getattr(model, "factory", None)
    text = type(model).__name__ + (f" {factory!r}" if isinstance(factory, str) else "")
    return text + (f" with {size[0]}={size[1]}" if size is not None else "")


def _sample_spec(data: Any) -> tuple[Any, Any] | None:
    """`(x, y)` of the first sample as objects with `.shape`/`.dtype`, or None to skip."""
    spec = None
    try:
        spec = getattr(data, "element_spec", None)
    except Exception:
        spec = None
    if isinstance(spec, Mapping) and "x" in spec and "y" in spec:
        x, y = spec["x"], spec["y"]
    else:
        sample = data[0]
        if not isinstance(sample, Mapping) or "x" not in sample or "y" not in sample:
            return None
        x, y = sample["x"], sample["y"]
    if not all(hasattr(a, "shape") and hasattr(a, "dtype") for a in (x, y)):
        return None  # dicts or other structures: not probed
    return x, y


def _first_line(exc: BaseException, limit: int = 200) -> str:
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_shapes(adapter: Adapter, plan: Plan) -> None:
    """Probe the model with the shapes of `data` and `validation` (see `Adapter.output_shape`).

    Called by `TrainingLoop` at construction, after `adapter.validate(plan)`. Only core
    datasets with a length are probed (streams and native loaders are not); nothing is
    checked where the adapter cannot probe (`output_shape` returns None).

    Raises:
        ConfigError: a field's channel axis does not match the model's layout (fields
            are channels-last, `(H, W, C)`), the model cannot take the data's inputs (the
            backend's error is the `__cause__`), its predictions and the targets differ in shape for a loss
            that needs them equal (`mse`, `mae`, `huber`, `binary_cross_entropy`), or
            its output width is not the layout `mixture_nll`/`flow_nll` needs.
    """
    from pipekit_train.core.spec._plan import is_core_dataset

    model = plan.model
    same_shape = _same_shape_loss(plan.loss)
    describe = getattr(plan.loss, "describe", None)
    ensemble = ensemble_params(describe()) if callable(describe) else None
    noise_dim = 0 if ensemble is None else ensemble[1]
    probed: dict[tuple[tuple[int, ...], np.dtype], tuple[int, ...] | None] = {}
    for name in ("data", "validation"):
        data = getattr(plan, name)
        if data is None or not is_core_dataset(data) or not hasattr(data, "__len__"):
            continue
        spec = _sample_spec(data)
        if spec is None:
            continue
        x, y = spec
        x_shape = tuple(int(d) for d in x.shape)
        y_shape = tuple(int(d) for d in y.shape)
        # a generative model takes the state's channels and its noise channels
        layout_shape = (*x_shape[:-1], x_shape[-1] + noise_dim) if noise_dim else x_shape
        layout_error = _layout_error(model, name, layout_shape)
        if layout_error is not None:
            if noise_dim:
                raise _noise_error(plan.loss, name, x_shape, noise_dim, layout_error)
            raise layout_error
        batch = (plan.batch_size, *x_shape)
        if noise_dim:  # a generative model takes the state and its noise channels
            batch = (*batch[:-1], batch[-1] + noise_dim)
        key = (batch, np.dtype(x.dtype))
        if key in probed:  # validation usually has the training data's shapes
            out = probed[key]
        else:
            try:
                out = adapter.output_shape(model, batch, np.dtype(x.dtype))
            except Exception as exc:
                if noise_dim:
                    raise _noise_error(plan.loss, name, x_shape, noise_dim, exc) from exc
                raise _input_error(adapter, model, name, x_shape, np.dtype(x.dtype), exc) from exc
            probed[key] = out
        if out is None:
            continue
        out = tuple(int(d) for d in out)
        if plan.rollout is not None:  # each prediction is fed back as the next state
            inputs = getattr(plan, "inputs", None)
            state_shape = x_shape if inputs is None else tuple(inputs.state_shape)
            if out != (plan.batch_size, *state_shape):
                what = "an increment" if plan.rollout.residual else "the next state"
                fix = (
                    "Use a model with out_size == in_size."
                    if inputs is None
                    else f"Use a model with {inputs.in_channels} input and "
                    f"{inputs.channels} output channels."
                )
                raise ConfigError(
                    f"Rollout training feeds each prediction back as the state, so the model "
                    f"must predict {what} of the state's shape. Received: state shape "
                    f"{state_shape}, prediction shape {out[1:]} (`{name}`). {fix}"
                )
            continue
        mixture = _mixture_params(plan.loss)
        if mixture is not None and y_shape:
            _check_mixture(model, mixture, name, out[1:], y_shape)
        flow = _flow_params(plan.loss)
        if flow is not None and y_shape:
            _check_flow(model, flow, name, out[1:], y_shape)
        if not same_shape:
            continue
        if out != (plan.batch_size, *y_shape):
            raise _target_error(model, plan.loss, name, out[1:], y_shape)


def _noise_error(
    loss: Any, name: str, x_shape: tuple[int, ...], noise_dim: int, exc: Exception
) -> ConfigError:
    width = x_shape[-1] if x_shape else 0
    return ConfigError(
        f"A generative model takes the state's {width} channels followed by noise_dim="
        f"{noise_dim} noise channels ({width + noise_dim} in all). Received: "
        f"loss={loss.name}(noise_dim={noise_dim}) and `{name}` states of shape {x_shape}, "
        f"but the model fails on inputs of shape {(*x_shape[:-1], width + noise_dim)} "
        f"({type(exc).__name__}: {str(exc)[:200]}). Build the model with "
        f"{width + noise_dim} input channels, or set noise_dim to the model's input "
        f"channels minus {width}."
    )


def _input_error(
    adapter: Adapter,
    model: Any,
    name: str,
    x_shape: tuple[int, ...],
    dtype: np.dtype,
    exc: Exception,
) -> ConfigError:
    size = _size_kwarg(model, _IN_KWARGS)
    try:
        expected = adapter.expected_input_shape(model)
    except Exception:
        expected = None
    if expected is None and size is not None and len(x_shape) == 1:
        expected = (size[1],)
    received = f"Received: {name}['x'] with samples of shape {x_shape}"
    described = _describe_model(model, size)
    if expected is not None and tuple(expected) != x_shape:
        fix = "Make the data match the model"
        if size is not None and len(x_shape) == 1:
            fix += f", or build the model with {size[0]}={x_shape[0]}"
        return ConfigError(
            f"`{name}` does not fit the model. {received}, but the model expects inputs of "
            f"shape {tuple(expected)} ({described}). {fix}."
        )
    hint = ""
    if getattr(model, "layout", None) == "channels_last" and len(x_shape) >= 2:
        hint = (
            " The operator's layout='channels_last' hands the model each sample as "
            f"(C, *spatial) with C the data's last axis (size {x_shape[-1]}): make that axis "
            "the model's input channels, or drop `layout` for a channels-last model."
        )
    elif len(x_shape) == 3:
        hint = (
            " Fields are channels-last (H, W, C); a channels-first network needs "
            "layout='channels_last' on its operator."
        )
    return ConfigError(
        f"`{name}` does not fit the model: the model ({described}) fails on a batch of its "
        f"inputs. {received} ({dtype}); the backend raised: {_first_line(exc)}. Make the data match "
        f"the model's input (the original error is chained above).{hint}"
    )


def _mixture_params(loss: Any) -> dict[str, Any] | None:
    """`mixture_nll`'s (or `mixture_crps`'s) parameters when `loss` is that built-in loss,
    else None."""
    from pipekit_train.core.losses import Loss, mixture_crps, mixture_nll

    if isinstance(loss, Loss) and loss.fn in (mixture_nll.fn, mixture_crps.fn):
        return loss.params
    return None


def _check_mixture(
    model: Any, params: dict[str, Any], name: str, pred: tuple[int, ...], target: tuple[int, ...]
) -> None:
    from pipekit_train.core.losses import mixture_width

    k, cov = params["n_components"], params["covariance"]
    width = mixture_width(k, target[-1], cov)
    if pred != (*target[:-1], width):
        size = _size_kwarg(model, _OUT_KWARGS)
        fix = f"build the model with {size[0]}={width}" if size is not None else "change the model"
        raise ConfigError(
            f"`{name}` targets do not fit the model's predictions for `mixture_nll` with "
            f"n_components={k}, covariance={cov!r}: {target[-1]} target values need "
            f"{width} outputs (mixture_width({k}, {target[-1]}, {cov!r})). Received: "
            f"{name}['y'] with samples of shape {target}, but the model predicts samples of "
            f"shape {pred} ({_describe_model(model, size)}). Make the outputs match: {fix}, "
            "or change n_components."
        )


def _flow_params(loss: Any) -> dict[str, Any] | None:
    """`flow_nll`'s parameters when `loss` is that built-in loss, else None."""
    from pipekit_train.core.losses import Loss, flow_nll

    if isinstance(loss, Loss) and loss.fn is flow_nll.fn:
        return loss.params
    return None


def _check_flow(
    model: Any, params: dict[str, Any], name: str, pred: tuple[int, ...], target: tuple[int, ...]
) -> None:
    from pipekit_train.core.distributions._flow_math import check_coupling
    from pipekit_train.core.losses import flow_width

    layers, bins = params["flow_layers"], params["flow_bins"]
    hidden = params.get("flow_hidden", 0)
    check_coupling(target[-1], hidden, f"`{name}` target")
    width = flow_width(target[-1], layers, bins, hidden)
    if pred != (*target[:-1], width):
        size = _size_kwarg(model, _OUT_KWARGS)
        fix = f"build the model with {size[0]}={width}" if size is not None else "change the model"
        options = f"flow_layers={layers}, flow_bins={bins}"
        args = f"{target[-1]}, {layers}, {bins}"
        if hidden:
            options, args = f"{options}, flow_hidden={hidden}", f"{args}, {hidden}"
        raise ConfigError(
            f"`{name}` targets do not fit the model's predictions for `flow_nll` with "
            f"{options}: {target[-1]} target values need {width} outputs (flow_width({args})). "
            f"Received: {name}['y'] with samples of shape {target}, but the model predicts "
            f"samples of shape {pred} ({_describe_model(model, size)}). Make the outputs "
            f"match: {fix}, or change flow_layers/flow_bins{'/flow_hidden' if hidden else ''}."
        )


def _target_error(
    model: Any, loss: Any, name: str, pred: tuple[int, ...], target: tuple[int, ...]
) -> ConfigError:
    size = _size_kwarg(model, _OUT_KWARGS)
    label = getattr(loss, "name", None) or getattr(loss, "__name__", None) or repr(loss)
    fix = f"Make {name}['y'] match the model's output"
    if size is not None and len(target) == 1 and len(pred) == 1:
        fix += f", or build the model with {size[0]}={target[0]}"
    elif len(pred) == len(target) + 1 and pred[-1] == 1:
        fix += " (e.g. give y a trailing axis of size 1)"
    return ConfigError(
        f"`{name}` targets do not fit the model's predictions for the loss {label!r}, which "
        f"needs pred and target of the same shape. Received: {name}['y'] with samples of "
        f"shape {target}, but the model predicts samples of shape {pred} "
        f"({_describe_model(model, size)}). {fix}."
    )
