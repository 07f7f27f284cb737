"""`Torch(compile="cuda-graphs")`: the whole update as one CUDA graph.

On the CPU: everything that cannot be captured is refused before the run, naming the
setting and the fix. With CUDA (skipped without it; `scripts/gpu_check.py` runs the same
checks on a GPU node): a graphed run resumes bit-exact and trains like an eager one.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from pipekit_train.core import ConfigError, TrainingLoop
from pipekit_train.core.testing import regression_task
from pipekit_train.lightning import Torch, TorchModelOp
from pipekit_train.lightning.testing import GRAPHS_LOSS_RTOL, graphs_check, graphs_failures

CUDA = torch.cuda.is_available()


def _plan(**overrides: Any) -> Any:
    train, _ = regression_task()
    kwargs: dict[str, Any] = {
        "model": TorchModelOp("pipekit_train.lightning.testing:mlp", in_size=4, out_size=1),
        "data": train,
        "optimizer_config": {"name": "adam", "lr": 1e-3},
        "batch_size": 16,
        "max_steps": 5,
        "adapter": Torch(),
        "progress": False,
    }
    kwargs.update(overrides)
    return TrainingLoop(**kwargs).plan


def test_cuda_graphs_on_the_cpu_is_refused_before_any_work() -> None:
    with pytest.raises(ConfigError, match=r"needs a CUDA device.*compile='cuda-graphs'"):
        _plan(adapter=Torch(compile="cuda-graphs", device="cpu"))


@pytest.mark.parametrize(
    ("adapter", "overrides", "match"),
    [
        (
            {},
            {"optimizer_config": {"name": "sgd", "lr": 0.1}},
            r"\['adam', 'adamw'\].*Received: optimizer='sgd'",
        ),
        ({"fused_optimizer": True}, {}, r"fused_optimizer=True\. Drop fused_optimizer"),
        ({"precision": "float16-mixed"}, {}, r"precision='float16-mixed'\. Use 'bfloat16-mixed'"),
        ({}, {"on_nonfinite": "skip"}, r"on_nonfinite='skip'"),
        (
            {},
            {
                "model": TorchModelOp(
                    "pipekit_train.lightning.testing:mlp", in_size=4, out_size=1, dropout=0.1
                )
            },
            r"random layers \(e\.g\. Dropout\)",
        ),
    ],
    ids=["sgd", "fused", "float16", "skip", "dropout"],
)
def test_what_cannot_be_captured_is_refused(
    adapter: dict[str, Any], overrides: dict[str, Any], match: str
) -> None:
    # the checks of a capturable plan, called as validate() calls them on a CUDA device
    torch_adapter = Torch(compile="cuda-graphs", **adapter)
    plan = _plan(**overrides)
    with pytest.raises(ConfigError, match=match):
        torch_adapter._check_capturable(plan)


def test_a_capturable_plan_passes_the_checks() -> None:
    Torch(compile="cuda-graphs", precision="bfloat16-mixed")._check_capturable(
        _plan(optimizer_config={"name": "adamw", "lr": 1e-3, "clip_norm": 1.0, "ema": 0.99})
    )


@pytest.mark.skipif(not CUDA, reason="CUDA graphs need a CUDA GPU (scripts/gpu_check.py runs this)")
@pytest.mark.parametrize(
    "options",
    [{}, {"steps_per_execution": 10}, {"precision": "bfloat16-mixed"}],
    ids=["k1", "k10", "bf16"],
)
def test_a_graphed_run_resumes_bit_exact_and_trains_like_eager(options: dict[str, Any]) -> None:
    # the GPU check's verdict too: captured (no fallback to eager), resumed bit-exact at 30,
    # final loss within GRAPHS_LOSS_RTOL of eager Torch()'s
    result = graphs_check("cuda", **options)
    assert graphs_failures(result) == {}, result


def test_the_graphs_verdict_fails_a_fallback_a_resume_mismatch_and_a_loss_gap() -> None:
    # a graphs_check result with the numbers of the K=1 row measured on one H200
    # (docs/performance.md, "On a GPU")
    good = {
        "stop_at": 30,
        "resume_bit_exact": True,
        "resumed_from_step": 30,
        "graphed_loss": 0.726,
        "eager_loss": 0.726,
        "loss_rel_diff": 9.44e-06,
        "report": {
            "cuda_graphs": True,
            "captured_at_update": 5,
            "fell_back": None,
        },
    }
    assert graphs_failures(good) == {}
    fell_back = {**good, "report": {**good["report"], "fell_back": "RuntimeError: x"}}
    assert graphs_failures(fell_back) == {"capture": "fell back to eager: RuntimeError: x"}
    never = {**good, "report": {**good["report"], "captured_at_update": None}}
    assert list(graphs_failures(never)) == ["capture"]
    assert list(graphs_failures({**good, "report": None})) == ["capture"]
    assert list(graphs_failures({**good, "resume_bit_exact": False})) == ["resume"]
    assert list(graphs_failures({**good, "resumed_from_step": 0})) == ["resume"]
    for gap in (GRAPHS_LOSS_RTOL, 0.5, float("nan"), None):
        assert list(graphs_failures({**good, "loss_rel_diff": gap})) == ["loss"], gap
