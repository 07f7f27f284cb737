"""APEBench's networks in torch and Keras, started from the pdequinox weights (issue 62, item 4).

APEBench (`apebench` 0.1.1) trains pdequinox networks; this module writes two of them
again, equal in function, for `Torch()`/`Lightning()` (`TorchConvNet`, `TorchFNO`) and
Keras 3 (`keras_net`: `keras.ops` only, run here on the jax backend), and moves the
pdequinox weights into them through the library's own weight export:

- `Conv;HIDDEN;DEPTH;ACT` (pdequinox `ConvNet`): `DEPTH + 1` convolutions of kernel 3 with
  bias, "same" periodic padding (pdequinox's `boundary_mode="periodic"` is circular
  padding, one cell each side), the activation after every convolution but the last.
- `FNO;MODES;WIDTH;BLOCKS;ACT` (pdequinox `ClassicFNO`): a pointwise (1x1) lifting to
  `WIDTH` channels, `BLOCKS` blocks `act(spectral(x) + bypass(x))`, a pointwise projection.
  The spectral convolution keeps the lowest `MODES` rfft modes (0..MODES-1), multiplies
  them by the complex weight `weights_real + 1j * weights_imag` (pdequinox's array of shape
  `(1, WIDTH, WIDTH, MODES)`, read as `(1, C_out, C_in, MODES)`), zeroes the other modes
  and transforms back (`irfft` of length `N`). `gelu` is jax's default, the tanh
  approximation (torch `approximate="tanh"`, Keras `approximate=True`).

Every network takes channels-first batches `(B, C, N)` as pdequinox does (vmapped over
`B`) and as APEBench stores its states: the operators are built with
`layout="channels_first"` and train on APEBench's `(n, T, C, N)` trajectories unchanged.
Only 1-D problems (one spatial axis) are covered.

**The weight handoff.** `EquinoxModelOp("apebench_nets:pdeqx_net", arch=..., ...)` holds
the pdequinox network; its `serialize_weights()` bytes (`eqx.tree_serialise_leaves`: one
`.npy` record per leaf, read here with `allow_pickle=False`, no equinox needed) become
named arrays (`equinox_arrays`, by pdequinox path: `.layers[3].weight`), then a torch
state dict (`torch_state`) or the Keras model's variables (`keras_arrays`), each array
checked against the shape the mapping expects. `torch_weights` / `keras_weights` give the
safetensors bytes of `TorchModelOp.with_weights` / `KerasModelOp.with_weights`; the
factories `torch_net` / `keras_net` take a file of those equinox bytes themselves
(`equinox_weights="path"`), so a config names the whole start.

**The checks.** `python benchmarks/apebench_nets.py --check` (under
`uv run --with apebench==0.1.1`, about a minute) builds both networks for seeds 0..2 as
APEBench does (`init_key = split(PRNGKey(seed))[0]`), converts them, and compares outputs on
random inputs and the gradients of one MSE loss (`parity`).

**The cells.** `run_backend_cell(backend, scenario="diff_ks", config="one" | "sup;5",
seed, updates)` trains on `Torch()` or Keras (jax) with `TrainingLoop` and APEBench's
defaults, and returns the trained network's 200-step rollouts of the test trajectories
as numpy; `run_apebench_cell` trains the same cell with APEBench's own trainer from the
same weights; `gmean_nrmse` scores either with APEBench's metric (the geometric mean over
steps 1..100 of exponax's mean nRMSE). `python benchmarks/apebench_nets.py --cells` runs
`diff_ks` `one` and `sup;5` for one seed on all three (about 16 minutes at 2 000 updates
on the shared 2-core CPU, load about 6).

This module is not named `bench_*`: `run_all.py` does not run it. torch, Keras, jax and
APEBench are imported inside the functions that need them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

if __package__ in (None, ""):  # run as a script: let configs name this module `apebench_nets`
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipekit_train.core import ConfigError, model_factory

__all__ = [
    "Arch",
    "TorchConvNet",
    "TorchFNO",
    "apebench_data",
    "equinox_arrays",
    "gmean_nrmse",
    "keras_arrays",
    "keras_net",
    "keras_weights",
    "parity",
    "parse_arch",
    "pdeqx_net",
    "run_apebench_cell",
    "run_backend_cell",
    "torch_net",
    "torch_state",
    "torch_weights",
]

ACTIVATIONS = ("relu", "gelu", "tanh")
CONV = "Conv;26;10;relu"
FNO = "FNO;12;8;4;gelu"
KERNEL = 3  # APEBench's Conv: pdequinox ConvNet's default kernel size


# -- the architecture string -------------------------------------------------------------
@dataclass(frozen=True)
class Arch:
    """An APEBench network string, parsed: `Conv;HIDDEN;DEPTH;ACT` or `FNO;MODES;WIDTH;BLOCKS;ACT`."""

    kind: str  # "conv" | "fno"
    width: int  # Conv: hidden channels; FNO: width
    depth: int  # Conv: hidden layers; FNO: blocks
    modes: int  # FNO only (0 for Conv)
    activation: str

    def spec(self, channels: int) -> list[tuple[str, tuple[int, ...]]]:
        """`(pdequinox path, shape)` of every weight array, in pdequinox's leaf order."""
        c, w = channels, self.width
        if self.kind == "conv":
            sizes = [c] + [w] * self.depth + [c]
            out: list[tuple[str, tuple[int, ...]]] = []
            for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
                out += [(f".layers[{i}].weight", (b, a, KERNEL)), (f".layers[{i}].bias", (b, 1))]
            return out
        out = [(".lifting.weight", (w, c, 1)), (".lifting.bias", (w, 1))]
        for i in range(self.depth):
            p = f".blocks[{i}]"
            out += [
                (f"{p}.spectral_conv.weights_real", (1, w, w, self.modes)),
                (f"{p}.spectral_conv.weights_imag", (1, w, w, self.modes)),
                (f"{p}.by_pass_conv.weight", (w, w, 1)),
                (f"{p}.by_pass_conv.bias", (w, 1)),
            ]
        return out + [(".projection.weight", (c, w, 1)), (".projection.bias", (c, 1))]


def parse_arch(arch: str) -> Arch:
    """Parse `Conv;26;10;relu` or `FNO;12;8;4;gelu`.

    Raises:
        ConfigError: another network, a bad count or an activation other than `ACTIVATIONS`.
    """
    parts = str(arch).split(";")
    kind = parts[0].lower()
    fix = f"Use e.g. arch={CONV!r} or arch={FNO!r}."
    if kind not in ("conv", "fno") or len(parts) != (4 if kind == "conv" else 5):
        raise ConfigError(
            f"`arch` must be APEBench's 'Conv;HIDDEN;DEPTH;ACT' or 'FNO;MODES;WIDTH;BLOCKS;ACT'. "
            f"Received: arch={arch!r}. {fix}"
        )
    try:
        counts = [int(p) for p in parts[1:-1]]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise ConfigError(f"`arch` counts must be integers >= 1. Received: arch={arch!r}. {fix}")
    act = parts[-1].lower()
    if act not in ACTIVATIONS:
        raise ConfigError(
            f"`arch` activation must be one of {list(ACTIVATIONS)}. Received: arch={arch!r}. {fix}"
        )
    if kind == "conv":
        return Arch("conv", counts[0], counts[1], 0, act)
    return Arch("fno", counts[1], counts[2], counts[0], act)


# -- pdequinox (jax) ---------------------------------------------------------------------
@model_factory
def pdeqx_net(
    arch: str,
    channels: int = 1,
    *,
    key: Any = None,
    apebench_seed: int | None = None,
) -> Any:
    """The pdequinox network of `arch` for a 1-D problem, as APEBench builds it.

    The factory of `EquinoxModelOp("apebench_nets:pdeqx_net", arch=..., channels=1,
    layout="channels_first")` (the operator passes `key=PRNGKey(seed)`).
    `apebench_seed=s` initialises as APEBench's run of seed `s` does
    (`split(PRNGKey(s))[0]`) and ignores `key`.
    """
    import jax
    import pdequinox as pdeqx

    a = parse_arch(arch)
    if apebench_seed is not None:
        key = jax.random.split(jax.random.PRNGKey(int(apebench_seed)), 2)[0]
    act = getattr(jax.nn, a.activation)
    common = dict(num_spatial_dims=1, in_channels=channels, out_channels=channels, key=key)
    if a.kind == "conv":
        return pdeqx.arch.ConvNet(
            hidden_channels=a.width,
            depth=a.depth,
            activation=act,
            boundary_mode="periodic",
            **common,
        )
    return pdeqx.arch.ClassicFNO(
        num_modes=a.modes,
        hidden_channels=a.width,
        num_blocks=a.depth,
        activation=act,
        boundary_mode="periodic",
        **common,
    )


def equinox_arrays(blob: bytes, arch: str, channels: int = 1) -> dict[str, np.ndarray]:
    """The weight arrays in `EquinoxModelOp.serialize_weights()` bytes of `arch`, by pdequinox path.

    The bytes are `eqx.tree_serialise_leaves` of the network: one `.npy` record per leaf
    (pdequinox's FNO also stores two integer leaves per block, `num_spatial_dims` and
    `num_modes`, skipped here). Read with `allow_pickle=False`.

    Raises:
        ConfigError: the bytes hold other arrays than `arch` has.
    """
    buf = io.BytesIO(bytes(blob))
    records = []
    while buf.tell() < len(blob):
        records.append(np.lib.format.read_array(buf, allow_pickle=False))
    arrays = [r for r in records if r.ndim > 0]
    spec = parse_arch(arch).spec(channels)
    shapes = [tuple(r.shape) for r in arrays]
    if shapes != [s for _, s in spec]:
        raise ConfigError(
            f"The equinox weight bytes do not hold the arrays of arch={arch!r}, channels={channels}. "
            f"Received: {len(arrays)} arrays of shapes {shapes[:4]}...; expected "
            f"{len(spec)} of shapes {[s for _, s in spec][:4]}.... Pass the bytes of the "
            "EquinoxModelOp built with the same arch and channels."
        )
    return {name: np.asarray(r, np.float32) for (name, _), r in zip(spec, arrays, strict=True)}


def _read_blob(weights: bytes | str | os.PathLike[str]) -> bytes:
    if isinstance(weights, (bytes, bytearray, memoryview)):
        return bytes(weights)
    path = Path(weights)
    if not path.is_file():
        raise ConfigError(
            f"`equinox_weights` must name a file of EquinoxModelOp.serialize_weights() bytes. "
            f"Received: equinox_weights={str(weights)!r}, which is not a file."
        )
    return path.read_bytes()


# -- torch ---------------------------------------------------------------------------------
def _torch_act(name: str) -> Any:
    import torch.nn.functional as F

    if name == "gelu":
        return lambda x: F.gelu(x, approximate="tanh")  # jax.nn.gelu's default
    return getattr(F, name)


def _torch_classes() -> tuple[type, type]:
    import torch
    from torch import nn

    class TorchConvNet(nn.Module):
        """pdequinox `ConvNet` in torch: `(B, C, N) -> (B, C, N)`, periodic kernel-3 convs."""

        def __init__(self, arch: str = CONV, channels: int = 1):
            super().__init__()
            a = parse_arch(arch)
            sizes = [channels] + [a.width] * a.depth + [channels]
            self.layers = nn.ModuleList(
                nn.Conv1d(i, o, KERNEL, padding=KERNEL // 2, padding_mode="circular")
                for i, o in zip(sizes[:-1], sizes[1:], strict=True)
            )
            self.act = _torch_act(a.activation)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers[:-1]:
                x = self.act(layer(x))
            return self.layers[-1](x)

    class SpectralConv1d(nn.Module):
        """pdequinox `SpectralConv` (1-D): weights `(1, C_out, C_in, modes)`, real and imaginary."""

        def __init__(self, width: int, modes: int):
            super().__init__()
            scale = 1.0 / (width * width)
            self.weights_real = nn.Parameter(scale * torch.randn(1, width, width, modes))
            self.weights_imag = nn.Parameter(scale * torch.randn(1, width, width, modes))
            self.modes = modes

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            n = x.shape[-1]
            xf = torch.fft.rfft(x)[..., : self.modes]
            w = torch.complex(self.weights_real[0], self.weights_imag[0])
            # irfft zero-pads the modes above `modes`, as pdequinox's scatter into zeros does
            return torch.fft.irfft(torch.einsum("bim,oim->bom", xf, w), n=n)

    class Block(nn.Module):
        def __init__(self, width: int, modes: int, act: Any):
            super().__init__()
            self.spectral_conv = SpectralConv1d(width, modes)
            self.by_pass_conv = nn.Conv1d(width, width, 1)
            self.act = act

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.spectral_conv(x) + self.by_pass_conv(x))

    class TorchFNO(nn.Module):
        """pdequinox `ClassicFNO` in torch: lifting, spectral blocks, projection; `(B, C, N)`."""

        def __init__(self, arch: str = FNO, channels: int = 1):
            super().__init__()
            a = parse_arch(arch)
            act = _torch_act(a.activation)
            self.lifting = nn.Conv1d(channels, a.width, 1)
            self.blocks = nn.ModuleList(Block(a.width, a.modes, act) for _ in range(a.depth))
            self.projection = nn.Conv1d(a.width, channels, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.lifting(x)
            for block in self.blocks:
                x = block(x)
            return self.projection(x)

    return TorchConvNet, TorchFNO


def __getattr__(name: str) -> Any:  # TorchConvNet / TorchFNO without importing torch up front
    if name in ("TorchConvNet", "TorchFNO"):
        global TorchConvNet, TorchFNO
        TorchConvNet, TorchFNO = _torch_classes()  # type: ignore[misc]  # module-level cache
        return globals()[name]
    raise AttributeError(name)


def torch_state(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """pdequinox-named arrays as the torch state dict of `TorchConvNet` / `TorchFNO`.

    The mapping: `.layers[i].weight` -> `layers.i.weight` (`(O, I, K)`, the same layout:
    both are cross-correlations); a bias `(O, 1)` -> `(O,)`; `.blocks[i].spectral_conv.*`
    -> `blocks.i.spectral_conv.*` unchanged; the other names by dots.
    """
    out = {}
    for name, arr in arrays.items():
        key = name.lstrip(".").replace("[", ".").replace("]", "")
        out[key] = arr.reshape(-1) if key.endswith(".bias") else arr
    return out


def torch_weights(blob: bytes, arch: str, channels: int = 1) -> bytes:
    """`EquinoxModelOp.serialize_weights()` bytes as `TorchModelOp.with_weights` bytes (safetensors)."""
    from safetensors.numpy import save

    state = torch_state(equinox_arrays(blob, arch, channels))
    return save({k: np.ascontiguousarray(v) for k, v in state.items()})


@model_factory
def torch_net(arch: str = CONV, channels: int = 1, equinox_weights: str | None = None) -> Any:
    """Factory of `TorchModelOp("apebench_nets:torch_net", arch=..., channels=1)`.

    `equinox_weights`: a file of `EquinoxModelOp.serialize_weights()` bytes of the same
    `arch` and `channels`; the network starts from those weights (else torch's default
    initialisation).
    """
    import torch

    conv_cls, fno_cls = _torch_classes()
    module = (conv_cls if parse_arch(arch).kind == "conv" else fno_cls)(arch, channels)
    if equinox_weights is not None:
        state = torch_state(equinox_arrays(_read_blob(equinox_weights), arch, channels))
        module.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    return module


# -- Keras 3 -----------------------------------------------------------------------------------
def _keras_layers() -> dict[str, type]:
    import keras
    from keras import ops

    class PeriodicConv1D(keras.layers.Layer):
        """A channels-first 1-D convolution with circular "same" padding (pdequinox `PhysicsConv`)."""

        def __init__(self, filters: int, kernel_size: int, **kw: Any):
            super().__init__(**kw)
            self.filters, self.kernel_size = filters, kernel_size

        def build(self, input_shape: Any) -> None:
            c = input_shape[1]
            self.kernel = self.add_weight(
                shape=(self.kernel_size, c, self.filters),
                initializer="glorot_uniform",
                name="kernel",
            )
            self.bias = self.add_weight(shape=(self.filters,), initializer="zeros", name="bias")

        def call(self, x: Any) -> Any:
            p = self.kernel_size // 2
            if p:
                x = ops.concatenate([x[..., -p:], x, x[..., :p]], axis=-1)
            y = ops.conv(x, self.kernel, strides=1, padding="valid", data_format="channels_first")
            return y + ops.reshape(self.bias, (1, -1, 1))

    class SpectralConv1D(keras.layers.Layer):
        """pdequinox `SpectralConv` (1-D) with `keras.ops.rfft`/`irfft`, channels-first."""

        def __init__(self, width: int, modes: int, **kw: Any):
            super().__init__(**kw)
            self.width, self.modes = width, modes

        def build(self, input_shape: Any) -> None:
            shape = (1, self.width, self.width, self.modes)
            init = keras.initializers.RandomNormal(stddev=1.0 / (self.width * self.width))
            self.weights_real = self.add_weight(shape=shape, initializer=init, name="weights_real")
            self.weights_imag = self.add_weight(shape=shape, initializer=init, name="weights_imag")

        def call(self, x: Any) -> Any:
            n = x.shape[-1]
            xr, xi = ops.rfft(x, fft_length=n)
            xr, xi = xr[..., : self.modes], xi[..., : self.modes]
            wr, wi = self.weights_real[0], self.weights_imag[0]
            mm = lambda a, b: ops.einsum("bim,oim->bom", a, b)  # noqa: E731
            yr, yi = mm(xr, wr) - mm(xi, wi), mm(xr, wi) + mm(xi, wr)
            pad = [(0, 0), (0, 0), (0, n // 2 + 1 - self.modes)]
            return ops.irfft((ops.pad(yr, pad), ops.pad(yi, pad)), fft_length=n)

    return {"PeriodicConv1D": PeriodicConv1D, "SpectralConv1D": SpectralConv1D}


def _keras_act(name: str) -> Any:
    from keras import ops

    if name == "gelu":
        return lambda x: ops.gelu(x, approximate=True)
    return getattr(ops, name)


@model_factory
def keras_net(
    arch: str = CONV,
    channels: int = 1,
    num_points: int = 160,
    equinox_weights: str | None = None,
) -> Any:
    """Factory of `KerasModelOp("apebench_nets:keras_net", arch=..., layout="channels_first")`.

    A functional `keras.Model` on `Input((channels, num_points))`, channels-first like
    pdequinox; its variables are named by pdequinox path (`layers_3/kernel`,
    `blocks_0_spectral/weights_real`). `equinox_weights` as in `torch_net`.
    """
    import keras

    a = parse_arch(arch)
    L = _keras_layers()
    act = _keras_act(a.activation)
    x = inp = keras.Input((channels, num_points))
    if a.kind == "conv":
        sizes = [a.width] * a.depth + [channels]
        for i, o in enumerate(sizes):
            x = L["PeriodicConv1D"](o, KERNEL, name=f"layers_{i}")(x)
            if i < len(sizes) - 1:
                x = keras.layers.Activation(act)(x)
    else:
        x = L["PeriodicConv1D"](a.width, 1, name="lifting")(x)
        for i in range(a.depth):
            s = L["SpectralConv1D"](a.width, a.modes, name=f"blocks_{i}_spectral")(x)
            b = L["PeriodicConv1D"](a.width, 1, name=f"blocks_{i}_bypass")(x)
            x = keras.layers.Activation(act)(keras.layers.Add()([s, b]))
        x = L["PeriodicConv1D"](channels, 1, name="projection")(x)
    model = keras.Model(inp, x, name=f"apebench_{a.kind}")
    if equinox_weights is not None:
        values = keras_arrays(equinox_arrays(_read_blob(equinox_weights), arch, channels), model)
        for v, arr in zip(model.weights, values, strict=True):
            v.assign(arr)
    return model


def _keras_path(name: str) -> str:
    """pdequinox path -> Keras variable path (`.layers[3].weight` -> `layers_3/kernel`)."""
    head, _, leaf = name.lstrip(".").replace("[", "_").replace("]", "").rpartition(".")
    head = head.replace(".spectral_conv", "_spectral").replace(".by_pass_conv", "_bypass")
    return f"{head}/{'kernel' if leaf == 'weight' else leaf}"


def keras_arrays(arrays: dict[str, np.ndarray], model: Any) -> list[np.ndarray]:
    """pdequinox-named arrays in the order of `model.weights` (a `keras_net` model).

    A conv weight `(O, I, K)` becomes the Keras kernel `(K, I, O)`; a bias `(O, 1)` becomes
    `(O,)`; the spectral weights keep their layout.

    Raises:
        ConfigError: the model's variables are not those of the arrays (names or shapes).
    """
    by_path = {}
    for name, arr in arrays.items():
        path = _keras_path(name)
        if path.endswith("/kernel"):
            arr = np.transpose(arr, (2, 1, 0))
        elif path.endswith("/bias"):
            arr = arr.reshape(-1)
        by_path[path] = np.ascontiguousarray(arr)
    out = []
    for v in model.weights:
        arr = by_path.pop(v.path, None)
        if arr is None or tuple(arr.shape) != tuple(v.shape):
            raise ConfigError(
                f"The Keras model's variable {v.path!r} {tuple(v.shape)} has no pdequinox array of "
                f"that shape. Received: arrays for {sorted(by_path)[:4]}.... Build the model with "
                "keras_net and the same arch and channels."
            )
        out.append(arr)
    if by_path:
        raise ConfigError(
            f"pdequinox arrays without a Keras variable: {sorted(by_path)[:4]}. Received: a model "
            f"with {len(model.weights)} variables. Build it with keras_net and the same arch."
        )
    return out


def keras_weights(blob: bytes, arch: str, model: Any, channels: int = 1) -> bytes:
    """`EquinoxModelOp.serialize_weights()` bytes as `KerasModelOp.with_weights` bytes.

    `model`: the operator's `keras_net` model (its variable order is the bytes' order).
    """
    from safetensors.numpy import save

    values = keras_arrays(equinox_arrays(blob, arch, channels), model)
    return save(
        {f"w/{i:05d}": v for i, v in enumerate(values)}, metadata={"format": "pipekit-keras/1"}
    )


# -- parity ------------------------------------------------------------------------------
def _keras_jax() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() != "jax":
        raise ConfigError(
            f"The Keras cells run on Keras's jax backend. Received: KERAS_BACKEND="
            f"{keras.backend.backend()!r}. Set KERAS_BACKEND=jax before anything imports keras."
        )
    return keras


def parity(
    arch: str, seed: int, *, channels: int = 1, num_points: int = 160, batch: int = 8
) -> dict[str, float]:
    """Compare pdequinox, torch and Keras (jax) on one network of APEBench seed `seed`.

    The equinox operator's weight bytes go through `torch_weights` / `keras_weights` into
    `TorchModelOp` / `KerasModelOp` (`with_weights`); all three run one random batch
    `(batch, C, N)` of standard normal values. Returns the largest absolute and relative
    (to the largest pdequinox output) output difference of each, and the same of the
    gradients of `mean((net(x) - t)^2)` over all weights (relative to the largest
    pdequinox gradient entry).
    """
    import equinox as eqx
    import jax
    import jax.numpy as jnp
    import torch

    keras = _keras_jax()
    from pipekit_train.equinox import EquinoxModelOp
    from pipekit_train.keras import KerasModelOp
    from pipekit_train.lightning import TorchModelOp

    eq = EquinoxModelOp(
        "apebench_nets:pdeqx_net",
        arch=arch,
        channels=channels,
        apebench_seed=seed,
        layout="channels_first",
    )
    blob = eq.serialize_weights()
    th = TorchModelOp("apebench_nets:torch_net", arch=arch, channels=channels)
    th = th.with_weights(torch_weights(blob, arch, channels))
    ke = KerasModelOp(
        "apebench_nets:keras_net",
        arch=arch,
        channels=channels,
        num_points=num_points,
        layout="channels_first",
    )
    ke = ke.with_weights(keras_weights(blob, arch, ke.model, channels))

    rng = np.random.default_rng(1000 + seed)
    x = rng.standard_normal((batch, channels, num_points)).astype(np.float32)
    t = rng.standard_normal((batch, channels, num_points)).astype(np.float32)
    ref = np.asarray(eq(x))
    scale = float(np.abs(ref).max())
    out: dict[str, float] = {}
    for name, y in (("torch", th(x)), ("keras", ke(x))):
        err = float(np.abs(np.asarray(y) - ref).max())
        out[f"{name}_out_abs"], out[f"{name}_out_rel"] = err, err / scale

    # gradients of one MSE loss, in pdequinox's names
    net = eq.model

    def loss(m: Any) -> Any:
        return jnp.mean((jax.vmap(m)(jnp.asarray(x)) - t) ** 2)

    g = eqx.filter_grad(loss)(net)
    g_ref = torch_state(
        equinox_arrays(_serialise(eqx, g), arch, channels)
    )  # torch names, torch shapes
    gscale = max(float(np.abs(v).max()) for v in g_ref.values())

    mod = th.model
    mod.zero_grad()
    torch.mean((mod(torch.from_numpy(x)) - torch.from_numpy(t)) ** 2).backward()
    g_torch = {k: p.grad.numpy() for k, p in mod.named_parameters()}
    err = max(float(np.abs(g_torch[k] - g_ref[k]).max()) for k in g_ref)
    out["torch_grad_abs"], out["torch_grad_rel"] = err, err / gscale

    model = ke.model
    tv = [v.value for v in model.trainable_variables]
    ntv = [v.value for v in model.non_trainable_variables]

    def kloss(tv_: Any) -> Any:
        y, _ = model.stateless_call(tv_, ntv, jnp.asarray(x), training=True)
        return jnp.mean((y - t) ** 2)

    g_keras = jax.grad(kloss)(tv)
    g_ref_keras = keras_arrays(equinox_arrays(_serialise(eqx, g), arch, channels), model)
    paths = [v.path for v in model.weights]
    by_path = dict(zip(paths, g_ref_keras, strict=True))
    err = max(
        float(np.abs(np.asarray(gk) - by_path[v.path]).max())
        for v, gk in zip(model.trainable_variables, g_keras, strict=True)
    )
    out["keras_grad_abs"], out["keras_grad_rel"] = err, err / gscale
    del keras
    return out


def _serialise(eqx: Any, tree: Any) -> bytes:
    buf = io.BytesIO()
    eqx.tree_serialise_leaves(buf, tree)
    return buf.getvalue()


# -- the cells -----------------------------------------------------------------------------
TEST_STEPS = 200  # APEBench's test_temporal_horizon
SCORE_STEPS = 100  # the gmean of the mean nRMSE over steps 1..100


def rollout_steps(config: str) -> int:
    """The unrolled steps of an APEBench training config: `one` -> 1, `sup;T` -> T.

    Raises:
        ConfigError: another config (`div;T` needs the reference stepper in the loop).
    """
    parts = str(config).split(";")
    if parts == ["one"]:
        return 1
    if len(parts) == 2 and parts[0] == "sup" and parts[1].isdigit() and int(parts[1]) >= 1:
        return int(parts[1])
    raise ConfigError(
        f"`config` must be APEBench's 'one' or 'sup;T'. Received: config={config!r}. "
        "Use config='one' or config='sup;5'."
    )


def _scenario(scenario: str, updates: int, warmup: int) -> Any:
    import apebench

    table = apebench.scenarios.scenario_dict
    if scenario not in table:
        raise ConfigError(
            f"`scenario` must be an APEBench scenario. Received: scenario={scenario!r}. "
            "Use e.g. scenario='diff_ks'."
        )
    return table[scenario](optim_config=f"adam;{updates};warmup_cosine;0.0;1e-3;{warmup}")


def apebench_data(scenario: str = "diff_ks") -> tuple[np.ndarray, np.ndarray]:
    """APEBench's train `(50, 51, C, N)` and test `(30, 201, C, N)` trajectories, float32."""
    s = _scenario(scenario, 10_000, 2_000)
    return (
        np.asarray(s.get_train_data(), np.float32),
        np.asarray(s.get_test_data(), np.float32),
    )


def gmean_nrmse(predictions: np.ndarray, test: np.ndarray, up_to: int = SCORE_STEPS) -> float:
    """APEBench's score: the geometric mean over steps 1..`up_to` of exponax's mean nRMSE.

    Args:
        predictions: `(n, steps, C, N)` rollouts from `test[:, 0]` (initial state excluded).
        test: the test trajectories `(n, steps + 1, C, N)`.
    """
    import exponax as ex
    import jax
    import jax.numpy as jnp
    from scipy.stats import gmean

    pred, ref = jnp.asarray(predictions), jnp.asarray(test[:, 1 : predictions.shape[1] + 1])
    err = jax.vmap(lambda p, r: ex.metrics.mean_metric(ex.metrics.nRMSE, p, r), in_axes=1)(
        pred, ref
    )
    return float(gmean(np.asarray(err)[:up_to]))


def _equinox_blob(arch: str, seed: int, channels: int) -> bytes:
    from pipekit_train.equinox import EquinoxModelOp

    op = EquinoxModelOp(
        "apebench_nets:pdeqx_net",
        arch=arch,
        channels=channels,
        apebench_seed=seed,
        layout="channels_first",
    )
    return op.serialize_weights()


def _model_op(backend: str, arch: str, blob: bytes, channels: int, num_points: int) -> Any:
    if backend == "torch":
        from pipekit_train.lightning import TorchModelOp

        op = TorchModelOp("apebench_nets:torch_net", arch=arch, channels=channels)
        return op.with_weights(torch_weights(blob, arch, channels))
    if backend == "keras":
        _keras_jax()
        from pipekit_train.keras import KerasModelOp

        op = KerasModelOp(
            "apebench_nets:keras_net",
            arch=arch,
            channels=channels,
            num_points=num_points,
            layout="channels_first",
        )
        return op.with_weights(keras_weights(blob, arch, op.model, channels))
    raise ConfigError(
        f"`backend` must be 'torch' or 'keras'. Received: backend={backend!r}. "
        "Use run_apebench_cell for APEBench's own (Equinox) training."
    )


def run_backend_cell(
    backend: str,
    scenario: str = "diff_ks",
    config: str = "one",
    seed: int = 0,
    updates: int = 2_000,
    *,
    arch: str = CONV,
    warmup: int | None = None,
    train: np.ndarray | None = None,
    test: np.ndarray | None = None,
    equinox_weights: bytes | None = None,
    batch_size: int = 20,
    torch_threads: int | None = 1,
) -> dict[str, Any]:
    """Train one APEBench cell on `Torch()` (`backend="torch"`) or Keras on jax (`"keras"`).

    APEBench's defaults: the network `arch` started from APEBench seed `seed`'s pdequinox
    weights (or `equinox_weights`, `EquinoxModelOp.serialize_weights()` bytes), windows of
    `k + 1` states over the training trajectories (stride 1), batches of 20, MSE, Adam
    with a linear warm-up from 0 to 1e-3 over `warmup` updates (default `updates // 5`)
    then cosine decay to 0 at `updates`; `sup;T` is `Rollout(steps=T, reduction="sum")`
    (trainax's sum of the per-step losses). No normaliser, no residual: the network maps
    a state to the next, as APEBench's `predict` task. Data channels-first `(n, T, C, N)`,
    the operators `layout="channels_first"`.

    Args:
        backend: `"torch"` or `"keras"` (Keras needs `KERAS_BACKEND=jax`, set here when
            unset before keras is first imported).
        scenario: the APEBench scenario of the data when `train`/`test` are not given.
        config: `"one"` or `"sup;T"`.
        seed: the APEBench seed of the initial weights, and the library's data-order seed.
        updates: the number of optimizer updates.
        arch: `CONV` or `FNO` (APEBench network strings).
        warmup: the warm-up updates of the learning rate.
        train, test: the trajectories as numpy (default: `apebench_data(scenario)`).
        equinox_weights: the starting weights (default: APEBench's for `seed`).
        batch_size: the batch size.
        torch_threads: torch's intra-op threads for the run (`torch.set_num_threads`;
            None: torch's default). One by default: on a shared 2-core machine two
            OpenMP threads made an update 20x slower (3.1 s against 0.13 s for `sup;5`).

    Returns:
        `{"predictions": (n_test, 200, C, N) float32 numpy (the trained network's
        rollout of every test trajectory from its first state, initial state excluded),
        "train_seconds": the wall time of `TrainingLoop(...).run()`, set-up and
        compilation included, "backend", "config", "seed", "updates"}`.
    """
    k = rollout_steps(config)
    if backend == "keras":
        _keras_jax()
    from pipekit_train.core import NeuralForward, Rollout, TrainingLoop, TrajectoryWindows

    if train is None or test is None:
        train, test = apebench_data(scenario)
    channels, num_points = train.shape[2], train.shape[3]
    blob = equinox_weights if equinox_weights is not None else _equinox_blob(arch, seed, channels)
    model = _model_op(backend, arch, blob, channels, num_points)
    warmup = updates // 5 if warmup is None else warmup
    adapter = None
    if backend == "torch":
        from pipekit_train.lightning import Torch

        adapter = Torch()
        if torch_threads is not None:
            import torch

            torch.set_num_threads(int(torch_threads))
    t0 = time.perf_counter()
    artifact = TrainingLoop(
        model=model,
        data=TrajectoryWindows(np.asarray(train, np.float32), k=k),
        rollout=None if k == 1 else Rollout(steps=k, reduction="sum"),
        loss="mse",
        optimizer_config={
            "name": "adam",
            "lr": {
                "schedule": "warmup_cosine",
                "init_value": 0.0,
                "peak_value": 1e-3,
                "warmup_steps": warmup,
                "decay_steps": updates,
            },
        },
        batch_size=batch_size,
        max_steps=updates,
        seed=seed,
        adapter=adapter,
        progress=False,
    ).run()
    seconds = time.perf_counter() - t0
    forward = NeuralForward(artifact.model, state_ndim=2)
    traj = forward.rollout(np.asarray(test[:, 0], np.float32), TEST_STEPS)  # (201, n, C, N)
    return {
        "predictions": np.asarray(np.moveaxis(np.asarray(traj)[1:], 0, 1), np.float32),
        "train_seconds": seconds,
        "backend": backend,
        "config": config,
        "seed": seed,
        "updates": updates,
    }


def run_apebench_cell(
    scenario: str = "diff_ks",
    config: str = "one",
    seed: int = 0,
    updates: int = 2_000,
    *,
    arch: str = CONV,
    warmup: int | None = None,
) -> dict[str, Any]:
    """The same cell trained by APEBench's own trainer (trainax, Equinox), from the same weights.

    Returns the dict of `run_backend_cell` (`"backend": "apebench"`); `train_seconds` is the
    wall time of the trainer's call (compilation included).
    """
    import equinox as eqx
    import exponax as ex
    import jax

    warmup = updates // 5 if warmup is None else warmup
    s = _scenario(scenario, updates, warmup)
    trainer = s.get_trainer(train_config=config)
    init_key, shuffle_key = jax.random.split(jax.random.PRNGKey(seed), 2)
    net = s.get_neural_stepper(task_config="predict", network_config=arch, key=init_key)
    t0 = time.perf_counter()
    trained, losses, _ = trainer(net, shuffle_key, record_loss_every=s.record_loss_every)
    jax.block_until_ready(eqx.filter(trained, eqx.is_array))
    seconds = time.perf_counter() - t0
    test = np.asarray(s.get_test_data(), np.float32)
    pred = jax.vmap(ex.rollout(trained, TEST_STEPS, include_init=False))(test[:, 0])
    return {
        "predictions": np.asarray(pred, np.float32),
        "train_seconds": seconds,
        "backend": "apebench",
        "config": config,
        "seed": seed,
        "updates": updates,
    }


# -- the script ----------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    """`--check` (parity, seeds 0..2, both networks) and/or `--cells` (diff_ks one and sup;5)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--check", action="store_true", help="parity of the networks, seeds 0..2")
    p.add_argument("--cells", action="store_true", help="train diff_ks one and sup;5 cells")
    p.add_argument("--updates", type=int, default=2_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--arch", default=CONV)
    p.add_argument("--configs", nargs="+", default=["one", "sup;5"])
    p.add_argument("--backends", nargs="+", default=["apebench", "torch", "keras"])
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    args = p.parse_args(argv)
    os.environ.setdefault("KERAS_BACKEND", "jax")
    results: dict[str, Any] = {}
    if args.check:
        worst: dict[str, float] = {}
        for arch in (CONV, FNO):
            for seed in range(3):
                r = parity(arch, seed)
                print(f"{arch} seed {seed}: " + ", ".join(f"{k}={v:.2e}" for k, v in r.items()))
                for key, val in r.items():
                    worst[key] = max(worst.get(key, 0.0), val)
        results["parity_worst"] = worst
        assert worst["torch_out_rel"] < 1e-5 and worst["keras_out_rel"] < 1e-5, worst
        assert worst["torch_grad_rel"] < 1e-4 and worst["keras_grad_rel"] < 1e-4, worst
        print("parity OK: worst " + ", ".join(f"{k}={v:.2e}" for k, v in worst.items()))
    if args.cells:
        train, test = apebench_data("diff_ks")
        cells = []
        for config in args.configs:
            for backend in args.backends:
                if backend == "apebench":
                    r = run_apebench_cell(
                        "diff_ks", config, args.seed, args.updates, arch=args.arch
                    )
                else:
                    r = run_backend_cell(
                        backend,
                        "diff_ks",
                        config,
                        args.seed,
                        args.updates,
                        arch=args.arch,
                        train=train,
                        test=test,
                    )
                score = gmean_nrmse(r["predictions"], test)
                cell = {k: r[k] for k in ("backend", "config", "seed", "updates", "train_seconds")}
                cell["gmean100"] = score
                cells.append(cell)
                print(json.dumps(cell), flush=True)
        results["cells"] = cells
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
