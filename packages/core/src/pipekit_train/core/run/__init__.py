"""One training run, on every backend: its lifecycle and its state.

`RunLifecycle` (`_lifecycle`) owns a run — start, the end of each optimizer update,
finish, abort — and drives `RunContext` (`_context`), which is composed of single-purpose
parts: the metric log (`_metrics`), validation (`_validation`), the checkpoint schedule
(`_checkpoint_schedule`), the callbacks' read-only view `RunState` (`_state`). Around
them: the data feed that remembers positions (`_feed`), preemption (`_preemption`),
evaluation (`_evaluation`), the `TrainingArtifact` (`_artifact`) and its `History`.
"""
