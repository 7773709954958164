"""rnntrain: LSTM-CTC training on RNNLIB-format NetCDF data (CPU, CUDA, MPI)."""
import os

# oneDNN (torch's CPU LSTM kernels) caches a compiled primitive, with its buffers, per
# input shape, up to 1024 of them. Length-grouped batches bring new shapes all epoch long,
# so with that default the process grows with the size of the corpus (measured: peak RSS
# +36% for 10x the data with a tiny model; +22% with 64 entries, +8% with 8). A small
# cache keeps memory bounded by the chunk size, as the reader promises, at no measured
# speed cost (bench threads: same frames/s). Set the variable yourself to override; it
# must be set before torch initialises oneDNN, which is why it lives here.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

__version__ = "0.1.0"
