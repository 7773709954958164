"""Stage 4, run: the training loop, evaluation, checkpoints, the run folder, faults and
traces."""
