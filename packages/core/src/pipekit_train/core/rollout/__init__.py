"""Rollouts: a trained emulator used as a forward operator (`NeuralForward`) and the closed
loop that advances a state with one (`Cycle`)."""
