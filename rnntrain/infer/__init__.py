"""Using a trained model: load (``model``), run and decode (``api.Model``), transcribe
inputs in bulk (``transcribe``), export to TorchScript/ONNX (``graph``, ``export``).

The front end that made the training frames comes from ``rnntrain.frontend``, shared with
the converters, so a model transcribes exactly as it was trained.
"""
