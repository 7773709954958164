"""Convert an RNNLIB config file (``name value`` lines) into an rnntrain TOML config.

``rnntrain-data rnnlib-config OLD.config > NEW.toml``: the TOML goes to stdout, one
warning per line to stderr for every setting that has no exact equivalent (and what was
done instead) and for every key this converter does not know. RNNLIB's defaults are
written out explicitly (plain SGD, learnRate 1e-4, momentum 0.9, gradients summed over the
sequences of an update, maxTestsNoBest 20, RNNLIB's own LSTM cell) so that the converted
run trains the same model the same way unless the user edits it.

The mapping follows RNNLIB's sources (Main.cpp, Mdrnn.hpp, MultilayerNet.hpp,
Trainer.hpp); docs/rnnlib.md explains it for users.
"""
from __future__ import annotations

from pathlib import Path

from rnntrain.config import toml_value
from rnntrain.errors import UserError

# keys that only affect RNNLIB's console output, debugging or its weight files
IGNORED = {
    "verbose": "rnntrain logs to train.log and metrics.jsonl",
    "display": "no display mode; use rnntrain decode",
    "displayPath": "no display mode",
    "gradCheck": "the peephole cell's gradients are tested against a numpy reference",
    "sigFigs": "gradient-check setting", "pert": "gradient-check setting",
    "jacobianCoords": "no Jacobian export", "sequence": "display/gradCheck setting",
    "dataset": "display setting", "dataFileNum": "display setting",
    "errorTest": "use rnntrain eval CHECKPOINT DATA",
}
# keys with no equivalent in rnntrain, reported when set to a non-default value
NO_EQUIVALENT = {
    "hiddenBlock": ("", "time-collapsing blocks between hidden levels are not supported"),
    "subsampleSize": ("", "tanh feed-forward layers between hidden levels are not supported"),
    "symmetry": ("false", "mirrored (weight-shared) directions are not supported"),
    "actSmoothing": ("0", "activation smoothing penalty is not supported"),
    "actDecay": ("0", "activation decay penalty is not supported"),
    "batchLearn": ("false", "full-batch learning is not supported; batches are "
                            "batch.batch_frames"),
    "nBest": ("1", "n-best decoding is not supported; rnntrain decode does best path or "
                   "beam search"),
    "fixedLength": ("-1", "fixed-length decoding is not supported"),
}
# decoding settings: in rnntrain they are options of the commands that decode
DECODING = {
    "dictionary": "a decoding setting here: rnntrain decode/eval/transcribe CHECKPOINT ... "
                  "--lexicon {value} --space LABEL (one word per line, optionally followed by "
                  "its labels, as RNNLIB's dictionaries)",
    "bigrams": "a decoding setting here: build an ARPA model (rnntrain-data ngram TEXT --out "
               "LM.arpa) and decode with --lm LM.arpa; RNNLIB's bigram file is not read",
}
KNOWN = {"task", "trainFile", "valFile", "testFile", "hiddenSize", "hiddenType",
         "bidirectional", "recurrent", "inputBlock", "learnRate", "momentum", "optimiser",
         "seqsPerWeightUpdate", "totalEpochs", "maxTestsNoBest", "inputNoiseDev", "randSeed",
         "dataFraction", "initWeightRange", "loadWeights"} | set(IGNORED) | set(NO_EQUIVALENT) | set(DECODING)


def parse(text: str, source: str = "config") -> dict[str, str]:
    """RNNLIB's format: one ``name value`` per line (value may be empty); later lines win."""
    entries: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        key, value = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        entries[key] = value
    return entries


def _list(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _bool(value: str, key: str, source: str) -> bool:
    v = value.strip().lower()
    if v in ("true", "1", "yes"):
        return True
    if v in ("false", "0", "no"):
        return False
    raise UserError(f"{source}: {key} {value!r} is not a boolean (true/false)")


def _num(value: str, key: str, source: str, typ=float):
    try:
        return typ(value) if typ is float else int(float(value))
    except ValueError:
        raise UserError(f"{source}: {key} {value!r} is not a number") from None


def _mean_length(path: str, base: Path | None) -> float | None:
    """Mean sequence length of an RNNLIB file, when it can be read from here."""
    from rnntrain.data.ncdata import read_header
    for cand in ([Path(path)] + ([base / path] if base is not None else [])):
        if cand.is_file():
            try:
                return float(read_header(str(cand)).lengths.mean())
            except UserError:
                return None
    return None


def convert(entries: dict[str, str], source: str = "config",
            base_dir: str | Path | None = None) -> tuple[str, list[str]]:
    """RNNLIB entries → (TOML text, warnings). Raises UserError for what cannot train."""
    warn: list[str] = []
    get = entries.get
    base = Path(base_dir) if base_dir is not None else None
    out: dict[str, dict[str, tuple[object, str]]] = {s: {} for s in
                                                     ("data", "model", "optim", "train")}

    def put(section, key, value, why=""):
        out[section][key] = (value, why)

    task = get("task", "")
    if task not in ("transcription", ""):
        raise UserError(f"{source}: task {task!r} cannot be converted: rnntrain trains CTC "
                        f"transcription (task transcription) only")
    if not task:
        warn.append("task is not set; assuming transcription (CTC)")

    # ---- data
    for key, sec_key in (("trainFile", "train"), ("valFile", "val"), ("testFile", "test")):
        files = _list(get(key, ""))
        if not files:
            if key == "trainFile":
                raise UserError(f"{source}: trainFile is not set")
            continue
        if len(files) > 1:
            warn.append(f"{key} lists {len(files)} files; rnntrain reads one .nc file or a "
                        f"dataset manifest: using {files[0]} (merge or shard the files with "
                        f"rnntrain-data into one dataset)")
        put("data", sec_key, files[0], f"{key} {get(key)}")
    fraction = _num(get("dataFraction", "1"), "dataFraction", source)
    if fraction != 1:
        warn.append(f"dataFraction {fraction}: no equivalent; the whole files are used "
                    f"(write a smaller .nc file to train on a fraction)")

    # ---- model
    sizes = [_num(s, "hiddenSize", source, int) for s in _list(get("hiddenSize", ""))]
    if not sizes:
        raise UserError(f"{source}: hiddenSize is not set (e.g. hiddenSize 100 or 50,100)")
    hidden = max(sizes)
    if len(set(sizes)) > 1:
        warn.append(f"hiddenSize {get('hiddenSize')}: rnntrain uses one size for every layer; "
                    f"using {hidden} units per direction in all {len(sizes)} layers")
    put("model", "layers", len(sizes), f"hiddenSize {get('hiddenSize')}")
    put("model", "hidden", hidden, "units per direction")
    types = _list(get("hiddenType", "lstm")) or ["lstm"]
    if any(t != "lstm" for t in types):
        warn.append(f"hiddenType {get('hiddenType')}: only LSTM layers exist in rnntrain; "
                    f"using RNNLIB's LSTM (peephole) cell in every layer")
    put("model", "cell", "peephole", "RNNLIB's LSTM; \"lstm\" (no peepholes) is faster")
    bidir = [_bool(v, "bidirectional", source) for v in _list(get("bidirectional", "true"))]
    if len(bidir) > 1:
        raise UserError(f"{source}: bidirectional {get('bidirectional')} describes "
                        f"{len(bidir)}-D data; rnntrain supports 1-D sequences only")
    put("model", "bidirectional", bidir[0] if bidir else True, "")
    if "recurrent" in entries and not all(_bool(v, "recurrent", source)
                                          for v in _list(entries["recurrent"])):
        warn.append(f"recurrent {entries['recurrent']}: non-recurrent hidden levels are not "
                    f"supported; every layer is recurrent")
    block = [_num(v, "inputBlock", source, int) for v in _list(get("inputBlock", "0"))]
    if len(block) > 1:
        raise UserError(f"{source}: inputBlock {get('inputBlock')} describes multi-dimensional "
                        f"data; rnntrain supports 1-D sequences only")
    if block and block[0] > 1:
        put("model", "subsample", block[0], f"inputBlock {block[0]}: stack frames")
    init = _num(get("initWeightRange", "0.1"), "initWeightRange", source)
    if init != 0.1:
        warn.append(f"initWeightRange {init}: the peephole cell is always initialised "
                    f"uniformly in [-0.1, 0.1] (RNNLIB's default)")

    # ---- optimizer
    optimiser = get("optimiser", "steepest").strip()
    if optimiser == "rprop":
        warn.append("optimiser rprop: no equivalent; using Adam (lr 1e-3) instead")
        put("optim", "name", "adam", "optimiser rprop has no equivalent")
        put("optim", "lr", 1e-3, "")
        put("optim", "normalize", "sequences", "")
    else:
        if optimiser != "steepest":
            warn.append(f"optimiser {optimiser!r}: unknown; using steepest descent (sgd)")
        put("optim", "name", "sgd", "optimiser steepest (with momentum)")
        put("optim", "lr", _num(get("learnRate", "1e-4"), "learnRate", source),
            f"learnRate {get('learnRate', '1e-4 (RNNLIB default)')}")
        put("optim", "momentum", _num(get("momentum", "0.9"), "momentum", source),
            f"momentum {get('momentum', '0.9 (RNNLIB default)')}")
        put("optim", "normalize", "sum", "RNNLIB sums the gradients of an update's sequences")

    # ---- training
    per_update = _num(get("seqsPerWeightUpdate", "1"), "seqsPerWeightUpdate", source, int)
    mean = _mean_length(out["data"]["train"][0], base)
    if mean is not None:
        budget = max(1, int(round(per_update * mean)))
        put("train", "batch_frames", budget,
            f"seqsPerWeightUpdate {per_update} x mean length {mean:.0f} frames")
        if per_update == 1:
            warn.append("seqsPerWeightUpdate 1: one sequence per update (as in RNNLIB) is "
                        "slow; raise batch.batch_frames (and lower optim.lr) to train faster")
    else:
        budget = per_update * 1000
        put("train", "batch_frames", budget,
            f"seqsPerWeightUpdate {per_update} x 1000 (training file not readable here)")
        warn.append(f"seqsPerWeightUpdate {per_update}: rnntrain batches by frames; the "
                    f"training file could not be read to measure the mean sequence length, "
                    f"so batch.batch_frames = {budget}: set it to about {per_update} x your "
                    f"mean sequence length")
    epochs = _num(get("totalEpochs", "-1"), "totalEpochs", source, int)
    if epochs <= 0:
        warn.append("totalEpochs -1 (train until maxTestsNoBest): using train.epochs = 1000 "
                    "with early stopping")
        epochs = 1000
    put("train", "epochs", epochs, f"totalEpochs {get('totalEpochs', '-1')}")
    no_best = _num(get("maxTestsNoBest", "20"), "maxTestsNoBest", source, int)
    # RNNLIB stops when ++testsSinceBest > maxTestsNoBest, i.e. after maxTestsNoBest + 1
    # validations without a new best; rnntrain stops after `patience` of them
    put("train", "patience", no_best + 1 if no_best > 0 else 0,
        f"maxTestsNoBest {get('maxTestsNoBest', '20 (RNNLIB default)')}, + 1")
    if "valFile" not in entries and no_best > 0:
        warn.append("no valFile: RNNLIB's maxTestsNoBest watched the training errors; "
                    "rnntrain's early stopping needs data.val")
    noise = _num(get("inputNoiseDev", "0"), "inputNoiseDev", source)
    if noise:
        put("train", "input_noise", noise, f"inputNoiseDev {noise}")
    seed = _num(get("randSeed", "0"), "randSeed", source, int)
    if seed == 0:
        warn.append("randSeed 0 (RNNLIB: seed from the clock): rnntrain runs are reproducible;"
                    " using train.seed = 1")
        seed = 1
    put("train", "seed", seed, f"randSeed {get('randSeed', '0')}")
    if get("loadWeights", "false").lower() == "true":
        warn.append("loadWeights true: this is an RNNLIB save file; its trained weights are "
                    "not imported (only the settings are converted)")

    # ---- everything else
    for key, value in entries.items():
        if key in IGNORED:
            warn.append(f"{key} {value}: ignored ({IGNORED[key]})")
        elif key in DECODING:
            if value.strip():
                warn.append(f"{key} {value}: {DECODING[key].format(value=value)}")
        elif key in NO_EQUIVALENT:
            default, why = NO_EQUIVALENT[key]
            if value.strip().lower() != default:
                warn.append(f"{key} {value}: no equivalent ({why})")
        elif key not in KNOWN:
            shown = value if len(value) <= 40 else value[:37] + "..."
            warn.append(f"{key} {shown}: unknown RNNLIB key, ignored")

    lines = [f"# Converted from the RNNLIB config {source} by rnntrain-data rnnlib-config.",
             "# See docs/rnnlib.md for what each setting means here.", ""]
    for section, values in out.items():
        if not values:
            continue
        lines.append(f"[{section}]")
        for key, (value, why) in values.items():
            lines.append(f"{key} = {toml_value(value)}" + (f"  # {why}" if why else ""))
        lines.append("")
    return "\n".join(lines), warn


def convert_file(path: str) -> tuple[str, list[str]]:
    from rnntrain.fsutil import read_text
    p = Path(path)
    text = read_text(p, "RNNLIB config")
    entries = parse(text, str(p))
    if not entries:
        raise UserError(f"{p}: no 'name value' lines found")
    return convert(entries, str(p), p.parent)
