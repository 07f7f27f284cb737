"""The run config file: TOML or JSON, `--set` overrides, and validation before any work.

`load_run_config` reads the file, applies the overrides and checks every key and every
value whose check needs no import (types, ranges, names, the checkpoint policy, the
optimizer spec, the loss and metric names). Anything wrong raises a `ConfigError` that
names the field (`checkpoint.every_n_steps`, `writers[1].type`), the value and the fix;
an unknown key lists the accepted ones. Nothing is imported, built or written here.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipekit_train.core._checks import check_seed, positive_int
from pipekit_train.core._errors import ConfigError
from pipekit_train.core.checkpoint._policy import Checkpoint
from pipekit_train.core.contract._backends import backend_names
from pipekit_train.core.spec._optimizer import resolve_optimizer_config
from pipekit_train.core.spec._policies import NonFinitePolicy
from pipekit_train.core.spec._rollout import Rollout, RolloutSchedule

from ._wording import in_cli_terms

__all__ = [
    "CALLBACKS",
    "CHECKPOINT_EXCLUDED",
    "LOOP_ELSEWHERE",
    "LOOP_EXCLUDED",
    "PROGRESS",
    "ROLLOUT_KEYS",
    "WRITERS",
    "ComponentSpec",
    "FactorySpec",
    "ModelSpec",
    "RunConfig",
    "apply_overrides",
    "checkpoint_keys",
    "load_run_config",
    "loop_keys",
    "read_config_file",
]

#: Built-in writer `type` names → `pipekit_train.core.writers` classes.
WRITERS = {
    "jsonl": "JsonlWriter",
    "csv": "CsvWriter",
    "tensorboard": "TensorBoardWriter",
    "mlflow": "MlflowWriter",
    "wandb": "WandbWriter",
}
#: Built-in callback `type` names → `pipekit_train.core.callbacks` classes.
CALLBACKS = {
    "early_stopping": "EarlyStopping",
    "nan_guard": "NaNGuard",
    "lr_logger": "LearningRateLogger",
}
#: `progress` values: a bar on a terminal and lines otherwise, or one of them, or nothing.
PROGRESS = ("auto", "bar", "lines", "none")

#: `TrainingLoop` parameters the run config spells another way, and where.
LOOP_ELSEWHERE: dict[str, str] = {
    "model": "the [model] table (factory, kwargs, seed)",
    "data": "the [data] table (factory, kwargs, split)",
    "validation": "the [validation] table, or data.split",
    "optimizer_config": "the [optimizer] table",
    "checkpoint": "the [checkpoint] table",
    "callbacks": "the [[callbacks]] array of tables",
    "writers": "the [[writers]] array of tables",
    "adapter": "the `backend` key and the [adapter.<backend>] table",
    "normalizer": "the [normalizer] table",
    "rollout": "the [rollout] table (the `Rollout` fields; schedule as a table)",
    "progress": "the `progress` key (auto, bar, lines, none) and `progress_interval_s`",
}
#: `TrainingLoop` parameters with no run-config key: their values are Python objects.
LOOP_EXCLUDED: dict[str, str] = {
    "sharding": "a backend-specific Python object (e.g. an Equinox ShardingSpec over a "
    "device mesh); a config file has no way to build one",
    "sweep_id": "set by pipekit_train.sweep on each trial it runs, not by a user",
}
#: `Checkpoint` fields with no `[checkpoint]` key.
CHECKPOINT_EXCLUDED: dict[str, str] = {
    "storage_options": "credentials do not belong in a run config (writers such as W&B "
    "record the config); fsspec reads them from the environment (AWS_ACCESS_KEY_ID, ...)",
}


def loop_keys() -> tuple[str, ...]:
    """The top-level run-config keys that are `TrainingLoop` keyword arguments.

    Derived from `TrainingLoop`'s signature: every parameter that is not spelled another
    way (`LOOP_ELSEWHERE`) or a Python object (`LOOP_EXCLUDED`), so a parameter added to
    `TrainingLoop` is a config key without an edit here.
    """
    from pipekit_train.core.train._training_loop import TrainingLoop

    params = inspect.signature(TrainingLoop).parameters
    return tuple(n for n in params if n not in LOOP_ELSEWHERE and n not in LOOP_EXCLUDED)


def checkpoint_keys() -> tuple[str, ...]:
    """The `[checkpoint]` keys: the `Checkpoint` fields less `CHECKPOINT_EXCLUDED`."""
    return tuple(
        f.name for f in dataclasses.fields(Checkpoint) if f.name not in CHECKPOINT_EXCLUDED
    )


def _top_keys() -> tuple[str, ...]:
    return (
        "backend",
        "pythonpath",
        *loop_keys(),
        "progress",
        "progress_interval_s",
        "optimizer",
        "model",
        "data",
        "validation",
        "normalizer",
        "rollout",
        "checkpoint",
        "writers",
        "callbacks",
        "adapter",
        "registry",
    )


_POSITIVE_INTS = (
    "batch_size",
    "max_steps",
    "max_epochs",
    "validate_every_n_steps",
    "log_every_n_steps",
    "accumulate_grad_batches",
    "max_consecutive_skips",
)
_BOOLS = ("shuffle", "drop_remainder", "log_grad_norm", "restore_best")
_MODEL_KEYS = ("factory", "kwargs", "seed")
_DATA_KEYS = ("factory", "kwargs", "split", "split_seed")
_VALIDATION_KEYS = ("factory", "kwargs")
_NORMALIZER_KEYS = ("keys", "path", "per")
#: The `[rollout]` keys: the `Rollout` fields.
ROLLOUT_KEYS = tuple(f.name for f in dataclasses.fields(Rollout))
#: The keys of a `[rollout.schedule]` table that is a `RolloutSchedule`.
_SCHEDULE_KEYS = tuple(f.name for f in dataclasses.fields(RolloutSchedule))
_REGISTRY_KEYS = ("uri", "name")


@dataclass(frozen=True)
class FactorySpec:
    """A callable named by import path, with JSON keyword arguments."""

    factory: str
    kwargs: dict[str, Any]
    where: str  # the config field, for messages


@dataclass(frozen=True)
class ModelSpec:
    """The model operator: a factory per backend (or one with `{backend}`), kwargs, seed."""

    factory: str | dict[str, str]
    kwargs: dict[str, Any]
    seed: int

    def factory_for(self, backend: str) -> str:
        """The factory path for `backend`.

        Raises:
            ConfigError: a per-backend table without an entry for `backend`.
        """
        if isinstance(self.factory, str):
            return self.factory
        if backend not in self.factory:
            raise ConfigError(
                f"`model.factory` has no entry for backend {backend!r}. Received: "
                f"model.factory keys={sorted(self.factory)}. Add {backend} = 'module:function' "
                "to [model.factory], or use one path with '{backend}' in it."
            )
        return self.factory[backend]


@dataclass(frozen=True)
class ComponentSpec:
    """A writer or callback: a built-in `type` name or a `"module:Class"` path, and kwargs."""

    type: str
    kwargs: dict[str, Any]
    where: str
    wrap_async: bool = False


@dataclass(frozen=True)
class RunConfig:
    """A validated run config (see docs/cli.md for the file format).

    Attributes:
        source: the config file.
        raw: the config after overrides, as read (JSON values).
        backend: the chosen backend (`--backend` over the file's `backend`).
        pythonpath: folders put on `sys.path` while the run is built.
        loop: `TrainingLoop` keyword arguments that need no building (batch size, steps,
            seed, loss, metrics, optimizer config, schedules, flags).
        model: the model operator spec.
        data: the training data factory.
        split: `(train, validation)` fractions for splitting the data factory's dataset.
        split_seed: the seed of that split.
        validation: the validation data factory, if any.
        normalizer: `{"keys": [...]}` (fit on the training data) or `{"path": ...}`.
        checkpoint: the checkpoint policy, if any.
        writers: metric writers.
        callbacks: callbacks.
        adapter: keyword arguments of the backend's adapter.
        registry: `{"uri", "name"}` to register the trained model, if any.
        progress: `"auto"`, `"bar"`, `"lines"` or `"none"`.
        progress_interval_s: seconds between progress lines.
    """

    source: Path
    raw: dict[str, Any]
    backend: str
    pythonpath: tuple[Path, ...]
    loop: dict[str, Any]
    model: ModelSpec
    data: FactorySpec
    split: tuple[float, float] | None = None
    split_seed: int = 0
    validation: FactorySpec | None = None
    normalizer: dict[str, Any] | None = None
    checkpoint: Checkpoint | None = None
    writers: tuple[ComponentSpec, ...] = ()
    callbacks: tuple[ComponentSpec, ...] = ()
    adapter: dict[str, Any] = field(default_factory=dict)
    registry: dict[str, str] | None = None
    progress: str = "auto"
    progress_interval_s: float = 10.0


# -- reading and overriding ---------------------------------------------------------------


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Read a `.toml` or `.json` run config into a dict.

    Raises:
        ConfigError: the file is missing, has another suffix, or does not parse.
    """
    path = Path(path)
    if path.suffix not in (".toml", ".json"):
        raise ConfigError(
            f"The run config must be a .toml or .json file. Received: config={str(path)!r}. "
            "Rename it, e.g. run.toml."
        )
    try:
        text = path.read_text()
    except FileNotFoundError as exc:
        raise ConfigError(
            f"The run config file does not exist. Received: config={str(path)!r}."
        ) from exc
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        raise ConfigError(
            f"The run config {str(path)!r} does not parse as {path.suffix[1:].upper()}: {exc}. "
            "Fix the syntax at that position."
        ) from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"The run config must hold a table (a JSON object). Received: {type(data).__name__} "
            f"in {str(path)!r}."
        )
    return data


def _parse_value(text: str) -> Any:
    """A TOML value (`3`, `1e-3`, `true`, `"a"`, `[1, 2]`, `{a = 1}`), else the raw string."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `--set key.path=value` overrides to a copy of `config`.

    The value is read as a TOML value when it parses as one (`3`, `true`, `[1, 2]`,
    `"text"`), and as a plain string otherwise (`/tmp/run`, `keras`). A list element is
    addressed by its index (`writers.0.uri=...`). Missing tables are created.

    Raises:
        ConfigError: an override without `=` or with an empty key, or a path through a
            value that is not a table or list.
    """
    out: dict[str, Any] = json.loads(json.dumps(config))
    for item in overrides:
        key, sep, text = item.partition("=")
        parts = key.strip().split(".")
        if not sep or not all(parts):
            raise ConfigError(
                f"`--set` takes key=value (a dotted key, e.g. optimizer.lr=0.01). "
                f"Received: --set {item!r}."
            )
        node: Any = out
        for depth, part in enumerate(parts):
            last = depth == len(parts) - 1
            where = ".".join(parts[: depth + 1])
            if isinstance(node, list):
                if not part.isdigit() or int(part) >= len(node):
                    raise ConfigError(
                        f"`--set {key}`: `{'.'.join(parts[:depth])}` is a list of {len(node)}; "
                        f"address an element by its index 0..{len(node) - 1}. Received: {part!r}."
                    )
                if last:
                    node[int(part)] = _parse_value(text)
                else:
                    node = node[int(part)]
            elif isinstance(node, dict):
                if last:
                    node[part] = _parse_value(text)
                else:
                    node = node.setdefault(part, {})
            else:
                raise ConfigError(
                    f"`--set {key}`: `{where}` is inside a value that is not a table. "
                    f"Received: {'.'.join(parts[:depth])}={node!r}."
                )
    return out


def _substitute(value: Any, backend: str) -> Any:
    """Replace `{backend}` in every string of the config by the chosen backend."""
    if isinstance(value, str):
        return value.replace("{backend}", backend)
    if isinstance(value, list):
        return [_substitute(v, backend) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, backend) for k, v in value.items()}
    return value


# -- checks -----------------------------------------------------------------------------


def _did_you_mean(key: str, accepted: Sequence[str]) -> str:
    """A "Did you mean" hint: a close spelling, else the keys `key` begins (`every`)."""
    close = difflib.get_close_matches(key, accepted, n=1)
    if not close:
        close = [a for a in accepted if a.startswith(key) or key.startswith(a)]
    if not close:
        return ""
    if len(close) == 1:
        return f" Did you mean `{close[0]}`?"
    return f" Did you mean one of {', '.join(f'`{c}`' for c in close)}?"


def _unknown(where: str, table: Mapping[str, Any], accepted: Sequence[str]) -> None:
    extra = [k for k in table if k not in accepted]
    if not extra:
        return
    key = extra[0]
    name = f"{where}.{key}" if where else key
    hint = _did_you_mean(key, accepted)
    section = f"[{where}]" if where else "the top level"
    raise ConfigError(
        f"Unknown key `{name}` in the run config.{hint} Received: {name}={table[key]!r}. "
        f"Accepted keys at {section}: {list(accepted)}."
    )


def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"`{where}` must be a table. Received: {where}={value!r}. Write it as [{where}] "
            "with keys below it."
        )
    return dict(value)


def _seed(where: str, value: Any) -> int:
    return check_seed(value, name=where)


def _string(where: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"`{where}` must be a non-empty string. Received: {where}={value!r}.")
    return value


def _import_path(where: str, value: Any, example: str = "mypkg.models:mlp") -> str:
    if not isinstance(value, str) or ":" not in value or value.startswith(":"):
        raise ConfigError(
            f"`{where}` must be an import path 'module:name'. Received: {where}={value!r}. "
            f"Use e.g. {example!r}."
        )
    return value


def _kwargs(where: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    return _table(where, value)


def _factory_spec(where: str, table: Mapping[str, Any], accepted: Sequence[str]) -> FactorySpec:
    _unknown(where, table, accepted)
    if "factory" not in table:
        raise ConfigError(
            f"`{where}.factory` is required: the 'module:function' that returns the dataset. "
            f"Received: [{where}] keys={sorted(table)}."
        )
    return FactorySpec(
        factory=_import_path(f"{where}.factory", table["factory"], "mypkg.data:make_dataset"),
        kwargs=_kwargs(f"{where}.kwargs", table.get("kwargs")),
        where=where,
    )


def _model_spec(value: Any, seed: int) -> ModelSpec:
    table = _table("model", value)
    _unknown("model", table, _MODEL_KEYS)
    if "factory" not in table:
        raise ConfigError(
            "`model.factory` is required: the 'module:function' that builds the model, one "
            "path with '{backend}' in it or a table with one path per backend. Received: "
            f"[model] keys={sorted(table)}. Use e.g. factory = 'pipekit_train.{{backend}}.testing:mlp'."
        )
    factory = table["factory"]
    if isinstance(factory, Mapping):
        _unknown("model.factory", factory, backend_names())
        factory = {
            str(k): _import_path(f"model.factory.{k}", v, f"mypkg.{k}_models:mlp")
            for k, v in factory.items()
        }
        if not factory:
            raise ConfigError(
                "`model.factory` is an empty table. Received: model.factory={}. Add one "
                "'module:function' per backend, e.g. equinox = 'mypkg.models:eqx_mlp'."
            )
    else:
        factory = _import_path("model.factory", factory, "pipekit_train.{backend}.testing:mlp")
    return ModelSpec(
        factory=factory,
        kwargs=_kwargs("model.kwargs", table.get("kwargs")),
        seed=_seed("model.seed", table.get("seed", seed)),
    )


def _split(value: Any) -> tuple[float, float]:
    ok = (
        isinstance(value, Sequence)
        and not isinstance(value, str)
        and len(value) == 2
        and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and 0 < v < 1 for v in value
        )
        and sum(value) <= 1 + 1e-9
    )
    if not ok:
        raise ConfigError(
            "`data.split` must be two fractions in (0, 1) summing to at most 1: the training "
            f"and validation parts. Received: data.split={value!r}. Use e.g. [0.9, 0.1]."
        )
    return float(value[0]), float(value[1])


def _normalizer(value: Any) -> dict[str, Any]:
    table = _table("normalizer", value)
    _unknown("normalizer", table, _NORMALIZER_KEYS)
    if sum(k in table for k in _NORMALIZER_KEYS) != 1:
        raise ConfigError(
            "`normalizer` needs exactly one of `keys` (fit on the training data), `path` "
            "(a saved Normalizer JSON) and `per` (the trajectory normalizer of "
            f"TrajectoryWindows data). Received: [normalizer] keys={sorted(table)}. "
            'Use e.g. keys = ["x", "y"], or per = "channel" for trajectory windows.'
        )
    if "per" in table:
        if table["per"] not in ("channel", "feature"):
            raise ConfigError(
                "`normalizer.per` must be 'channel' or 'feature' (statistics per channel, "
                f"or per grid point and channel). Received: normalizer.per={table['per']!r}."
            )
        return {"per": table["per"]}
    if "keys" in table:
        keys = table["keys"]
        if isinstance(keys, str):
            keys = [keys]
        if (
            not isinstance(keys, Sequence)
            or not keys
            or not all(isinstance(k, str) and k for k in keys)
        ):
            raise ConfigError(
                "`normalizer.keys` must be a list of sample keys. "
                f'Received: normalizer.keys={table["keys"]!r}. Use e.g. ["x", "y"].'
            )
        return {"keys": list(keys)}
    return {"path": _string("normalizer.path", table["path"])}


def _schedule(value: Any) -> Any:
    """`rollout.schedule`: a `RolloutSchedule` table, `{update = k}` or `[[update, k], ...]`."""
    if isinstance(value, Mapping) and any(k in _SCHEDULE_KEYS for k in value):
        _unknown("rollout.schedule", value, _SCHEDULE_KEYS)
        try:
            return RolloutSchedule(**value)
        except ConfigError as exc:
            raise ConfigError(f"[rollout.schedule] {exc}") from exc
    if isinstance(value, Mapping):
        stages: dict[int, Any] = {}
        for key, k in value.items():
            if not (isinstance(key, str) and key.isdigit()):
                raise ConfigError(
                    "`rollout.schedule` maps the first update of each length (a whole number) "
                    f"to the length, or holds {list(_SCHEDULE_KEYS)}. Received: "
                    f"rollout.schedule.{key}={k!r}. Use e.g. schedule = {{0 = 1, 1000 = 4}}, "
                    "or schedule = {start = 1, every_n_steps = 1000, maximum = 4}."
                )
            stages[int(key)] = k
        return stages
    if isinstance(value, list):
        return [tuple(p) if isinstance(p, list) else p for p in value]
    raise ConfigError(
        "`rollout.schedule` must be a table ({0 = 1, 1000 = 4}, or start, every_n_steps and "
        f"maximum) or a list of [update, k] pairs. Received: rollout.schedule={value!r}."
    )


def _rollout(value: Any) -> Rollout:
    """The `[rollout]` table as a `Rollout` (its own checks, in config terms)."""
    table = _table("rollout", value)
    _unknown("rollout", table, ROLLOUT_KEYS)
    if "schedule" in table:
        table["schedule"] = _schedule(table["schedule"])
    if isinstance(table.get("weights"), list):
        table["weights"] = tuple(table["weights"])
    try:
        return Rollout(**table)
    except ConfigError as exc:
        raise ConfigError(f"[rollout] {exc}") from exc


def _checkpoint(value: Any) -> Checkpoint:
    if isinstance(value, str):
        value = {"directory": value}
    table = _table("checkpoint", value)
    _unknown("checkpoint", table, checkpoint_keys())
    if "directory" not in table:
        raise ConfigError(
            "`checkpoint.directory` is required. Received: [checkpoint] keys="
            f"{sorted(table)}. Use e.g. directory = 'runs/exp1/checkpoints'."
        )
    if table.get("max_to_keep") == "all":
        table["max_to_keep"] = None
    try:
        return Checkpoint(**table)
    except ConfigError as exc:
        raise ConfigError(f"[checkpoint] {exc}") from exc


def _component(where: str, value: Any, builtins: Mapping[str, str], kind: str) -> ComponentSpec:
    table = _table(where, value)
    if "type" not in table:
        raise ConfigError(
            f"`{where}.type` is required: a built-in {kind} ({sorted(builtins)}) or a "
            f"'module:Class' path. Received: {where} keys={sorted(table)}."
        )
    kind_name = table.pop("type")
    if not isinstance(kind_name, str) or (kind_name not in builtins and ":" not in kind_name):
        raise ConfigError(
            f"`{where}.type` must be a built-in {kind} or a 'module:Class' path. Received: "
            f"{where}.type={kind_name!r}. Built-in {kind}s: {sorted(builtins)}."
        )
    wrap = table.pop("async", False) if kind == "writer" else False
    if not isinstance(wrap, bool):
        raise ConfigError(
            f"`{where}.async` must be true or false. Received: {where}.async={wrap!r}."
        )
    return ComponentSpec(type=kind_name, kwargs=table, where=where, wrap_async=wrap)


def _components(
    name: str, value: Any, builtins: Mapping[str, str], kind: str
) -> tuple[ComponentSpec, ...]:
    if value is None:
        return ()
    if isinstance(value, Mapping) or not isinstance(value, Sequence) or isinstance(value, str):
        raise ConfigError(
            f"`{name}` must be an array of tables ([[{name}]] blocks in TOML). "
            f"Received: {name}={value!r}."
        )
    return tuple(_component(f"{name}[{i}]", v, builtins, kind) for i, v in enumerate(value))


def _adapter(value: Any) -> dict[str, dict[str, Any]]:
    table = _table("adapter", value)
    _unknown("adapter", table, backend_names())
    return {k: _table(f"adapter.{k}", v) for k, v in table.items()}


def _registry(value: Any) -> dict[str, str]:
    from pipekit_train.core.registry._registry import _check_name

    table = _table("registry", value)
    _unknown("registry", table, _REGISTRY_KEYS)
    for key in _REGISTRY_KEYS:
        if key not in table:
            raise ConfigError(
                f"`registry.{key}` is required. Received: [registry] keys={sorted(table)}. "
                "Use e.g. uri = 'runs/models' and name = 'emulator'."
            )
    uri = _string("registry.uri", table["uri"])
    try:
        name = _check_name(table["name"])
    except ConfigError as exc:
        raise ConfigError(f"[registry] {exc}") from exc
    return {"uri": uri, "name": name}


def _loss_and_metrics(raw: Mapping[str, Any]) -> tuple[Any, Any]:
    from pipekit_train.core import losses
    from pipekit_train.core import metrics as metric_lib

    loss = raw.get("loss", "mse")
    if not (isinstance(loss, str) and ":" in loss):  # a 'module:function' is imported later
        losses.get(loss)  # raises ConfigError naming the known losses
    metrics = raw.get("metrics")
    if metrics is None:
        return loss, None
    if isinstance(metrics, str):
        metrics = [metrics]
    names = metrics.values() if isinstance(metrics, Mapping) else metrics
    if not isinstance(metrics, (Mapping, list)):
        raise ConfigError(
            f'`metrics` must be a list of metric names. Received: metrics={metrics!r}. Use e.g. ["mae", "r2"].'
        )
    for name in names:
        if not (isinstance(name, str) and ":" in name):
            metric_lib.get(name)
    return loss, metrics


def load_run_config(
    path: str | Path,
    *,
    overrides: Sequence[str] = (),
    backend: str | None = None,
) -> RunConfig:
    """Read, override and validate a run config; nothing is imported or written.

    Args:
        path: the `.toml` or `.json` file.
        overrides: `--set key.path=value` items, applied in order.
        backend: `--backend`, which wins over the file's `backend`.

    Raises:
        ConfigError: the first problem found, naming the field, the value and the fix.
    """
    source = Path(path)
    raw = apply_overrides(read_config_file(source), overrides)
    _unknown("", raw, _top_keys())
    chosen = backend if backend is not None else raw.get("backend")
    installed = backend_names()
    if chosen is None:
        raise ConfigError(
            "No backend chosen. Received: backend=None. Set backend = 'equinox' (or one of "
            f"{list(installed)}) in the config file, or pass --backend."
        )
    if chosen not in installed:
        close = difflib.get_close_matches(str(chosen), installed, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"`backend` must be an installed backend, one of {list(installed)}.{hint} "
            f"Received: backend={chosen!r}. Another backend needs its package installed "
            f"(e.g. pip install pipekit-train-{chosen})."
        )
    raw = _substitute(raw, chosen)
    pythonpath = raw.get("pythonpath", [])
    if isinstance(pythonpath, str):
        pythonpath = [pythonpath]
    if not isinstance(pythonpath, list) or not all(isinstance(p, str) for p in pythonpath):
        raise ConfigError(
            f"`pythonpath` must be a list of folders (relative to the config file). "
            f'Received: pythonpath={pythonpath!r}. Use e.g. ["."].'
        )
    base = source.resolve().parent
    paths = tuple((base / p).resolve() for p in pythonpath)
    for folder in paths:
        if not folder.is_dir():
            raise ConfigError(
                f"`pythonpath` names a folder that does not exist: {str(folder)!r} (relative "
                f"paths are relative to the config file). Received: pythonpath={pythonpath!r}."
            )

    seed = _seed("seed", raw.get("seed", 0))
    loop: dict[str, Any] = {"seed": seed}
    for key in _POSITIVE_INTS:
        if key in raw:
            loop[key] = positive_int(key, raw[key])
    if "max_steps" not in loop and "max_epochs" not in loop:
        raise ConfigError(
            "Set `max_steps` or `max_epochs` so the run knows when to stop. "
            "Received: neither is in the config. Add e.g. max_steps = 1000."
        )
    for key in _BOOLS:
        if key in raw:
            if not isinstance(raw[key], bool):
                raise ConfigError(f"`{key}` must be true or false. Received: {key}={raw[key]!r}.")
            loop[key] = raw[key]
    if "on_nonfinite" in raw:
        choices = [p.value for p in NonFinitePolicy]
        if raw["on_nonfinite"] not in choices:
            raise ConfigError(
                f"`on_nonfinite` must be one of {choices}. "
                f"Received: on_nonfinite={raw['on_nonfinite']!r}."
            )
        loop["on_nonfinite"] = raw["on_nonfinite"]
    if "max_consecutive_skips" in loop and loop.get("on_nonfinite") != "skip":
        raise ConfigError(
            "`max_consecutive_skips` only applies when skipping non-finite steps. Received: "
            f"max_consecutive_skips={loop['max_consecutive_skips']}, "
            f'on_nonfinite={raw.get("on_nonfinite", "stop")!r}. Add on_nonfinite = "skip" '
            "to the config (or --set on_nonfinite=skip), or drop max_consecutive_skips."
        )
    checked = {"seed", "loss", "metrics", *_POSITIVE_INTS, *_BOOLS, "on_nonfinite"}
    for key in loop_keys():  # parameters without a check here: TrainingLoop checks them
        if key in raw and key not in checked:
            loop[key] = raw[key]
    loop["loss"], metrics = _loss_and_metrics(raw)
    if metrics is not None:
        loop["metrics"] = metrics
    if "rollout" in raw:
        loop["rollout"] = _rollout(raw["rollout"])
    if "optimizer" in raw:
        optimizer = _table("optimizer", raw["optimizer"])
        try:
            resolve_optimizer_config(optimizer)
        except ConfigError as exc:
            raise in_cli_terms(ConfigError(f"[optimizer] {exc}")) from exc
        loop["optimizer_config"] = optimizer

    progress = raw.get("progress", "auto")
    if progress not in PROGRESS:
        raise ConfigError(
            f"`progress` must be one of {list(PROGRESS)}. Received: progress={progress!r}."
        )
    interval = raw.get("progress_interval_s", 10.0)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not math.isfinite(interval)
        or interval <= 0
    ):
        raise ConfigError(
            "`progress_interval_s` must be a positive number of seconds. "
            f"Received: progress_interval_s={interval!r}."
        )

    if "model" not in raw:
        raise ConfigError(
            "The run config has no [model] table. Received: top-level keys="
            f"{sorted(raw)}. Add [model] with factory = 'module:function' and kwargs."
        )
    if "data" not in raw:
        raise ConfigError(
            "The run config has no [data] table. Received: top-level keys="
            f"{sorted(raw)}. Add [data] with factory = 'module:function' returning a dataset."
        )
    data_table = _table("data", raw["data"])
    data = _factory_spec("data", data_table, _DATA_KEYS)
    split = _split(data_table["split"]) if "split" in data_table else None
    validation = (
        _factory_spec("validation", _table("validation", raw["validation"]), _VALIDATION_KEYS)
        if "validation" in raw
        else None
    )
    if split is not None and validation is not None:
        raise ConfigError(
            "`data.split` and [validation] both define the validation data. Received: "
            f"data.split={list(split)} and validation.factory={validation.factory!r}. Keep one."
        )
    model = _model_spec(raw["model"], seed)
    model.factory_for(chosen)  # a per-backend table must name the chosen backend
    return RunConfig(
        source=source,
        raw=raw,
        backend=chosen,
        pythonpath=paths,
        loop=loop,
        model=model,
        data=data,
        split=split,
        split_seed=_seed("data.split_seed", data_table.get("split_seed", seed)),
        validation=validation,
        normalizer=_normalizer(raw["normalizer"]) if "normalizer" in raw else None,
        checkpoint=_checkpoint(raw["checkpoint"]) if "checkpoint" in raw else None,
        writers=_components("writers", raw.get("writers"), WRITERS, "writer"),
        callbacks=_components("callbacks", raw.get("callbacks"), CALLBACKS, "callback"),
        adapter=_adapter(raw.get("adapter", {})).get(chosen, {}),
        registry=_registry(raw["registry"]) if "registry" in raw else None,
        progress=progress,
        progress_interval_s=float(interval),
    )
