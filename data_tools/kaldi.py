"""Corpora people already have: a Kaldi data directory or a Lhotse cut set → utterance
entries for ``audio.convert`` (same front end, statistics and alphabet handling as
``rnntrain-data audio``).

Kaldi data directory (https://kaldi-asr.org/doc/data_prep.html):

- ``wav.scp``: ``<recording-id> <audio file>``; with no ``segments`` file the recording id
  is the utterance id. Piped commands (``cmd |``) run a shell command: they are refused
  with the line named unless ``allow_pipes`` (``--allow-pipes``), which runs each one as
  Kaldi does and reads the audio from its output. Archive offsets (``file.ark:123``) are
  refused: the audio must be files (WAV, FLAC, OGG, ...).
- ``segments`` (optional): ``<utterance-id> <recording-id> <start s> <end s>`` (end -1 =
  the end of the recording).
- ``text``: ``<utterance-id> <transcript tokens ...>``: the tokens (words, phones or
  characters, whatever the corpus uses) are the label names; with ``--units chars`` each
  character is a label and the space between words is ``|``.
- ``utt2spk`` (optional): checked to cover every utterance; the speaker count is reported
  (and per-speaker CMVN uses it).
- ``feats.scp`` / ``cmvn.scp``: feature matrices instead of audio: see ``kaldi_feats``.

Utterances are written in the order of ``text`` (Kaldi keeps its files sorted); an
utterance with audio but no transcript is left out and counted.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rnntrain.errors import UserError
from rnntrain.fsutil import read_text

from .audio import Entry

WORD_SEPARATOR = "|"


def _table(path: Path, min_fields: int, what: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of a Kaldi table file; blank lines skipped."""
    rows = []
    for n, raw in enumerate(read_text(path, "Kaldi table").splitlines(), 1):
        fields = raw.split()
        if not fields:
            continue
        if len(fields) < min_fields:
            raise UserError(f"{path} line {n}: expected {what}, got {raw[:80]!r}")
        rows.append((n, fields))
    return rows


def _unique(path: Path, rows) -> dict[str, tuple[int, list[str]]]:
    out = {}
    for n, f in rows:
        if f[0] in out:
            raise UserError(f"{path} line {n}: id {f[0]!r} already on line {out[f[0]][0]}")
        out[f[0]] = (n, f)
    return out


def tokens(text: list[str], units: str) -> list[str]:
    if units == "words":
        return text
    out: list[str] = []
    for i, w in enumerate(text):
        if i:
            out.append(WORD_SEPARATOR)
        out.extend(w)
    return out


def _resolve(d: Path, name: str) -> Path:
    """A file named in a table of data folder ``d``: as written when it exists (Kaldi paths
    are relative to the recipe folder one runs from), else relative to ``d`` when it
    exists there (a data folder moved on its own usually keeps them relative to itself)."""
    p = Path(name)
    if p.is_absolute() or os.path.lexists(p) or not os.path.lexists(d / p):
        return p
    return d / p


def is_pipe(spec: str) -> bool:
    """A Kaldi rxspecifier that is a shell command (``cmd |``), not a file."""
    s = spec.strip()
    return s.endswith("|") or s.startswith("|")


def pipe_refused(where: str, key: str, spec: str, what: str) -> UserError:
    return UserError(f"{where}: {key!r} is a piped command ({spec[:60]!r}); piped commands "
                     f"run in a shell and are refused unless --allow-pipes is given (or run "
                     f"them once to write {what} and list those)")


@dataclass
class DataDir:
    """The tables of a Kaldi data folder every kind of input shares."""
    path: Path
    text: dict        # utterance id → (line number, fields of its ``text`` line)
    spk: dict | None  # utterance id → speaker id (``utt2spk``), None without the file


def read_data_dir(data_dir, needs: tuple[str, ...]) -> DataDir:
    """``text`` and ``utt2spk`` of a Kaldi data folder; ``needs``: the tables that must be
    there (named in the error when one is not)."""
    d = Path(data_dir)
    if not d.is_dir():
        raise UserError(f"{d}: not a folder (a Kaldi data directory holds "
                        f"{' and '.join(needs)})")
    for name in needs:
        if not os.path.lexists(d / name):  # a FIFO or a folder there: read_text names it
            raise UserError(f"{d}: no {name} (a Kaldi data directory holds "
                            f"{' and '.join(needs)})")
    spk = None
    if os.path.lexists(d / "utt2spk"):
        spk = {u: f[1] for u, (n, f) in _unique(
            d / "utt2spk", _table(d / "utt2spk", 2, "'<utterance-id> <speaker-id>'")).items()}
    text = _unique(d / "text", _table(d / "text", 1, "'<utterance-id> [tokens ...]'"))
    if spk is not None:
        for utt, (n, f) in text.items():
            if utt not in spk:
                raise UserError(f"{d / 'text'} line {n}: utterance {utt!r} is not in "
                                f"{d / 'utt2spk'}")
    return DataDir(d, text, spk)


def kaldi_entries(data_dir, units: str = "words",
                  allow_pipes: bool = False) -> tuple[list[Entry], str]:
    """Audio from ``wav.scp`` (and ``segments``) → (entries in ``text`` order, a one-line
    summary). ``allow_pipes``: run ``cmd |`` lines in a shell and read the audio they
    write to stdout, as Kaldi does."""
    dd = read_data_dir(data_dir, ("wav.scp", "text"))
    d = dd.path
    wav = {}
    for n, f in _unique(d / "wav.scp", _table(d / "wav.scp", 2, "'<id> <audio file>'")).values():
        rest = " ".join(f[1:])
        where = f"{d / 'wav.scp'} line {n}"
        if is_pipe(rest):
            if not allow_pipes:
                raise pipe_refused(where, f[0], rest, "audio files (sox/ffmpeg/sph2pipe ... "
                                   "> FILE.wav)")
            wav[f[0]] = (rest, where)
            continue
        if len(f) > 2:
            raise UserError(f"{where}: expected '<id> <audio file>', got {len(f) - 1} fields "
                            f"after the id (a file name with spaces, or a command?)")
        p = Path(f[1])
        if ".ark:" in f[1] or (not os.path.lexists(p) and f[1].rsplit(":", 1)[-1].isdigit()):
            raise UserError(f"{where}: {f[1]!r} is a Kaldi archive offset; rnntrain-data reads "
                            f"audio files only (wav-copy ... to write files first)")
        wav[f[0]] = (_resolve(d, f[1]), where)
    segs = None
    if os.path.lexists(d / "segments"):
        segs = {}
        for utt, (n, f) in _unique(d / "segments", _table(
                d / "segments", 4, "'<utterance-id> <recording-id> <start> <end>'")).items():
            where = f"{d / 'segments'} line {n}"
            if f[1] not in wav:
                raise UserError(f"{where}: recording {f[1]!r} is not in {d / 'wav.scp'}")
            try:
                start, end = float(f[2]), float(f[3])
            except ValueError:
                raise UserError(f"{where}: start and end must be seconds, got {f[2]!r} "
                                f"{f[3]!r}") from None
            if start < 0 or (end != -1 and end <= start):
                raise UserError(f"{where}: segment {start}-{end} s is empty or negative")
            segs[utt] = (f[1], start, None if end == -1 else end, where)
    entries = []
    for utt, (n, f) in dd.text.items():
        where = f"{d / 'text'} line {n}"
        if segs is not None:
            if utt not in segs:
                raise UserError(f"{where}: utterance {utt!r} is not in {d / 'segments'}")
            rec, start, end, seg_where = segs[utt]
            src, _ = wav[rec]
            where = f"{seg_where} (utterance {utt!r})"
        else:
            if utt not in wav:
                raise UserError(f"{where}: utterance {utt!r} is not in {d / 'wav.scp'}")
            (src, where), start, end = wav[utt], 0.0, None
            where = f"{where} (utterance {utt!r})"
        if isinstance(src, str):  # a command (allow_pipes): its stdout is the audio
            entries.append(Entry(n, Path(d / "wav.scp"), tokens(f[1:], units), tag=utt,
                                 where=where, load=functools.partial(
                                     piped_signal, src, start, end)))
        else:
            entries.append(Entry(n, src, tokens(f[1:], units), tag=utt, where=where,
                                 start=start, end=end))
    ids = set(segs) if segs is not None else set(wav)
    untranscribed = len(ids - set(dd.text))
    spk = dd.spk
    summary = (f"{len(entries)} utterances" + (f" from {len(wav)} recordings" if segs else "")
               + (f", {len(set(spk[e.tag] for e in entries))} speakers" if spk else "")
               + (f"; {untranscribed} without a transcript in text left out"
                  if untranscribed else ""))
    return entries, summary


def piped_signal(command: str, start: float = 0.0, end: float | None = None
                 ) -> tuple[int, np.ndarray]:
    """Run a wav.scp command (``sph2pipe -f wav X.sph |``) in a shell and read the audio it
    writes to stdout (any format libsndfile reads, at most ``READ_LIMIT`` bytes) →
    (rate, mono float64 signal) of [start, end) seconds."""
    import io
    import subprocess
    import tempfile
    import soundfile as sf
    from rnntrain.fsutil import READ_LIMIT
    from .audio import _mono_checked
    cmd = command.strip().strip("|").strip()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=err)
        data = proc.stdout.read(READ_LIMIT + 1)
        if len(data) > READ_LIMIT:
            proc.kill()
        proc.stdout.close()
        rc = proc.wait()
        err.seek(0)
        msg = err.read()[-300:].decode("utf-8", "replace").strip().splitlines()
    if len(data) > READ_LIMIT:
        raise UserError(f"command {cmd[:60]!r} wrote more than {READ_LIMIT:,} bytes")
    if rc != 0:
        raise UserError(f"command {cmd[:60]!r} failed (exit status {rc})"
                        + (f": {msg[-1]}" if msg else ""))
    try:
        x, rate = sf.read(io.BytesIO(data), dtype="float64", always_2d=True)
    except (RuntimeError, TypeError, ValueError) as e:
        raise UserError(f"command {cmd[:60]!r}: its output cannot be read as audio "
                        f"({e})") from None
    a = int(round(start * rate))
    b = len(x) if end is None else int(round(end * rate))
    if not 0 <= a < b <= len(x) + int(0.01 * rate):  # 10 ms of slack, as files
        raise UserError(f"command {cmd[:60]!r}: segment {start:.3f}-"
                        f"{'end' if end is None else f'{end:.3f}'} s lies outside its "
                        f"{len(x) / rate:.3f} s of audio")
    return _mono_checked(f"command {cmd[:60]!r}", int(rate), x[a:b])


# ---------------------------------------------------------------- Lhotse


def lhotse_entries(cuts_path, units: str = "words") -> tuple[list[Entry], str]:
    """A Lhotse cut set (``CutSet.to_file``: .jsonl, .jsonl.gz) → entries, one per cut; the
    transcript is the text of the cut's supervisions, in order, split on whitespace."""
    p = Path(cuts_path)
    if not p.is_file():
        raise UserError(f"{p}: cut set file not found")
    try:
        from lhotse import CutSet
    except ImportError as e:  # not installed, or installed without one of its own imports
        raise UserError(f"rnntrain-data lhotse needs the lhotse package: pip install "
                        f"'rnntrain[lhotse]' ({e})") from None
    try:
        cuts = CutSet.from_file(p)
        cut_list = list(cuts)
    except Exception as e:  # lhotse raises many kinds for a malformed manifest
        raise UserError(f"{p}: cannot read as a Lhotse cut set ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    entries = []
    for i, cut in enumerate(cut_list, 1):
        where = f"{p} cut {i} ({cut.id!r})"
        if not getattr(cut, "has_recording", False):
            raise UserError(f"{where}: has no recording (features-only cuts are not read: "
                            f"rnntrain-data computes its own features)")
        text = " ".join(s.text or "" for s in sorted(cut.supervisions, key=lambda s: s.start))
        entries.append(Entry(i, p, tokens(text.split(), units), tag=cut.id, where=where,
                             load=functools.partial(cut_signal, cut),
                             rate=int(cut.sampling_rate)))
    return entries, f"{len(entries)} cuts"


def cut_signal(cut) -> tuple[int, np.ndarray]:
    """(rate, mono float64 signal) of a Lhotse cut."""
    try:
        x = np.asarray(cut.load_audio(), dtype=np.float64)
    except Exception as e:
        raise UserError(f"cannot load the audio of cut {cut.id!r} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
    if x.ndim == 2:
        x = x.mean(axis=0)  # (channels, samples) → mono
    if x.size == 0:
        raise UserError(f"cut {cut.id!r} has no samples")
    if not np.isfinite(x).all():
        raise UserError(f"cut {cut.id!r} contains NaN or Inf samples")
    return int(cut.sampling_rate), x
