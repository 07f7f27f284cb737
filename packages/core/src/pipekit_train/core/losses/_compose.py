"""`Loss` objects: named, describable, composable losses, and the loss registry.

A `Loss` wraps a function `fn(pred, target, **params) -> scalar`. Every loss, built-in or
composed, has a JSON description (`describe()`) so a training plan can record it, and
`from_description` turns that description back into a loss.

Composition has one API with two spellings that build the same object:

- `Loss.weighted({"mse": 1.0, "mae": 0.1})` (or a list of `(loss, weight)` pairs), and
- arithmetic on `Loss` objects: `losses.mse + 0.1 * losses.mae`. `w * loss`, `loss * w`,
  `loss / w`, `loss + loss` and `sum([...])` all give a flat `WeightedLoss`.

Per-key losses for dict outputs: `Loss.per_key({"a": "mse", "b": "mae"}, weights={"b": 0.5})`.
"""

from __future__ import annotations

import difflib
import math
import numbers
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, TypeVar

from pipekit_train.core._errors import ConfigError
from pipekit_train.core._imports import import_string

__all__ = [
    "Loss",
    "PerKeyLoss",
    "WeightedLoss",
    "describe_callable",
    "from_description",
    "get",
    "names",
    "register",
]

T = TypeVar("T")


# --------------------------------------------------------------------------- helpers


def describe_callable(fn: Any) -> dict[str, Any]:
    """Describe a user callable as JSON.

    Args:
        fn: any callable.

    Returns:
        `{"import_path": "module:qualname"}` when the callable can be found again by that
        path in an already-imported module (nothing is imported to check), otherwise
        `{"callable": repr(fn)}` (informative only; it cannot be rebuilt).
    """
    describe = getattr(fn, "describe", None)
    if callable(describe) and not isinstance(fn, type):
        out = describe()
        if isinstance(out, dict):
            return out
    module = getattr(fn, "__module__", None)
    qualname = getattr(fn, "__qualname__", None)
    if (
        isinstance(module, str)
        and isinstance(qualname, str)
        and module != "__main__"
        and "<" not in qualname
    ):
        obj: Any = sys.modules.get(module)
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
        if obj is fn:
            return {"import_path": f"{module}:{qualname}"}
    return {"callable": repr(fn)}


def _check_weight(weight: Any, field: str) -> float:
    if (
        isinstance(weight, bool)
        or not isinstance(weight, numbers.Real)
        or not math.isfinite(float(weight))
    ):
        raise ConfigError(
            f"`{field}` must be a finite real number. Received: {field}={weight!r}. "
            "Pass a float such as 0.5."
        )
    return float(weight)


class _Registry(Generic[T]):
    """A name → object registry with the house error style (shared by losses and metrics)."""

    def __init__(self, kind: str, plural: str, wrap: Callable[[str, Callable[..., Any]], T]):
        self.kind = kind
        self.plural = plural
        self._wrap = wrap
        self._items: dict[str, T] = {}

    def names(self) -> list[str]:
        return sorted(self._items)

    def lookup(self, name: str) -> T | None:
        return self._items.get(name)

    def resolve(self, name: str, field: str) -> T:
        if isinstance(name, str) and name in self._items:
            return self._items[name]
        close = (
            difflib.get_close_matches(name, self._items, n=1, cutoff=0.5)
            if isinstance(name, str)
            else []
        )
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ConfigError(
            f"`{field}` names an unknown {self.kind}. Received: {field}={name!r}.{hint} "
            f"Known {self.plural}: {self.names()}. Pass one of these names, a callable "
            f"`fn(pred, target)`, or register your own with `register(name, fn)`."
        )

    def register(self, name: str, fn: Callable[..., Any], *, overwrite: bool) -> T:
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(
                f"`name` must be a non-empty string. Received: name={name!r}. "
                f"Pass the name the {self.kind} will be known by, e.g. 'my_{self.kind}'."
            )
        if not callable(fn):
            raise ConfigError(
                f"`fn` must be a callable `fn(pred, target)`. Received: fn={fn!r}. Pass a function."
            )
        if name in self._items and not overwrite:
            raise ConfigError(
                f"`name` is already registered as a {self.kind}. Received: name={name!r}. "
                "Pick another name or pass `overwrite=True` to replace it."
            )
        item = self._wrap(name, fn)
        self._items[name] = item
        return item


# --------------------------------------------------------------------------- Loss


class Loss:
    """A loss `loss(pred, target) -> scalar` with a JSON description.

    Built-in losses are `Loss` objects; any callable can be wrapped with `Loss(fn)`.
    Calling a loss with two positional arguments computes it. Calling it with keyword
    arguments only returns a copy with those parameters changed, so `losses.huber` is
    the default Huber loss and `losses.huber(delta=0.5)` another one.

    Args:
        fn: `fn(pred, target, **params) -> scalar`.
        name: the registry name; `describe()` uses it when the name is registered for
            this same function, and the import path of `fn` otherwise.
        params: default values of the keyword parameters of `fn` (JSON values).
        check: `check(params)` validates parameters, raising `ConfigError`.

    Examples:
        >>> from pipekit_train.core import losses
        >>> total = losses.mse + 0.1 * losses.mae
        >>> total.describe()["weighted"][1]
        {'weight': 0.1, 'loss': {'name': 'mae'}}
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        params: Mapping[str, Any] | None = None,
        check: Callable[[dict[str, Any]], None] | None = None,
    ):
        if not callable(fn):
            raise ConfigError(
                f"`fn` must be a callable `fn(pred, target)`. Received: fn={fn!r}. Pass a function."
            )
        self._fn = fn
        self._name = name
        self._params: dict[str, Any] = dict(params or {})
        self._check = check
        if check is not None:
            check(dict(self._params))
        self.__name__ = name or getattr(fn, "__name__", type(fn).__name__)
        self.__doc__ = getattr(fn, "__doc__", None) or type(self).__doc__

    # ------------------------------------------------------------------ properties
    @property
    def name(self) -> str | None:
        """The registry name, or `None` for an unnamed wrapper."""
        return self._name

    @property
    def params(self) -> dict[str, Any]:
        """A copy of the keyword parameters passed to `fn`."""
        return dict(self._params)

    @property
    def fn(self) -> Callable[..., Any]:
        """The wrapped function."""
        return self._fn

    # ------------------------------------------------------------------ calling
    def __call__(self, *args: Any, **params: Any) -> Any:
        """`loss(pred, target)` computes the loss; `loss(**params)` returns a configured copy."""
        if not args and params:
            return self.with_params(**params)
        if len(args) != 2 or params:
            raise TypeError(
                f"{self!r} is called as `loss(pred, target)` to compute the loss, or as "
                f"`loss(param=value)` to configure it; received {len(args)} positional and "
                f"{len(params)} keyword arguments."
            )
        return self._compute(args[0], args[1])

    def _compute(self, pred: Any, target: Any) -> Any:
        return self._fn(pred, target, **self._params)

    def with_params(self, **params: Any) -> Loss:
        """Return a copy of this loss with some parameters changed.

        Raises:
            ConfigError: a parameter name is not one this loss takes, or a value is invalid.
        """
        unknown = sorted(set(params) - set(self._params))
        if unknown:
            label = self._name or self.__name__
            accepted = sorted(self._params) or "none"
            raise ConfigError(
                f"`{label}` does not take the parameter(s) {unknown}. "
                f"Received: {', '.join(f'{k}={params[k]!r}' for k in unknown)}. "
                f"Accepted parameters: {accepted}."
            )
        return type(self)(
            self._fn, name=self._name, params={**self._params, **params}, check=self._check
        )

    # ------------------------------------------------------------------ description
    def describe(self) -> dict[str, Any]:
        """A JSON description: `{"name": ...}` (+ `"params"`) or the callable's import path."""
        out: dict[str, Any]
        registered = _REGISTRY.lookup(self._name) if self._name else None
        if registered is not None and registered._fn is self._fn:
            out = {"name": self._name}
        else:
            out = describe_callable(self._fn)
        if self._params:
            out["params"] = dict(self._params)
        return out

    def __repr__(self) -> str:
        label = self._name or self.__name__
        if self._params:
            args = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
            return f"Loss({label}, {args})"
        return f"Loss({label})"

    # ------------------------------------------------------------------ composition
    @classmethod
    def weighted(cls, terms: Mapping[Any, float] | Iterable[tuple[Any, float]]) -> WeightedLoss:
        """A weighted sum of losses.

        Args:
            terms: `{loss: weight}` (losses as names, `Loss` objects or callables), or a list
                of `(loss, weight)` pairs (use pairs to repeat a loss).

        Returns:
            A `WeightedLoss` computing `sum(weight * loss(pred, target))`.

        Raises:
            ConfigError: empty terms, an unknown loss name or a non-finite weight.
        """
        items = list(terms.items()) if isinstance(terms, Mapping) else list(terms)
        if not items:
            raise ConfigError(
                f"`terms` must name at least one loss. Received: terms={terms!r}. "
                "Pass e.g. {'mse': 1.0, 'mae': 0.1}."
            )
        out: list[tuple[float, Loss]] = []
        for item in items:
            if not isinstance(item, tuple) or len(item) != 2:
                raise ConfigError(
                    f"`terms` must be a mapping or a list of (loss, weight) pairs. "
                    f"Received: terms={terms!r}. Pass e.g. [('mse', 1.0), ('mae', 0.1)]."
                )
            loss, weight = item
            out.append((_check_weight(weight, "weight"), get(loss, field="terms")))
        return WeightedLoss(out)

    @classmethod
    def per_key(
        cls, losses: Mapping[str, Any], weights: Mapping[str, float] | None = None
    ) -> PerKeyLoss:
        """A loss for dict outputs: one loss per key, summed with weights.

        `pred` and `target` must be mappings holding every configured key (extra keys,
        e.g. auxiliary outputs, are ignored).

        Args:
            losses: `{key: loss}` with losses as names, `Loss` objects or callables.
            weights: `{key: weight}`; keys left out weigh 1.0.

        Returns:
            A `PerKeyLoss` computing `sum(weights[k] * losses[k](pred[k], target[k]))`.

        Raises:
            ConfigError: empty losses, a weight for a key without a loss, a bad weight.
        """
        if not isinstance(losses, Mapping) or not losses:
            raise ConfigError(
                f"`losses` must be a non-empty mapping {{key: loss}}. Received: losses={losses!r}. "
                "Pass e.g. {'a': 'mse', 'b': 'mae'}."
            )
        weights = dict(weights or {})
        extra = sorted(set(weights) - set(losses), key=str)
        if extra:
            raise ConfigError(
                f"`weights` has keys without a loss. Received: weights keys {extra}, "
                f"loss keys {sorted(losses, key=str)}. Give a weight only to keys in `losses`."
            )
        parts = {
            str(key): (
                _check_weight(weights.get(key, 1.0), f"weights[{key!r}]"),
                get(loss, field=f"losses[{key!r}]"),
            )
            for key, loss in losses.items()
        }
        return PerKeyLoss(parts)

    def _terms(self) -> list[tuple[float, Loss]]:
        return [(1.0, self)]

    def __mul__(self, weight: Any) -> WeightedLoss:
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            return NotImplemented
        w = _check_weight(weight, "weight")
        return WeightedLoss([(w * w_i, loss) for w_i, loss in self._terms()])

    __rmul__ = __mul__

    def __truediv__(self, weight: Any) -> WeightedLoss:
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real):
            return NotImplemented
        if weight == 0:
            raise ConfigError(
                "Dividing a loss by zero. Received: weight=0. Divide by a nonzero number."
            )
        return self * (1.0 / float(weight))

    def __add__(self, other: Any) -> Loss:
        if isinstance(other, numbers.Number) and other == 0:
            return self
        if not (isinstance(other, (Loss, str)) or callable(other)):
            return NotImplemented
        other_loss = get(other, field="loss")
        return WeightedLoss([*self._terms(), *other_loss._terms()])

    def __radd__(self, other: Any) -> Loss:
        if isinstance(other, numbers.Number) and other == 0:  # sum([...]) starts at 0
            return self
        if not (isinstance(other, str) or callable(other)):
            return NotImplemented
        other_loss = get(other, field="loss")
        return WeightedLoss([*other_loss._terms(), *self._terms()])


class WeightedLoss(Loss):
    """`sum(weight * loss(pred, target))` over its terms (see `Loss.weighted`)."""

    def __init__(self, terms: Iterable[tuple[float, Loss]]):
        self._wterms = [(float(w), loss) for w, loss in terms]
        super().__init__(self._evaluate, name=None)
        self.__name__ = "weighted"
        self.__doc__ = WeightedLoss.__doc__

    @property
    def terms(self) -> list[tuple[float, Loss]]:
        """The `(weight, loss)` terms."""
        return list(self._wterms)

    def _evaluate(self, pred: Any, target: Any) -> Any:
        total: Any = None
        for weight, loss in self._wterms:
            value = loss(pred, target)
            if weight != 1.0:
                value = weight * value
            total = value if total is None else total + value
        return total

    def _terms(self) -> list[tuple[float, Loss]]:
        return list(self._wterms)

    def with_params(self, **params: Any) -> Loss:
        """Composed losses take no parameters; configure the terms instead."""
        raise ConfigError(
            f"A weighted loss takes no parameters. Received: {params!r}. "
            "Configure the terms, e.g. `losses.huber(delta=0.5) + losses.mse`."
        )

    def describe(self) -> dict[str, Any]:
        """`{"weighted": [{"weight": w, "loss": <description>}, ...]}`."""
        return {"weighted": [{"weight": w, "loss": loss.describe()} for w, loss in self._wterms]}

    def __repr__(self) -> str:
        return " + ".join(f"{w!r} * {loss!r}" for w, loss in self._wterms)


class PerKeyLoss(Loss):
    """One loss per key of dict outputs, summed with weights (see `Loss.per_key`)."""

    def __init__(self, parts: Mapping[str, tuple[float, Loss]]):
        self._parts = dict(parts)
        super().__init__(self._evaluate, name=None)
        self.__name__ = "per_key"
        self.__doc__ = PerKeyLoss.__doc__

    @property
    def parts(self) -> dict[str, tuple[float, Loss]]:
        """`{key: (weight, loss)}`."""
        return dict(self._parts)

    def _evaluate(self, pred: Any, target: Any) -> Any:
        for field, value in (("pred", pred), ("target", target)):
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"`{field}` must be a dict for a per-key loss. "
                    f"Received: {field} of type {type(value).__name__}. "
                    f"Return a dict with keys {sorted(self._parts)} from the model and the data."
                )
            missing = [k for k in self._parts if k not in value]
            if missing:
                raise ConfigError(
                    f"`{field}` lacks key(s) {missing} that the per-key loss needs. "
                    f"Received: {field} keys {sorted(map(str, value))}. "
                    f"Provide every key of {sorted(self._parts)}."
                )
        total: Any = None
        for key, (weight, loss) in self._parts.items():
            value = loss(pred[key], target[key])
            if weight != 1.0:
                value = weight * value
            total = value if total is None else total + value
        return total

    def with_params(self, **params: Any) -> Loss:
        """Composed losses take no parameters; configure the per-key losses instead."""
        raise ConfigError(
            f"A per-key loss takes no parameters. Received: {params!r}. "
            "Configure the per-key losses, e.g. {'a': losses.huber(delta=0.5)}."
        )

    def describe(self) -> dict[str, Any]:
        """`{"per_key": {key: {"weight": w, "loss": <description>}, ...}}`."""
        return {
            "per_key": {
                k: {"weight": w, "loss": loss.describe()} for k, (w, loss) in self._parts.items()
            }
        }

    def __repr__(self) -> str:
        inner = ", ".join(f"{k!r}: {w!r} * {loss!r}" for k, (w, loss) in self._parts.items())
        return f"PerKeyLoss({{{inner}}})"


# --------------------------------------------------------------------------- registry


def _wrap_registered(name: str, fn: Callable[..., Any]) -> Loss:
    if isinstance(fn, Loss):
        if isinstance(fn, (WeightedLoss, PerKeyLoss)):
            return fn
        return Loss(fn.fn, name=name, params=fn.params, check=fn._check)
    return Loss(fn, name=name)


_REGISTRY: _Registry[Loss] = _Registry("loss", "losses", _wrap_registered)


def names() -> list[str]:
    """The registered loss names, sorted."""
    return _REGISTRY.names()


def register(name: str, fn: Callable[..., Any] | None = None, *, overwrite: bool = False) -> Any:
    """Register a loss under `name` so `get(name)` and `loss="name"` find it.

    Usable directly, `register("my_loss", fn)`, or as a decorator, `@register("my_loss")`.

    Args:
        name: the name.
        fn: `fn(pred, target) -> scalar` (a plain function or a `Loss`).
        overwrite: replace an existing registration of the same name.

    Returns:
        The registered `Loss` (direct form) or a decorator returning `fn` unchanged.

    Raises:
        ConfigError: the name is empty or taken (without `overwrite`), or `fn` is not callable.
    """
    if fn is None:

        def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
            _REGISTRY.register(name, func, overwrite=overwrite)
            return func

        return decorator
    return _REGISTRY.register(name, fn, overwrite=overwrite)


def get(name_or_callable: Any, *, field: str = "loss") -> Loss:
    """Resolve a loss.

    Args:
        name_or_callable: a registered name (`"mse"`), a `Loss`, any callable
            `fn(pred, target)` (wrapped in a `Loss`; a backend-native function works only
            on its backend), or a description dict as returned by `Loss.describe()`.
        field: the user-facing field name used in error messages.

    Returns:
        A `Loss`.

    Raises:
        ConfigError: an unknown name (the message lists the known ones) or an unusable value.
    """
    obj = name_or_callable
    if isinstance(obj, Loss):
        return obj
    if isinstance(obj, str):
        return _REGISTRY.resolve(obj, field)
    if isinstance(obj, Mapping):
        return from_description(obj, field=field)
    if callable(obj):
        return Loss(obj)
    raise ConfigError(
        f"`{field}` must be a loss name, a callable `fn(pred, target)` or a loss description. "
        f"Received: {field}={obj!r}. Pass e.g. 'mse'; known names: {names()}."
    )


def from_description(description: Mapping[str, Any], *, field: str = "loss") -> Loss:
    """Rebuild a loss from its `describe()` output.

    Raises:
        ConfigError: the description is malformed, names an unknown loss, or describes a
            callable that is not importable (`{"callable": ...}`).
    """
    d = description
    if "name" in d:
        loss = _REGISTRY.resolve(d["name"], field)
        return loss.with_params(**d["params"]) if d.get("params") else loss
    if "import_path" in d:
        fn = import_string(d["import_path"], field=f"{field}['import_path']")
        loss = fn if isinstance(fn, Loss) else Loss(fn)
        return loss.with_params(**d["params"]) if d.get("params") else loss
    if "weighted" in d:
        return Loss.weighted(
            [(from_description(t["loss"], field=field), t["weight"]) for t in d["weighted"]]
        )
    if "per_key" in d:
        parts = d["per_key"]
        return Loss.per_key(
            {k: from_description(v["loss"], field=field) for k, v in parts.items()},
            weights={k: v["weight"] for k, v in parts.items()},
        )
    if "callable" in d:
        raise ConfigError(
            f"`{field}` describes a callable that cannot be imported, so it cannot be rebuilt. "
            f"Received: {field}={dict(d)!r}. Define the loss at module level in an importable "
            "module, or register it with `losses.register(name, fn)`."
        )
    raise ConfigError(
        f"`{field}` is not a loss description. Received: {field}={dict(d)!r}. Pass a dict with "
        "one of the keys 'name', 'import_path', 'weighted' or 'per_key' (see `Loss.describe`)."
    )
