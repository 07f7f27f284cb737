"""Resource settings of the executors: validation, and how many trials a cluster fits."""

from __future__ import annotations

from typing import Any

import pytest

from pipekit_train.core import ConfigError
from pipekit_train.sweep import HyperSweep, ProcessExecutor, RayExecutor
from pipekit_train.sweep._resources import check_devices, check_resources, trials_that_fit
from pipekit_train.sweep.testing import numpy_trial


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"num_gpus": -0.5}, r"`num_gpus` cannot be negative\. Received: num_gpus=-0\.5"),
        ({"num_cpus": "2"}, r"`num_cpus` must be a number\. Received: num_cpus='2'"),
        ({"num_cpus": True}, r"`num_cpus` must be a number"),
        ({"num_gpus": float("nan")}, r"`num_gpus` must be a number"),
        (
            {"num_gpus": 1.5},
            r"above 1 must be a whole number of GPUs\. Received: num_gpus=1\.5\..*num_gpus=2",
        ),
        ({"num_gpus": 0.00001}, r"steps of 0\.0001\. Received: num_gpus=1e-05"),
        ({"gpus": 1}, r"Unknown key\(s\) \['gpus'\] in `resources_per_trial`.*Known: \['num_cpus'"),
        ({"bigmem": 1}, r"custom Ray resources go under 'resources'"),
        ({"resources": {"GPU": 1}}, r"`GPU` is not a custom resource.*Use 'num_cpus', 'num_gpus'"),
        ({"resources": {"bigmem": -1}}, r"`resources\['bigmem'\]` cannot be negative"),
        ({"resources": [("bigmem", 1)]}, r"must map custom resource names to amounts"),
        ({"accelerator_type": "H100"}, r"must ask for a GPU.*Add num_gpus=1"),
        ({"accelerator_type": 3, "num_gpus": 1}, r"`accelerator_type` must name an accelerator"),
        ([("num_gpus", 1)], r"`resources_per_trial` must be a dict"),
    ],
)
def test_bad_ray_resources_are_refused_with_the_fix(resources: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        RayExecutor(resources)


def test_ray_resources_become_task_options() -> None:
    assert check_resources(None) == {"num_cpus": 1}
    assert check_resources({"num_gpus": 0.5}) == {"num_cpus": 1, "num_gpus": 0.5}
    assert check_resources(
        {"num_cpus": 0, "num_gpus": 2, "resources": {"bigmem": 1}, "accelerator_type": "H100"}
    ) == {"num_cpus": 0, "num_gpus": 2, "resources": {"bigmem": 1}, "accelerator_type": "H100"}
    with pytest.raises(ConfigError, match=r"`address` must be a Ray cluster address"):
        RayExecutor(address="")


def test_trials_that_fit_counts_each_node_by_its_scarcest_resource() -> None:
    nodes = [
        {"CPU": 2.0, "memory": 8e9, "node:10.0.0.1": 1.0},  # no GPU: fits no GPU trial
        {"CPU": 4.0, "GPU": 1.0},
        {"CPU": 1.0, "GPU": 2.0, "bigmem": 1.0},
    ]
    assert trials_that_fit(check_resources({"num_gpus": 0.5}), nodes) == 2 + 1  # CPU-bound there
    assert trials_that_fit(check_resources({"num_cpus": 0.5, "num_gpus": 0.5}), nodes) == 2 + 2
    assert trials_that_fit(check_resources({"num_gpus": 0.3, "num_cpus": 0}), nodes) == 3 + 6
    assert trials_that_fit(check_resources(None), nodes) == 7
    assert trials_that_fit(check_resources({"resources": {"bigmem": 1}}), nodes) == 1
    assert trials_that_fit(check_resources({"num_gpus": 4}), nodes) == 0
    assert trials_that_fit(check_resources({"num_cpus": 0}), nodes) is None  # nothing asked


@pytest.mark.parametrize(
    ("devices", "per_device", "message"),
    [
        (["gpu:0"], 1, r"`devices\[0\]` must be 'cuda:<index>'.*Received: devices\[0\]='gpu:0'"),
        (["cuda"], 1, r"must be 'cuda:<index>'"),
        (["cuda:0", "cuda:x"], 1, r"devices\[1\]='cuda:x'"),
        (["cuda:0", "cuda:0,1"], 1, r"GPU 0 is in two devices .*use trials_per_device"),
        (["cpu", "cpu"], 1, r"A device is listed twice"),
        (["cuda:1,1"], 1, r"names a GPU twice"),
        ([0], 1, r"must be a device such as 'cuda:0'"),
        ([{"HIP_VISIBLE_DEVICES": 0}], 1, r"dict must map environment variable names to string"),
        ("cuda:0", 1, r"`devices` must be a list such as \['cuda:0', 'cuda:1'\]"),
        ([], 1, r"`devices` is empty"),
        (["cuda:0"], 0, r"`trials_per_device` must be at least 1\. Received: trials_per_device=0"),
        (["cuda:0"], 1.5, r"`trials_per_device` must be a positive int"),
        (None, 2, r"`trials_per_device` needs `devices`"),
    ],
)
def test_bad_devices_are_refused_with_the_fix(devices: Any, per_device: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ProcessExecutor(devices, trials_per_device=per_device)


def test_devices_give_each_worker_its_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("XLA_PYTHON_CLIENT_MEM_FRACTION", "XLA_PYTHON_CLIENT_PREALLOCATE"):
        monkeypatch.delenv(name, raising=False)
    [a, b, c, d] = check_devices([" CUDA:0 ", "cuda:1, 2", "cpu", {"HIP_VISIBLE_DEVICES": "3"}], 1)
    assert (a.label, a.env) == ("cuda:0", {"CUDA_VISIBLE_DEVICES": "0"})
    assert (b.label, b.env) == ("cuda:1,2", {"CUDA_VISIBLE_DEVICES": "1,2"})
    assert (c.label, c.env) == ("cpu", {"CUDA_VISIBLE_DEVICES": ""})
    assert (d.label, d.env) == ("HIP_VISIBLE_DEVICES=3", {"HIP_VISIBLE_DEVICES": "3"})
    executor = ProcessExecutor(["cuda:0", "cpu"], trials_per_device=4)
    assert executor.slots == 8
    assert executor._env(0) == {
        "CUDA_VISIBLE_DEVICES": "0",
        "PIPEKIT_SWEEP_DEVICE": "cuda:0",
        "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.1875",  # JAX's 0.75, shared by 4 trials
    }
    assert executor._env(1) == {"CUDA_VISIBLE_DEVICES": "", "PIPEKIT_SWEEP_DEVICE": "cpu"}
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # the user's choice wins
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in executor._env(0)


def test_executor_settings_are_checked_against_the_sweep() -> None:
    executor = ProcessExecutor(["cuda:0", "cuda:1"], trials_per_device=2)
    with pytest.raises(ConfigError, match=r"At most 4 trials run at once on 2 device\(s\)"):
        HyperSweep(numpy_trial, [{}], "val_loss", executor=executor, max_concurrent=5)
    sweep = HyperSweep(numpy_trial, [{}], "val_loss", executor=executor, max_concurrent=3)
    assert sweep.executor == "process"
    assert sweep.get_config()["executor_settings"] == {
        "kind": "process",
        "devices": ["cuda:0", "cuda:1"],
        "trials_per_device": 2,
    }
    with pytest.raises(
        ConfigError, match=r"Give the Ray address once.*RayExecutor\(address=\.\.\.\)"
    ):
        HyperSweep(numpy_trial, [{}], "val_loss", executor=RayExecutor(), ray_address="auto")
    with pytest.raises(ConfigError, match=r"`executor` must be one of .*or an executor such as"):
        HyperSweep(numpy_trial, [{}], "val_loss", executor=object())  # type: ignore[arg-type]
