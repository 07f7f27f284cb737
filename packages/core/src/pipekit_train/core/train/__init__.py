"""The drivers: `TrainingLoop` (`_training_loop`), `SeedGroup` (`_seed_group`, its lockstep
loop `_group_loop`), `OnlineTrainer` (`_online`), the step
loop for backends that expose a train step (`_step_loop`), `lr_find` (`_lr_find`), and
the checks that turn a training description into a `Plan` (`_build_plan`, `_shapes`)."""
