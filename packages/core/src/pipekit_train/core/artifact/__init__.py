"""What a run hands downstream: the `TrainingArtifact` and what it is judged by.

`TrainingArtifact` (`_artifact`) holds the trained model, the plan in its JSON form, the
metric `History` (`_history`) and the version table (`_versions`); `evaluate`
(`_evaluation`) scores a model operator on a dataset the way validation does, and
`artifact.rollout` judges an emulator on held-out trajectories (`_rollout_evaluation`).
None of it needs a backend or a live run: the run engine (`pipekit_train.core.run`)
builds the artifact, and a loader reads one back from the registry.
"""

from ._artifact import TrainingArtifact
from ._evaluation import evaluate
from ._history import History

__all__ = ["History", "TrainingArtifact", "evaluate"]
