"""The rollout-training settings the emulator examples and the guide's table compare.

One definition for `examples/emulator.py`, `examples/field_emulator.py`,
`examples/chaotic_emulator.py` and `benchmarks/rollout_training_table.py`: a setting's
name (as the table prints it) and the `Rollout` it means, at a number of updates.

- `one-step`: ordinary training on one-step increments (`rollout=None`, windows of k = 1);
- `k=4`: `Rollout(steps=k, residual=True)`, full backpropagation through the k steps;
- `curriculum 1→4`: the same with `RolloutSchedule(start=1, every_n_steps=updates // 5,
  maximum=k)` (k = 1, 2, 3 for a fifth of the updates each, then k);
- `pushforward`: `Rollout(steps=k, backprop="last")` (k - 1 steps without gradient, the
  last trained);
- `input noise`: one step with Gaussian noise on the input state (`Rollout(steps=1,
  noise_std=NOISE_STD)`; the target stays the true next state).
"""

from __future__ import annotations

from pipekit_train.core import Rollout, RolloutSchedule

SETTINGS = ("one-step", "k=4", "curriculum 1→4", "pushforward", "input noise")
NOISE_STD = 0.01  # normalised units of the state


def rollout_setting(name: str, updates: int, k: int = 4) -> Rollout | None:
    """The `Rollout` of setting `name` over `updates` updates (None: one-step training).

    `k` is the rollout length of `k=4`, the curriculum's last length and pushforward's.
    """
    if name == "one-step":
        return None
    if name == "k=4":
        return Rollout(steps=k, residual=True)
    if name == "curriculum 1→4":
        schedule = RolloutSchedule(start=1, every_n_steps=max(1, updates // 5), maximum=k)
        return Rollout(steps=k, residual=True, schedule=schedule)
    if name == "pushforward":
        return Rollout(steps=k, residual=True, backprop="last")
    if name == "input noise":
        return Rollout(steps=1, residual=True, noise_std=NOISE_STD)
    raise ValueError(f"Received: setting={name!r}. Use one of {', '.join(SETTINGS)}.")


def window_length(rollout: Rollout | None) -> int:
    """The `k` of the training windows a setting needs (1 for one-step training)."""
    return 1 if rollout is None else rollout.max_steps
