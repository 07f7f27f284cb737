"""The run engine: one training run, on every backend, from start to finish.

`RunLifecycle` (`_lifecycle`) owns a run — start, the end of each optimizer update,
finish, abort — and drives `RunContext` (`_context`), which is composed of single-purpose
parts: the metric log (`_metrics`), validation (`_validation`), the checkpoint schedule
(`_checkpoint_schedule`), progress and stop requests (`_progress`), the learning-rate
scale (`_lr_scale`), the callbacks' dispatch (`_dispatch`) and their handle `RunState`
(`_state`). Around them: the data feed that remembers positions (`_feed`, with rollout
input noise in `_rollout_noise`), the prefetcher (`_prefetch`) and preemption
(`_preemption`). What a finished run hands downstream (`TrainingArtifact`, `History`,
`evaluate`) is in `pipekit_train.core.artifact`.
"""
