"""rnntrain: LSTM-CTC training on RNNLIB-format NetCDF data (CPU, CUDA, MPI)."""
import os

# oneDNN (torch's CPU LSTM kernels) caches a compiled primitive, with its buffers, per
# input shape, up to 1024 of them. Length-grouped batches bring new shapes all epoch long,
# so with that default the process grows with the size of the corpus. A small cache keeps
# memory bounded by the chunk size, as the reader promises (figures: docs/threads.md, "The
# CPU LSTM path"). Set the variable yourself to override; it must be set before torch
# initialises oneDNN, which is why it lives here.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

__version__ = "0.1.0"
