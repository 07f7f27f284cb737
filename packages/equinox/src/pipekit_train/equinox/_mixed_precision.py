"""Mixed precision: a jmp-style dtype policy and a dynamic loss scale.

A policy string names three dtypes, as jmp does:
`"params=float32,compute=bfloat16,output=float32"` (short forms `p=f32,c=bf16,o=f32`;
a single dtype such as `"bfloat16"` means `params=float32,compute=bfloat16,output=float32`).
Parameters are stored in `params`; the forward pass casts the model's floating arrays
and the floating inputs to `compute`; the prediction is cast to `output` before the loss.

float16 underflows small gradients, so a float16 compute dtype turns on dynamic loss
scaling by default: the loss is multiplied by a scale before differentiation, the
gradients are divided by it, a step with non-finite gradients is skipped (parameters,
optimizer and layer state unchanged) and halves the scale; `period` finite steps in a
row double it. (jmp 0.0.4's `DynamicLossScale` cannot cross `jax.jit` boundaries as an
`eqx.Module` field, so this module carries its own ~20-line version.)

Which policy a run's `Equinox(precision=...)` means is `_precision.native_precision`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int, PyTree

import equinox as eqx
from pipekit_train.core.adapter import ConfigError

Scalar = Float[Array, ""]
IntScalar = Int[Array, ""]
BoolScalar = Bool[Array, ""]

__all__ = ["DynamicLossScale", "Policy", "all_finite", "parse_policy"]

_DTYPES: Final[dict[str, Any]] = {
    "float32": jnp.float32,
    "f32": jnp.float32,
    "full": jnp.float32,
    "single": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "f16": jnp.float16,
    "half": jnp.float16,
}
_KEYS: Final[dict[str, str]] = {
    "params": "params",
    "param": "params",
    "p": "params",
    "compute": "compute",
    "c": "compute",
    "output": "output",
    "o": "output",
}
_EXAMPLE: Final = "'params=float32,compute=bfloat16,output=float32'"


@dataclass(frozen=True)
class Policy:
    """Three dtypes: parameter storage, forward computation, model output."""

    params: Any = jnp.float32
    compute: Any = jnp.float32
    output: Any = jnp.float32

    @property
    def is_full(self) -> bool:
        """Whether everything runs in float32 (no casts at all)."""
        return (
            self.params == jnp.float32
            and self.compute == jnp.float32
            and self.output == jnp.float32
        )

    def __str__(self) -> str:
        name = lambda d: jnp.dtype(d).name  # noqa: E731
        return f"params={name(self.params)},compute={name(self.compute)},output={name(self.output)}"

    @staticmethod
    def _cast(tree: PyTree, dtype: Any) -> PyTree:
        def cast(x: Any) -> Any:
            if eqx.is_inexact_array(x) and x.dtype != dtype:
                return x.astype(dtype)
            return x

        return jax.tree.map(cast, tree)

    def cast_to_param(self, tree: PyTree) -> PyTree:
        """Floating arrays of `tree` in the parameter dtype."""
        return self._cast(tree, self.params)

    def cast_to_compute(self, tree: PyTree) -> PyTree:
        """Floating arrays of `tree` in the compute dtype."""
        return self._cast(tree, self.compute)

    def cast_to_output(self, tree: PyTree) -> PyTree:
        """Floating arrays of `tree` in the output dtype."""
        return self._cast(tree, self.output)


def parse_policy(spec: Any) -> Policy:
    """Parse a policy string (or a `jmp.Policy`, or a `Policy`).

    Raises:
        ConfigError: an unknown key or dtype.
    """
    if spec is None:
        return Policy()
    if isinstance(spec, Policy):
        return spec
    if all(
        hasattr(spec, a) for a in ("param_dtype", "compute_dtype", "output_dtype")
    ):  # jmp.Policy
        return Policy(spec.param_dtype, spec.compute_dtype, spec.output_dtype)
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(
            f"`precision` must be a policy string such as {_EXAMPLE}. Received: precision={spec!r}."
        )
    text = spec.strip().lower()
    if "=" not in text:
        if text not in _DTYPES:
            raise ConfigError(
                f"`precision` names an unknown dtype. Received: precision={spec!r}. "
                f"Use one of {sorted(set(_DTYPES))} or a full policy such as {_EXAMPLE}."
            )
        return Policy(jnp.float32, _DTYPES[text], jnp.float32)
    values: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = (s.strip() for s in part.partition("="))
        if not sep or key not in _KEYS:
            raise ConfigError(
                f"`precision` has an unknown entry {part.strip()!r}. Received: precision={spec!r}. "
                f"Use the keys params, compute and output, e.g. {_EXAMPLE}."
            )
        if value not in _DTYPES:
            raise ConfigError(
                f"`precision` has an unknown dtype {value!r} for {key}. Received: precision={spec!r}. "
                f"Use one of {sorted(set(_DTYPES))}."
            )
        values[_KEYS[key]] = _DTYPES[value]
    return Policy(**values)


class DynamicLossScale(eqx.Module):
    """A dynamic loss scale that lives inside the train state.

    Attributes:
        scale: the current scale (float32 scalar).
        counter: finite steps since the last change (int32 scalar).
        period: finite steps after which the scale doubles.
        factor: the growth/shrink factor.
        min_scale: the scale never drops below this.
    """

    scale: Scalar
    counter: IntScalar
    period: int = eqx.field(static=True, default=2000)
    factor: float = eqx.field(static=True, default=2.0)
    min_scale: float = eqx.field(static=True, default=1.0)

    @classmethod
    def create(
        cls,
        initial: float = 2.0**15,
        *,
        period: int = 2000,
        factor: float = 2.0,
        min_scale: float = 1.0,
    ) -> DynamicLossScale:
        """A fresh loss scale."""
        return cls(
            jnp.asarray(initial, jnp.float32), jnp.asarray(0, jnp.int32), period, factor, min_scale
        )

    def scale_loss(self, loss: Scalar) -> Scalar:
        """`loss * scale` (in float32)."""
        return loss.astype(jnp.float32) * self.scale

    def unscale(self, grads: PyTree) -> PyTree:
        """Gradients divided by the scale."""
        inv = 1.0 / self.scale
        return jax.tree.map(lambda g: (g * inv).astype(g.dtype), grads)

    def adjust(self, finite: BoolScalar) -> DynamicLossScale:
        """The next scale after a step whose gradients were (not) all finite."""
        grow = self.counter + 1 >= self.period
        scale = jnp.where(
            finite,
            jnp.where(grow, self.scale * self.factor, self.scale),
            jnp.maximum(self.scale / self.factor, self.min_scale),
        )
        counter = jnp.where(finite & ~grow, self.counter + 1, 0).astype(jnp.int32)
        return DynamicLossScale(
            scale.astype(jnp.float32), counter, self.period, self.factor, self.min_scale
        )


def all_finite(tree: PyTree) -> BoolScalar:
    """Whether every floating array of `tree` is finite."""
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if eqx.is_inexact_array(x)]
    if not leaves:
        return jnp.asarray(True)
    return jnp.stack(leaves).all()
