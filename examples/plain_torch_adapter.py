"""A fourth backend in one file: plain PyTorch (no Lightning) through the adapter contract.

This is the walk-through of `docs/adapters.md`: a `StepAdapter` whose `StepBackend`
translates core's canonical spec into `torch.optim`, runs train and eval steps, and
checkpoints through core's atomic `DirectoryCheckpointer`. Core's `run_step_loop` does
everything else (batching, validation, checkpoint cadence and resume, callbacks, writers,
the artifact). It passes the same golden-run suite as the three shipped backends:

```python
from pipekit_train.core.testing import GoldenBackend, run_golden
from pipekit_train.lightning.testing import mlp_from_weights
from plain_torch_adapter import PlainTorch

runs = run_golden(GoldenBackend("plain-torch", mlp_from_weights, lambda p: PlainTorch()))
```

Models are `TorchModelOp`s (any `torch.nn.Module` factory), reused as plain operators.

`BACKEND` is what the backend's `pipekit_train.backends` entry point names; a package
shipping this file would declare, in its `pyproject.toml`,

```toml
[project.entry-points."pipekit_train.backends"]
plain_torch = "plain_torch_adapter:BACKEND"
```

and `pipekit-train run` then takes `backend = "plain_torch"` (no edit to core).
"""

from __future__ import annotations

import copy
import io
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from safetensors.torch import load, save

from pipekit_train.core.adapter import (
    BackendEntry,
    Capabilities,
    ConfigError,
    DirectoryCheckpointer,
    Plan,
    StepAdapter,
    StepBackend,
    learning_rate_at,
    optimizer_spec,
)

__all__ = ["BACKEND", "PlainTorch"]


class PlainTorch(StepAdapter):
    """Train a torch module with a hand-written loop (`backend = "plain_torch"`)."""

    name = "plain_torch"
    capabilities = Capabilities(online=True, accumulation=True, lr_scale=True)

    def get_config(self) -> dict[str, Any]:
        """JSON options (there are none)."""
        return {"type": "plain_torch_adapter:PlainTorch", "kwargs": {}}

    def validate(self, plan: Plan) -> None:
        """What this backend needs (core checks the capabilities afterwards)."""
        self.validate_online(plan)

    def validate_online(self, plan: Plan) -> None:
        """A torch model operator and a canonical optimizer config."""
        if not isinstance(getattr(plan.model, "model", None), torch.nn.Module):
            raise ConfigError(
                "PlainTorch trains a model operator holding a torch.nn.Module. "
                f"Received: model={type(plan.model).__name__}."
            )
        if not isinstance(plan.optimizer_config, Mapping):
            raise ConfigError(
                "PlainTorch takes a dict optimizer_config. "
                f"Received: optimizer_config={plan.optimizer_config!r}."
            )

    def step_backend(self, plan: Plan) -> TorchBackend:
        """The step backend of one run."""
        return TorchBackend(plan)

    def output_shape(
        self, model: Any, input_shape: tuple[int, ...], dtype: Any = np.float32
    ) -> tuple[int, ...] | None:
        """The prediction's shape from one zero row (eval mode, no grad, RNG forked)."""
        net = getattr(model, "model", None)
        if not isinstance(net, torch.nn.Module):
            return None
        x = torch.zeros((1, *input_shape[1:]), dtype=torch.float32)
        was_training = net.training
        with torch.random.fork_rng(devices=[]):
            net.eval()
            try:
                with torch.no_grad():
                    out = net(x)
            finally:
                net.train(was_training)
        if not isinstance(out, torch.Tensor) or out.ndim == 0:
            return None
        return (input_shape[0], *(int(d) for d in out.shape[1:]))


BACKEND = BackendEntry(
    name="plain_torch",
    adapter="plain_torch_adapter:PlainTorch",
    model_op="pipekit_train.lightning:TorchModelOp",
    testing="pipekit_train.lightning.testing",
    distributions=("torch", "safetensors"),
    install="pip install torch safetensors pipekit-train-lightning",
)
"""The `pipekit_train.backends` entry point's value for this backend."""


@dataclass
class State:
    """Module, optimizer and update count (the schedule's position)."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    updates: int = 0


def _optimizer(spec: Any, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The canonical spec in torch.optim terms (decay is applied apart, decoupled)."""
    h = spec.hyper
    if spec.name in ("adam", "adamw"):
        return torch.optim.Adam(params, lr=1.0, betas=(h["b1"], h["b2"]), eps=h["eps"])
    if spec.name == "sgd":
        return torch.optim.SGD(params, lr=1.0, momentum=h["momentum"], nesterov=h["nesterov"])
    if spec.name == "rmsprop":
        return torch.optim.RMSprop(
            params,
            lr=1.0,
            alpha=h["decay"],
            eps=h["eps"],
            momentum=h["momentum"],
            centered=h["centered"],
        )
    return torch.optim.Adagrad(
        params, lr=1.0, initial_accumulator_value=h["initial_accumulator_value"], eps=h["eps"]
    )


class TorchOp(Protocol):
    """What the backend uses of a model operator (`validate_online` checked it)."""

    model: torch.nn.Module

    def with_model(self, model: torch.nn.Module) -> Any:
        """A new operator holding `model`."""
        ...


class TorchBackend(StepBackend[State]):
    """One run's steps. A step takes `plan.accumulate_grad_batches` batches."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.op = cast(TorchOp, plan.model)  # validate_online(): it holds a torch module
        assert isinstance(plan.optimizer_config, Mapping)  # validate_online() checked it
        self.spec = optimizer_spec(plan.optimizer_config)
        self.micro = plan.accumulate_grad_batches
        self.lr_scale = 1.0  # core's learning-rate scale (ReduceLROnPlateau), see with_lr_scale

    def init_state(self) -> State:
        module = copy.deepcopy(self.op.model).train()
        return State(module, _optimizer(self.spec, list(module.parameters())))

    def put(self, batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}

    def _update(self, state: State, batches: list[dict[str, torch.Tensor]]) -> torch.Tensor:
        """One optimizer update from `len(batches)` batches; their losses."""
        module, opt, spec = state.module, state.optimizer, self.spec
        opt.zero_grad(set_to_none=True)
        losses = []
        for batch in batches:
            loss = self.plan.loss(module(batch["x"]), batch["y"])
            (loss / len(batches)).backward()
            losses.append(loss.detach())
        if spec.clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(module.parameters(), spec.clip_norm)
        elif spec.clip_value is not None:
            torch.nn.utils.clip_grad_value_(module.parameters(), spec.clip_value)
        lr = self.learning_rate(state)
        for group in opt.param_groups:
            group["lr"] = lr
        if spec.weight_decay:
            with torch.no_grad():
                for p in module.parameters():
                    p.mul_(1.0 - lr * spec.weight_decay)
        opt.step()
        state.updates += 1
        return torch.stack(losses)

    def train_step(self, state: State, batch: Any) -> tuple[State, dict[str, Any]]:
        return state, {"loss": self._update(state, [batch])[0]}

    def train_steps(self, state: State, stacked: Any) -> tuple[State, dict[str, Any]]:
        """Accumulation: `stacked` holds `K * micro` batches, `micro` per update."""
        n = stacked["x"].shape[0]
        batches = [{k: v[i] for k, v in stacked.items()} for i in range(n)]
        losses = [self._update(state, batches[i : i + self.micro]) for i in range(0, n, self.micro)]
        return state, {"loss": torch.cat(losses)}

    def eval_batch(self, state: State, batch: Mapping[str, np.ndarray]) -> tuple[Any, Any]:
        module = state.module.eval()
        try:
            with torch.no_grad():
                tensors = self.put(batch)
                pred = module(tensors["x"])
                return pred.numpy(), float(self.plan.loss(pred, tensors["y"]))
        finally:
            module.train()

    def learning_rate(self, state: State) -> float:
        return learning_rate_at(self.spec.learning_rate, state.updates) * self.lr_scale

    def with_lr_scale(self, state: State, scale: float) -> State:
        # core keeps the scale in the checkpoint's run state and hands it back on resume
        self.lr_scale = scale
        return state

    def model_op(self, state: State) -> Any:
        return self.op.with_model(copy.deepcopy(state.module).eval())

    # -- checkpoints: safetensors + JSON, written atomically by core ---------------------
    def checkpointer(self) -> DirectoryCheckpointer:
        assert self.plan.checkpoint is not None
        return DirectoryCheckpointer(self.plan.checkpoint, encode=_encode, decode=_decode)


def _encode(state: State) -> dict[str, bytes]:
    tensors = {f"model/{k}": v.detach().clone() for k, v in state.module.state_dict().items()}
    opt = state.optimizer.state_dict()
    scalars: dict[str, Any] = {}
    for index, entry in opt["state"].items():
        for key, value in entry.items():
            if torch.is_tensor(value) and value.dim() > 0:
                tensors[f"opt/{index}/{key}"] = value.detach().clone()
            else:
                scalars[f"{index}/{key}"] = float(value)
    meta = {"updates": state.updates, "scalars": scalars, "groups": opt["param_groups"]}
    return {"tensors.safetensors": save(tensors), "state.json": json.dumps(meta).encode()}


def _decode(blobs: Mapping[str, bytes], template: State) -> State:
    tensors = load(blobs["tensors.safetensors"])
    meta = json.loads(io.BytesIO(blobs["state.json"]).read())
    template.module.load_state_dict(
        {k.split("/", 1)[1]: v for k, v in tensors.items() if k.startswith("model/")}
    )
    entries: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("opt/"):
            _, index, key = name.split("/", 2)
            entries.setdefault(int(index), {})[key] = value
    for name, value in meta["scalars"].items():
        index, key = name.split("/", 1)
        entries.setdefault(int(index), {})[key] = torch.tensor(value)
    template.optimizer.load_state_dict({"state": entries, "param_groups": meta["groups"]})
    template.updates = int(meta["updates"])
    return template
