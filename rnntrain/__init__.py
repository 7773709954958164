"""rnntrain: LSTM-CTC training on RNNLIB-format NetCDF data (CPU, CUDA, MPI).

Python API (lazy: ``import rnntrain`` loads neither torch nor NetCDF)::

    import rnntrain
    run = rnntrain.train("my.toml", train={"epochs": 5})   # → the run folder
    m = rnntrain.load(run)            # run folder, checkpoint, TorchScript or ONNX export
    e = rnntrain.load_ensemble("runs/x-crossfold5")  # several models as one (voting)
    m.transcribe("a.wav").text        # also an image, a .npy path, a signal or features
    m.log_probs(frames)               # (T', C) from model-ready frames (T, F)
    m.export("m.onnx", "onnx")
"""
import os

# oneDNN (torch's CPU LSTM kernels) caches a compiled primitive, with its buffers, per
# input shape, up to 1024 of them. Length-grouped batches bring new shapes all epoch long,
# so with that default the process grows with the size of the corpus. A small cache keeps
# memory bounded by the chunk size, as the reader promises (figures: docs/threads.md, "The
# CPU LSTM path"). Set the variable yourself to override; it must be set before torch
# initialises oneDNN, which is why it lives here.
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "8")

__version__ = "0.1.0"

__all__ = ["load", "load_ensemble", "train", "Model", "Transcript", "FrontEnd", "UserError", "__version__"]

# public name → module that defines it, imported on first use
_LAZY = {"load": "rnntrain.infer.api", "load_ensemble": "rnntrain.infer.ensemble",
         "train": "rnntrain.api", "Model": "rnntrain.infer.api",
         "Transcript": "rnntrain.infer.api", "FrontEnd": "rnntrain.frontend",
         "UserError": "rnntrain.errors"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value  # later look-ups skip this function
        return value
    raise AttributeError(f"module 'rnntrain' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
