"""Evaluation: CTC loss, best-path (and beam) decoding, label error rates.

Used for validation during training and by ``rnntrain eval`` / ``rnntrain decode``.
Under MPI each rank evaluates its dealt share of every batch and the counts are summed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from rnntrain.decode.score import ErrorCounts
from rnntrain.decode.search import best_path_batch
from rnntrain.data.plan import make_plan
from rnntrain.data.reader import ChunkReader
from rnntrain.compute.tasks import collate
from rnntrain.compute.model import ctc_loss_sum
from rnntrain.parallel.collectives import sum_over_ranks


@torch.no_grad()
def evaluate(model, ds, keep: np.ndarray, batch_frames: int, device: torch.device, comm=None,
             beam: int = 0, on_hyp: Callable[[int, list[int]], None] | None = None,
             decoder=None, space: int | None = None, threads: int = 1,
             on_log_probs: Callable[[list[int], np.ndarray, np.ndarray], None] | None = None,
             score: bool = True) -> dict[str, ErrorCounts]:
    """Score ``ds`` (only sequences with keep[i]); returns {"best": counts[, "beam": counts]}.

    "beam" is the ``decoder``'s (a ``decode.beam.Decoder``: beam search, lexicon, LM), or a
    plain beam search of width ``beam``. ``space``: the word separator's label index, for
    word error rates. Infeasible sequences (keep False) are counted as skipped.
    on_hyp(seq id, labels) is called with each hypothesis (the decoder's if there is one),
    in plan order; on_log_probs(seq ids, log_probs (T, N, C), lengths (N,)) with each
    batch's network output (``tune-decoder`` keeps them to decode again). score=False
    (decoding: targets absent or not needed) skips the CTC loss.
    """
    rank, world = (comm.rank, comm.size) if comm is not None else (0, 1)
    was_training = model.training
    model.eval()
    if decoder is None and beam:
        from rnntrain.decode.beam import Decoder
        decoder = Decoder(ds.labels, model.blank, beam=beam)
    counts = {"best": ErrorCounts()}
    if decoder is not None:
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
                loss = float(ctc_loss_sum(lp, out_len, targets, model.blank)) if score else 0.0
                lp = lp.float().cpu().numpy()
                c = counts["best"]
                c.loss_sum += loss
                c.frames += int(lengths.sum())
                refs = [t.tolist() for t in targets]
                lens = out_len.cpu().numpy()
                bp, n = best_path_batch(lp.argmax(-1), lens, model.blank)  # (N, L), (N,)
                hyps = [bp[j, : n[j]].tolist() for j in range(len(seqs))]
                c.add_batch(refs, hyps, space)
                if on_log_probs is not None:
                    on_log_probs(list(seqs), lp, lens)
                if decoder is not None:
                    hyps = decoder.decode_batch(lp, lens, threads)
                    counts["beam"].add_batch(refs, hyps, space)
                if on_hyp is not None:
                    for sid, h in zip(seqs, hyps):
                        on_hyp(sid, h)
    finally:
        reader.close()
        model.train(was_training)
    if comm is not None and comm.size > 1:
        for key, c in counts.items():
            counts[key] = ErrorCounts.from_array(sum_over_ranks(comm, c.as_array(),
                                                                 f"{key} error counts"))
    if decoder is not None:
        b = counts["beam"]
        b.loss_sum, b.frames, b.skipped = (counts["best"].loss_sum, counts["best"].frames,
                                           counts["best"].skipped)
    return counts
