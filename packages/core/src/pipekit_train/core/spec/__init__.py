"""The frozen description of a run, and the vocabulary every backend runs the same way.

`Plan` (`_plan`), the canonical optimizer spec (`_optimizer`), learning-rate schedules
(`_schedules`), the typed policies `Precision` and `NonFinitePolicy` (`_policies`), the
learning-rate scale (`_lr_scale`) and the preemption signals and time budget a plan
names (`_signals`). Validated here once; each adapter only translates.
"""
