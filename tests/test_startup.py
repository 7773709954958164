"""What a training start pays before its first step (docs/accuracy.md, "FSDD: where the
seconds before the first validation go"): modules it never needs stay unimported.

Each check runs in a fresh interpreter (a real subprocess), since this test process has
imported everything already."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> set[str]:
    """The top-level names in ``sys.modules`` after running ``code`` in a fresh process."""
    prog = code + "\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))\n"
    r = subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return set(json.loads(r.stdout.splitlines()[-1]))


def test_reading_an_audio_front_end_does_not_import_scipy():
    """A speech dataset's front-end record is read at every training start
    (``dataset.read_frontend``); scipy (~0.3 s to import) is needed only to compute MFCCs,
    (tests/test_audio.py checks the MFCCs against the DCT written out)."""
    mods = _modules_after(
        "import numpy as np\n"
        "import rnntrain.run.train\n"
        "from rnntrain.frontend import FrontEnd\n"
        "from rnntrain.frontend.features import FeatureConfig\n"
        "fc = FeatureConfig(kind='mfcc')\n"
        "fe = FrontEnd('audio', fc.size, np.zeros(fc.size), np.ones(fc.size), fc)\n"
        "back = FrontEnd.from_json(fe.to_json())\n"
        "assert back == fe and back.features.kind == 'mfcc'\n")
    assert "rnntrain.run.train" in mods and "rnntrain.frontend.features" in mods
    assert "scipy" not in mods and not any(m.startswith("scipy.") for m in mods)


def _pair(seed=0):
    """Two parameter sets with the same values, for our class and torch's own."""
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    vals = [torch.randn(s, generator=g) for s in shapes]
    return [torch.nn.Parameter(v.clone()) for v in vals], [torch.nn.Parameter(v.clone())
                                                           for v in vals]


@pytest.mark.parametrize("name,fused", [("adam", True), ("adam", None), ("sgd", True),
                                        ("sgd", None)])
def test_eager_optimizer_is_torchs_bit_for_bit(name, fused):
    """``compute.optim.eager``'s class against torch's own (torch.optim.Adam / SGD) over
    steps with a masked (found_inf) step and a changing learning rate: the same weights,
    moments and step counts to the bit, state dicts loadable either way (a checkpoint
    written by one resumes in the other) and equal."""
    from rnntrain.compute import optim
    ours_cls = optim.Adam if name == "adam" else optim.SGD
    torch_cls = torch.optim.Adam if name == "adam" else torch.optim.SGD
    assert issubclass(ours_cls, torch_cls) and ours_cls is not torch_cls
    kw = dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.01) if name == "adam" else \
        dict(lr=0.05, momentum=0.9, weight_decay=0.01)
    a, b = _pair()
    oa, ob = ours_cls(a, fused=fused, **kw), torch_cls(b, fused=fused, **kw)
    g = torch.Generator().manual_seed(1)
    for i in range(6):
        for p, q in zip(a, b):
            p.grad = torch.randn(p.shape, generator=g) * (i + 1)
            q.grad = p.grad.clone()
        for o in (oa, ob):
            for grp in o.param_groups:
                grp["lr"] = 0.01 * (1 + i) / 6
        if fused and i == 3:  # a step the fused kernel skips (as device.masked_step)
            oa.found_inf = ob.found_inf = torch.tensor(1.0)
        oa.step()
        ob.step()
        oa.__dict__.pop("found_inf", None)
        ob.__dict__.pop("found_inf", None)
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["param_groups"] == sb["param_groups"]
    for k in sb["state"]:
        for key, v in sb["state"][k].items():
            assert torch.equal(sa["state"][k][key], v), key
    # a checkpoint of one resumes in the other and the next step agrees
    c, d = _pair()
    for p, q, src in zip(c, d, a):
        p.data.copy_(src)
        q.data.copy_(src)
    oc, od = ours_cls(c, fused=fused, **kw), torch_cls(d, fused=fused, **kw)
    oc.load_state_dict(sb)
    od.load_state_dict(sa)
    for p, q in zip(c, d):
        p.grad = torch.ones_like(p)
        q.grad = torch.ones_like(q)
    oc.step()
    od.step()
    for p, q in zip(c, d):
        assert torch.equal(p, q)
    oc.zero_grad()
    assert all(p.grad is None for p in c)


def test_training_start_up_does_not_import_dynamo(tmp_path):
    """A whole `rnntrain train` (a tiny run: open, build, steps, validation, checkpoints,
    resume from its checkpoint) in a fresh process never imports torch._dynamo (1-2.6 s
    on 2 cores; torch.optim's torch.compile wrappers imported it on the first use)."""
    from data_tools.synth import write_synth
    data = tmp_path / "d.nc"
    write_synth(str(data), num_seqs=12, num_labels=4, input_size=5, seed=3)
    ov = [f"data.train={data}", f"data.val={data}", "model.layers=1", "model.hidden=8",
          "batch.batch_frames=400", "train.epochs=1", "compute.threads=2",
          f"run.dir={tmp_path / 'run'}"]
    code = (f"import sys\nfrom rnntrain.cli import main\nov = {ov!r}\n"
            "assert main(['train', *ov]) == 0\n"
            "assert main(['train', *ov[:-3], 'train.epochs=2', ov[-1], '--resume']) == 0\n")
    mods = _modules_after(code)
    assert "rnntrain.run.train" in mods and "rnntrain.compute.optim" in mods
    assert not any(m == "torch._dynamo" or m.startswith("torch._dynamo.") for m in mods)
    ck = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert ck["state"]["epoch"] == 2 and all(g["fused"] for g in ck["optim"]["param_groups"])
