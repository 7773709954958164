"""Write tests/data/ckpt_format1.pt and the log-probabilities it gives, with the code of
the commit this runs in (run once, from the commit before the typed checkpoint record:
d578050, "format 1" as it was then; tests/test_checkpoint_record.py loads, resumes and
transcribes it with today's code).

    PYTHONPATH=. python tests/data/make_old_checkpoint.py tests/data

A tiny model (1 BLSTM layer of 4 units) trained 1 epoch on 24 synthetic sequences
(data_tools.synth, seed 7, 4 labels, 3 inputs): a few KB. Only API that both the old and
the new code have is used (config, train, rnntrain.load).
"""
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

DATA = dict(num_seqs=24, num_labels=4, input_size=3, seed=7)
OVERRIDES = ["model.layers=1", "model.hidden=4", "train.epochs=1", "train.batch_frames=400",
             "train.threads=1", "optim.warmup_steps=0"]


def frames() -> np.ndarray:
    """The input the log-probabilities are recorded for: (30, 3) float32."""
    return np.random.default_rng(0).standard_normal((30, 3)).astype(np.float32)


def main(out: Path):
    import rnntrain
    from data_tools.synth import write_synth
    from rnntrain.config import load_config
    from rnntrain.run.train import train
    tmp = Path(tempfile.mkdtemp())
    write_synth(str(tmp / "train.nc"), **DATA)
    over = [f"data.train={tmp / 'train.nc'}", *OVERRIDES, f"run.dir={tmp / 'run'}"]
    run = train(load_config(None, over), None, over)
    shutil.copyfile(Path(run) / "checkpoints" / "last.pt", out / "ckpt_format1.pt")
    lp = rnntrain.load(out / "ckpt_format1.pt").log_probs(frames())
    np.save(out / "ckpt_format1_logprobs.npy", lp.astype(np.float32))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
