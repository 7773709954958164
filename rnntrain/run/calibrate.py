"""Fitting a model's confidence temperature on labelled data (``rnntrain calibrate``, and
the end of training on the validation set with the best checkpoint).

The network runs once over the data (``evaluate``'s workers); each sequence's hypothesis
(best path, or the decoder's) is aligned in the workers and its labels' aligned frames
are kept (``decode.calibrate.LabelSamples``); then one temperature is fitted
(``fit_temperature``). The math and the ECE: ``rnntrain/decode/calibrate.py``.
"""
from __future__ import annotations

import numpy as np

from rnntrain.decode.align import path_positions, viterbi_positions
from rnntrain.decode.calibrate import Calibration, LabelSamples, ece, fit_temperature, nll
from rnntrain.run.evaluate import evaluate


class _Aligner:
    """The worker side: (T', C) log-probs → (hypothesis, its aligned frames' rows, their
    label positions)."""

    def __init__(self, blank: int, decoder=None):
        self.blank, self.decoder = blank, decoder

    def __call__(self, lp: np.ndarray):
        if self.decoder is not None:
            hyp = self.decoder.decode(lp)
            pos = viterbi_positions(lp, hyp, self.blank)
        else:
            path = np.argmax(lp, axis=1)
            pos = path_positions(path, self.blank)
            keep = np.ones(len(path), bool)
            keep[1:] = path[1:] != path[:-1]
            hyp = [int(c) for c in path[keep] if c != self.blank]
        frames = np.flatnonzero(pos >= 0)
        return hyp, np.asarray(lp[frames], np.float32), pos[frames]


def calibrate(model, ds, keep: np.ndarray, batch_frames: int, device, decoder=None,
              workers: int = 0, data: str = "") -> Calibration:
    """Fit the temperature of ``model``'s confidences on the sequences of ``ds`` with
    keep[i] (their targets are the references)."""
    samples = collect(model, ds, keep, batch_frames, device, decoder, workers)
    return fit_temperature(samples, data,
                           decoder.describe() if decoder is not None else "best path")


def check(samples: LabelSamples, temperature: float) -> dict:
    """ECE and NLL of ``samples`` at T = 1 and at ``temperature`` (a stored calibration
    checked on held-out data)."""
    arrays = samples.arrays()
    correct = arrays[3]
    out = {"temperature": temperature, "labels": int(len(correct)),
           "accuracy": float(correct.mean()) if len(correct) else 0.0}
    for key, t in (("before", 1.0), ("after", temperature)):
        c = samples.confidences(t, arrays)
        out[f"ece_{key}"], out[f"nll_{key}"] = ece(c, correct), nll(c, correct)
    return out


def collect(model, ds, keep: np.ndarray, batch_frames: int, device, decoder=None,
            workers: int = 0) -> LabelSamples:
    """The hypothesis labels of ``ds``'s kept sequences with their aligned frames and
    correctness (``LabelSamples``)."""
    samples = LabelSamples()

    def take(sid: int, res):
        hyp, rows, pos = res
        # rows are already the aligned frames: positions index them directly
        samples.add(rows, hyp, ds.targets[sid], model.blank, positions=pos)

    evaluate(model, ds, keep, batch_frames, device, workers=workers,
             per_seq=_Aligner(model.blank, decoder), on_seq=take)
    return samples


def store(path, calibration: Calibration, out=None):
    """Write ``calibration`` into the checkpoint ``path`` (its ``calibration`` entry; the
    rest unchanged), atomically, or into a copy at ``out``."""
    from rnntrain.run import checkpoint as ckpt
    ck = ckpt.read(path)
    ck.card.calibration = calibration.to_dict()  # a field of the model card
    ck.save(out if out is not None else path)
