"""Model operators and what a trained model hands downstream.

The `Operator` / `ModelOp` contracts and `ModelOpBase` (`_operators`), which framework a
built model belongs to (`_kind`), the trusted-factory list (`_trust`), and the
distribution heads a model's output can be read as: `Gaussian` (`_heads`), `Mixture`
(`_mixture`) and `Flow` (`_flow`, a conditional normalizing flow), and several networks'
distributions mixed as one (`Ensemble`, `PosteriorEnsemble`: `_ensemble`).
"""
