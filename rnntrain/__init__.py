"""rnntrain: LSTM-CTC training on RNNLIB-format NetCDF data (CPU, CUDA, MPI)."""
__version__ = "0.1.0"
