"""Fine-tuning: a new run that starts from another model's weights (``train.init_from``).

The new run has its own optimizer, schedule and epoch counter; only the network's weights
come from the checkpoint. Its input side must be the checkpoint's (inputPattSize, frame
size, image height, front end). Its output alphabet (``train.init_alphabet``):

- ``keep``: the data's alphabet must be the model's, label for label;
- ``merge``: the model keeps every label it knows and adds the data's labels it lacks:
  the alphabet is the data's labels (their order indexes the targets) followed by the
  model's labels the data does not have;
- ``replace``: the output layer follows the data's alphabet; labels the model does not
  know start from fresh rows, labels only the model had are dropped.

In every case the output rows (weights and bias) of a label the two share are copied
exactly, by name, and the CTC blank (the last class, as in RNNLIB) keeps its row. Labels
new to the model keep the rows the seeded initialisation gave them.

``train.freeze``: "frontend" (the conv front end) and "lstm:K" (the first K LSTM layers)
are not trained: their gradients are zeroed before clipping and they are left out of the
optimizer, so their weights stay exactly the checkpoint's.
"""
from __future__ import annotations

from pathlib import Path

import torch

from rnntrain.data.dataset import alphabet_difference
from rnntrain.errors import UserError
from rnntrain.run import checkpoint as ckpt

MODES = ("keep", "merge", "replace")


def source(path: str) -> Path:
    """A checkpoint file, a run folder's best (else last) checkpoint, or a zoo model."""
    from rnntrain.artifact.paths import resolve
    return resolve(path, "train.init_from")


def alphabet(mode: str, model_labels: list[str], data_labels: list[str], where) -> list[str]:
    """The fine-tuned model's labels (see the module docstring); UserError for ``keep``
    when they differ, naming the difference."""
    if mode not in MODES:
        raise UserError(f"train.init_alphabet = {mode!r}: choose one of {', '.join(MODES)}")
    data = list(data_labels)
    if mode == "keep":
        if list(model_labels) != data:
            raise UserError(f"train.init_from = {where}: the data's alphabet differs from the "
                            f"model's ({alphabet_difference(data, model_labels, 'in the data', 'in the model')}); "
                            "set train.init_alphabet = \"merge\" or \"replace\"")
        return data
    if mode == "merge":
        return data + [lb for lb in model_labels if lb not in set(data)]
    return data


def start_from(cfg, model, labels: list[str], ds) -> tuple[ckpt.Checkpoint, str]:
    """Load ``cfg.train.init_from``'s weights (those its card names, as inference uses
    them: the weight average where the run kept one) into ``model`` (built for ``labels``, the
    output of ``alphabet``) → (the source checkpoint, the line to log). The output
    layer's rows are carried over by label name; every other tensor must have the same
    shape (else one line naming the first that differs)."""
    path = source(cfg.train.init_from)
    ck = ckpt.read(path)
    check_input(ck.card, path, ds, cfg)
    src = ck.inference_weights()  # what validation scored: the average where one was kept
    own = model.state_dict()
    rows = [(i, ck.card.labels.index(lb)) for i, lb in enumerate(labels)
            if lb in ck.card.labels]
    rows.append((len(labels), len(ck.card.labels)))  # the blank: last in both
    new = {}
    for key, t in own.items():
        if key not in src:
            raise UserError(f"train.init_from = {path}: it has no {key} (a different "
                            "[model] section: layers, cell, front end)")
        s = src[key]
        if key.startswith("out."):
            if s.shape[1:] != t.shape[1:]:
                raise UserError(f"train.init_from = {path}: {key} has shape "
                                f"{tuple(s.shape)}, this model's {tuple(t.shape)} (a "
                                "different [model] section)")
            t = t.clone()
            dst, org = zip(*rows)
            t[list(dst)] = s[list(org)].to(t.dtype)
            new[key] = t
        elif s.shape != t.shape:
            raise UserError(f"train.init_from = {path}: {key} has shape {tuple(s.shape)}, "
                            f"this model's {tuple(t.shape)} (a different [model] section: "
                            "layers, hidden, bidirectional, subsample, front end)")
        else:
            new[key] = s
    extra = sorted(set(src) - set(own))
    if extra:
        raise UserError(f"train.init_from = {path}: it has {extra[0]}, which this model "
                        "lacks (a different [model] section)")
    model.load_state_dict(new)
    added = [lb for lb in labels if lb not in ck.card.labels]
    dropped = [lb for lb in ck.card.labels if lb not in labels]
    note = (f"initialised from {path} ({len(labels)} labels: {len(rows) - 1} kept"
            + (f", {len(added)} new: {' '.join(added[:10])}{' ...' if len(added) > 10 else ''}"
               if added else "")
            + (f", {len(dropped)} dropped: {' '.join(dropped[:10])}"
               f"{' ...' if len(dropped) > 10 else ''}" if dropped else "")
            + f"; alphabet {cfg.train.init_alphabet})")
    return ck, note


def check_input(card: ckpt.ModelCard, path, ds, cfg):
    """The data's input side must be the model's: one line naming both."""
    card.check_input(ds, f"train.init_from = {path}", {"frontend": cfg.model.frontend})


def frozen_parameters(model, freeze: list[str]) -> list[torch.nn.Parameter]:
    """The parameters ``train.freeze`` names: "frontend" and "lstm:K" (the first K LSTM
    layers)."""
    out: list = []
    for item in freeze:
        if item == "frontend":
            if model.frontend is None:
                raise UserError('train.freeze = "frontend": the model has no front end '
                                '(model.frontend = "none")')
            out += list(model.frontend.parameters())
        elif item.startswith("lstm:") and item[5:].isdigit() and int(item[5:]) >= 1:
            k = int(item[5:])
            if k > len(model.rnns):
                raise UserError(f"train.freeze = {item!r}: the model has {len(model.rnns)} "
                                "LSTM layer(s)")
            out += [p for rnn in model.rnns[:k] for p in rnn.parameters()]
        else:
            raise UserError(f"train.freeze = {item!r}: expected \"frontend\" or \"lstm:K\" "
                            "(the first K LSTM layers)")
    return out


def gradient_mask(model, frozen: list[torch.nn.Parameter], device) -> torch.Tensor | None:
    """(P,) 1 for trained, 0 for frozen parameters, in ``model.parameters()`` order (the
    flat gradient's layout); None when nothing is frozen."""
    if not frozen:
        return None
    ids = {id(p) for p in frozen}
    parts = [torch.full((p.numel(),), 0.0 if id(p) in ids else 1.0)
             for p in model.parameters()]
    return torch.cat(parts).to(device)
