"""A conditional normalizing flow's mathematics, written once against the array API.

A *flow head* predicts, per sample, every parameter of a normalizing flow over a target
of `d` values (`d >= 1`): the network maps `x` to one output vector, and the flow's
mathematics (transforms, log-determinants, inverse) lives here once, written against the
Python array API, so it runs unchanged on numpy, jax and torch arrays. The network stays
an ordinary model (an MLP, an embedding and an MLP, ...) on every backend.

**The flow.** `flow_layers` layers `L` map a target `theta` to a base point `z` (the
*normalizing* direction), and `z` is standard normal:

    h_0 = theta;  a = A_l h_{l-1} + b_l;  h_l = s_l(a)  for l = 1..L;  z = h_L ~ N(0, I)

- `A_l = Lower_l @ Upper_l`: `Lower_l` unit lower-triangular, `Upper_l` upper-triangular
  with a positive diagonal `softplus(r + c) + 1e-3` (`c` makes a raw value 0 a diagonal
  of exactly 1). Invertible for any network output; `log|det A_l| = sum(log diag)`.
  Every layer mixes all dimensions.
- `s_l`: an element-wise monotone rational-quadratic spline (Durkan et al. 2019, *Neural
  spline flows*) on each of the `d` values, with `flow_bins` bins on `[-B, B]`
  (`B = flow_bound`) and the identity outside (its derivative is 1 at both ends, so the
  map is continuously differentiable). Bin widths and heights are softmaxes of the raw
  values (at least `1e-3` of the interval each), interior knot derivatives `softplus(r +
  c) + 1e-3` (a raw 0 is a derivative of 1: all-zero raw values are the identity).

The log-density is exact: `log p(theta) = log N(z; 0, I) + sum_l (log|det A_l| + sum_i
log s_l'(a_i))`, each term a log of a positive quantity computed directly (no
determinant of a product). Sampling runs the inverse: `z ~ N(0, I)`, each spline inverted
by solving its quadratic, each `A_l` by two triangular solves (`flow_inverse`).

**Output layout.** The last axis holds `flow_layers` blocks of `flow_layer_width(d, K)`
values (`K = flow_bins`), layer 1 first; within a block, in this order:

| slice of the block                               | meaning                                          |
|--------------------------------------------------|--------------------------------------------------|
| `[0, d*K)`                                       | spline bin-width logits, `(d, K)` row-major      |
| `[d*K, 2*d*K)`                                   | spline bin-height logits, `(d, K)`               |
| `[2*d*K, 2*d*K + d*(K-1))`                        | raw interior knot derivatives, `(d, K-1)`        |
| next `d*(d-1)/2`                                 | `Lower`'s strictly-lower entries, row by row (`(1,0), (2,0), (2,1), ...`) |
| next `d*(d-1)/2`                                 | `Upper`'s strictly-upper entries, row by row (`(0,1), (0,2), ..., (1,2), ...`) |
| next `d`                                         | raw diagonal of `Upper`                          |
| last `d`                                         | the shift `b`                                    |

So a block is `d*(3K - 1) + d*d + d` values and the width `flow_width(d, L, K) =
L * (d*(3K - 1) + d*d + d)`. The loss `losses.flow_nll` is `-mean(flow_log_prob)` over
samples; `Flow` (`_flow`) reads the same layout in numpy.

**Coupling (`flow_hidden = H > 0`, `d >= 2`).** The element-wise splines carry no
dependence *between* values; with `flow_hidden` each layer also couples them, still as a
pure function of the network output (a *hypernetwork* coupling: the network outputs the
conditioner's weights too, per sample). The target splits into the first `d_a = d // 2`
values (`A`) and the other `d_b = d - d_a` (`B`); one fixed split is enough because the
LU map of the next layer mixes every value into both halves. In each layer, after the
affine map `a = A_l h + b_l`:

    y_A = s(a_A);  u = tanh(W1 y_A + c1);  delta = W2 u + c2;  y_B = s_delta(a_B)

`s` is the element-wise spline of the `A` rows with the layer's raw spline values, and
`s_delta` the spline of the `B` rows with their raw values plus `delta` (`P = d_b*(3K - 1)`
values, read as `(d_b, K)` width logits, `(d_b, K)` height logits and `(d_b, K-1)` raw
derivatives, in that order). All-zero conditioner values give `delta = 0`: the
element-wise layer. The Jacobian of a layer is block-triangular (`y_A` does not depend on
`a_B`), so the log-determinant stays exact: `log|det A_l|` plus the log-derivatives of
both halves' splines. The inverse runs the `A` half first (its output `y_A` is the
conditioner's input), then the `B` half, then the affine inverse.

The conditioner's values follow each layer's block above (so the element-wise layout is
a prefix of the block), row-major:

| slice after the element-wise block  | meaning                                          |
|-------------------------------------|--------------------------------------------------|
| first `H*d_a`                       | `W1`, `(H, d_a)`                                 |
| next `H`                            | `c1`                                             |
| next `P*H`                          | `W2`, `(P, H)`                                   |
| last `P`                            | `c2`                                             |

A coupled block is `d*(3K - 1) + d*d + d + H*d_a + H + P*H + P` values
(`flow_layer_width(d, K, H)`). `flow_hidden = 0` (the default) is the element-wise flow,
layout and numbers unchanged.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

import array_api_compat

from pipekit_train.core._errors import ConfigError

from ._mixture_math import log_softmax

__all__ = [
    "FLOW_DEFAULTS",
    "check_params",
    "flow_inverse",
    "flow_layer_width",
    "flow_log_prob",
    "flow_transform",
    "flow_width",
]

#: `flow_nll`'s parameters and their defaults (also the flow head's options).
FLOW_DEFAULTS: dict[str, Any] = {
    "flow_layers": 4,
    "flow_bins": 8,
    "flow_bound": 3.0,
    "flow_hidden": 0,
}

_LOG_2PI = math.log(2.0 * math.pi)
_MIN_BIN = 1e-3  # the smallest bin width/height, as a share of the interval
_MIN_SLOPE = 1e-3  # the smallest knot derivative and `Upper` diagonal
_SHIFT = math.log(math.expm1(1.0 - _MIN_SLOPE))  # softplus(0 + _SHIFT) + _MIN_SLOPE == 1


def _coupling_width(dim: int, flow_bins: int, flow_hidden: int) -> int:
    """The conditioner's values in one layer (0 without coupling)."""
    if flow_hidden <= 0:
        return 0
    d_a = dim // 2
    p = (dim - d_a) * (3 * flow_bins - 1)
    return flow_hidden * d_a + flow_hidden + p * flow_hidden + p


def flow_layer_width(dim: int, flow_bins: int = 8, flow_hidden: int = 0) -> int:
    """The number of values one flow layer takes for `d = dim` target values, `K` bins and
    `flow_hidden` conditioner units (0: no coupling)."""
    return (
        dim * (3 * flow_bins - 1) + dim * dim + dim + _coupling_width(dim, flow_bins, flow_hidden)
    )


def flow_width(dim: int, flow_layers: int = 4, flow_bins: int = 8, flow_hidden: int = 0) -> int:
    """The size of the network's last output axis for a flow over `dim` values.

    Args:
        dim: `d`, the number of target values.
        flow_layers: `L`, the number of layers.
        flow_bins: `K`, the spline bins per layer and value.
        flow_hidden: `H`, the coupling conditioner's hidden units per layer (0: no
            coupling; `H > 0` needs `dim >= 2`).

    Raises:
        ConfigError: `flow_hidden > 0` with `dim < 2` (nothing to couple).

    Examples:
        >>> from pipekit_train.core.losses import flow_width
        >>> flow_width(2), flow_width(2, flow_layers=2, flow_bins=4)
        (208, 56)
        >>> flow_width(2, flow_layers=2, flow_bins=4, flow_hidden=3)  # + 2 * (3 + 3 + 33 + 11)
        156
    """
    check_coupling(dim, flow_hidden)
    return flow_layers * flow_layer_width(dim, flow_bins, flow_hidden)


def check_coupling(dim: int, flow_hidden: int, field: str = "target") -> None:
    """Refuse `flow_hidden > 0` for fewer than two target values (nothing to couple)."""
    if flow_hidden > 0 and dim < 2:
        raise ConfigError(
            f"`flow_hidden` couples the two halves of a target of at least 2 values. "
            f"Received: flow_hidden={flow_hidden}, but the {field} has {dim} value. Use "
            "flow_hidden=0 (the element-wise flow) for a single value."
        )


def check_params(params: dict[str, Any]) -> None:
    """Validate `flow_nll`'s parameters (`flow_layers`, `flow_bins`, `flow_bound`,
    `flow_hidden`)."""
    layers = params.get("flow_layers")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ConfigError(
            f"`flow_layers` must be a positive int for `flow_nll`. Received: "
            f"flow_layers={layers!r}. Pass e.g. flow_nll(flow_layers=4)."
        )
    bins = params.get("flow_bins")
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 2:
        raise ConfigError(
            f"`flow_bins` must be an int >= 2 for `flow_nll`. Received: flow_bins={bins!r}. "
            "Pass e.g. flow_nll(flow_bins=8)."
        )
    bound = params.get("flow_bound")
    if (
        isinstance(bound, bool)
        or not isinstance(bound, numbers.Real)
        or not math.isfinite(bound)
        or bound <= 0
    ):
        raise ConfigError(
            f"`flow_bound` must be a positive finite number for `flow_nll` (the splines act on "
            f"[-flow_bound, flow_bound]). Received: flow_bound={bound!r}. Pass e.g. "
            "flow_nll(flow_bound=3.0) for normalised targets."
        )
    hidden = params.get("flow_hidden", 0)
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 0:
        raise ConfigError(
            f"`flow_hidden` must be an int >= 0 for `flow_nll` (the coupling conditioner's "
            f"hidden units per layer; 0: no coupling). Received: flow_hidden={hidden!r}. "
            "Pass e.g. flow_nll(flow_hidden=32), or leave it out for the element-wise flow."
        )


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in x.shape)


def _softplus(xp: Any, a: Any) -> Any:
    return xp.maximum(a, xp.zeros_like(a)) + xp.log1p(xp.exp(-xp.abs(a)))


class _Spline:
    """Raw spline values of some rows: width and height logits `(..., n, K)` and raw
    interior derivatives `(..., n, K-1)`, on `[-bound, bound]`."""

    def __init__(self, widths: Any, heights: Any, derivs: Any, bound: float):
        self.widths, self.heights, self.derivs, self.bound = widths, heights, derivs, bound

    def rows(self, start: int, stop: int) -> _Spline:
        """The splines of rows `start:stop`."""
        return _Spline(
            self.widths[..., start:stop, :],
            self.heights[..., start:stop, :],
            self.derivs[..., start:stop, :],
            self.bound,
        )

    def shifted(self, xp: Any, delta: Any) -> _Spline:
        """These splines with `delta` `(..., n*(3K - 1))` added to their raw values."""
        lead = _shape(delta)[:-1]
        n, k = _shape(self.widths)[-2:]
        o = n * k
        dw = xp.reshape(delta[..., :o], (*lead, n, k))
        dh = xp.reshape(delta[..., o : 2 * o], (*lead, n, k))
        dd = xp.reshape(delta[..., 2 * o :], (*lead, n, k - 1))
        return _Spline(self.widths + dw, self.heights + dh, self.derivs + dd, self.bound)


class _Layer:
    """One layer's parameters, split from the output `(..., width)`."""

    def __init__(self, xp: Any, block: Any, d: int, k: int, bound: float, hidden: int = 0):
        lead = _shape(block)[:-1]
        m = d * (d - 1) // 2
        o = 0
        widths = xp.reshape(block[..., o : o + d * k], (*lead, d, k))
        o += d * k
        heights = xp.reshape(block[..., o : o + d * k], (*lead, d, k))
        o += d * k
        derivs = xp.reshape(block[..., o : o + d * (k - 1)], (*lead, d, k - 1))
        o += d * (k - 1)
        self.spline = _Spline(widths, heights, derivs, bound)
        self.lower = block[..., o : o + m]
        o += m
        self.upper = block[..., o : o + m]
        o += m
        self.diag = _softplus(xp, block[..., o : o + d] + _SHIFT) + _MIN_SLOPE
        o += d
        self.shift = block[..., o : o + d]
        o += d
        self.d, self.k, self.bound, self.hidden = d, k, bound, hidden
        if hidden > 0:
            d_a = d // 2
            p = (d - d_a) * (3 * k - 1)
            self.w1 = xp.reshape(block[..., o : o + hidden * d_a], (*lead, hidden, d_a))
            o += hidden * d_a
            self.c1 = block[..., o : o + hidden]
            o += hidden
            self.w2 = xp.reshape(block[..., o : o + p * hidden], (*lead, p, hidden))
            o += p * hidden
            self.c2 = block[..., o : o + p]

    def lower_at(self, i: int, j: int) -> Any:
        return self.lower[..., i * (i - 1) // 2 + j]

    def upper_at(self, i: int, j: int) -> Any:
        d = self.d
        return self.upper[..., i * (d - 1) - i * (i - 1) // 2 + (j - i - 1)]

    def coupled(self, xp: Any, y_a: Any) -> _Spline:
        """The `B` rows' splines given the `A` half's spline output `y_a` `(..., d_a)`."""
        u = xp.tanh(xp.matmul(self.w1, xp.expand_dims(y_a, axis=-1))[..., 0] + self.c1)
        delta = xp.matmul(self.w2, xp.expand_dims(u, axis=-1))[..., 0] + self.c2
        return self.spline.rows(self.d // 2, self.d).shifted(xp, delta)


def _layers(
    xp: Any, pred: Any, d: int, layers: int, bins: int, bound: float, hidden: int = 0
) -> list[_Layer]:
    w = flow_layer_width(d, bins, hidden)
    return [
        _Layer(xp, pred[..., i * w : (i + 1) * w], d, bins, bound, hidden) for i in range(layers)
    ]


# --------------------------------------------------------------------------- the affine map


def _affine(xp: Any, layer: _Layer, h: Any) -> Any:
    """`Lower @ Upper @ h + shift` over the last axis (d is small: one row at a time)."""
    d = layer.d
    v = []
    for i in range(d):
        row = layer.diag[..., i] * h[..., i]
        for j in range(i + 1, d):
            row = row + layer.upper_at(i, j) * h[..., j]
        v.append(row)
    out = []
    for i in range(d):
        row = v[i]
        for j in range(i):
            row = row + layer.lower_at(i, j) * v[j]
        out.append(row)
    return xp.stack(out, axis=-1) + layer.shift


def _affine_inverse(xp: Any, layer: _Layer, a: Any) -> Any:
    """Solve `Lower @ Upper @ h = a - shift` (forward, then back substitution)."""
    d = layer.d
    a = a - layer.shift
    v: list[Any] = []
    for i in range(d):
        row = a[..., i]
        for j in range(i):
            row = row - layer.lower_at(i, j) * v[j]
        v.append(row)
    h: list[Any] = [None] * d
    for i in reversed(range(d)):
        row = v[i]
        for j in range(i + 1, d):
            row = row - layer.upper_at(i, j) * h[j]
        h[i] = row / layer.diag[..., i]
    return xp.stack(h, axis=-1)


# --------------------------------------------------------------------------- the spline


def _edges(xp: Any, raw: Any, bound: float) -> tuple[Any, Any]:
    """`(left edges, sizes)` of the bins on `[-bound, bound]`, from their logits."""
    k = int(raw.shape[-1])
    p = xp.exp(log_softmax(xp, raw))
    p = _MIN_BIN + (1.0 - _MIN_BIN * k) * p
    cum = xp.cumulative_sum(p, axis=-1)
    return -bound + 2.0 * bound * (cum - p), 2.0 * bound * p


def _bin_parts(xp: Any, layer: _Spline, value: Any, on_heights: bool) -> tuple[Any, ...]:
    """The parameters of the bin holding each (clipped) value: `(x_k, w_k, y_k, h_k, d_k, d_k1)`."""
    xl, xw = _edges(xp, layer.widths, layer.bound)
    yl, yh = _edges(xp, layer.heights, layer.bound)
    inner = _softplus(xp, layer.derivs + _SHIFT) + _MIN_SLOPE
    one = xp.ones_like(inner[..., :1])
    d_left = xp.concat([one, inner], axis=-1)
    d_right = xp.concat([inner, one], axis=-1)
    edges = yl if on_heights else xl
    # `value >= edge` is a prefix of Trues (edges increase, the first is -bound): the
    # bin is the last True, a one-hot as the difference of neighbours (no integer gather)
    above = xp.astype(xp.expand_dims(value, axis=-1) >= edges, value.dtype)
    onehot = above - xp.concat([above[..., 1:], xp.zeros_like(above[..., :1])], axis=-1)

    def pick(a: Any) -> Any:
        return xp.sum(onehot * a, axis=-1)

    return pick(xl), pick(xw), pick(yl), pick(yh), pick(d_left), pick(d_right)


def _spline(xp: Any, layer: _Spline, x: Any) -> tuple[Any, Any]:
    """`(s(x), log s'(x))` element-wise; the identity (log-derivative 0) outside the bound."""
    b = layer.bound
    xc = xp.clip(x, -b, b)
    xk, wk, yk, hk, dk, dk1 = _bin_parts(xp, layer, xc, on_heights=False)
    s = hk / wk
    xi = (xc - xk) / wk
    t = xi * (1.0 - xi)
    den = s + (dk1 + dk - 2.0 * s) * t
    y = yk + hk * (s * xi * xi + dk * t) / den
    num = dk1 * xi * xi + 2.0 * s * t + dk * (1.0 - xi) * (1.0 - xi)
    log_d = 2.0 * xp.log(s) + xp.log(num) - 2.0 * xp.log(den)
    inside = (x >= -b) & (x <= b)
    return xp.where(inside, y, x), xp.where(inside, log_d, xp.zeros_like(log_d))


def _spline_inverse(xp: Any, layer: _Spline, y: Any) -> Any:
    """`s^{-1}(y)`: the root in `[0, 1]` of the bin's quadratic (the stable form)."""
    b = layer.bound
    yc = xp.clip(y, -b, b)
    xk, wk, yk, hk, dk, dk1 = _bin_parts(xp, layer, yc, on_heights=True)
    s = hk / wk
    dy = yc - yk
    c2 = dk1 + dk - 2.0 * s
    qa = hk * (s - dk) + dy * c2
    qb = hk * dk - dy * c2
    qc = -s * dy
    disc = qb * qb - 4.0 * qa * qc
    disc = xp.maximum(disc, xp.zeros_like(disc))
    xi = (2.0 * qc) / (-qb - xp.sqrt(disc))
    x = xk + xi * wk
    inside = (y >= -b) & (y <= b)
    return xp.where(inside, x, y)


# --------------------------------------------------------------------------- public functions


def _namespace(pred: Any, other: Any, field: str) -> tuple[Any, Any]:
    try:
        xp = array_api_compat.array_namespace(pred)
    except TypeError as exc:
        raise ConfigError(
            "`pred` must be an array (numpy, jax or torch) for `flow_nll`. Received: pred "
            f"of type {type(pred).__name__}. Pass the model output array."
        ) from exc
    try:
        array_api_compat.array_namespace(pred, other)
    except TypeError:
        other = xp.asarray(other, device=array_api_compat.device(pred))
    if not hasattr(other, "shape"):
        other = xp.asarray(other, device=array_api_compat.device(pred))
    if other.dtype != pred.dtype and xp.isdtype(pred.dtype, "real floating"):
        other = xp.astype(other, pred.dtype)
    return xp, other


def check_layout(
    pred: Any,
    target: Any,
    flow_layers: int,
    flow_bins: int,
    field: str = "target",
    flow_hidden: int = 0,
    *,
    broadcast: bool = False,
) -> int:
    """Check `pred`'s width against `target`'s `d` values and return `d` (`broadcast`:
    `pred`'s leading axes may be 1 where `target`'s are longer)."""
    if pred.ndim < 1 or target.ndim != pred.ndim or int(target.shape[-1]) < 1:
        raise ConfigError(
            f"`pred` and `{field}` need the same number of axes for `flow_nll`, the last "
            f"holding the flow's parameters and the {field}'s values. Received: "
            f"pred.shape={_shape(pred)}, {field}.shape={_shape(target)}. Give the {field} a "
            "trailing axis, e.g. (n, 1)."
        )
    d = int(target.shape[-1])
    check_coupling(d, flow_hidden, field)
    width = flow_width(d, flow_layers, flow_bins, flow_hidden)
    lead, want = _shape(pred)[:-1], _shape(target)[:-1]
    if broadcast:
        lead = tuple(b if a == 1 else a for a, b in zip(lead, want, strict=True))
    if lead != want or int(pred.shape[-1]) != width:
        hidden = f", flow_hidden={flow_hidden}" if flow_hidden else ""
        call = f"{d}, {flow_layers}, {flow_bins}" + (f", {flow_hidden}" if flow_hidden else "")
        axes = " (or 1 on a leading axis, with broadcast=True)" if broadcast else ""
        raise ConfigError(
            f"`pred` must have shape {field}.shape[:-1] + ({width},){axes} for `flow_nll` with "
            f"flow_layers={flow_layers}, flow_bins={flow_bins}{hidden} and {d} {field} values. "
            f"Received: pred.shape={_shape(pred)}, {field}.shape={_shape(target)}. Give the "
            f"model {width} outputs (flow_width({call}))."
        )
    return d


def _forward_layer(xp: Any, layer: _Layer, h: Any) -> tuple[Any, Any]:
    """One layer of the normalizing direction: `(output, log|det|)`."""
    a = _affine(xp, layer, h)
    if layer.hidden <= 0:
        y, log_d = _spline(xp, layer.spline, a)
        return y, xp.sum(xp.log(layer.diag) + log_d, axis=-1)
    d_a = layer.d // 2
    y_a, log_a = _spline(xp, layer.spline.rows(0, d_a), a[..., :d_a])
    y_b, log_b = _spline(xp, layer.coupled(xp, y_a), a[..., d_a:])
    log_det = xp.sum(xp.log(layer.diag), axis=-1) + xp.sum(log_a, axis=-1) + xp.sum(log_b, axis=-1)
    return xp.concat([y_a, y_b], axis=-1), log_det


def _inverse_layer(xp: Any, layer: _Layer, y: Any) -> Any:
    """One layer of the sampling direction: the `A` half, the `B` half, the affine map."""
    if layer.hidden <= 0:
        a = _spline_inverse(xp, layer.spline, y)
    else:
        d_a = layer.d // 2
        y_a = y[..., :d_a]
        a_a = _spline_inverse(xp, layer.spline.rows(0, d_a), y_a)
        a_b = _spline_inverse(xp, layer.coupled(xp, y_a), y[..., d_a:])
        a = xp.concat([a_a, a_b], axis=-1)
    return _affine_inverse(xp, layer, a)


def flow_transform(
    pred: Any,
    target: Any,
    *,
    flow_layers: int = 4,
    flow_bins: int = 8,
    flow_bound: float = 3.0,
    flow_hidden: int = 0,
    broadcast: bool = False,
) -> tuple[Any, Any]:
    """The normalizing direction: `(z, log|det dz/dtarget|)` of shapes `target.shape` and
    `target.shape[:-1]`, for `pred` in the layout of the module docstring (`flow_hidden >
    0`: the coupled layers). `broadcast=True` lets `pred` have length 1 on a leading axis
    where `target` is longer: one flow scores several values without copies of its
    parameters (the spline knots are computed once per flow)."""
    xp, target = _namespace(pred, target, "target")
    d = check_layout(
        pred, target, flow_layers, flow_bins, flow_hidden=flow_hidden, broadcast=broadcast
    )
    h, log_det = target, None
    for layer in _layers(xp, pred, d, flow_layers, flow_bins, float(flow_bound), flow_hidden):
        h, term = _forward_layer(xp, layer, h)
        log_det = term if log_det is None else log_det + term
    return h, log_det


def flow_inverse(
    pred: Any,
    z: Any,
    *,
    flow_layers: int = 4,
    flow_bins: int = 8,
    flow_bound: float = 3.0,
    flow_hidden: int = 0,
    broadcast: bool = False,
) -> Any:
    """The sampling direction: the target whose `flow_transform` is `z` (same shape as `z`).

    With `z` standard normal this draws from the flow (what `Flow.sample` does).
    `broadcast` as in `flow_transform`.
    """
    xp, z = _namespace(pred, z, "z")
    d = check_layout(
        pred, z, flow_layers, flow_bins, field="z", flow_hidden=flow_hidden, broadcast=broadcast
    )
    h = z
    layers = _layers(xp, pred, d, flow_layers, flow_bins, float(flow_bound), flow_hidden)
    for layer in reversed(layers):
        h = _inverse_layer(xp, layer, h)
    return h


def flow_log_prob(
    pred: Any,
    target: Any,
    *,
    flow_layers: int = 4,
    flow_bins: int = 8,
    flow_bound: float = 3.0,
    flow_hidden: int = 0,
    broadcast: bool = False,
) -> Any:
    """The flow's log-density of `target`, per sample: shape `target.shape[:-1]`.

    `pred` has the layout of the module docstring; any array-API library (numpy, jax,
    torch), differentiable where the library is. `broadcast` as in `flow_transform`.
    """
    z, log_det = flow_transform(
        pred,
        target,
        flow_layers=flow_layers,
        flow_bins=flow_bins,
        flow_bound=flow_bound,
        flow_hidden=flow_hidden,
        broadcast=broadcast,
    )
    xp = array_api_compat.array_namespace(z)
    d = int(z.shape[-1])
    return -0.5 * xp.sum(z * z, axis=-1) - 0.5 * d * _LOG_2PI + log_det
