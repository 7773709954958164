"""Stage 2, compute: the model, the device, the worker pool and the per-task step."""
