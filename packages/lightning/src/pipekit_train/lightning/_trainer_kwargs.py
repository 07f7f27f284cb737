"""`TRAINER_KWARGS`: the `lightning.Trainer` arguments `Lightning()` forwards.

`Lightning(**trainer_kwargs)` takes exactly these; `Torch()` (`torch/`) refuses them
with a pointer to `Lightning()`. A leaf both adapters import, so `Torch()` needs nothing
from the Lightning adapter's module (`_adapter.py`).
"""

from __future__ import annotations

__all__ = ["TRAINER_KWARGS"]

TRAINER_KWARGS = frozenset(
    {
        "accelerator",
        "strategy",
        "devices",
        "num_nodes",
        "precision",
        "logger",
        "callbacks",
        "limit_val_batches",
        "limit_test_batches",
        "limit_predict_batches",
        "val_check_interval",
        "check_val_every_n_epoch",
        "num_sanity_val_steps",
        "log_every_n_steps",
        "enable_checkpointing",
        "enable_progress_bar",
        "enable_model_summary",
        "gradient_clip_val",
        "gradient_clip_algorithm",
        "deterministic",
        "benchmark",
        "inference_mode",
        "use_distributed_sampler",
        "profiler",
        "detect_anomaly",
        "barebones",
        "plugins",
        "sync_batchnorm",
        "reload_dataloaders_every_n_epochs",
        "default_root_dir",
        "enable_autolog_hparams",
        "model_registry",
    }
)
"""`lightning.Trainer` keyword arguments, minus the ones `TrainingLoop` owns."""
