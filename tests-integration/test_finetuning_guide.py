"""The recipes of docs/guides/finetuning.md work: frozen weights stay put, adapters train,
and the fine-tuned model comes back from the registry with the same predictions.

The guide's `# my_project/models.py` code blocks are written to a module of their own and
imported by name, as the registry does. peft is an optional extra of the guide, not of any
package: the workspace's `guides` dependency group holds it, outside the default
environment (`uv run --group guides pytest tests-integration/test_finetuning_guide.py`
runs its recipe; the guide says so).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipekit_train.core import LocalModelRegistry, TrainingLoop
from pipekit_train.core.data import ArrayDataset, split

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "finetuning.md"
MODULE = "finetuning_guide_models"
STEPS = 150


@pytest.fixture(scope="module")
def factories(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The guide's factory module, importable as `finetuning_guide_models`."""
    blocks = re.findall(r"```python\n# my_project/models.py\n(.*?)```", GUIDE.read_text(), re.S)
    assert len(blocks) == 4, "expected the Equinox, peft and two Keras factory blocks"
    folder = tmp_path_factory.mktemp("guide")
    (folder / f"{MODULE}.py").write_text("\n\n".join(blocks))
    sys.path.insert(0, str(folder))
    try:
        yield MODULE
    finally:
        sys.path.remove(str(folder))
        sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def tasks() -> dict[str, Any]:
    x = np.random.default_rng(0).uniform(-1, 1, (1024, 4)).astype(np.float32)
    y_a = np.sin(x).sum(1, keepdims=True).astype(np.float32)
    y_b = (y_a + 0.5 * x[:, :1]).astype(np.float32)
    a_train, a_val = split(ArrayDataset(x=x, y=y_a), (0.9, 0.1), seed=0)
    b_train, b_val = split(ArrayDataset(x=x, y=y_b), (0.9, 0.1), seed=0)
    return {"a": (a_train, a_val), "b": (b_train, b_val), "x": x[:8]}


def _fit(model: Any, data: tuple[Any, Any], optimizer_config: Any = None) -> Any:
    train, val = data
    return TrainingLoop(
        model=model,
        data=train,
        validation=val,
        optimizer_config=optimizer_config or {"name": "adam", "lr": 1e-2},
        batch_size=64,
        max_steps=STEPS,
        seed=0,
        progress=False,
    ).run()


@pytest.mark.slow
def test_equinox_masks_and_lora(factories: str, tasks: dict[str, Any], tmp_path: Path) -> None:
    import equinox as eqx
    import jax
    import optax

    from pipekit_train.equinox import EquinoxModelOp

    registry = LocalModelRegistry(tmp_path)
    base = EquinoxModelOp(
        "pipekit_train.equinox.testing:mlp", in_size=4, out_size=1, width=32, depth=1, seed=0
    )
    _fit(base, tasks["a"]).register(registry, "base")
    pretrained = registry.load("base")

    def last_layer_only(params: Any) -> Any:
        last = len(params.layers) - 1
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "train" if path[1].idx == last else "frozen", params
        )

    def frozen(params: Any) -> Any:
        last = len(params.layers) - 1
        return jax.tree_util.tree_map_with_path(lambda path, _: path[1].idx < last, params)

    multi = optax.multi_transform(
        {"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, last_layer_only
    )
    masked = optax.chain(optax.adam(1e-2), optax.masked(optax.set_to_zero(), frozen))
    heads = [_fit(pretrained, tasks["b"], tx).model.model for tx in (multi, masked)]
    for head in heads:
        assert np.array_equal(head.layers[0].weight, pretrained.model.layers[0].weight)
        assert not np.array_equal(head.layers[-1].weight, pretrained.model.layers[-1].weight)
    assert np.array_equal(heads[0].layers[-1].weight, heads[1].layers[-1].weight)

    lora = EquinoxModelOp(
        f"{factories}:lora_mlp", in_size=4, out_size=1, width=32, depth=1, rank=2, seed=0
    )
    lora = lora.with_model(eqx.tree_at(lambda m: m.base, lora.model, pretrained.model))
    np.testing.assert_allclose(lora(tasks["x"]), pretrained(tasks["x"]), atol=1e-6)

    def adapters_only(params: Any) -> Any:
        return jax.tree_util.tree_map_with_path(
            lambda path, _: "train" if path[0].name in ("a", "b") else "frozen", params
        )

    tx = optax.multi_transform(
        {"train": optax.adam(1e-2), "frozen": optax.set_to_zero()}, adapters_only
    )
    before = _fit(pretrained, tasks["b"], {"name": "adam", "lr": 1e-12}).final_metrics["val_loss"]
    tuned = _fit(lora, tasks["b"], tx)
    assert tuned.final_metrics["val_loss"] < 0.5 * before
    base_layer = tuned.model.model.base.layers[0].weight
    assert np.array_equal(base_layer, pretrained.model.layers[0].weight)
    tuned.register(registry, "base-lora")
    back = registry.load("base-lora")
    assert back.get_config()["kwargs"]["rank"] == 2
    np.testing.assert_array_equal(back(tasks["x"]), tuned.model(tasks["x"]))


@pytest.mark.slow
def test_keras_trainable_and_enable_lora(
    factories: str, tasks: dict[str, Any], tmp_path: Path
) -> None:
    from pipekit_train.keras import KerasModelOp

    frozen_op = KerasModelOp(
        f"{factories}:keras_mlp", in_size=4, out_size=1, width=32, depth=1, frozen=1, seed=0
    )
    first = [w.numpy().copy() for w in frozen_op.model.layers[0].weights]
    trained = _fit(frozen_op, tasks["a"]).model.model
    assert all(
        np.array_equal(a, np.asarray(b))
        for a, b in zip(first, trained.layers[0].weights, strict=True)
    )

    registry = LocalModelRegistry(tmp_path)
    kwargs = {"in_size": 4, "out_size": 1, "width": 32, "depth": 1}
    _fit(KerasModelOp(f"{factories}:keras_lora_mlp", **kwargs, seed=0), tasks["a"]).register(
        registry, "base"
    )
    pretrained = registry.load("base")
    lora = KerasModelOp(f"{factories}:keras_lora_mlp", **kwargs, rank=2, seed=0)
    for src, dst in zip(pretrained.model.layers, lora.model.layers, strict=True):
        kept = [w for w in dst.weights if "lora" not in w.path]
        for v_src, v_dst in zip(src.weights, kept, strict=True):
            v_dst.assign(np.asarray(v_src))
    np.testing.assert_allclose(lora(tasks["x"]), pretrained(tasks["x"]), atol=1e-6)
    tuned = _fit(lora, tasks["b"])
    for src, dst in zip(pretrained.model.layers, tuned.model.model.layers, strict=True):
        assert np.array_equal(np.asarray(src._kernel), np.asarray(dst._kernel))
    tuned.register(registry, "base-lora")
    back = registry.load("base-lora")
    assert back.get_config()["kwargs"]["rank"] == 2
    np.testing.assert_allclose(back(tasks["x"]), tuned.model(tasks["x"]), rtol=1e-6, atol=1e-6)


def test_lightning_requires_grad(tasks: dict[str, Any]) -> None:
    import torch

    from pipekit_train.lightning import LightningModelOp

    op = LightningModelOp(
        "pipekit_train.lightning.testing:mlp", in_size=4, out_size=1, width=32, depth=1, seed=0
    )
    op.model[0].requires_grad_(False)
    first, last = op.model[0].weight.detach().clone(), op.model[2].weight.detach().clone()
    config = {"name": "adamw", "lr": 1e-2, "weight_decay": 0.1}
    trained = _fit(op, tasks["b"], config).model.model
    assert torch.equal(trained[0].weight.detach(), first)
    assert not torch.equal(trained[2].weight.detach(), last)


def test_peft_lora(factories: str, tasks: dict[str, Any], tmp_path: Path) -> None:
    pytest.importorskip(
        "peft",
        reason="peft is in the `guides` group only: uv run --group guides pytest "
        "tests-integration/test_finetuning_guide.py",
    )
    import torch

    from pipekit_train.lightning import LightningModelOp

    registry = LocalModelRegistry(tmp_path)
    base = LightningModelOp(f"{factories}:torch_lora_mlp", in_size=4, out_size=1, seed=0)
    _fit(base, tasks["a"]).register(registry, "base")
    pretrained = registry.load("base")
    lora = LightningModelOp(f"{factories}:torch_lora_mlp", in_size=4, out_size=1, rank=2, seed=0)
    state = {
        k.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias"): v
        for k, v in pretrained.model.state_dict().items()
    }
    missing, unexpected = lora.model.load_state_dict(state, strict=False)
    assert not unexpected and all("lora_" in m for m in missing)
    tuned = _fit(lora, tasks["b"])
    base_weight = tuned.model.model[0].base_layer.weight.detach()
    assert torch.equal(base_weight, pretrained.model[0].weight.detach())
    tuned.register(registry, "base-lora")
    back = registry.load("base-lora")
    np.testing.assert_allclose(back(tasks["x"]), tuned.model(tasks["x"]), rtol=1e-6, atol=1e-6)
