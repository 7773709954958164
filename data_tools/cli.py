"""``rnntrain-data``: make, convert and check RNNLIB-format NetCDF datasets."""
from __future__ import annotations

import argparse
import sys

from rnntrain.cli_args import (Parser, non_negative_float, non_negative_int, positive_float,
                               positive_int, run_main, version)
from rnntrain.errors import UserError
from rnntrain.data.ncdata import FORMATS


def _synth(a):
    from .synth import write_synth
    write_synth(a.out, a.seqs, a.labels, a.inputs, a.seed, a.format,
                mean_labels=a.mean_labels, noise=a.noise)
    print(f"wrote {a.out}: {a.seqs} sequences")


def _inspect(a):
    from .inspect_nc import inspect
    problems: list[str] = []
    print(inspect(a.path, a.subsample, problems=problems))
    if problems:
        raise UserError(f"{len(problems)} problem(s) found; first: {problems[0]}")


def _shard(a):
    from .shard import shard

    def progress(s, c, entry):
        print(f"  shard {s} chunk {c}: {entry['numSeqs']} sequences, "
              f"{entry['numTimesteps']:,} frames", flush=True)
    path = shard(a.inputs, a.shards, a.out, a.chunk_frames, a.chunk_seqs, a.seed, a.within,
                 a.merge_labels, a.format, progress if a.verbose else None)
    print(f"wrote {path}")


def _audio(a):
    from .audio import AudioSource, convert, feature_config, parse_labels
    cfg = feature_config(a.features, a.rate, a.mels, a.stats, a.list)
    st = convert(a.list, a.out, AudioSource(cfg), a.stats, a.save_stats,
                 parse_labels(a.labels) if a.labels else None, a.format)
    print(f"wrote {a.out}: {cfg.kind} {cfg.size} features at {cfg.rate} Hz, "
          f"{len(st.labels)} labels" + ("" if a.stats else f"; statistics from {st.frames} "
                                        f"frames saved to {a.save_stats or a.out + '.stats.json'}"))


def _stats_note(a, st) -> str:
    return "" if a.stats else (f"; statistics from {st.frames} frames saved to "
                               f"{a.save_stats or a.out + '.stats.json'}")


def _kaldi_feats(a) -> bool:
    """Whether ``rnntrain-data kaldi`` reads feature matrices (feats.scp, --feats) rather
    than computing features from wav.scp; refuses the options of the other kind."""
    import os
    feats = a.feats is not None or a.source == "feats" or (
        a.source == "auto" and os.path.lexists(os.path.join(a.data_dir, "feats.scp")))
    if feats:
        if a.source == "wav":
            raise UserError("--feats reads feature matrices: leave out --from wav")
        given = [f for f, v in (("--features", a.features), ("--rate", a.rate),
                                ("--mels", a.mels)) if v is not None]
        if given:
            raise UserError(f"{given[0]} sets how audio becomes features, but the features "
                            f"come from {a.feats or os.path.join(a.data_dir, 'feats.scp')} "
                            f"(--from wav computes them from wav.scp)")
    elif a.cmvn != "none" or a.cmvn_vars:
        raise UserError("--cmvn applies to Kaldi feature matrices (feats.scp); features "
                        "computed from wav.scp are normalised over the whole set")
    return feats


def _corpus(a):
    from .audio import AudioSource, convert, feature_config, parse_labels
    from .kaldi import kaldi_entries, lhotse_entries
    labels = parse_labels(a.labels) if a.labels else None
    if a.cmd == "kaldi" and _kaldi_feats(a):
        from .kaldi_feats import kaldi_feature_entries
        entries, summary, source = kaldi_feature_entries(
            a.data_dir, a.units, a.feats, a.cmvn, a.cmvn_vars, a.allow_pipes)
        st = convert(a.data_dir, a.out, source, a.stats, a.save_stats, labels, a.format,
                     entries=entries)
        print(f"wrote {a.out}: {summary}, {len(st.labels)} labels" + _stats_note(a, st))
        return
    src = a.data_dir if a.cmd == "kaldi" else a.cuts
    entries, summary = (kaldi_entries(src, a.units, a.allow_pipes) if a.cmd == "kaldi"
                        else lhotse_entries(src, a.units))
    if not entries:
        raise UserError(f"{src}: no utterances")
    cfg = feature_config(a.features, a.rate, a.mels, a.stats, src, first=entries[0])
    st = convert(src, a.out, AudioSource(cfg), a.stats, a.save_stats, labels, a.format,
                 entries=entries)
    print(f"wrote {a.out}: {summary}; {cfg.kind} {cfg.size} features at {cfg.rate} Hz, "
          f"{len(st.labels)} labels" + _stats_note(a, st))


def _convert(a):
    from .audio import ArraySource, convert, parse_labels
    st = convert(a.list, a.out, ArraySource(), a.stats, a.save_stats,
                 parse_labels(a.labels) if a.labels else None, a.format)
    print(f"wrote {a.out}: {len(st.mean)} features, {len(st.labels)} labels"
          + ("" if a.stats else f"; statistics saved to {a.save_stats or a.out + '.stats.json'}"))


def _fsdd_strings(a):
    from .fsdd import make_strings, parse_range
    lst = make_strings(a.recordings, a.split, a.count, parse_range(a.digits, "--digits"),
                       a.seed, a.out, parse_range(a.takes, "--takes") if a.takes else None)
    print(f"wrote {a.count} {a.split} strings and {lst}")


def _yesno_lists(a):
    from .yesno import make_lists
    out = make_lists(a.recordings, a.out, a.seed, a.test, a.val)
    print("wrote " + ", ".join(str(p) for p in out.values()))


def _list_args(s, what: str | None):
    if what:
        s.add_argument("--list", required=True,
                       help=f"LIST.tsv: {what}<TAB>transcript per line")
    s.add_argument("--out", required=True, help="output .nc file")
    s.add_argument("--stats", help="apply these saved statistics (validation/test sets)")
    s.add_argument("--save-stats", help="where to save the statistics computed on this list "
                                        "(default OUT.stats.json)")
    s.add_argument("--labels", help="alphabet in index order, comma-separated "
                                    "(default: sorted set of transcript tokens)")
    s.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET",
                   help="NetCDF file format")


def _feature_args(a):
    a.add_argument("--features", choices=("fbank", "mfcc"),
                   help="log-mel filterbank (default) or MFCC 13 + delta + delta-delta")
    a.add_argument("--rate", type=positive_int, help="feature sample rate in Hz; other rates "
                   "are resampled (default: the first utterance's rate)")
    a.add_argument("--mels", type=positive_int, help="mel bands (default 40)")
    if a.prog.split()[-1] in ("kaldi", "lhotse"):
        a.add_argument("--units", choices=("words", "chars"), default="words",
                       help="labels: the transcript's space-separated tokens, or its "
                            "characters with '|' between words")


def _images(a):
    from .images import convert_images, parse_split
    if not a.list and not a.inputs:
        raise UserError("give line images: a folder, a glob, image files (each with its "
                        ".gt.txt) or --list LIST.tsv")
    labels = parse_labels_arg(a, chars=a.chars or any(not i.endswith(".tsv") for i in a.inputs))
    info = convert_images(a.list, a.out, image_settings(a), a.chars, a.space, labels,
                          a.layout, a.format, inputs=a.inputs,
                          keep_unknown=bool(a.labels_from),
                          split=parse_split(a.split) if a.split else None, seed=a.seed)
    print_summary(a, info)


def image_settings(a):
    """--height, --trim and --invert → ImageSettings (trim: off unless given)."""
    from .images import ImageSettings
    if a.height < 0:
        raise UserError(f"--height {a.height} must be >= 0 (0 keeps the sizes)")
    if a.trim is None:
        trim = -1             # measured: trimming by default slowed learning (accuracy.md)
    elif a.trim in ("none", "no", "off"):
        trim = -1
    else:
        try:
            trim = int(a.trim)
        except ValueError:
            trim = -2
        if trim < 0:
            raise UserError(f"--trim {a.trim!r}: give the padding in pixels (>= 0) or none")
    return ImageSettings(a.height, a.invert, trim)


def print_summary(a, info):
    ooa = (f"; {info['out_of_alphabet']} line(s) hold characters outside the alphabet (kept "
           "with their full text: rnntrain eval scores them)") if info["out_of_alphabet"] else ""
    what = ", ".join(info["files"])
    if "splits" in info:
        what += " (" + ", ".join(f"{k} {v}" for k, v in info["splits"].items()) + \
            "; each split's lines in a .tsv beside it)"
    print(f"wrote {what}: {info['images']} lines, {info['columns']:,} columns, heights "
          f"{info['heights'][0]}-{info['heights'][1]}, {info['labels']} labels "
          f"(layout {a.layout}){ooa}")


def parse_labels_arg(a, chars: bool | None = None):
    """--labels (names or a file of one label per line), --labels-from (an .nc file or
    such a file) or --alphabet → the alphabet, or None (from the transcripts)."""
    import os
    from .audio import parse_labels
    from .images import as_label_names, labels_file, labels_from
    chars = a.chars if chars is None else chars
    if sum(map(bool, (a.labels, a.labels_from, a.alphabet))) > 1:
        raise UserError("give one of --labels, --labels-from and --alphabet")
    if a.alphabet:
        from .images import ascii_alphabet
        if not chars:
            raise UserError("--alphabet needs --chars (it names characters)")
        return ascii_alphabet(a.space)
    if a.labels_from:
        return as_label_names(labels_from(a.labels_from), chars, a.space)
    if a.labels and os.path.isfile(a.labels):
        return as_label_names(labels_file(a.labels), chars, a.space)
    return parse_labels(a.labels) if a.labels else None


def _image_args(m, what: str):
    """Options shared by the line-image converters (images, pagexml)."""
    m.add_argument("--out", required=True, help="output .nc file (with --split: the stem "
                   "of OUT-train.nc, OUT-val.nc, OUT-test.nc)")
    m.add_argument("--height", type=int, default=48, help="scale every line to this height "
                   "keeping the aspect ratio (default 48, as kraken and Calamari; 0: keep "
                   "the sizes)")
    m.add_argument("--trim", default=None, metavar="PAD|none", help="crop the margins to the "
                   f"ink, keeping PAD pixels of background around it (e.g. {4}: loosely or "
                   "unevenly cropped lines); default none: the margins kept")
    m.add_argument("--invert", choices=("auto", "yes", "no"), default="auto",
                   help="make ink high: auto inverts images with a light background")
    m.add_argument("--layout", choices=("2d", "columns"), default="2d",
                   help="2d: RNNLIB numDims = 2 (default); columns: 1-D frames of pixel columns")
    m.add_argument("--space", default="<space>", help="label name of the space with --chars "
                   "(default <space>)")
    m.add_argument("--labels", help="alphabet in index order: names separated by commas, or a "
                   "file with one label per line (default: the sorted set of the "
                   f"{what}' labels)")
    m.add_argument("--labels-from", help="the alphabet of this .nc file or labels file "
                   "(validation and test sets: the training set's); lines with characters it "
                   "lacks are kept with their full text for rnntrain eval")
    m.add_argument("--alphabet", choices=("ascii",), help="with --chars: a fixed alphabet, "
                   "ascii = the space and the 94 printable ASCII characters in code order")
    m.add_argument("--split", metavar="TRAIN,VAL[,TEST]", help="split the lines at random by "
                   "these fractions (e.g. 0.8,0.1,0.1) into OUT-train.nc, OUT-val.nc, "
                   "OUT-test.nc, each with its list OUT-NAME.tsv")
    m.add_argument("--seed", type=non_negative_int, default=1, help="the split's seed")
    m.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET",
                   help="NetCDF file format")


def _pagexml(a):
    from .images import parse_split
    from .pagexml import convert_pages
    labels = parse_labels_arg(a, chars=True)
    info = convert_pages(a.inputs, a.out, image_settings(a), a.space, labels, a.layout,
                         a.format, keep_unknown=bool(a.labels_from),
                         split=parse_split(a.split) if a.split else None, seed=a.seed,
                         padding=a.padding, image_dir=a.image_dir, crop=a.crop,
                         image=a.image)
    print_summary(a, info)


def _float_range(flag: str, text: str) -> tuple[float, float]:
    """'A-B' or 'A' → (A, B) as finite floats, else one clean error line."""
    import math
    try:
        lo, hi = (float(v) for v in text.split("-", 1)) if "-" in text else (float(text),) * 2
    except ValueError:
        raise UserError(f"{flag} {text!r}: give A-B (two numbers)") from None
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise UserError(f"{flag} {text!r}: give finite numbers")
    return lo, hi


def _render_lines(a):
    from .render import render_lines
    try:
        lo, hi = (int(v) for v in a.sizes.split("-")) if "-" in a.sizes else (int(a.sizes),) * 2
    except ValueError:
        raise UserError(f"--sizes {a.sizes!r}: give A-B (font sizes in pixels)") from None
    lst = render_lines(a.out, a.count, a.fonts.replace(",", " ").split(), (lo, hi), a.seed,
                       a.rotate, a.blur, a.noise, a.max_chars, a.text,
                       margin=_float_range("--margin", a.margin) if a.margin else None,
                       stretch=_float_range("--stretch", a.stretch))
    print(f"wrote {a.count} lines and {lst}")


def _perplexity(a):
    import math
    from rnntrain.decode.lm import ArpaLM
    from .ngram import sentences
    lm = ArpaLM.load(a.lm)
    sents = sentences(a.text, chars=a.chars, space_token=a.space_token)
    # as SRILM's ngram -ppl: every token and </s> is predicted; OOVs are counted apart
    # (scored as <unk> when the model lists it, as the decoder scores them)
    ln = sum(lm.sentence_logprob(s) for s in sents)
    n = sum(len(s) + 1 for s in sents)
    oov = sum(1 for s in sents for w in s if w not in lm.index)
    ppl = math.exp(-ln / n)
    if a.json:
        import json
        print(json.dumps({"lm": a.lm, "order": lm.order, "text": a.text, "sentences": len(sents),
                          "tokens": n, "oov": oov, "logprob": ln, "perplexity": ppl}))
        return
    print(f"{a.text}: {len(sents)} sentences, {n} tokens with </s> ({oov} OOV); "
          f"{a.lm} ({lm.order}-gram): ln P {ln:.1f}, perplexity {ppl:.3f}")


def _faker_text(a):
    from .lmtext import write_faker_text
    n, dropped, known = write_faker_text(a.out, a.count, a.seed, a.max_chars, a.exclude or [])
    print(f"wrote {a.out}: {n} lines (Faker en_US, seed {a.seed}); dropped {dropped} equal to "
          f"one of the {known} distinct lines of the --exclude lists")


def _rnnlib_config(a):
    from .rnnlib_config import convert_file
    toml, warnings = convert_file(a.config)
    for w in warnings:
        print(f"rnntrain-data rnnlib-config: warning: {w}", file=sys.stderr)
    print(toml, end="")


def _ngram(a):
    from .ngram import build, sentences, write_arpa
    sents = sentences(a.text, chars=a.chars, space_token=a.space_token)
    ng = build(sents, a.order, a.smoothing, a.discount_fallback)
    write_arpa(ng, a.out)
    sizes = ", ".join(f"{len(ng[k])} {k}-grams" for k in sorted(ng))
    print(f"wrote {a.out}: {a.smoothing} {a.order}-gram model from {len(sents)} lines ({sizes})")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="rnntrain-data", description=__doc__.splitlines()[0])
    p.add_argument("--version", action="version", version=f"rnntrain-data {version()}")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    s = sub.add_parser("synth", help="write a synthetic CTC dataset")
    s.add_argument("out", help="output .nc file")
    s.add_argument("--seqs", type=positive_int, default=2000, help="number of sequences")
    s.add_argument("--labels", type=positive_int, default=20, help="alphabet size")
    s.add_argument("--inputs", type=positive_int, default=20, help="inputPattSize")
    s.add_argument("--mean-labels", type=positive_float, default=6.0,
                   help="mean target length")
    s.add_argument("--noise", type=non_negative_float, default=0.5,
                   help="Gaussian noise std on the frames")
    s.add_argument("--seed", type=non_negative_int, default=1, help="random seed")
    s.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET",
                   help="NetCDF file format")
    s.set_defaults(fn=_synth)
    i = sub.add_parser("inspect", help="summarise a .nc file or dataset manifest")
    i.add_argument("path", help=".nc file or sharded dataset folder/manifest.json")
    i.add_argument("--subsample", type=positive_int, default=1,
                   help="input frames per output frame in training: model.subsample times the "
                   "conv front end's width pooling (for the infeasible count)")
    i.set_defaults(fn=_inspect)
    h = sub.add_parser("shard", help="length-sorted shards + manifest (streaming)")
    h.add_argument("inputs", nargs="+", metavar="INPUT.nc", help="RNNLIB .nc files to shard")
    h.add_argument("--shards", type=positive_int, required=True, help="number of shards (a multiple "
                   "of the number of MPI ranks you will train on)")
    h.add_argument("--out", required=True, help="output folder (gets manifest.json)")
    g = h.add_mutually_exclusive_group()
    g.add_argument("--chunk-frames", type=positive_int, help="frames per chunk file (default 2000000)")
    g.add_argument("--chunk-seqs", type=positive_int, help="sequences per chunk file")
    h.add_argument("--seed", type=non_negative_int, default=1, help="breaks length ties (and shuffles "
                   "with --within shuffle)")
    h.add_argument("--within", choices=("sorted", "shuffle"), default="sorted",
                   help="order inside a shard: sorted by length (default) or shuffled "
                   "(the RNNLIB recipe)")
    h.add_argument("--merge-labels", action="store_true",
                   help="allow inputs with different alphabets (uses their union)")
    h.add_argument("--format", choices=FORMATS, default="NETCDF3_64BIT_OFFSET",
                   help="NetCDF file format")
    h.add_argument("-v", "--verbose", action="store_true", help="print each chunk written")
    h.set_defaults(fn=_shard)
    a = sub.add_parser("audio", help="audio files (WAV, FLAC, OGG) listed in a LIST.tsv → "
                                     "normalised features .nc")
    _list_args(a, "path to a .wav/.flac/.ogg file")
    _feature_args(a)
    a.set_defaults(fn=_audio)
    k = sub.add_parser("kaldi", help="a Kaldi data directory (feats.scp or wav.scp, text, "
                                     "segments, utt2spk) → normalised features .nc",
                       description="Read a Kaldi data directory: text, utt2spk when present, "
                                   "and either the feature matrices of feats.scp (Kaldi "
                                   "archives, binary, text or compressed; optional CMVN) or "
                                   "the audio of wav.scp (with segments when present; "
                                   "features computed as in 'audio'). Statistics and "
                                   "alphabet as in 'audio'.")
    k.add_argument("data_dir", metavar="DATA_DIR", help="folder with text and feats.scp or "
                                                        "wav.scp")
    _list_args(k, None)
    k.add_argument("--from", dest="source", choices=("auto", "feats", "wav"), default="auto",
                   help="auto (default): feats.scp when DATA_DIR has one, else wav.scp; "
                        "feats: Kaldi's feature matrices; wav: compute features from the audio")
    k.add_argument("--feats", metavar="SCP_OR_ARK", help="read the feature matrices of this "
                   "feats .scp or bare .ark (binary or text) instead of DATA_DIR/feats.scp")
    k.add_argument("--cmvn", choices=("none", "utterance", "speaker", "scp"), default="none",
                   help="with feature matrices: subtract the mean of each utterance, of each "
                        "speaker (utt2spk), or Kaldi's own statistics in DATA_DIR/cmvn.scp "
                        "(default none); the corpus-wide normalisation follows in every case")
    k.add_argument("--cmvn-vars", action="store_true", help="with --cmvn: also divide by the "
                   "standard deviation (Kaldi's apply-cmvn --norm-vars)")
    k.add_argument("--allow-pipes", action="store_true", help="run the shell commands of "
                   "wav.scp/feats.scp lines ending in '|' (as Kaldi does) and read their "
                   "output; refused by default: only for tables you trust")
    _feature_args(k)
    k.set_defaults(fn=_corpus)
    lh = sub.add_parser("lhotse", help="a Lhotse cut set (.jsonl.gz) → normalised features .nc",
                        description="Read a Lhotse cut set (needs the lhotse package): one "
                                    "sequence per cut, its supervisions' text as the "
                                    "transcript. Features, statistics and alphabet as in "
                                    "'audio'.")
    lh.add_argument("cuts", metavar="CUTS", help="cut set file (CutSet.to_file: .jsonl.gz)")
    _list_args(lh, None)
    _feature_args(lh)
    lh.set_defaults(fn=_corpus)
    c = sub.add_parser("convert", help=".npy arrays (frames, features) listed in a LIST.tsv "
                                       "→ normalised .nc")
    _list_args(c, "path.npy")
    c.set_defaults(fn=_convert)
    f = sub.add_parser("fsdd-strings", help="connected-digit WAVs + LIST.tsv from FSDD")
    f.add_argument("--recordings", required=True, help="FSDD recordings/ folder")
    f.add_argument("--split", choices=("train", "test"), required=True,
                   help="train: takes 5-49; test: takes 0-4")
    f.add_argument("--takes", help="narrow the split's takes, e.g. 5-9")
    f.add_argument("--count", type=positive_int, default=1000, help="strings to make")
    f.add_argument("--digits", default="3-7", help="digits per string, A-B")
    f.add_argument("--seed", type=non_negative_int, default=1, help="random seed")
    f.add_argument("--out", required=True, help="output folder (wav/, list.tsv, sources.tsv)")
    f.set_defaults(fn=_fsdd_strings)
    y = sub.add_parser("yesno-lists", help="seeded train/val/test LIST.tsv files for YesNo")
    y.add_argument("--recordings", required=True, help="the waves_yesno/ folder")
    y.add_argument("--out", required=True, help="output folder (train.tsv, val.tsv, test.tsv)")
    y.add_argument("--seed", type=non_negative_int, default=1, help="random seed")
    y.add_argument("--test", type=positive_int, default=15, help="held-out recordings")
    y.add_argument("--val", type=positive_int, default=5, help="validation recordings (from the rest)")
    y.set_defaults(fn=_yesno_lists)
    n = sub.add_parser("ngram", help="a smoothed n-gram language model (ARPA) from text",
                       description="One sentence per line. Modified Kneser-Ney (default) or "
                       "Witten-Bell, interpolated, written in back-off (ARPA) form.")
    n.add_argument("text", help="text file, one sentence per line")
    n.add_argument("--order", type=positive_int, default=3, help="n-gram order")
    n.add_argument("--out", required=True, help="the ARPA file to write")
    n.add_argument("--smoothing", choices=("kn", "wb"), default="kn",
                   help="kn: modified Kneser-Ney (default); wb: Witten-Bell")
    n.add_argument("--chars", action="store_true", help="every character is a token (a "
                   "label-level model for character alphabets); default: words")
    n.add_argument("--space-token", default="<space>", help="with --chars: the token a space "
                   "becomes (the name of the alphabet's word-separator label)")
    n.add_argument("--discount-fallback", action="store_true", help="kn on a text too small "
                   "to estimate the discounts: use 0.5, 1, 1.5 (as KenLM's lmplz)")
    n.set_defaults(fn=_ngram)
    m = sub.add_parser("images", help="text-line images with their transcripts (.gt.txt "
                       "beside them, or a LIST.tsv) → RNNLIB 2-D .nc (or column frames)",
                       description="INPUT: folders of line images with a .gt.txt beside each "
                       "(0001.png + 0001.gt.txt; .bin.png/.nrm.png read the same .gt.txt), "
                       "globs, image files, or LIST.tsv files (path<TAB>transcript).")
    m.add_argument("inputs", nargs="*", metavar="INPUT",
                   help="folder, glob, image file (with its .gt.txt) or LIST.tsv")
    m.add_argument("--list", help="LIST.tsv: image path<TAB>transcript per line")
    m.add_argument("--chars", action="store_true", help="transcripts are plain text, split "
                   "into characters (NFC; implied for .gt.txt); default: space-separated "
                   "label names")
    _image_args(m, "transcripts")
    m.set_defaults(fn=_images)
    px = sub.add_parser("pagexml", help="PAGE-XML or ALTO pages → their text lines cropped "
                        "from the page images, as 'images' writes them",
                        description="Each TextLine is cut out of the page image (its polygon "
                        "or bounding box, rotated to its baseline), its text from "
                        "TextEquiv/Unicode (PAGE) or the String CONTENT (ALTO). The page image "
                        "is the one the XML names (Page/@imageFilename, ALTO "
                        "sourceImageInformation/fileName), found beside the XML file or in "
                        "the folder above it (an OCR-D workspace), or under --image-dir.")
    px.add_argument("inputs", nargs="+", metavar="PAGE.xml", help="PAGE (2013, 2019) or ALTO "
                    "files, folders of them, or a split's list (.tsv of XML#LINE rows)")
    px.add_argument("--image-dir", help="look the page images up here (their path as the XML "
                    "gives it, else their file name)")
    px.add_argument("--image", help="the page image of a single XML file that names none")
    px.add_argument("--padding", type=non_negative_int, default=0, help="pixels of the page "
                    "added around each line's polygon before cropping (default 0)")
    px.add_argument("--crop", choices=("polygon", "box"), default="polygon",
                    help="polygon: paper outside the line's polygon is blanked (default); "
                         "box: its bounding box as it is")
    _image_args(px, "lines")
    px.set_defaults(fn=_pagexml, chars=True)
    rl = sub.add_parser("render-lines", help="render synthetic printed text lines "
                        "(matplotlib's fonts, Faker's text) + LIST.tsv")
    rl.add_argument("--out", required=True, help="output folder (img/, list.tsv)")
    rl.add_argument("--count", type=positive_int, default=1000, help="lines to render")
    rl.add_argument("--fonts", default="DejaVuSans,DejaVuSerif,DejaVuSansMono",
                    help="font file stems from matplotlib's fonts or .ttf paths, comma-separated")
    rl.add_argument("--sizes", default="18-28", help="font sizes in pixels, A-B")
    rl.add_argument("--margin", default=None,
                    help="paper above and below the text, each side drawn from A-B times the "
                         "font size (default: a quarter of the size)")
    rl.add_argument("--stretch", default="1",
                    help="width factor drawn from A-B (e.g. 0.75-1.25: narrow and wide faces)")
    rl.add_argument("--rotate", type=float, default=1.5, help="max rotation in degrees")
    rl.add_argument("--blur", type=float, default=1.0, help="max Gaussian blur radius (px)")
    rl.add_argument("--noise", type=float, default=8.0, help="max noise std (grey levels)")
    rl.add_argument("--max-chars", type=int, default=40, help="longest line in characters")
    rl.add_argument("--text", help="take lines from this UTF-8 text file instead of Faker")
    rl.add_argument("--seed", type=non_negative_int, default=1, help="random seed")
    rl.set_defaults(fn=_render_lines)
    pp = sub.add_parser("perplexity", help="perplexity of an ARPA model on a text (choose an "
                        "order or smoothing on held-out text)")
    pp.add_argument("lm", help="ARPA file (plain or .gz)")
    pp.add_argument("text", help="held-out text file, one sentence per line")
    pp.add_argument("--chars", action="store_true", help="tokens are characters (as "
                    "ngram --chars)")
    pp.add_argument("--space-token", default="<space>", help="with --chars: the space's token")
    pp.add_argument("--json", action="store_true", help="one JSON object instead of a line")
    pp.set_defaults(fn=_perplexity)
    ft = sub.add_parser("faker-text", help="language-model text: lines as render-lines draws "
                        "them (Faker en_US), minus the lines of LIST.tsv files",
                        description="One line per line of OUT, cut as render-lines cuts them; "
                        "every line equal to a transcript of an --exclude list is dropped "
                        "(and replaced by the next one drawn).")
    ft.add_argument("--out", required=True, help="text file to write")
    ft.add_argument("--count", type=positive_int, default=100000, help="lines to write")
    ft.add_argument("--seed", type=non_negative_int, default=1, help="random seed (use one "
                    "the rendered sets did not)")
    ft.add_argument("--max-chars", type=positive_int, default=40,
                    help="longest line in characters (as render-lines)")
    ft.add_argument("--exclude", action="append", metavar="LIST.tsv", help="a LIST.tsv "
                    "(path<TAB>text) whose lines must not occur; repeatable")
    ft.set_defaults(fn=_faker_text)
    r = sub.add_parser("rnnlib-config", help="convert an RNNLIB config file to rnntrain TOML "
                       "(stdout; warnings on stderr)")
    r.add_argument("config", help="RNNLIB config file ('name value' lines)")
    r.set_defaults(fn=_rnnlib_config)
    return p


# commands whose --out is one file, and the arguments that name their input files
FILE_OUTPUTS = ("synth", "audio", "kaldi", "lhotse", "convert", "ngram", "images", "pagexml",
                "faker-text")
INPUT_ARGS = ("list", "text", "inputs", "stats", "cuts", "exclude", "config")


def _checked(a):
    """The command, after --out is checked before any work (fsutil.check_output: not a
    folder, its folder exists and is writable, not one of the command's inputs)."""
    if a.cmd in FILE_OUTPUTS:
        from rnntrain.fsutil import check_output
        inputs = []
        for k in INPUT_ARGS:
            v = getattr(a, k, None)
            inputs += v if isinstance(v, list) else [v] if v else []
        check_output(a.out, inputs)
    return a.fn(a)


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    return run_main("rnntrain-data", a.cmd, _checked, a)
