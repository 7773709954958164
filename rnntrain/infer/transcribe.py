"""``rnntrain transcribe MODEL INPUT...``: one line per utterance, in input order.

INPUT: audio files (WAV, FLAC, ... any sample rate), image files (PNG, JPEG, TIFF, ...; for
models trained on images), ``.npy`` feature arrays, NetCDF files (with or without targets:
every sequence is transcribed, none is skipped), folders (their audio, image and .npy
files, sorted), or list files (one path per line; ``path<TAB>anything`` as in the
converters' LIST.tsv; relative paths are relative to the list).

Utterances run on a pool of threads (each with one intra-op thread), in a bounded window
so a long list never holds more than a few utterances in memory; lines come out in input
order. NetCDF files are read on the calling thread (the NetCDF library is not thread-safe),
one chunk at a time.
"""
from __future__ import annotations

import json
import sys
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rnntrain.compute.pool import usable_cores
from rnntrain.errors import DataError, UserError
from rnntrain.fsutil import read_bytes
from rnntrain.frontend.images import IMAGE_SUFFIXES
from rnntrain.infer.api import AUDIO_SUFFIXES, Model, Transcript

LIST_SUFFIXES = {".tsv", ".txt", ".lst", ".list", ".scp"}
FILE_SUFFIXES = AUDIO_SUFFIXES | IMAGE_SUFFIXES | {".npy"}


def check_file(p: Path, where: str):
    """A regular file, else one line: a FIFO or device would block or fail when read."""
    if p.is_file():
        return
    if p.exists():
        raise UserError(f"{where}: not a regular file")
    raise UserError(f"{where}: file not found")


@dataclass
class Source:
    kind: str          # "file" (audio, image or .npy), "nc" or "page" (PAGE/ALTO XML)
    path: Path
    name: str          # what the output line shows


def expand(inputs: list[str]) -> list[Source]:
    """Command-line inputs → sources, checked to exist (one clear line otherwise)."""
    out: list[Source] = []
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            try:
                files = sorted(f for f in p.iterdir()
                               if f.suffix.lower() in FILE_SUFFIXES and f.is_file())
            except OSError as e:
                raise UserError(f"{p}: cannot list the folder ({e.strerror})") from None
            if not files:
                raise UserError(f"{p}: a folder without audio, image or .npy files")
            out += [Source("file", f, str(f)) for f in files]
            continue
        check_file(p, str(p))
        suf = p.suffix.lower()
        if suf == ".nc":
            out.append(Source("nc", p, str(p)))
        elif suf == ".xml":
            out.append(Source("page", p, str(p)))
        elif suf in FILE_SUFFIXES:
            out.append(Source("file", p, str(p)))
        elif suf in LIST_SUFFIXES:
            out += read_list(p)
        else:
            raise UserError(f"{p}: not an audio file, image, .npy array, NetCDF file, PAGE-XML "
                            f"or ALTO page (.xml) or list "
                            f"({', '.join(sorted(LIST_SUFFIXES))})")
    return out


def read_list(path: Path) -> list[Source]:
    out = []
    raw = read_bytes(path, "list")  # a regular file of bounded size (fsutil)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise UserError(f"{path} line {line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); "
                        "save the list as UTF-8") from None
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = Path(line.split("\t", 1)[0].strip())
        f = f if f.is_absolute() else path.parent / f
        if f.suffix.lower() not in FILE_SUFFIXES:
            raise UserError(f"{path} line {n}: {f} is not an audio file, image or .npy array")
        check_file(f, f"{path} line {n}: {f}")
        out.append(Source("file", f, str(f)))
    if not out:
        raise UserError(f"{path}: no files listed")
    return out


def nc_items(model: Model, src: Source, chunk_frames: int = 1_000_000) -> Iterator[tuple]:
    """(name, frames) of every sequence of a NetCDF file, read one chunk at a time."""
    from rnntrain.data.dataset import Dataset
    from rnntrain.frontend import FrontEnd
    ds = Dataset.open(str(src.path), chunk_frames, need_targets=False)
    if ds.is_2d:  # images: columns padded to the model's height, as decode serves them
        # without the converter's record, the height is what the model's frames hold
        height = model.image.height if model.image is not None else \
            model.input_size // ds.input_size
        if height < 1 or height * ds.input_size != model.input_size:
            raise DataError(src.path, f"a 2-D (image) file of {ds.input_size} values per "
                                      f"pixel; the model takes {model.input_size} values "
                                      "per frame, not whole image columns", var="seqDims")
        ds.set_pad_height(height, f"model {model.path}")
    if ds.frame_size != model.input_size:
        what = (f"{ds.frame_size} values per image column" if ds.is_2d or ds.column_height
                else f"inputPattSize {ds.input_size}")
        raise DataError(src.path, f"{what}, the model takes {model.input_size}")
    if ds.frontend is not None and model.frontend is not None and \
            FrontEnd.from_dict(ds.frontend) != model.frontend:
        raise DataError(src.path, "features or normalisation statistics differ from the "
                                  "model's front end (attribute 'rnntrain_frontend')")
    for k in range(len(ds.chunks)):
        payload = ds.load_chunk(k)
        for s in ds.chunks[k].seqs.tolist():
            yield ds.tag(s), payload[s]


def check_page_out(sources: list[Source], page_out: str | None) -> list[Path]:
    """The PAGE inputs; with ``page_out``, refuse before any work what cannot be written
    (not a folder, two pages of one name, an ALTO page, a page written over itself)."""
    from rnntrain.infer import pagexml
    pages = [s.path for s in sources if s.kind == "page"]
    if page_out is not None:
        if not pages:
            raise UserError(f"--page-out {page_out}: no PAGE-XML input to write back")
        if not Path(page_out).is_dir():
            raise UserError(f"--page-out {page_out}: not a folder")
        names = [p.name for p in pages]
        if len(set(names)) != len(names):
            raise UserError(f"--page-out {page_out}: two input pages are named "
                            f"{next(n for n in names if names.count(n) > 1)}")
        from rnntrain.fsutil import check_output
        for p in pages:
            pagexml.check_writable(p)
            check_output(Path(page_out) / p.name, [p], what="--page-out")
    return pages


def transcribe(model: Model, inputs: list[str], beam=0, threads: int = 0,
               as_json: bool = False, out=None, progress: bool = True, nbest: int = 1,
               full: bool = False, page_out: str | None = None) -> int:
    """Write one line per utterance to ``out`` (a text stream); returns the count.
    ``beam``: a width, or a ``Decoder`` (None: best path); see ``Model.decode``.
    ``nbest``, ``full``: see ``format_line``. PAGE-XML inputs: one line per text line;
    ``page_out``: a folder where each page is written back with its lines' text
    (``infer.pagexml``)."""
    from rnntrain.infer import pagexml
    beam = 0 if beam is None else beam
    sources = expand(inputs)
    pages = check_page_out(sources, page_out)
    results: dict[Path, dict] = {p: {} for p in pages}
    out = out or sys.stdout
    workers = threads or usable_cores()
    from tqdm import tqdm
    n_files = sum(1 for s in sources if s.kind == "file")
    bar = tqdm(total=n_files or None, unit="utt", desc="transcribe", leave=False,
               disable=not progress or (len(sources) < 20 and not any(
                   s.kind in ("nc", "page") for s in sources)) or None, file=sys.stderr)
    import torch
    saved = torch.get_num_threads()
    # one intra-op thread per worker: utterances in parallel scale better than one
    # utterance's small matrices over several threads
    torch.set_num_threads(max(1, usable_cores() // workers))
    window: deque[tuple[str, Future, tuple | None]] = deque()
    count = 0

    def emit(name: str, fut: Future, line: tuple | None = None):
        nonlocal count
        t = fut.result()
        if line is not None:  # (page, line id): kept for --page-out
            results[line[0]][line[1]] = t
        out.write(format_line(name, t, as_json, full or nbest > 1))
        count += 1
        bar.update(1)

    def job(item):
        if isinstance(item, Path):
            return model.transcribe(item, beam, nbest=nbest)
        if isinstance(item, tuple):  # a line cut from a page: spans in page columns
            name, crop, x0 = item
            frames, geo = model.frames_geometry(crop, name)
            t = model.decode_frames(frames, beam, nbest)
            for h in t.nbest or [t]:
                h.pixel_map = model.pixel_map(pagexml.Shifted(geo, x0))
            return t
        return model.decode_frames(item, beam, nbest)

    def items_of(src: Source):
        if src.kind == "file":
            yield src.name, src.path, None
        elif src.kind == "nc":
            for name, frames in nc_items(model, src):
                yield name, frames, None
        else:
            for name, lid, crop, x0 in pagexml.page_items(model, src.path):
                yield name, (name, crop, x0), (src.path, lid)

    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="transcribe") as pool:
            try:
                for src in sources:
                    for name, item, line in items_of(src):
                        window.append((name, pool.submit(job, item), line))
                        if len(window) >= 4 * workers:
                            emit(*window.popleft())
                while window:
                    emit(*window.popleft())
            except BaseException:
                for _, f, _ in window:
                    f.cancel()
                raise
    finally:
        bar.close()
        torch.set_num_threads(saved)
    if page_out is not None:
        for p in pages:
            added = pagexml.write_page(p, results[p], Path(page_out) / p.name)
            if added:  # PAGE requires the id; the page written back carries one
                print(f"{Path(page_out) / p.name}: {added} TextLine(s) without an id got "
                      "one (line_N, N its place on the page)", file=sys.stderr)
    return count


def format_line(name: str, t: Transcript, as_json: bool, full: bool = False,
                key: str = "input") -> str:
    """One utterance's output (docs/decoding.md, "What comes back").

    TSV: ``input, hypothesis, peak times`` (seconds; model frames without a front end).
    ``full`` (``--full``, implied by ``--nbest``): five more columns, ``confidences,
    starts, ends`` (space-separated, one per label; starts/ends in ``t.unit``),
    ``score`` and ``rank`` (1 = best), and one line per n-best hypothesis.
    JSON: one object per utterance (``Transcript.to_dict``, the name under ``key``).
    """
    if as_json:
        return json.dumps({key: name, **t.to_dict()}, ensure_ascii=False) + "\n"
    lines = []
    for rank, h in enumerate(t.nbest or [t], 1):
        times = h.times
        peaks = " ".join(f"{v:.2f}" for v in times) if times is not None else \
            " ".join(str(p) for p in h.peaks)
        line = f"{name}\t{h.text}\t{peaks}"
        if full:
            line += "\t" + "\t".join([
                " ".join(f"{c:.4f}" for c in h.confidences),
                " ".join(_num(v) for v in h.span_starts),
                " ".join(_num(v) for v in h.span_ends),
                "" if h.score is None else f"{h.score:.4f}", str(rank)])
        lines.append(line + "\n")
        if not full:
            break
    return "".join(lines)


def _num(v) -> str:
    return str(v) if isinstance(v, int) else f"{v:.3f}".rstrip("0").rstrip(".")
