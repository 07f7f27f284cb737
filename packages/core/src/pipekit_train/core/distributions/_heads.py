"""Model heads: what a model's output means, and the options that say how to read it.

A *head* names how to read a trained model's raw output:

- `"point"`: the output is the prediction (in the target's normalised units when the
  model was trained with a `Normalizer`).
- `"gaussian"`: the output's last axis holds `2k` values for a target of `k` values:
  `out[..., :k]` is the mean and `out[..., k:]` the log-variance of a normal
  distribution over the (normalised) target. This is the layout `gaussian_nll` trains.
- `"mixture"`: the output holds a mixture of `n_components` Gaussians (weight logits,
  means, log-scales and, with `covariance="full"`, Cholesky entries), the layout
  `mixture_nll` trains (`_mixture_math`). Its *head options*
  `{"n_components": K, "covariance": "diag" | "full"}` say how to split the output.
- `"flow"`: the output holds every parameter of a conditional normalizing flow (spline
  and mixing-map parameters, layer by layer), the layout `flow_nll` trains
  (`_flow_math`). Its head options `{"flow_layers": L,
  "flow_bins": K, "flow_bound": B}` (and `"flow_hidden": H` for a coupled flow) say how
  to read it.
- `"generative"`: the model maps a state *and noise* to a next state (a generative
  emulator): its input is the (normalised) state with `noise_dim` channels of standard
  normal noise appended on the last axis, its output a point prediction, one draw per
  noise. Its head option `{"noise_dim": w}` says how many channels. The ensemble losses
  (`crps`, `energy_score`) train it; a rollout draws fresh noise each step
  (`stochastic=True`), or takes zero noise (the central member) otherwise.

The head (and its options) is recorded in the model registry (`register(..., head=...,
head_options=...)`), so a loader knows what the output means without the training code.
"""

from __future__ import annotations

from typing import Any

from pipekit_train.core._errors import ConfigError

__all__ = [
    "HEADS",
    "check_head",
    "check_head_options",
    "head_for_loss",
    "head_options_for_loss",
]

#: The known heads.
HEADS = ("point", "gaussian", "mixture", "flow", "generative")


def check_head(head: Any, *, field: str = "head") -> str:
    """Return `head` if it is a known head name, else raise `ConfigError`."""
    if not isinstance(head, str) or head not in HEADS:
        raise ConfigError(
            f"`{field}` must be one of {list(HEADS)}. Received: {field}={head!r}. Use "
            "'gaussian' for a model trained with `gaussian_nll` (mean and log-variance "
            "outputs), 'mixture' for one trained with `mixture_nll`, 'flow' for one trained "
            "with `flow_nll`, 'generative' for a model of (state, noise) trained with `crps` "
            "or `energy_score`, 'point' for a plain prediction."
        )
    return head


def check_head_options(head: str, options: Any, *, field: str = "head_options") -> dict | None:
    """Validate the options of `head`: `{"n_components", "covariance"}` for `"mixture"`,
    `{"flow_layers", "flow_bins", "flow_bound"}` (and `"flow_hidden"`) for `"flow"`.

    Returns:
        The options as a new dict (`covariance` filled in with `"diag"`, a flow's missing
        options with `flow_nll`'s defaults, except `flow_hidden`, kept only when it is not
        0: an element-wise flow's options read as they did before the option existed, and
        a record without it is an element-wise flow), or None for a head without options.

    Raises:
        ConfigError: options for a head that takes none, or bad/missing options.
    """
    if head == "flow":
        return _flow_options(options, field)
    if head == "generative":
        return _generative_options(options, field)
    if head != "mixture":
        if options:
            raise ConfigError(
                f"`{field}` is only for head='mixture', 'flow' or 'generative'. Received: "
                f"{field}={options!r} with head={head!r}. Leave `{field}` out."
            )
        return None
    if not isinstance(options, dict) or "n_components" not in options:
        raise ConfigError(
            f"head='mixture' needs `{field}` with the number of components. Received: "
            f"{field}={options!r}. Pass {field}={{'n_components': K}} (and 'covariance': "
            "'full' for a full-covariance mixture), as trained by mixture_nll(n_components=K)."
        )
    unknown = sorted(set(options) - {"n_components", "covariance"})
    if unknown:
        raise ConfigError(
            f"`{field}` has unknown keys for head='mixture'. Received: {unknown}. Use only "
            "'n_components' and 'covariance'."
        )
    from ._mixture_math import check_params

    out = {"n_components": options["n_components"], "covariance": options.get("covariance", "diag")}
    check_params(out)
    return out


def _generative_options(options: Any, field: str) -> dict:
    noise_dim = options.get("noise_dim") if isinstance(options, dict) else None
    if (
        not isinstance(options, dict)
        or set(options) != {"noise_dim"}
        or isinstance(noise_dim, bool)
        or not isinstance(noise_dim, int)
        or noise_dim < 1
    ):
        raise ConfigError(
            f"head='generative' needs `{field}` with the noise channels the model takes. "
            f"Received: {field}={options!r}. Pass {field}={{'noise_dim': w}} (w >= 1), as "
            "trained by crps(noise_dim=w)."
        )
    return {"noise_dim": int(noise_dim)}


def _flow_options(options: Any, field: str) -> dict:
    from ._flow_math import FLOW_DEFAULTS, check_params

    if options is None:
        options = {}
    if not isinstance(options, dict):
        raise ConfigError(
            f"`{field}` must be a dict for head='flow'. Received: {field}={options!r}. Pass "
            f"{field}={{'flow_layers': L, 'flow_bins': K}} as trained by flow_nll(...)."
        )
    unknown = sorted(set(options) - set(FLOW_DEFAULTS))
    if unknown:
        raise ConfigError(
            f"`{field}` has unknown keys for head='flow'. Received: {unknown}. Use only "
            f"{sorted(FLOW_DEFAULTS)}."
        )
    out = {**FLOW_DEFAULTS, **options}
    check_params(out)
    if out["flow_hidden"] == 0:
        del out["flow_hidden"]
    return out


def head_for_loss(loss: Any) -> str | None:
    """The head a loss description implies: `"gaussian"` for `gaussian_nll` and
    `gaussian_crps`, `"mixture"` for `mixture_nll` and `mixture_crps`, `"flow"` for `flow_nll`,
    `"generative"` for `crps` and `energy_score`, else None.

    Args:
        loss: a plan's loss description (`{"name": "gaussian_nll", ...}`).
    """
    if isinstance(loss, dict):
        heads = {
            "gaussian_nll": "gaussian",
            "gaussian_crps": "gaussian",
            "mixture_nll": "mixture",
            "mixture_crps": "mixture",
            "flow_nll": "flow",
            "crps": "generative",
            "energy_score": "generative",
        }
        return heads.get(str(loss.get("name")))
    return None


def head_options_for_loss(loss: Any) -> dict | None:
    """The head options a loss description implies (`mixture_nll`'s or `flow_nll`'s
    parameters, an ensemble loss's `noise_dim`), or None."""
    head = head_for_loss(loss)
    if head not in ("mixture", "flow", "generative"):
        return None
    params = loss.get("params") or {}
    if head == "generative":
        noise_dim = params.get("noise_dim")
        return None if noise_dim is None else {"noise_dim": int(noise_dim)}
    if head == "flow":
        return _flow_options(dict(params), "loss.params")
    return {
        "n_components": params.get("n_components", 1),
        "covariance": params.get("covariance", "diag"),
    }
