"""The abstract adapter contract: `Adapter`, `StepBackend`, `Capabilities`,
`NotSupportedError` (`_adapter`) and backend discovery through entry points (`_backends`).

It implements nothing of a run: the run (`pipekit_train.core.run`) and the drivers
(`pipekit_train.core.train`) sit above it. Adapter authors import these names from the
public module `pipekit_train.core.adapter`.
"""
