"""Evaluation: CTC loss, best-path (and beam) decoding, label error rates.

Used for validation during training and by ``rnntrain eval`` / ``rnntrain decode``.
Under MPI each rank evaluates its dealt share of every batch and the counts are summed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rnntrain.decode.score import ErrorCounts
from rnntrain.decode.search import best_path, prefix_beam_search
from rnntrain.data.plan import make_plan
from rnntrain.data.reader import ChunkReader
from rnntrain.compute.tasks import collate
from rnntrain.compute.model import ctc_loss_sum
from rnntrain.parallel.collectives import sum_over_ranks


@torch.no_grad()
def evaluate(model, ds, keep: np.ndarray, batch_frames: int, device: torch.device, comm=None,
             beam: int = 0, on_hyp: Callable[[int, list[int]], None] | None = None
             ) -> dict[str, ErrorCounts]:
    """Score ``ds`` (only sequences with keep[i]); returns {"best": counts[, "beam": counts]}.

    Infeasible sequences (keep False) are counted as skipped. on_hyp(seq id, labels) is
    called with each best-path (or, with beam > 0, beam) hypothesis, in plan order.
    """
    rank, world = (comm.rank, comm.size) if comm is not None else (0, 1)
    was_training = model.training
    model.eval()
    counts = {"best": ErrorCounts()}
    if beam:
        counts["beam"] = ErrorCounts()
    counts["best"].skipped = int((~keep).sum()) if rank == 0 else 0
    steps = make_plan(ds, keep, batch_frames, seed=0, epoch=0, rank=rank, world=world,
                      shuffle=False)
    by_chunk: dict[int, list] = {}
    for s in steps:
        by_chunk.setdefault(s.chunk, []).append(s.seqs)
    reader = ChunkReader(ds.load_chunk, list(by_chunk))
    try:
        for _ in range(len(by_chunk)):
            k, payload = reader.next()
            for seqs in by_chunk[k]:
                if not seqs:
                    continue
                x, lengths = collate([payload[s] for s in seqs])
                lp, out_len = model(x.to(device), lengths)
                targets = [ds.targets[s] for s in seqs]
                loss = float(ctc_loss_sum(lp, out_len, targets, model.blank))
                lp = lp.float().cpu().numpy()
                c = counts["best"]
                c.loss_sum += loss
                c.frames += int(lengths.sum())
                for j, s in enumerate(seqs):
                    ref = ds.targets[s].tolist()
                    hyp = best_path(lp[:, j], int(out_len[j]), model.blank)
                    c.add(ref, hyp)
                    if beam:
                        bh = prefix_beam_search(lp[:, j], int(out_len[j]), model.blank, beam)
                        counts["beam"].add(ref, bh)
                        hyp = bh
                    if on_hyp is not None:
                        on_hyp(s, hyp)
    finally:
        reader.close()
        model.train(was_training)
    if comm is not None and comm.size > 1:
        for key, c in counts.items():
            counts[key] = ErrorCounts.from_array(sum_over_ranks(comm, c.as_array(),
                                                                 f"{key} error counts"))
    if beam:
        b = counts["beam"]
        b.loss_sum, b.frames, b.skipped = (counts["best"].loss_sum, counts["best"].frames,
                                           counts["best"].skipped)
    return counts
