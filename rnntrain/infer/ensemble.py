"""Ensembles: several models read the same input, one hypothesis comes out.

``rnntrain eval``, ``decode`` and ``transcribe`` take several models wherever they take
one (``model_paths``): a crossfold folder (``rnntrain crossfold``: the best checkpoint of
each fold) or paths separated by commas. Two ways to combine them (``--combine``), and
``auto``, the default, which picks one (``resolve_combine``):

- ``posteriors``: the frame posteriors are averaged, ``log mean_k exp(lp_k)`` per frame
  and class (``average_log_probs``), then decoded as one model's (best path, beam search,
  lexicon, LM). Needs one frame rate: the models' outputs must have the same number of
  frames for every input.
- ``vote``: Calamari's confidence voting (Wick, Reul and Puppe, "Calamari", 2018; their
  ``ConfidenceVoter``). Each model's best path is read with, for every label, the
  probability of every class at that label's frames (the maximum over the run of frames
  where it is the argmax: ``alternatives``); the K label sequences are aligned by
  repeatedly cutting at their longest common substring (``synchronize``); in each aligned
  segment the models whose segment has the most frequent length vote, position by
  position, by summing their probabilities of each label; the label with the highest sum
  wins (``vote``). Models may have different frame rates.
- ``auto``: ``vote`` for a plain best-path reading, ``posteriors`` when the command asks
  for what only averaged posteriors give (a beam search, lexicon or LM; n-best lists;
  label spans). Why vote first: members trained apart (crossfold folds from random weights)
  put their CTC peaks on different frames, so their average smears them: 5 such
  printed-lines folds read the unseen font at 3.09 % CER by voting and 9.51 % by
  averaging; 5 members fine-tuned from one model tie (2.64 against 2.62 %; docs/accuracy.md,
  *Ensembles*, *archiscribe*).

Labels are matched by name: the models must share one alphabet, in any order (the first
model's order is the ensemble's). K copies of one model give exactly that model's output
under both methods (the average of K equal log-probabilities is computed so that it is
exactly that value; the vote of K equal hypotheses is that hypothesis).

Shapes: K models, T' output frames, N sequences, C classes (blank last), L labels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rnntrain.errors import UserError
from rnntrain.infer.api import Model, Transcript, load

COMBINE = ("auto", "vote", "posteriors")


# ---------------------------------------------------------------- which models


def model_paths(spec) -> list[Path]:
    """A MODEL argument → the models it names: a crossfold folder → each fold's run folder;
    ``a,b,c`` → a, b and c (each a checkpoint, run folder, export or zoo name); else
    itself."""
    from rnntrain.artifact.paths import exists
    from rnntrain.tools.crossfold import read_manifest
    text = str(spec)
    parts = [text] if exists(text) or "," not in text else \
        [p for p in text.split(",") if p]
    out: list[Path] = []
    for part in parts:
        p = Path(part)
        rec = read_manifest(p) if p.is_dir() else None
        if rec is None:
            out.append(p)
            continue
        missing = [r for r in rec["runs"] if not _has_checkpoint(p / r)]
        if missing:
            raise UserError(f"{p}: crossfold folds without a checkpoint yet: "
                            f"{', '.join(missing)} (run the same rnntrain crossfold command "
                            f"again to finish them)")
        out += [p / r for r in rec["runs"]]
    if not out:
        raise UserError(f"{text!r}: no model named")
    return out


def _has_checkpoint(run: Path) -> bool:
    from rnntrain.artifact.runfolder import RunFolder
    return RunFolder(run).model_checkpoint() is not None


def check_combine(combine: str) -> str:
    if combine not in COMBINE:
        raise UserError(f"--combine {combine!r}: choose {', '.join(COMBINE[:-1])} or "
                        f"{COMBINE[-1]}")
    return combine


def resolve_combine(combine: str, needs: list[str]) -> str:
    """``--combine`` → "vote" or "posteriors": ``auto`` is "vote" unless ``needs`` names
    options that only averaged posteriors serve (``--beam``, ``--lm``, ``--nbest``, spans
    ...: the caller lists those given), then "posteriors"; the others are themselves."""
    if check_combine(combine) != "auto":
        return combine
    return "posteriors" if needs else "vote"


def wants_posteriors(beam, nbest: int) -> bool:
    """A decoding request (``beam``: a width, a Decoder, or None for best path; ``nbest``)
    that voting cannot serve: anything but a plain best path."""
    if beam is None:
        return nbest > 1
    return not isinstance(beam, (int, np.integer)) or beam > 0 or nbest > 1


# ---------------------------------------------------------------- alphabets


def label_orders(label_lists: list[list[str]], names: list[str]) -> list[np.ndarray]:
    """For each model, the class index (C,) of every ensemble class (the first model's
    labels, then blank): column j of the ensemble is column order[j] of that model.
    UserError naming the model and the labels when an alphabet differs as a set."""
    ref = list(label_lists[0])
    out = []
    for labels, name in zip(label_lists, names):
        pos = {lab: i for i, lab in enumerate(labels)}
        if len(pos) != len(labels) or set(pos) != set(ref):
            extra = sorted(set(labels) - set(ref))[:8]
            lack = sorted(set(ref) - set(labels))[:8]
            raise UserError(f"{name}: its alphabet ({len(labels)} labels) differs from "
                            f"{names[0]}'s ({len(ref)}): only here {extra}, missing here "
                            f"{lack}; an ensemble needs one alphabet (in any order)")
        out.append(np.array([pos[lab] for lab in ref] + [len(labels)], np.int64))
    return out


# ---------------------------------------------------------------- posterior averaging


def average_log_probs(lps):
    """K log-probability arrays (..., C) of one shape → log of their mean probability,
    ``m + log(mean_k exp(lp_k - m))`` with m the elementwise maximum: stable, and exactly
    lp when all K are equal (exp(0) = 1, a mean of ones is 1, log 1 = 0). numpy arrays or
    torch tensors (the result is of the inputs' kind)."""
    if len(lps) == 1:
        return lps[0]
    if isinstance(lps[0], np.ndarray):
        x = np.stack(lps)
        m = x.max(0)
        m = np.where(np.isfinite(m), m, 0).astype(x.dtype)
        with np.errstate(divide="ignore"):
            return m + np.log(np.exp(x - m).mean(0))
    x = torch.stack(list(lps))
    m = x.amax(0)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return m + torch.log(torch.exp(x - m).mean(0))


# ---------------------------------------------------------------- confidence voting


@dataclass
class Read:
    """One model's best path of one sequence: the labels and, for each, the probability of
    every class at its frames (the maximum over the frames where it is the argmax)."""
    labels: list[int]               # L label indices (ensemble order)
    probs: np.ndarray               # (L, C) float64
    peaks: list[int] = field(default_factory=list)  # L: the frame where each is likeliest
    frames: int = 0                 # T': the model's output frames


def alternatives(lp: np.ndarray, blank: int) -> Read:
    """(T', C) log-probs of one sequence → its best path with each label's alternatives."""
    path = np.argmax(lp, axis=1)
    T = len(path)
    if T == 0:
        return Read([], np.zeros((0, lp.shape[1])), [], 0)
    starts = np.flatnonzero(np.concatenate([[True], path[1:] != path[:-1]]))
    stops = np.concatenate([starts[1:], [T]])
    runs = [(s, e) for s, e in zip(starts, stops) if path[s] != blank]
    p = np.exp(lp.astype(np.float64))
    probs = np.array([p[s:e].max(0) for s, e in runs]).reshape(len(runs), lp.shape[1])
    peaks = [int(s + np.argmax(lp[s:e, path[s]])) for s, e in runs]
    return Read([int(path[s]) for s, _ in runs], probs, peaks, T)


def _longest_common(a: list[int], b: list[int]) -> tuple[int, int, int]:
    """The longest common substring of a and b → (length, start in a, start in b); of
    those as long, the first in a, then in b. (0, 0, 0) when none."""
    if not a or not b:
        return 0, 0, 0
    bb = np.asarray(b)
    prev = np.zeros(len(b) + 1, np.int64)
    best = (0, 0, 0)
    for i, x in enumerate(a):
        cur = np.zeros_like(prev)
        cur[1:] = np.where(bb == x, prev[:-1] + 1, 0)
        j = int(np.argmax(cur))
        if cur[j] > best[0]:
            best = (int(cur[j]), i - int(cur[j]) + 1, j - int(cur[j]))
        prev = cur
    return best


def synchronize(seqs: list[list[int]]) -> list[list[tuple[int, int]]]:
    """Align K label sequences: → segments in order, each K ranges [start, stop), one per
    sequence, that together cover every sequence. A segment is either common to all K
    (equal labels) or lies between two common ones. Calamari's text synchroniser: cut at
    a longest substring common to all K (the first sequence's range is narrowed to its
    common part with each next one), then do the same left and right of it."""
    K = len(seqs)

    def split(ranges: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
        if all(e == s for s, e in ranges):
            return []
        if any(e == s for s, e in ranges):
            return [ranges]
        (s0, e0), starts = ranges[0], [ranges[0][0]]
        length = e0 - s0
        for k in range(1, K):
            sk, ek = ranges[k]
            n, i, j = _longest_common(seqs[0][s0:s0 + length], seqs[k][sk:ek])
            if n == 0:
                return [ranges]
            # the match narrows sequence 0's common part: the earlier ones move with it
            starts = [st + i for st in starts] + [sk + j]
            s0, length = s0 + i, n
        match = [(st, st + length) for st in starts]
        left = [(s, m) for (s, _), (m, _) in zip(ranges, match)]
        right = [(m, e) for (_, e), (_, m) in zip(ranges, match)]
        return split(left) + [match] + split(right)

    return split([(0, len(s)) for s in seqs])


@dataclass
class Voted:
    """The vote's hypothesis: labels, the mean probability their voters gave each, and the
    frame where each is likeliest (on the first model's frames)."""
    labels: list[int]
    confidences: list[float]
    peaks: list[int]


def vote(reads: list[Read], blank: int) -> Voted:
    """K models' reads of one sequence → the voted hypothesis."""
    out = Voted([], [], [])
    T0 = reads[0].frames
    for seg in synchronize([r.labels for r in reads]):
        lengths = [e - s for s, e in seg]
        counts: dict[int, int] = {}
        for n in lengths:  # in model order: a tie goes to the first model's length
            counts[n] = counts.get(n, 0) + 1
        length = max(counts, key=lambda n: counts[n])
        voters = [k for k, n in enumerate(lengths) if n == length]
        for j in range(length):
            score = np.zeros(reads[0].probs.shape[1])
            said = np.zeros_like(score)
            for k in voters:
                pos = seg[k][0] + j
                score += reads[k].probs[pos]
                said[reads[k].labels[pos]] += 1
            score[blank] = -np.inf  # a position holds a label: blank does not compete
            # highest summed probability; on a tie, the label more voters read there
            best = max(range(len(score)), key=lambda c: (score[c], said[c], -c))
            k = next((k for k in voters if reads[k].labels[seg[k][0] + j] == best),
                     voters[0])
            peak = reads[k].peaks[seg[k][0] + j]
            if reads[k].frames != T0:  # another frame rate: to the first model's frames
                peak = min(T0 - 1, peak * T0 // max(reads[k].frames, 1))
            out.labels.append(best)
            out.confidences.append(float(score[best] / len(voters)))
            out.peaks.append(int(peak))
    return out


def vote_log_probs(lps: list[np.ndarray], blank: int) -> Voted:
    """K models' (T'_k, C) log-probs of one sequence (ensemble class order) → the vote."""
    return vote([alternatives(lp, blank) for lp in lps], blank)


# ---------------------------------------------------------------- networks (eval, decode)


def _reorder(lp, order: np.ndarray):
    """(T', N, C) tensor in a model's class order → the ensemble's."""
    if np.array_equal(order, np.arange(len(order))):
        return lp
    return lp.index_select(-1, torch.as_tensor(order, device=lp.device))


def same_frames(outs: list, lens: list) -> bool:
    """Every model gave the same number of output frames (shape and lengths)."""
    return all(o.shape == outs[0].shape for o in outs) and \
        all(bool((n == lens[0]).all()) for n in lens)


def frame_rate_error(names: list[str], rates: list[int]) -> UserError:
    shown = ", ".join(f"{n}: 1 per {r} input frames" for n, r in zip(names, rates))
    return UserError(f"averaging posteriors needs one frame rate, these models differ "
                     f"({shown}); use --combine vote")


class EnsembleNet(torch.nn.Module):
    """K training networks (``compute.model.CTCModel``, loaded) as one: ``forward`` gives
    the members' averaged log-probs (T', N, C) and output lengths (N,) for x (T, N, F),
    lengths (N,); ``vote_batch`` their voted best paths. Classes in the first member's
    order (labels matched by name). ``rates``: each member's input frames per output
    frame (``model.total_subsample``)."""

    def __init__(self, nets: list, label_lists: list[list[str]], names: list[str],
                 rates: list[int], combine: str = "posteriors"):
        super().__init__()
        assert combine in ("posteriors", "vote"), "resolve_combine first"
        self.orders = label_orders(label_lists, names)
        if combine == "posteriors" and len(set(rates)) > 1:
            raise frame_rate_error(names, rates)
        self.members = torch.nn.ModuleList(nets)
        self.labels = list(label_lists[0])
        self.blank = len(self.labels)
        self.names, self.rates, self.combine = list(names), list(rates), combine

    def each(self, x, lengths):
        """→ ([K log-probs (T'_k, N, C), ensemble order], [K output lengths (N,)])."""
        outs, lens = [], []
        for net, order in zip(self.members, self.orders):
            lp, n = net(x, lengths)
            outs.append(_reorder(lp, order))
            lens.append(n)
        return outs, lens

    def forward(self, x, lengths):
        outs, lens = self.each(x, lengths)
        if not same_frames(outs, lens):
            raise frame_rate_error(self.names, self.rates)
        return average_log_probs(outs), lens[0]

    def vote_batch(self, x, lengths):
        """→ (averaged log-probs (T', N, C), or None where the frame counts differ, output
        lengths (N,) or None, N voted label lists)."""
        outs, lens = self.each(x, lengths)
        arrs = [o.float().cpu().numpy() for o in outs]
        ns = [n.cpu().numpy() for n in lens]
        hyps = [vote_log_probs([a[:int(n[j]), j] for a, n in zip(arrs, ns)],
                               self.blank).labels for j in range(x.shape[1])]
        if same_frames(outs, lens):
            return average_log_probs(outs), lens[0], hyps
        return None, None, hyps


# ---------------------------------------------------------------- Model API (transcribe)


def _input_side(meta) -> dict:
    return {"input size": meta.input_size,
            "front end": meta.frontend.to_dict() if meta.frontend is not None else None,
            "image preparation": meta.image.to_dict() if meta.image is not None else None}


class EnsembleEngine:
    """The members' engines as one: ``run`` averages their posteriors (one frame rate),
    ``run_each`` gives each one's, in the ensemble's class order."""
    name = "ensemble"

    def __init__(self, engines: list, orders: list[np.ndarray], names: list[str],
                 rates: list[int]):
        self.engines, self.orders, self.names, self.rates = engines, orders, names, rates

    def run_each(self, x: np.ndarray, lengths: np.ndarray):
        outs, lens = [], []
        for eng, order in zip(self.engines, self.orders):
            lp, n = eng.run(x, lengths)
            outs.append(lp[..., order])
            lens.append(np.asarray(n))
        return outs, lens

    def run(self, x: np.ndarray, lengths: np.ndarray):
        outs, lens = self.run_each(x, lengths)
        if not same_frames(outs, lens):
            raise frame_rate_error(self.names, self.rates)
        return average_log_probs(outs), lens[0]


def load_ensemble(spec, combine: str = "auto", device: str = "cpu", threads: int = 0):
    """A MODEL argument (``model_paths``) → ``api.Model`` (one model) or ``EnsembleModel``
    (``combine``: "auto", "vote" or "posteriors", as ``EnsembleModel`` takes it)."""
    check_combine(combine)
    paths = model_paths(spec)
    models = [load(p, device=device, threads=threads) for p in paths]
    if len(models) == 1:
        return models[0]
    return EnsembleModel(models, combine)


class EnsembleModel(Model):
    """K models as one ``Model``: the first one's labels, input preparation and frame
    rate; ``combine`` "posteriors", "vote" or "auto" (see the module docstring): "auto"
    votes for a plain best path and averages the posteriors for a beam search or an
    n-best list, call by call (a voted Transcript has no spans: ask for "posteriors" when
    spans matter)."""

    def __init__(self, models: list, combine: str = "auto"):
        names = [str(m.path) for m in models]
        first = _input_side(models[0].meta)
        for m, name in zip(models[1:], names[1:]):
            side = _input_side(m.meta)
            for key in first:
                if side[key] != first[key]:
                    raise UserError(f"{name}: its {key} differs from {names[0]}'s "
                                    f"({side[key]} vs {first[key]}); an ensemble reads "
                                    f"one input prepared one way")
        orders = label_orders([m.labels for m in models], names)
        rates = [m.subsample for m in models]
        if check_combine(combine) == "posteriors" and len(set(rates)) > 1:
            raise frame_rate_error(names, rates)
        engine = EnsembleEngine([m.engine for m in models], orders, names, rates)
        super().__init__(models[0].meta, engine, models[0].path)
        self.members, self.combine = models, combine

    def __repr__(self) -> str:
        return (f"<rnntrain ensemble of {len(self.members)} models ({self.combine}): "
                f"{', '.join(str(m.path) for m in self.members)}>")

    @property
    def temperature(self) -> float:
        """1: a calibration belongs to one model, not to the members' average."""
        return 1.0

    def decode_frames(self, frames: np.ndarray, beam=0, nbest: int = 1) -> Transcript:
        """Model-ready frames (T, F) → Transcript, combined as ``combine`` says (voting:
        the voters' mean confidences, no spans, no n-best)."""
        how = resolve_combine(self.combine, ["beam"] if wants_posteriors(beam, nbest) else [])
        if how == "posteriors":
            return super().decode_frames(frames, beam, nbest)
        if wants_posteriors(beam, nbest):
            raise UserError("--combine vote votes on each model's best path: it takes "
                            "no --beam, --lexicon, --lm or --nbest (use --combine posteriors)")
        x = frames[:, None, :].astype(np.float32)
        outs, lens = self.engine.run_each(x, np.array([len(frames)], np.int64))
        lps = [o[:int(n[0]), 0] for o, n in zip(outs, lens)]
        v = vote_log_probs(lps, self.blank)
        names = [self.labels[k] for k in v.labels]
        spelled = self.image.text(names) if self.image is not None else None
        return Transcript(names, v.peaks, len(lps[0]), self.frame_seconds, spelled,
                          confidences=v.confidences)
