"""Model operators: a backend's trained network behind one interface.

The `Operator` / `ModelOp` contracts and `ModelOpBase` (`_operators`), which framework a
built model belongs to (`_kind`), the trusted-factory list (`_trust`) and the checks every
backend's embedding networks share (`_embeddings`). What a model's output means as a
distribution is in `pipekit_train.core.distributions`; a trained model used as a forward
operator or a posterior (`NeuralForward`, `PosteriorEnsemble`) in
`pipekit_train.core.rollout`.
"""
