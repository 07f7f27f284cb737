"""A pure-numpy reference adapter: a linear model with analytic gradients.

It exists so the conformance suite, `RunContext`, `run_step_loop` and the checkpoint
store are tested without any backend. It supports the `mse` loss, `sgd`/`adam`
optimizers with a constant learning rate and optional gradient noise (drawn from a
checkpointed RNG, so exact resume covers RNG state), and `optimizer_config["ema"]` (the
average lives with the optimizer state, `ema/<name>`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np

from pipekit_train.core import NotSupportedError
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.adapter import (
    GRAD_NORM,
    Capabilities,
    DirectoryCheckpointer,
    GroupStepBackend,
    HostBuffers,
    Plan,
    StepAdapter,
    StepBackend,
    global_grad_norm,
    learning_rate_at,
    step_members,
)

from ._numpy_model import decode_arrays, encode_arrays

__all__ = ["NumpyAdapter"]


def _describe(loss: Any) -> Any:
    describe = getattr(loss, "describe", None)
    return describe() if callable(describe) else repr(loss)


_OPTIMIZERS = ("sgd", "adam")


class _NumpyOp(Protocol):
    """What the backend uses of a numpy model operator (`validate` checked it is one)."""

    model: Any

    def with_model(self, model: Any) -> Any:
        """A new operator holding `model`."""
        ...


@dataclass
class _State:
    params: dict[str, np.ndarray]
    opt: dict[str, np.ndarray]
    t: int
    rng: np.random.Generator


class NumpyAdapter(StepAdapter):
    """The numpy reference adapter (`backend = "numpy"`).

    Args:
        gradient_noise: standard deviation of Gaussian noise added to each gradient,
            drawn from the run's RNG (exercises RNG checkpointing).
        prefetch: groups of batches a background thread prepares ahead of the step
            (`StepBackend.prefetch`; exercises the step loop's prefetching on the CPU).
    """

    name = "numpy"
    capabilities = Capabilities(
        online=True, skip_nonfinite=True, grad_norm=True, lr_scale=True, ema=True, seed_groups=True
    )

    def __init__(self, gradient_noise: float = 0.0, prefetch: int = 0):
        if (
            isinstance(gradient_noise, bool)
            or not isinstance(gradient_noise, (int, float))
            or gradient_noise < 0
        ):
            raise ConfigError(
                f"`gradient_noise` must be a non-negative number. Received: gradient_noise={gradient_noise!r}."
            )
        self.gradient_noise = float(gradient_noise)
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise ConfigError(
                f"`prefetch` must be a non-negative int. Received: prefetch={prefetch!r}."
            )
        self.prefetch = int(prefetch)

    def get_config(self) -> dict[str, Any]:
        """JSON options."""
        return {
            "type": "pipekit_train.core.testing:NumpyAdapter",
            "kwargs": {"gradient_noise": self.gradient_noise, "prefetch": self.prefetch},
        }

    def validate(self, plan: Plan) -> None:
        """Only linear models with parameters, the mse loss and sgd/adam are supported."""
        if (
            not callable(getattr(plan.model, "serialize_weights", None))
            or getattr(plan.model, "backend", None) != "numpy"
        ):
            raise ConfigError(
                f"NumpyAdapter trains numpy model operators. Received: model={type(plan.model).__name__}."
            )
        self.validate_online(plan)
        if plan.sharding is not None:
            raise ConfigError(f"NumpyAdapter does not shard. Received: sharding={plan.sharding!r}.")
        super().validate(plan)

    def validate_online(self, plan: Plan) -> None:
        """Checks shared by `TrainingLoop` and `OnlineTrainer`."""
        if _describe(plan.loss) != {"name": "mse"} and getattr(plan.loss, "__name__", "") != "mse":
            raise ConfigError(
                f"NumpyAdapter computes analytic gradients for 'mse' only. Received: loss={_describe(plan.loss)!r}."
            )
        cfg = plan.optimizer_config
        if not isinstance(cfg, Mapping):
            raise ConfigError(f"NumpyAdapter needs a dict optimizer_config. Received: {cfg!r}.")
        if cfg["name"] not in _OPTIMIZERS:
            raise ConfigError(
                f"`optimizer_config['name']` must be one of {list(_OPTIMIZERS)} for NumpyAdapter. "
                f"Received: name={cfg['name']!r}."
            )
        unsupported = {k: cfg[k] for k in ("weight_decay", "clip_norm", "clip_value") if cfg.get(k)}
        if unsupported:
            raise NotSupportedError(
                f"NumpyAdapter does not implement {sorted(unsupported)}. Received: "
                f"{', '.join(f'{k}={v!r}' for k, v in unsupported.items())}. Drop them, or use "
                "a framework backend."
            )

    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape: the train step's forward (`x @ W + b`) on one zero row."""
        params = model.model.parameters()
        row = np.zeros((1, *input_shape[1:]), np.float32)
        out = row @ params["W"] + params["b"]  # numpy's ValueError when the widths differ
        return (input_shape[0], *out.shape[1:])

    def expected_input_shape(self, model: Any) -> tuple[int, ...] | None:
        """`(in_size,)`: the rows of `W`."""
        return (int(model.model.parameters()["W"].shape[0]),)

    def step_backend(self, plan: Plan) -> _NumpyBackend:
        """The step backend for `run_step_loop` and `OnlineTrainer`."""
        backend = _NumpyBackend(plan, self.gradient_noise)
        backend.prefetch = self.prefetch
        return backend

    def group_backend(self, plans: Sequence[Plan]) -> _NumpyGroup:
        """The members' steps one after another (the reference of core's group loop)."""
        return _NumpyGroup([self.step_backend(plan) for plan in plans])


class _NumpyGroup(GroupStepBackend[_State, list[_State]]):
    """A `SeedGroup`'s members stepped one by one (no batching across members)."""

    def __init__(self, members: Sequence[_NumpyBackend]):
        self.members = list(members)

    def stack(self, states: Sequence[_State]) -> list[_State]:
        return list(states)

    def member(self, group: list[_State], index: int) -> _State:
        return group[index]

    def train_step(
        self, group: list[_State], batch: Mapping[str, np.ndarray], active: Sequence[bool] | None
    ) -> tuple[list[_State], list[Mapping[str, Any]]]:
        return step_members(self.members, group, batch, active)


class _NumpyBackend(StepBackend[_State]):
    name = "numpy"

    def __init__(self, plan: Plan, noise: float):
        self.plan = plan
        self.noise = noise
        self.skip_nonfinite = plan.on_nonfinite == "skip"
        self.op = cast(_NumpyOp, plan.model)  # validate(): a numpy model operator
        self.log_grad_norm = plan.log_grad_norm
        cfg = plan.optimizer_config
        assert isinstance(cfg, Mapping)  # validate_online() checked it
        self.opt_name = cfg["name"]
        spec = cfg["learning_rate"]
        # a constant rate, or one of core's schedules evaluated in plain Python
        self.lr_spec: Mapping[str, Any] | None = spec if isinstance(spec, Mapping) else None
        self.lr = 0.0 if self.lr_spec is not None else float(spec)
        self.lr_scale = 1.0  # core's learning-rate scale (`with_lr_scale`)
        self.b1, self.b2, self.eps = (
            float(cfg.get("b1", 0.9)),
            float(cfg.get("b2", 0.999)),
            float(cfg.get("eps", 1e-8)),
        )
        self.ema: float | None = cfg.get("ema")

    def init_state(self) -> _State:
        params = {k: v.copy() for k, v in self.op.model.parameters().items()}
        opt = {}
        if self.opt_name == "adam":
            for k, v in params.items():
                opt[f"m/{k}"] = np.zeros_like(v)
                opt[f"v/{k}"] = np.zeros_like(v)
        if self.ema is not None:  # the average starts from the initial weights
            opt.update({f"ema/{k}": v.copy() for k, v in params.items()})
        return _State(params, opt, 0, np.random.default_rng([self.plan.seed, 7919]))

    def put(self, batch: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        return batch

    def _forward(self, params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
        return np.asarray(x, np.float32) @ params["W"] + params["b"]

    def train_step(
        self, state: _State, batch: Mapping[str, np.ndarray]
    ) -> tuple[_State, dict[str, Any]]:
        x = np.asarray(batch["x"], np.float32)
        y = np.asarray(batch["y"], np.float32)
        pred = self._forward(state.params, x)
        err = pred - y
        loss = np.float32(np.mean(err * err))
        g = (2.0 / err.size) * err
        grads = {"W": x.T @ g, "b": g.sum(axis=0)}
        if self.noise:
            grads = {
                k: v + self.noise * state.rng.standard_normal(v.shape).astype(np.float32)
                for k, v in grads.items()
            }
        metrics: dict[str, Any] = {"loss": loss}
        if self.log_grad_norm:
            metrics[GRAD_NORM] = np.float32(global_grad_norm(grads.values()))
        if self.skip_nonfinite and not np.isfinite(loss):
            # on_nonfinite="skip": parameters and optimizer state (and its count) unchanged
            return _State(state.params, state.opt, state.t, state.rng), metrics
        lr = self.learning_rate(state)
        t = state.t + 1
        params, opt = {}, dict(state.opt)
        for k, p in state.params.items():
            gk = grads[k].astype(np.float32)
            if self.opt_name == "sgd":
                params[k] = (p - lr * gk).astype(np.float32)
            else:
                m = self.b1 * opt[f"m/{k}"] + (1 - self.b1) * gk
                v = self.b2 * opt[f"v/{k}"] + (1 - self.b2) * gk * gk
                opt[f"m/{k}"], opt[f"v/{k}"] = m.astype(np.float32), v.astype(np.float32)
                mhat = m / (1 - self.b1**t)
                vhat = v / (1 - self.b2**t)
                params[k] = (p - lr * mhat / (np.sqrt(vhat) + self.eps)).astype(np.float32)
            if self.ema is not None:
                d = self.ema
                opt[f"ema/{k}"] = (d * opt[f"ema/{k}"] + (1 - d) * params[k]).astype(np.float32)
        return _State(params, opt, t, state.rng), metrics

    def _weights(self, state: _State) -> dict[str, np.ndarray]:
        """What validation and the artifact use: the moving average when the plan keeps one."""
        if self.ema is None:
            return state.params
        return {k: state.opt[f"ema/{k}"] for k in state.params}

    def eval_batch(
        self, state: _State, batch: Mapping[str, np.ndarray]
    ) -> tuple[np.ndarray, float]:
        pred = self._forward(self._weights(state), batch["x"])
        err = pred - np.asarray(batch["y"], np.float32)
        return pred, float(np.mean(err * err))

    def learning_rate(self, state: _State) -> float:
        base = self.lr if self.lr_spec is None else learning_rate_at(self.lr_spec, state.t)
        return base if self.lr_scale == 1.0 else base * self.lr_scale

    def with_lr_scale(self, state: _State, scale: float) -> _State:
        self.lr_scale = float(scale)
        return state

    def model_op(self, state: _State) -> Any:
        return self._op_of(self._weights(state))

    def raw_model_op(self, state: _State) -> Any:
        return None if self.ema is None else self._op_of(state.params)

    def _op_of(self, params: Mapping[str, np.ndarray]) -> Any:
        return self.op.with_model(self.op.model.replace(**{k: v.copy() for k, v in params.items()}))

    # -- checkpointing -------------------------------------------------------------------
    @staticmethod
    def _snapshot(state: _State, buffers: HostBuffers) -> dict[str, Any]:
        """Training thread: copy the arrays into reused host buffers, the rest as JSON."""
        arrays = {f"params/{k}": v for k, v in state.params.items()}
        arrays.update({f"opt/{k}": v for k, v in state.opt.items()})
        return {
            "arrays": {k: buffers.copy(k, v) for k, v in arrays.items()},
            "t": state.t,
            "rng": json.dumps(state.rng.bit_generator.state, sort_keys=True).encode(),
        }

    def _encode(self, snapshot: Mapping[str, Any]) -> dict[str, bytes]:
        """Writer thread: the blobs of a snapshot."""
        return {
            "arrays.bin": encode_arrays(snapshot["arrays"]),
            "train.json": json.dumps({"t": snapshot["t"]}).encode(),
            "rng.json": snapshot["rng"],
        }

    def _decode(self, blobs: Mapping[str, bytes], template: _State) -> _State:
        arrays = decode_arrays(blobs["arrays.bin"])
        params = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("params/")}
        opt = {k.split("/", 1)[1]: v for k, v in arrays.items() if k.startswith("opt/")}
        if set(params) != set(template.params):
            raise ValueError(
                f"checkpoint parameters {sorted(params)} do not match the model's {sorted(template.params)}"
            )
        rng = np.random.default_rng()
        rng.bit_generator.state = json.loads(blobs["rng.json"])
        return _State(params, opt, int(json.loads(blobs["train.json"])["t"]), rng)

    def checkpointer(self) -> DirectoryCheckpointer:
        assert self.plan.checkpoint is not None
        buffers = HostBuffers()
        return DirectoryCheckpointer(
            self.plan.checkpoint,
            encode=self._encode,
            decode=self._decode,
            snapshot=lambda state: self._snapshot(state, buffers),
        )
