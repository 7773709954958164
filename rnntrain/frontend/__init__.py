"""The front end: what turns a recording (or a feature array) into the frames a model saw.

``FrontEnd`` is the record of it: the feature settings (``features.FeatureConfig``; None
for feature arrays converted as they are) and the per-feature normalisation statistics.
The converters write it into the NetCDF file as the global attribute ``rnntrain_frontend``
(a JSON string; RNNLIB ignores attributes it does not know), training copies it into every
checkpoint, and inference applies it. Training and inference call the same functions
(``features.compute``, ``audio.load_signal``, ``normalise``), so a recording transcribed
later gives the frames it would have given in the training file, bit for bit.

Shapes: signal (S,); features (T, F); mean, std (F,).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from rnntrain.errors import UserError

ATTR = "rnntrain_frontend"    # the NetCDF global attribute
VERSION = 1


def normalise(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(T, F) → (T, F) float32: (x - mean) / std computed in float64, as written to .nc."""
    return ((np.asarray(x, dtype=np.float64) - mean) / std).astype(np.float32)


@dataclass(frozen=True, eq=False)
class FrontEnd:
    source: str                      # "audio" (rnntrain-data audio) or "arrays" (convert)
    size: int                        # features per frame (inputPattSize)
    mean: np.ndarray                 # (F,) float64
    std: np.ndarray                  # (F,) float64
    features: "object | None" = None  # features.FeatureConfig for "audio"

    def __eq__(self, other) -> bool:
        return isinstance(other, FrontEnd) and self.to_dict() == other.to_dict()

    @property
    def frame_seconds(self) -> float | None:
        """Seconds between feature frames (None for arrays: the rate is not known)."""
        return self.features.hop_ms / 1000.0 if self.features is not None else None

    @property
    def rate(self) -> int | None:
        return self.features.rate if self.features is not None else None

    def normalise(self, x: np.ndarray) -> np.ndarray:
        return normalise(x, self.mean, self.std)

    def signal_features(self, signal: np.ndarray, rate: int | None = None) -> np.ndarray:
        """Signal (S,) at ``rate`` (default: the front end's) → normalised (T, F) float32."""
        if self.features is None:
            raise UserError("this model was trained on feature arrays: give it features "
                            "(.npy or NetCDF), not audio")
        from rnntrain.frontend import features as feat
        from rnntrain.frontend.audio import resample
        x = resample(np.asarray(signal, dtype=np.float64), rate or self.features.rate,
                     self.features.rate)
        return self.normalise(feat.compute(x, self.features))

    def file_features(self, path) -> np.ndarray:
        """An audio file (any rate; channels averaged) → normalised (T, F) float32."""
        from rnntrain.frontend import features as feat
        from rnntrain.frontend.audio import load_signal
        if self.features is None:
            raise UserError(f"{path}: this model was trained on feature arrays and cannot "
                            f"read audio; give it .npy features or a NetCDF file")
        return self.normalise(feat.compute(load_signal(path, self.features.rate),
                                           self.features))

    def describe(self) -> str:
        if self.features is None:
            return f"{self.size} features per frame (arrays), normalised"
        f = self.features
        return (f"{f.kind} {self.size} features at {f.rate} Hz, {f.win_ms:g} ms windows "
                f"every {f.hop_ms:g} ms, normalised")

    # ---- serialisation: checkpoints (plain dict), NetCDF attribute and exports (JSON)

    def to_dict(self) -> dict:
        return {"version": VERSION, "source": self.source, "size": int(self.size),
                "features": self.features.to_dict() if self.features is not None else None,
                "mean": [float(v) for v in self.mean], "std": [float(v) for v in self.std]}

    @classmethod
    def from_dict(cls, d: dict, where: str = "front end") -> "FrontEnd":
        from rnntrain.frontend.features import FeatureConfig
        try:
            if d.get("version") != VERSION:
                raise ValueError(f"version {d.get('version')}, this rnntrain reads {VERSION}")
            fc = FeatureConfig(**d["features"]) if d.get("features") else None
            mean = np.asarray(d["mean"], dtype=np.float64)
            std = np.asarray(d["std"], dtype=np.float64)
            fe = cls(str(d["source"]), int(d["size"]), mean, std, fc)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"{where}: malformed front-end record ({e})") from None
        if mean.shape != (fe.size,) or std.shape != (fe.size,) or not (std > 0).all() or \
                (fc is not None and fc.size != fe.size):
            raise UserError(f"{where}: front-end record does not fit {fe.size} features")
        return fe

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str, where: str = "front end") -> "FrontEnd":
        try:
            d = json.loads(text)
        except ValueError as e:
            raise UserError(f"{where}: front-end record is not JSON ({e})") from None
        if not isinstance(d, dict):
            raise UserError(f"{where}: front-end record is not a JSON object")
        return cls.from_dict(d, where)
