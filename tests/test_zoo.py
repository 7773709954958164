"""The model zoo (rnntrain models, rnntrain.artifact.zoo), named models everywhere a path
goes, rnntrain finetune and rnntrain rank-lines, on line-image models built here with the
real converter and the training writer (tests/test_infer_images.image_run), packed by the
real command; and the cards of the models that ship in the package."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from rnntrain.artifact import zoo
from rnntrain.run import checkpoint as ckpt
from tests.conftest import ROOT, run_cli

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402
from tests.images2d import glyph_images  # noqa: E402
from tests.test_infer_images import image_run  # noqa: E402

INFO = {"title": "tiny glyph model", "summary": "a test model",
        "data": [{"corpus": "glyphs", "lines": 6, "split": "train", "license": "CC0"}],
        "licenses": ["CC0"],
        "training": {"command": "tests", "date": "2026-12-02", "cpu": "any",
                     "cpu_seconds": 1, "commit": "test"}}


def never_blank(run, seed_bias: float = -8.0):
    """Make the run's model never emit the blank (its output bias), so that untrained
    weights still read something: readings that differ between seeds."""
    ck = ckpt.read(run / "checkpoints" / "best.pt")
    ck.parts["model"]["out.bias"][-1] = seed_bias
    ck.save(run / "checkpoints" / "best.pt")


def pack(run, name, zoo_dir, data, dtype="float32", info=INFO):
    (zoo_dir.parent / "info.json").write_text(json.dumps(info))
    return run_cli("rnntrain", "models", name, "--pack", run, "--info",
                   zoo_dir.parent / "info.json", "--out", zoo_dir, "--score",
                   f"val={data}", "--dtype", dtype)


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """Two character models of line images 16 px high (different seeds), the first packed
    into a zoo folder as tiny-base → (work folder, run 0, run 1, image files, zoo env)."""
    d = tmp_path_factory.mktemp("zoo")
    runs = []
    for seed in (0, 1):
        run, ds, _, names = image_run(d / f"m{seed}", "2d", 16, seed=seed, chars=True)
        never_blank(run)
        runs.append(run)
    r = pack(runs[0], "tiny-base", d / "zoo", d / "m0" / "img.nc")
    assert r.returncode == 0, r.stderr[-2000:]
    images = [d / "m0" / n for n in names]
    return d, runs[0], runs[1], images, {zoo.ENV: str(d / "zoo")}


def test_a_packed_model_reads_by_name_as_its_checkpoint_does(packed):
    d, run, _, images, env = packed
    by_name = run_cli("rnntrain", "transcribe", "tiny-base", *images, "--json", env=env)
    by_path = run_cli("rnntrain", "transcribe", run, *images, "--json")
    assert by_name.returncode == 0, by_name.stderr[-2000:]
    assert by_name.stdout == by_path.stdout and by_name.stdout.strip()
    ev_name = run_cli("rnntrain", "eval", "tiny-base", d / "m0" / "img.nc", "--json", env=env)
    ev_path = run_cli("rnntrain", "eval", run, d / "m0" / "img.nc", "--json")
    assert ev_name.returncode == 0, ev_name.stderr[-2000:]
    assert json.loads(ev_name.stdout) == json.loads(ev_path.stdout)
    card = json.loads((d / "zoo" / "tiny-base.json").read_text())
    assert card["scores"]["val"]["cer"] == json.loads(ev_path.stdout)["ler"]
    # listed, and its card printed, by the models command
    ls = run_cli("rnntrain", "models", env=env)
    assert ls.returncode == 0 and "tiny-base" in ls.stdout and "tiny glyph model" in ls.stdout
    show = run_cli("rnntrain", "models", "tiny-base", "--json", env=env)
    assert json.loads(show.stdout) == card


def test_the_card_describes_the_file(packed):
    d, run, _, _, env = packed
    card = json.loads((d / "zoo" / "tiny-base.json").read_text())
    assert zoo.missing_fields(card) == []
    pt = d / "zoo" / "tiny-base.pt"
    assert card["file_bytes"] == pt.stat().st_size
    import hashlib
    assert card["sha256"] == hashlib.sha256(pt.read_bytes()).hexdigest()
    src = ckpt.read(run / "checkpoints" / "best.pt")
    spelled = [" " if lb == "<space>" else lb for lb in src.card.labels]
    assert card["alphabet"] == spelled
    assert card["input"]["height"] == src.card.image_height == 16
    net = src.card.build()
    assert card["architecture"]["parameters"] == sum(p.numel() for p in net.parameters())
    # the packed file holds the weights and no optimizer: a base to fine-tune, not resume
    got = ckpt.read(pt)
    assert not got.trainable
    for k, v in src.inference_weights().items():
        assert torch.equal(got.parts["model"][k], v), k


def test_float16_storage_halves_the_weights_and_loads(packed, tmp_path):
    d, run, _, images, _ = packed
    r = pack(run, "tiny-half", tmp_path / "zoo", d / "m0" / "img.nc", dtype="float16")
    assert r.returncode == 0, r.stderr[-2000:]
    half = ckpt.read(tmp_path / "zoo" / "tiny-half.pt")
    full = ckpt.read(d / "zoo" / "tiny-base.pt")
    for k, v in full.parts["model"].items():
        if v.is_floating_point():
            assert half.parts["model"][k].dtype == torch.float16
            assert torch.equal(half.parts["model"][k].float(), v.half().float()), k
    import rnntrain
    m = rnntrain.load(tmp_path / "zoo" / "tiny-half.pt")
    assert next(m.net.parameters()).dtype == torch.float32  # loaded into the fp32 network
    assert m.transcribe(images[0]).labels


@pytest.mark.parametrize("field", zoo.CARD_FIELDS)
def test_a_card_without_a_field_is_refused(packed, tmp_path, field):
    d, *_ = packed
    card = json.loads((d / "zoo" / "tiny-base.json").read_text())
    keys = field.split(".")
    node = card
    for k in keys[:-1]:
        node = node[k]
    del node[keys[-1]]
    assert field in zoo.missing_fields(card)
    shutil.copy(d / "zoo" / "tiny-base.pt", tmp_path / "broken.pt")
    (tmp_path / "broken.json").write_text(json.dumps(card))
    r = run_cli("rnntrain", "models", "broken", env={zoo.ENV: str(tmp_path)})
    assert r.returncode == 2 and f"lacks {field}" in r.stderr and "Traceback" not in r.stderr


def test_a_damaged_zoo_file_is_named_not_loaded(packed, tmp_path):
    d, _, _, images, _ = packed
    shutil.copy(d / "zoo" / "tiny-base.json", tmp_path / "tiny-base.json")
    raw = bytearray((d / "zoo" / "tiny-base.pt").read_bytes())
    raw[-100] ^= 0xFF
    (tmp_path / "tiny-base.pt").write_bytes(bytes(raw))
    r = run_cli("rnntrain", "transcribe", "tiny-base", images[0], env={zoo.ENV: str(tmp_path)})
    assert r.returncode == 2 and "damaged or replaced" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_an_unknown_name_says_what_the_zoo_has(packed):
    *_, images, env = packed
    r = run_cli("rnntrain", "transcribe", "no-such-model", images[0], env=env)
    assert r.returncode == 2 and "model not found" in r.stderr and "tiny-base" in r.stderr


def write_gt_folder(folder, n, seed, extra: str = ""):
    """n glyph lines as PNG + .gt.txt (16 px high); ``extra``: a character appended to
    every transcript (one the base model does not know)."""
    folder.mkdir(parents=True)
    imgs, targets = glyph_images(n, seed=seed, height=16)
    for i, (im, t) in enumerate(zip(imgs, targets)):
        Image.fromarray((255 - im * 255).round().astype(np.uint8)).save(folder / f"{i:03d}.png")
        (folder / f"{i:03d}.gt.txt").write_text(t + extra + "\n")
    return folder


def test_init_from_a_zoo_name_with_merge_keeps_the_base_rows(packed, tmp_path, monkeypatch):
    """train.init_from = NAME: the zoo's file, every shared label's output row exactly."""
    from data_tools.images import ImageSettings, convert_images
    from rnntrain.compute.model import build_model
    from rnntrain.config import load_config
    from rnntrain.data.dataset import Dataset
    from rnntrain.run import finetune
    from tests.test_infer_images import CONV
    d, *_, env = packed
    monkeypatch.setenv(zoo.ENV, env[zoo.ENV])
    lines = write_gt_folder(tmp_path / "lines", 8, seed=3, extra="z")
    convert_images(None, tmp_path / "new.nc", ImageSettings(16, "auto"), chars=True,
                   inputs=[str(lines)], progress=False)
    ds = Dataset.open(str(tmp_path / "new.nc"))
    cfg = load_config(None, [f"data.train={tmp_path / 'new.nc'}", *CONV,
                             "train.init_from=tiny-base", "train.init_alphabet=merge"])
    base = ckpt.read(d / "zoo" / "tiny-base.pt")
    assert finetune.source("tiny-base") == d / "zoo" / "tiny-base.pt"
    labels = finetune.alphabet("merge", base.card.labels, ds.labels, "tiny-base")
    assert "z" in labels and set(base.card.labels) <= set(labels)
    torch.manual_seed(1)
    net = build_model(cfg.model, ds.frame_size, len(labels), ds.frame_height)
    finetune.start_from(cfg, net, labels, ds)
    got, src = net.state_dict(), base.parts["model"]
    for key in src:
        if not key.startswith("out."):
            assert torch.equal(got[key], src[key].float()), key
    for i, lb in enumerate(labels):
        if lb in base.card.labels:
            j = base.card.labels.index(lb)
            assert torch.equal(got["out.weight"][i], src["out.weight"][j].float()), lb
            assert torch.equal(got["out.bias"][i], src["out.bias"][j].float()), lb
    assert torch.equal(got["out.bias"][len(labels)], src["out.bias"][len(base.card.labels)])


def test_finetune_on_a_folder_of_lines(packed, tmp_path):
    """One command: the folder converted at the base model's height, a held-out part drawn,
    the alphabet merged (the new character added, every base label kept), trained from the
    base weights, scored on --test lines."""
    d, *_, env = packed
    lines = write_gt_folder(tmp_path / "book", 20, seed=5, extra="z")
    test = write_gt_folder(tmp_path / "unseen", 4, seed=6)
    out = tmp_path / "ft"
    r = run_cli("rnntrain", "finetune", "tiny-base", lines, "--test", test, "--out", out,
                "--steps", "6", "compute.threads=1", "log.progress=lines", env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert f"initialised from {d / 'zoo' / 'tiny-base.pt'}" in log
    from rnntrain.data.dataset import Dataset
    tr, va = Dataset.open(str(out / "data" / "train.nc")), Dataset.open(str(out / "data" / "val.nc"))
    assert tr.num_seqs + va.num_seqs == 20 and va.num_seqs >= 4
    assert tr.frame_height == 16
    best = ckpt.read(out / "checkpoints" / "best.pt")
    base = ckpt.read(d / "zoo" / "tiny-base.pt")
    assert "z" in best.card.labels and set(base.card.labels) <= set(best.card.labels)
    assert best.card.init_from == str(d / "zoo" / "tiny-base.pt")
    metrics = [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]
    assert any(m["split"] == "test" for m in metrics)


def test_finetune_refuses_a_base_model_the_data_cannot_meet(packed, tmp_path, tiny_run):
    d, *_, env = packed
    lines = write_gt_folder(tmp_path / "book", 10, seed=5)
    _, _, audio_run = tiny_run   # trained on 3-feature frames: no line geometry
    r = run_cli("rnntrain", "finetune", audio_run, lines, "--out", tmp_path / "a")
    assert r.returncode == 2 and "not trained on line images" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    # a converted file of another height
    from data_tools.images import ImageSettings, convert_images
    for name, folder in (("t", lines), ("v", write_gt_folder(tmp_path / "v", 4, seed=8))):
        convert_images(None, tmp_path / f"{name}.nc", ImageSettings(24, "auto"),
                       chars=True, inputs=[str(folder)], progress=False)
    r = run_cli("rnntrain", "finetune", "tiny-base", tmp_path / "t.nc", "--val",
                tmp_path / "v.nc", "--out", tmp_path / "b", env=env)
    assert r.returncode == 2 and "input height 16" in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def test_rank_lines_orders_by_the_models_disagreement(packed, tmp_path):
    """Two models: each line's score is the edit distance of their readings over the longer
    one's length, computed here from each model's own transcription; most first. One model:
    1 - its mean confidence. Lines with a .gt.txt are left out."""
    import rnntrain
    d, run0, run1, _, env = packed
    lines = tmp_path / "lines"
    lines.mkdir()
    imgs, _ = glyph_images(12, seed=9, height=16)
    for i, im in enumerate(imgs):
        Image.fromarray((255 - im * 255).round().astype(np.uint8)).save(lines / f"{i:02d}.png")
    (lines / "00.gt.txt").write_text("a\n")   # transcribed already: not ranked
    m0, m1 = rnntrain.load(run0), rnntrain.load(run1)
    want = {}
    for f in sorted(lines.glob("*.png"))[1:]:
        a, b = m0.transcribe(f).text, m1.transcribe(f).text
        want[str(f)] = levenshtein(a, b) / max(len(a), len(b), 1)
    assert len(set(want.values())) > 2   # the readings differ, and by unequal amounts
    r = run_cli("rnntrain", "rank-lines", f"tiny-base,{run1}", lines, "--json", env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    got = [json.loads(ln) for ln in r.stdout.splitlines()]
    assert [g["path"] for g in got if g["path"] in want] == [g["path"] for g in got]
    assert len(got) == len(want)
    for g in got:
        assert g["score"] == pytest.approx(want[g["path"]], abs=1e-12)
    scores = [g["score"] for g in got]
    assert scores == sorted(scores, reverse=True)
    one = run_cli("rnntrain", "rank-lines", run0, lines, "--json", "--top", "3")
    rows = [json.loads(ln) for ln in one.stdout.splitlines()]
    assert len(rows) == 3
    for row in rows:
        conf = m0.transcribe(row["path"]).confidences
        assert row["score"] == pytest.approx(1 - sum(conf) / len(conf), abs=1e-9)


def test_shipped_zoo_cards_are_complete():
    """Every model that ships: its card has every field, describes its file (size, SHA-256),
    spells the checkpoint's alphabet and input height, and counts its parameters."""
    names = [n for n in zoo.names() if zoo.find(n).parent == zoo.SHIPPED]
    assert names, "the package ships no base model"
    for name in names:
        card = zoo.read_card(zoo.SHIPPED / f"{name}.json")
        pt = zoo.verify(name)
        ck = ckpt.read(pt)
        assert card["alphabet"] == [" " if lb == "<space>" else
                                    (chr(int(lb[2:], 16)) if lb.startswith("U+") else lb)
                                    for lb in ck.card.labels]
        assert card["input"]["height"] == ck.card.image_height
        net = ck.card.build()
        assert card["architecture"]["parameters"] == sum(p.numel() for p in net.parameters())
        assert {"validation"} <= set(card["scores"])


SHARED = ROOT.parent / "shared" / "data"   # the project's third-party data, read in place


@pytest.mark.skipif(not (SHARED / "archiscribe" / "split.tsv").is_file(),
                    reason="needs ../shared/data (archiscribe, fraktur19)")
def test_base_model_data_keep_the_unseen_books_out(tmp_path):
    """recipes/base_data.py: no line of archiscribe's test works in the training or
    validation lists, no test transcript among the texts to render, every fraktur19 line
    and every archiscribe training line in training, the validation lines validating."""
    import subprocess
    import sys
    sys.path.insert(0, str(ROOT / "recipes"))
    import base_data
    missing = [p for p in base_data.font_paths("de19") if not p.is_file()]
    if missing:
        pytest.skip(f"the de19 fonts are not installed ({missing[0]})")
    r = subprocess.run([sys.executable, "recipes/base_data.py", "de19", str(SHARED),
                        str(tmp_path)], capture_output=True, text=True,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    split = [ln.split("\t") for ln in (SHARED / "archiscribe" / "split.tsv").read_text(
        encoding="utf-8").splitlines()[1:]]
    test_works = {img.split("/")[0] for img, s in split if s == "test"}
    train_works = {img.split("/")[0] for img, s in split if s != "test"}
    assert test_works and not test_works & train_works

    def works(name):
        return {p.split("\t")[0].split("/archiscribe/")[1].split("/")[0]
                for p in (tmp_path / name).read_text(encoding="utf-8").splitlines()
                if "/archiscribe/" in p}
    assert works("real-train.tsv") == train_works and not works("real-train.tsv") & test_works
    assert not works("real-val.tsv") & test_works
    texts = set((tmp_path / "render.txt").read_text(encoding="utf-8").splitlines())
    for img, s in split:
        gt = (SHARED / "archiscribe" / (img.rsplit(".", 1)[0] + ".gt.txt")).read_text(
            encoding="utf-8")
        if s == "test":
            assert " ".join(gt.split()) not in texts, img
    n_train = sum(1 for _, s in split if s == "train")
    n_f19 = len(list((SHARED / "fraktur19").rglob("*.gt.txt")))
    assert len((tmp_path / "real-train.tsv").read_text().splitlines()) == n_train + n_f19
    assert len((tmp_path / "unseen.tsv").read_text().splitlines()) == \
        sum(1 for _, s in split if s == "test")
