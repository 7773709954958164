"""What a training start pays before its first step (docs/accuracy.md, "FSDD: where the
seconds before the first validation go"): modules it never needs stay unimported.

Each check runs in a fresh interpreter (a real subprocess), since this test process has
imported everything already."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
