"""Test utilities shipped with pipekit-train-core.

- `AdapterConformance`: the conformance suite each adapter package subclasses.
- `NumpyAdapter`, `NumpyLinearOp`: a pure-numpy reference backend (linear model,
  analytic gradients) that runs the suite without any framework.
- `regression_task`, `oscillator_task`, `damped_oscillator_step`: the shared toy tasks.
- `loopback_s3`, `LoopbackS3`: a moto S3 API server on 127.0.0.1 for cloud-checkpoint and
  registry tests (development dependencies `moto[server]`, `boto3`, `s3fs`).
- `small_filesystem`: a tiny tmpfs mounted for a test (root only) that fills up like a
  full disk.
- `RayProbe`: the callback of the Ray Train restart tests (records each worker's run,
  SIGKILLs one worker once).
- `check_restore_best`, `restore_best_loop`, `checkpoint_weights`, `ScoreReporter`: the
  check every backend's `restore_best=True` passes (the artifact holds the best
  checkpoint's weights byte for byte).
- `check_device_rollout`, `host_rollout`: the checks every backend's device rollout
  (`model_op.rollout`) passes against the host loop; `check_corrected_rollout` the same
  for a model that corrects a coarse stepper.
- `check_rollout_prediction`, `check_one_step_rollout`, `check_rollout_resume`,
  `check_rollout_kill_resume`, `check_rollout_schedule_counts_skipped_updates`: the checks
  every backend's rollout training passes.
- `run_golden`, `compare_golden`, `GOLDEN_CASES`, ...: the cross-backend golden-run suite
  (the same description and initial weights give the same loss curve on every backend);
  `run_golden_field`, `GOLDEN_FIELD_CASES`: its conv-net cases on channels-last fields;
  `run_golden_plateau`, `compare_plateau`, `PLATEAU_CASES`: its `ReduceLROnPlateau` cases;
  `run_golden_flow`, `compare_golden_flow`: its flow-head cases (`flow_nll`, `Flow`;
  element-wise and, with `GOLDEN_FLOW_COUPLED_OPTIONS`, coupled);
  `run_golden_rollout`, `GOLDEN_ROLLOUT_CASES`: its rollout-training cases (`Rollout`),
  with the array-API steppers `pendulum_rk4`, `pendulum_euler` and `periodic_diffusion`.
- `DeepSetSuite`, `point_sets`: the checks every backend's `deep_set` embedding passes.
- `write_well_file`: a small writer of The Well's HDF5 layout (trajectories of fields and
  scalars), for tests and examples of `pipekit_train.core.data.WellSource`.
- `spawn_python`, `run_python`: start a worker process (`python -m module ...` or
  `python script ...`) forked from a server that imported the framework once
  (`AdapterConformance.worker_preload`); a plain subprocess where forking is off.
"""

from typing import Any

from ._calibration import check_calibration_monitor
from ._embeddings import DEEP_SET_SIZES, DeepSetSuite, point_sets
from ._fork_server import ForkedProcess, run_python, spawn_python
from ._golden import (
    GOLDEN_CASES,
    GOLDEN_EMA_CASES,
    GOLDEN_FIELD_CASES,
    GOLDEN_FIELD_STEPS,
    GOLDEN_STEPS,
    GoldenBackend,
    GoldenCase,
    GoldenRun,
    compare_golden,
    conv_forward,
    conv_sizes,
    dump_runs,
    golden_conv_weights,
    golden_field_task,
    golden_task,
    golden_weights,
    load_runs,
    max_differences,
    max_norm_differences,
    mlp_sizes,
    run_golden,
    run_golden_field,
)
from ._golden_flow import (
    GOLDEN_FLOW_COUPLED_LR,
    GOLDEN_FLOW_COUPLED_OPTIONS,
    GOLDEN_FLOW_OPTIONS,
    GOLDEN_FLOW_STEPS,
    compare_golden_flow,
    golden_flow_task,
    run_golden_flow,
)
from ._golden_plateau import (
    PLATEAU_CASES,
    PLATEAU_STEPS,
    PLATEAU_VALIDATE_EVERY,
    PlateauRun,
    compare_plateau,
    plateau_loop,
    run_golden_plateau,
)
from ._golden_rollout import (
    GOLDEN_ROLLOUT_CASES,
    GOLDEN_ROLLOUT_STEPS,
    GOLDEN_ROLLOUTS,
    golden_forced_task,
    golden_rollout_task,
    pendulum_euler,
    pendulum_rk4,
    periodic_diffusion,
    rollout_case_loop,
    run_golden_rollout,
)
from ._lease import plant_lease
from ._numpy_adapter import NumpyAdapter
from ._numpy_model import LinearModel, NumpyLinearOp, decode_arrays, encode_arrays, linear
from ._ray_probe import RayProbe
from ._restore_best import (
    RESTORE_BEST_SCORES,
    RESTORE_BEST_STEP,
    RESTORE_BEST_STEPS,
    ScoreReporter,
    check_restore_best,
    checkpoint_weights,
    restore_best_loop,
)
from ._rollout import (
    ROLLOUT_HEADS,
    check_corrected_rollout,
    check_device_rollout,
    check_rollout_monitor,
    check_stochastic_rollout,
    host_rollout,
)
from ._rollout_training import (
    ROLLOUT_RESUME_LOSS,
    ROLLOUT_RESUME_SPEC,
    check_one_step_rollout,
    check_rollout_kill_resume,
    check_rollout_monitor_under_rollout,
    check_rollout_prediction,
    check_rollout_resume,
    check_rollout_schedule_counts_skipped_updates,
)
from ._s3 import LoopbackS3, loopback_s3
from ._smallfs import SmallFilesystemUnavailable, small_filesystem
from ._tasks import FLOW_HEAD, damped_oscillator_step, flow_task, oscillator_task, regression_task
from ._well import write_well_file

__all__ = [
    "ForkedProcess",
    "run_python",
    "spawn_python",
    "BAD_INPUTS",
    "FLOW_HEAD",
    "GOLDEN_CASES",
    "GOLDEN_EMA_CASES",
    "GOLDEN_FIELD_CASES",
    "GOLDEN_FIELD_STEPS",
    "GOLDEN_FLOW_COUPLED_LR",
    "GOLDEN_FLOW_COUPLED_OPTIONS",
    "GOLDEN_FLOW_OPTIONS",
    "GOLDEN_FLOW_STEPS",
    "GOLDEN_ROLLOUTS",
    "GOLDEN_ROLLOUT_CASES",
    "GOLDEN_ROLLOUT_STEPS",
    "GOLDEN_STEPS",
    "PLATEAU_CASES",
    "PLATEAU_STEPS",
    "PLATEAU_VALIDATE_EVERY",
    "RESTORE_BEST_SCORES",
    "RESTORE_BEST_STEP",
    "RESTORE_BEST_STEPS",
    "ROLLOUT_HEADS",
    "ROLLOUT_RESUME_LOSS",
    "ROLLOUT_RESUME_SPEC",
    "AdapterConformance",
    "GoldenBackend",
    "GoldenCase",
    "GoldenRun",
    "HookRecorder",
    "LinearModel",
    "LoopbackS3",
    "NumpyAdapter",
    "NumpyLinearOp",
    "PlateauRun",
    "RayProbe",
    "ScoreReporter",
    "SmallFilesystemUnavailable",
    "check_calibration_monitor",
    "DEEP_SET_SIZES",
    "DeepSetSuite",
    "point_sets",
    "check_corrected_rollout",
    "check_device_rollout",
    "check_one_step_rollout",
    "check_restore_best",
    "check_rollout_kill_resume",
    "check_rollout_monitor_under_rollout",
    "check_rollout_monitor",
    "check_rollout_prediction",
    "check_rollout_resume",
    "check_rollout_schedule_counts_skipped_updates",
    "check_stochastic_rollout",
    "compare_golden",
    "compare_golden_flow",
    "checkpoint_weights",
    "compare_plateau",
    "conv_forward",
    "conv_sizes",
    "damped_oscillator_step",
    "decode_arrays",
    "dump_runs",
    "encode_arrays",
    "flow_task",
    "golden_conv_weights",
    "golden_field_task",
    "golden_flow_task",
    "golden_forced_task",
    "golden_rollout_task",
    "golden_task",
    "golden_weights",
    "host_rollout",
    "linear",
    "load_runs",
    "loopback_s3",
    "max_differences",
    "max_norm_differences",
    "mlp_sizes",
    "oscillator_task",
    "pendulum_euler",
    "pendulum_rk4",
    "periodic_diffusion",
    "plant_lease",
    "plateau_loop",
    "regression_task",
    "restore_best_loop",
    "rollout_case_loop",
    "run_golden",
    "run_golden_field",
    "run_golden_flow",
    "run_golden_plateau",
    "run_golden_rollout",
    "small_filesystem",
    "write_well_file",
]


def __getattr__(name: str) -> Any:
    # The conformance suite imports pytest; load it only when asked for.
    if name in ("AdapterConformance", "BAD_INPUTS", "HookRecorder"):
        from . import _conformance

        return getattr(_conformance, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
