"""``Model``: a loaded model's Python interface (``rnntrain.load(path)`` returns one).

    m = rnntrain.load("runs/fsdd_digits")        # run folder, checkpoint or export
    m.labels                                      # ['0', '1', ..., '9']
    t = m.transcribe("a.wav")                     # or a .npy path, a signal, features
    t.text, t.labels, t.times                     # "3 1 4", [...], [0.36, 0.92, 1.4]
    lp = m.log_probs(frames)                      # (T', C) from model-ready frames (T, F)

What counts as input: an audio file (WAV, FLAC, ... at any sample rate, channels averaged)
or a 1-D signal (at ``rate``, default the front end's) goes through the recorded front
end; a ``.npy`` file or 2-D array holds features as the converter received or computed
them, before normalisation, and is normalised with the training statistics; ``log_probs``
takes frames exactly as the NetCDF file holds them (already normalised). A model trained
on images converted by ``rnntrain-data images`` takes image files (PNG, JPEG, TIFF, ...)
or Pillow images, prepared with the converter's settings (``rnntrain.frontend.images``):

    m = rnntrain.load("runs/printed_lines")
    m.transcribe("line.png").text                 # "Main St. 42": the characters as text
                                                  # (labels converted with --chars)
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError
from rnntrain.frontend.audio import read_npy
from rnntrain.frontend.images import IMAGE_SUFFIXES

AUDIO_SUFFIXES = {".wav", ".flac", ".ogg", ".oga", ".opus", ".mp3", ".aif", ".aiff", ".au",
                  ".caf", ".w64", ".rf64"}


@dataclass
class Transcript:
    """One hypothesis: label names, each label's frames on the CTC alignment, its peak and
    confidence (``rnntrain.decode.align``). Frames are model output frames (after
    stacking and the conv front end's width pooling)."""
    labels: list[str]
    peaks: list[int]                # model output frame (after stacking) of each label
    frames: int                     # model output frames of the input
    frame_seconds: float | None     # seconds per model output frame; None: not known
    spelled: str | None = None      # the text, for models whose labels are characters
    starts: list[int] = field(default_factory=list)  # first frame of each label's span
    ends: list[int] = field(default_factory=list)    # one past its last frame
    confidences: list[float] = field(default_factory=list)  # per label, in (0, 1]
    score: float | None = None      # the decoder's ranking score (module docs of decode.beam)
    log_prob: float | None = None   # log P_ctc(hypothesis | input), every alignment summed
    temperature: float = 1.0        # the confidences' temperature (the model's calibration)
    pixel_map: tuple | None = None  # images: (columns per frame, LineGeometry or None):
                                    # frame f starts at prepared column f × columns, mapped
                                    # to the image file's columns by the geometry if known
    nbest: list["Transcript"] = field(default_factory=list)  # --nbest: the N best, this first

    @property
    def text(self) -> str:
        """The characters as text for character models (trained on images converted with
        ``--chars``: "Main St. 42"), else the label names space-separated ("3 1 4")."""
        return self.spelled if self.spelled is not None else " ".join(self.labels)

    @property
    def times(self) -> list[float] | None:
        """Seconds of each label's peak (frame × hop × stacking), or None without a front end."""
        if self.frame_seconds is None:
            return None
        return [round(p * self.frame_seconds, 6) for p in self.peaks]

    @property
    def unit(self) -> str:
        """The unit of ``span_starts``/``span_ends``: "s" (audio front end), "px" (image
        columns) or "frame" (model output frames, neither known)."""
        return "s" if self.frame_seconds is not None else \
            "px" if self.pixel_map is not None else "frame"

    def _at(self, frame: int) -> float:
        if self.frame_seconds is not None:
            return round(frame * self.frame_seconds, 6)
        if self.pixel_map is not None:
            per, geo = self.pixel_map
            c = frame * per
            return round(geo.column_to_pixel(c) if geo is not None else c, 3)
        return frame

    @property
    def span_starts(self) -> list:
        """Where each label's aligned frames begin, in ``unit``: the start of its first
        frame (seconds: frame × hop × stacking; pixels: the first image column)."""
        return [self._at(f) for f in self.starts]

    @property
    def span_ends(self) -> list:
        """Where each label's aligned frames end, in ``unit``: the end of its last frame."""
        return [self._at(f) for f in self.ends]

    def to_dict(self, nbest: bool = True) -> dict:
        """The JSON object of ``--json`` (docs/decoding.md, "What comes back")."""
        d = {"text": self.text, "labels": self.labels, "peak_frames": self.peaks,
             "frames": self.frames}
        if self.frame_seconds is not None:
            d["times"] = self.times
            d["duration_s"] = round(self.frames * self.frame_seconds, 6)
        d.update(confidences=[round(c, 6) for c in self.confidences],
                 start_frames=self.starts, end_frames=self.ends, unit=self.unit,
                 starts=self.span_starts, ends=self.span_ends,
                 score=None if self.score is None else round(self.score, 6),
                 log_prob=None if self.log_prob is None else round(self.log_prob, 6),
                 temperature=self.temperature)
        if self.nbest and nbest:
            d["nbest"] = [t.to_dict(nbest=False) for t in self.nbest]
        return d


def decode_transcript(lp: np.ndarray, labels: list[str], blank: int, beam=0, nbest: int = 1,
                      temperature: float = 1.0, frame_seconds: float | None = None,
                      pixel_map: tuple | None = None,
                      speller=None) -> Transcript:
    """(T', C) log-probs of one utterance → Transcript (see ``Model.decode``); ``speller``:
    label names → text, for character models."""
    from rnntrain.decode.align import align, ctc_log_prob, path_positions
    positions = None
    if not isinstance(beam, (int, np.integer)):
        hyps = beam.decode_nbest(lp, None, nbest)
    elif beam > 0:
        from rnntrain.decode.search import prefix_beam_nbest
        hyps = prefix_beam_nbest(lp, len(lp), blank, beam, nbest)
    else:
        # the argmax path is the most probable path of all: the Viterbi alignment of the
        # hypothesis it collapses to
        from rnntrain.decode.search import collapse
        path = np.argmax(lp, axis=1)
        hyps = [(collapse(path, blank), float(lp.max(1).sum()) if len(lp) else 0.0)]
        positions = path_positions(path, blank)
    out = []
    for hyp, score in hyps:
        a = align(lp, hyp, blank, temperature, positions)
        names = [labels[k] for k in hyp]
        out.append(Transcript(names, a.peaks, len(lp), frame_seconds,
                              speller(names) if speller is not None else None,
                              a.starts, a.ends, a.confidences, score,
                              ctc_log_prob(lp, hyp, blank) if len(lp) else 0.0,
                              temperature, pixel_map))
        positions = None
    best = out[0]
    if nbest > 1:
        best.nbest = out
    return best


def load(path, device: str = "cpu", threads: int = 0) -> "Model":
    """A checkpoint, run folder (its best checkpoint) or exported model (TorchScript,
    ONNX) → Model. ``device``: checkpoints only ("cpu", "cuda", "cuda:N"); ``threads``:
    ONNX Runtime's intra-op threads (0 = its default; torch follows torch.set_num_threads).
    """
    from rnntrain.infer.model import open_model
    p, meta, engine, net = open_model(path, device, threads)
    return Model(meta, engine, p, net)


class Model:
    """A model with its labels and front end; see the module docstring."""

    def __init__(self, meta, engine, path: Path, net=None):
        self.meta, self.engine, self.path = meta, engine, Path(path)
        self.net = net   # the training network (checkpoints only): the reference for exports

    # ---- what it is
    @property
    def labels(self) -> list[str]:
        return self.meta.labels

    @property
    def input_size(self) -> int:
        return self.meta.input_size

    @property
    def subsample(self) -> int:
        return self.meta.subsample

    @property
    def frontend(self):
        """``rnntrain.frontend.FrontEnd`` (features and statistics), or None."""
        return self.meta.frontend

    @property
    def image(self):
        """``rnntrain.frontend.images.ImageFrontEnd`` for models trained on converted
        images, else None."""
        return self.meta.image

    @property
    def blank(self) -> int:
        return self.meta.blank

    @property
    def frame_seconds(self) -> float | None:
        """Seconds per model output frame (hop × stacking); None without a front end."""
        fs = self.frontend.frame_seconds if self.frontend is not None else None
        return fs * self.subsample if fs is not None else None

    def __repr__(self) -> str:
        fe = self.frontend.describe() if self.frontend is not None else \
            self.image.describe() if self.image is not None else "no front end"
        return (f"<rnntrain.Model {self.path} ({self.engine.name}): {len(self.labels)} labels, "
                f"{self.input_size} inputs, stacking {self.subsample}; {fe}>")

    # ---- input → frames
    def frames(self, x, rate: int | None = None, name: str | None = None) -> np.ndarray:
        """Model-ready frames (T, F) float32 from an audio/.npy/image path, a signal,
        features or a Pillow image."""
        fe = self.frontend
        if hasattr(x, "getbands") and hasattr(x, "mode"):  # a Pillow image
            from rnntrain.frontend.images import pixels
            name = name or "image"
            if self.image is None:
                raise UserError(f"{name}: an image, but {self._no_image()}")
            return self._checked(self.image.columns(pixels(x, self.image.settings, name),
                                                    name), name)
        if isinstance(x, (str, os.PathLike)):
            p = Path(x)
            name = name or str(p)
            suf = p.suffix.lower()
            if suf in IMAGE_SUFFIXES:
                if self.image is None:
                    raise UserError(f"{p}: an image, but {self._no_image()}")
                return self._checked(self.image.file_frames(p), name)
            if self.image is not None and suf != ".npy":
                raise UserError(f"{p}: this model was trained on images: give it image files "
                                f"(PNG, JPEG, TIFF, ...) or a NetCDF file, not "
                                f"{'audio' if suf in AUDIO_SUFFIXES else repr(suf or p.name)}")
            if suf == ".npy":
                x = read_npy(p)
            elif suf in AUDIO_SUFFIXES:
                if fe is None or fe.features is None:
                    raise UserError(f"{p}: {self._no_audio()}")
                return self._checked(fe.file_features(p), name)
            else:
                raise UserError(f"{p}: not an audio file ({', '.join(sorted(AUDIO_SUFFIXES))}), "
                                f"image or .npy feature array")
        x = np.asarray(x)
        name = name or "array"
        if x.ndim == 1:
            if fe is None or fe.features is None:
                raise UserError(f"{name}: a 1-D signal, but {self._no_audio()}")
            if x.dtype.kind not in "iuf" or len(x) == 0:
                raise UserError(f"{name}: a signal must be a non-empty numeric array")
            return self._checked(fe.signal_features(pcm_to_float(x), rate), name)
        if x.ndim != 2 or x.dtype.kind not in "iuf" or len(x) == 0:
            raise UserError(f"{name}: expected a signal (S,) or features (T, F), got shape "
                            f"{x.shape} {x.dtype}")
        # float32 first, as the converter stores arrays before normalising them
        x = self._checked(x.astype(np.float32), name)
        return fe.normalise(x) if fe is not None else x

    def _no_audio(self) -> str:
        if self.frontend is None:
            return ("this model has no front end (it was trained on a .nc file not written by "
                    "rnntrain-data audio): give it feature arrays (.npy) or a NetCDF file")
        return "this model was trained on feature arrays: give it .npy features or NetCDF"

    def _no_image(self) -> str:
        if self.frontend is not None and self.frontend.features is not None:
            return "this model was trained on audio: give it audio files, .npy or NetCDF"
        return ("this model has no image front end (it was not trained on images converted "
                "by rnntrain-data images): give it .npy features or a NetCDF file")

    def _checked(self, x: np.ndarray, name: str) -> np.ndarray:
        if x.shape[1] != self.input_size:
            raise UserError(f"{name}: {x.shape[1]} features per frame, the model takes "
                            f"{self.input_size}")
        if not np.isfinite(x).all():
            bad = int(np.flatnonzero(~np.isfinite(x).all(axis=1))[0])
            raise UserError(f"{name}: NaN or Inf in frame {bad}")
        return x

    # ---- frames → log-probabilities → labels
    def log_probs(self, frames: np.ndarray) -> np.ndarray:
        """Model-ready frames (T, F), normalised as in the training file → (T', C)."""
        return self.log_probs_batch([frames])[0]

    def log_probs_batch(self, frames: list[np.ndarray]) -> list[np.ndarray]:
        """Several utterances in one zero-padded batch → [(T'_i, C)]."""
        if not frames:
            return []
        for i, f in enumerate(frames):
            if f.ndim != 2 or f.shape[1] != self.input_size or len(f) == 0:
                raise UserError(f"frames {i}: expected (T, {self.input_size}) with T > 0, got "
                                f"shape {f.shape}")
        lengths = np.array([len(f) for f in frames], dtype=np.int64)
        x = np.zeros((int(lengths.max()), len(frames), self.input_size), np.float32)
        for i, f in enumerate(frames):
            x[:len(f), i] = f
        lp, out = self.engine.run(x, lengths)
        return [lp[:int(out[i]), i] for i in range(len(frames))]

    @property
    def temperature(self) -> float:
        """The confidences' temperature: fitted on validation data (``rnntrain
        calibrate``, or at the end of training) and stored with the model; 1 if never."""
        return self.meta.temperature

    def pixel_map(self, geometry=None) -> tuple | None:
        """Images: ``Transcript.pixel_map`` (columns per output frame, and the
        ``LineGeometry`` of an image file when known: spans in its own columns)."""
        return (self.subsample, geometry) if self.image is not None else None

    def frames_geometry(self, x, name: str | None = None) -> tuple[np.ndarray, object]:
        """An image file or a Pillow image → (model-ready frames (T, F), its
        ``LineGeometry``: where the frames' columns come from in the image)."""
        name = name or str(x)
        if self.image is None:
            raise UserError(f"{name}: an image, but {self._no_image()}")
        if hasattr(x, "getbands"):
            from rnntrain.frontend.images import pixels_geometry
            a, geo = pixels_geometry(x, self.image.settings, name)
            frames = self.image.columns(a, name)
        else:
            frames, geo = self.image.file_frames_geometry(x)
        return self._checked(frames, name), geo

    def decode(self, lp: np.ndarray, beam=0, nbest: int = 1, geometry=None) -> Transcript:
        """(T', C) log-probs → Transcript: best path, prefix beam search of width ``beam``,
        or ``beam`` a ``rnntrain.decode.beam.Decoder`` (beam search with a lexicon and LM,
        as ``rnntrain decode`` runs it). ``nbest`` > 1: the beam's N best in
        ``Transcript.nbest`` (the first is the returned one). ``geometry``: the image
        file's ``LineGeometry``, when known (spans in its columns, else the prepared
        image's)."""
        return decode_transcript(lp, self.labels, self.blank, beam, nbest, self.temperature,
                                 self.frame_seconds,
                                 self.pixel_map(geometry),
                                 self.image.text if self.image is not None else None)

    def decode_frames(self, frames: np.ndarray, beam=0, nbest: int = 1) -> Transcript:
        """Model-ready frames (T, F) → Transcript (``log_probs``, then ``decode``; an
        ensemble may combine its members' hypotheses instead: ``infer.ensemble``)."""
        return self.decode(self.log_probs(frames), beam, nbest)

    def transcribe(self, x, beam=0, rate: int | None = None, nbest: int = 1) -> Transcript:
        """An audio, image or .npy path, a signal (S,) at ``rate``, features (T, F) or a
        Pillow image → Transcript."""
        if isinstance(x, (str, os.PathLike)) and self.image is not None and \
                Path(x).suffix.lower() in IMAGE_SUFFIXES:
            # an image file: spans in its own pixel columns (its LineGeometry)
            frames, geo = self.frames_geometry(x)
            t = self.decode_frames(frames, beam, nbest)
            for h in t.nbest or [t]:
                h.pixel_map = self.pixel_map(geo)
            return t
        return self.decode_frames(self.frames(x, rate), beam, nbest)

    def export(self, out, format: str = "onnx", check_frames=None) -> Path:
        """Write this model as TorchScript or ONNX (see ``rnntrain.infer.export``)."""
        from rnntrain.infer.export import export
        return export(self, out, format, check_frames)


def pcm_to_float(x: np.ndarray) -> np.ndarray:
    """A signal as float64 in [-1, 1]: integer PCM scaled as soundfile reads it from a file
    (int16 / 2**15; uint8 centred on 128), floats as they are."""
    if x.dtype.kind == "u":
        half = 2.0 ** (8 * x.dtype.itemsize - 1)
        return (x.astype(np.float64) - half) / half
    if x.dtype.kind == "i":
        return x.astype(np.float64) / 2.0 ** (8 * x.dtype.itemsize - 1)
    return x.astype(np.float64)


