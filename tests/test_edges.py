"""Dependable at the edges: run-folder ownership, the best model after a kill, confined
and verified manifests, hostile files and values (docs/reliability.md lists each).

Real processes, real files, real FIFOs: a test that opens a FIFO by mistake hangs, so
those run under an alarm or a subprocess timeout.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import netCDF4
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from rnntrain.config import Config, ConfigError, load_config, to_toml, validate
from rnntrain.data.dataset import Dataset
from rnntrain.errors import DataError, UserError
from rnntrain.tools.runs import read_metrics
from tests.badinput import good_parts, write_nc
from tests.conftest import ROOT, run_cli, run_cli_batch
from tests.test_bad_input import assert_clean_error, config
from tests.test_fuzz import alarm


# ---------------------------------------------------------------- run folder ownership

class Paused:
    """A training subprocess blocked at an RNNTRAIN_TEST_PAUSE point (killed on exit)."""

    def __init__(self, cmd, pause: str, timeout: float = 240):
        env = dict(os.environ, PYTHONPATH=str(ROOT), RNNTRAIN_TEST_PAUSE=pause)
        self.p = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, start_new_session=True)
        self.watchdog = threading.Timer(timeout, self.kill)
        self.watchdog.start()
        self.err = []
        for line in self.p.stderr:
            self.err.append(line)
            if "rnntrain: paused at" in line:
                self.pid = int(re.search(r"pid (\d+)", line).group(1))
                return
        self.kill()
        raise AssertionError("the run ended before pausing:\n" + "".join(self.err)[-3000:])

    def kill(self):
        try:
            os.killpg(self.p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.p.wait()
        self.watchdog.cancel()


def _wait_unowned(run: Path, timeout: float = 120):
    """Until no process holds the run folder's lock. Killing mpiexec's process group does
    not kill the ranks at once (each rank runs in a session of its own): rank 0 may still
    be writing metrics.jsonl for a moment after ``Paused.kill`` returns."""
    import fcntl
    import time
    fd = os.open(run / "lock", os.O_RDONLY)
    try:
        t0 = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                fcntl.flock(fd, fcntl.LOCK_UN)
                return
            except BlockingIOError:
                assert time.monotonic() - t0 < timeout, f"{run} is still owned"
                time.sleep(0.05)
    finally:
        os.close(fd)


def _train_cmd(cfg, run, *extra):
    return [sys.executable, "-m", "rnntrain", "train", str(cfg), f"run.dir={run}", *extra]


def _cfg(tmp_path, synth_pair, test=False, **train):
    tr, val = synth_pair
    extra = "".join(f"{k} = {v}\n" for k, v in train.items())
    p = tmp_path / "exp.toml"
    p.write_text(f'[data]\ntrain = "{tr}"\nval = "{val}"\n'
                 + (f'test = "{val}"\n' if test else "")
                 + "[model]\nlayers = 1\nhidden = 12\n[optim]\nlr = 0.01\n"
                 "[batch]\nbatch_frames = 1500\n[compute]\nthreads = 1\n[log]\nevery_steps = 1\n"
                 f"[train]\nepochs = 2\n"
                 f"input_noise = 0.1\n{extra}[checkpoint]\nevery_steps = 2\nkeep_last = 2\n")
    return p


def test_second_training_on_a_live_run_folder_stops_at_once(tmp_path, synth_pair):
    """Run A is alive inside a checkpoint write (its temp file on disk). A second fresh
    run and a --resume on the same folder stop at once naming A (host, pid, start time)
    and leave A's temp file alone; once A is dead, --resume takes over and cleans up."""
    cfg, run = _cfg(tmp_path, synth_pair), tmp_path / "run"
    a = Paused(_train_cmd(cfg, run), "ckpt:4")  # step-2 checkpoint complete
    try:
        temps = list((run / "checkpoints").glob(".*.tmp*"))
        assert temps, "the paused write should have its temp file"
        for extra in ((), ("--resume",)):
            p = subprocess.run(_train_cmd(cfg, run, *extra), cwd=ROOT, capture_output=True,
                               text=True, timeout=120, env=dict(os.environ,
                                                                PYTHONPATH=str(ROOT)))
            msg = assert_clean_error(p, f"run folder {run} is in use by another training",
                                     f"pid {a.pid}", "started")
            assert "host " in msg
            assert all(t.exists() for t in temps), "a refused run touched the live run's files"
        assert a.p.poll() is None, "the live run must survive"
        status = json.loads((run / "status.json").read_text())
        assert status["status"] == "running" and status["pid"] == a.pid
    finally:
        a.kill()
    p = subprocess.run(_train_cmd(cfg, run, "--resume"), cwd=ROOT, capture_output=True,
                       text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-3000:]
    assert not list(run.rglob(".*.tmp*"))
    assert json.loads((run / "status.json").read_text())["status"] == "finished"


def test_run_lock_is_released_when_the_holder_dies(tmp_path):
    """flock belongs to the process: a holder killed with SIGKILL frees the folder."""
    code = ("import sys, time; from pathlib import Path; from rnntrain.artifact.runfolder import "
            "RunLock; RunLock(Path(sys.argv[1])).acquire(); print('held', flush=True); "
            "time.sleep(600)")
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT,
                         stdout=subprocess.PIPE, text=True,
                         env=dict(os.environ, PYTHONPATH=str(ROOT)))
    try:
        assert p.stdout.readline().strip() == "held"
        from rnntrain.artifact.runfolder import RunLock
        with pytest.raises(UserError, match=f"pid {p.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        p.kill()
        p.wait()
    with RunLock(tmp_path) as lock:
        assert lock.held
    assert not lock.held


# ---------------------------------------------------------------- best model after a kill

def test_kill_between_best_and_last_keeps_best_model_exact(tmp_path, synth_pair):
    """SIGKILL after best.pt and before last.pt of epoch 1, then --resume: best.pt is
    bit-identical to an uninterrupted run's, and data.test is scored on it alike."""
    cfg = _cfg(tmp_path, synth_pair, test=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ref = tmp_path / "ref"
    p = subprocess.run(_train_cmd(cfg, ref), cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = [json.loads(x) for x in (ref / "metrics.jsonl").read_text().splitlines()]
    end1 = next(r["step"] for r in recs if r["split"] == "val")  # last step of epoch 1
    run = tmp_path / "run"
    Paused(_train_cmd(cfg, run), f"best:{end1}").kill()
    # the window: epoch 1's best.pt written, its last.pt not
    assert (run / "checkpoints" / "best.pt").exists()
    assert not (run / "checkpoints" / "last.pt").exists()
    p = subprocess.run(_train_cmd(cfg, run, "--resume"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    a = torch.load(ref / "checkpoints" / "best.pt", weights_only=True)
    b = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert a["state"] == b["state"]
    for k in a["model"]:
        assert torch.equal(a["model"][k], b["model"][k]), k
    test = [[r for r in (json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines())
             if r["split"] == "test"] for d in (ref, run)]
    assert len(test[0]) == 1 and test[1][-1]["ler"] == test[0][0]["ler"] \
        and test[1][-1]["loss"] == test[0][0]["loss"]


# ---------------------------------------------------------------- manifests

@pytest.fixture
def sharded(tmp_path, synth_pair):
    from data_tools.shard import shard
    man = shard([str(synth_pair[0])], 2, str(tmp_path / "ds"), chunk_seqs=12)
    return Path(man)


def _edit(man: Path, fn):
    m = json.loads(man.read_text())
    fn(m)
    man.write_text(json.dumps(m))


@pytest.mark.parametrize("where", ["chunk", "index"])
@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink"])
def test_manifest_paths_confined_before_opening(tmp_path, sharded, where, how):
    """A path leading out of the dataset folder is refused before it is opened or
    hashed: the outside target is a FIFO, which would block any open()."""
    outside = tmp_path / "outside.fifo"
    os.mkfifo(outside)
    root = sharded.parent
    if how == "absolute":
        rel = str(outside)
    elif how == "dotdot":
        rel = "../outside.fifo"
    else:
        (root / "link").symlink_to(tmp_path)
        rel = "link/outside.fifo"

    def put(m):
        if where == "index":
            m["index"]["file"] = rel
        else:
            m["shards"][1]["chunks"][0]["file"] = rel
    _edit(sharded, put)
    with alarm(20), pytest.raises(UserError) as e:
        Dataset.open(str(root))
    assert "outside.fifo" in str(e.value) and str(sharded) in str(e.value)


def test_swapped_chunk_entries_fail_naming_the_chunk(sharded):
    """Chunk files swapped between shards (checksums swapped with them, so sha256 agrees)
    are caught by the always-on header check against the index, naming the chunk."""
    def swap(m):
        a, b = m["shards"][0]["chunks"][0], m["shards"][1]["chunks"][0]
        for k in ("file", "sha256", "bytes"):
            a[k], b[k] = b[k], a[k]
    _edit(sharded, swap)
    m = json.loads(sharded.read_text())
    ds = Dataset.open(str(sharded.parent))
    k = ds.shards[0][0]
    with pytest.raises(DataError) as e:
        ds.load_chunk(k)
    assert m["shards"][0]["chunks"][0]["file"] in str(e.value)
    assert "manifest index" in str(e.value)


# ---------------------------------------------------------------- hostile files

def _nc4_unwritten(path, skip: str, big: int = 0):
    """A netCDF-4 file with the RNNLIB layout where ``skip`` was never written; ``big``
    (if set) is the numSeqs/numTimesteps claimed, with nothing written for them."""
    parts = good_parts()
    n, t = len(parts["lengths"]), len(parts["inputs"])
    with netCDF4.Dataset(str(path), "w", format="NETCDF4") as ds:
        for name, size in (("numSeqs", big or n), ("numTimesteps", big or t),
                           ("inputPattSize", 3), ("numLabels", 3), ("maxLabelLength", 4),
                           ("maxTargStringLength", 8)):
            ds.createDimension(name, size)
        v = {"inputs": ds.createVariable("inputs", "f4", ("numTimesteps", "inputPattSize")),
             "seqLengths": ds.createVariable("seqLengths", "i4", ("numSeqs",)),
             "labels": ds.createVariable("labels", "S1", ("numLabels", "maxLabelLength")),
             "targetStrings": ds.createVariable("targetStrings", "S1",
                                                ("numSeqs", "maxTargStringLength"))}
        if big:
            return path
        from tests.badinput import chars
        vals = {"inputs": parts["inputs"], "seqLengths": parts["lengths"],
                "labels": chars(parts["labels"], 4),
                "targetStrings": chars(parts["targets"], 8)}
        for name, var in v.items():
            if name != skip:
                var[:] = vals[name]
    return path


@pytest.mark.parametrize("skip", ["inputs", "seqLengths"])
def test_netcdf4_unwritten_variable_named(tmp_path, skip):
    path = _nc4_unwritten(tmp_path / "x.nc", skip)
    with pytest.raises(DataError, match=f"variable '{skip}'.*fill value"):
        ds = Dataset.open(str(path))
        ds.load_chunk(0)


def test_claims_larger_than_the_file_refused_before_allocating(tmp_path):
    """numSeqs = numTimesteps = 10^10 in a 20 KB file: reading seqLengths would allocate
    40 GB. A clean error instead, quickly."""
    path = _nc4_unwritten(tmp_path / "huge.nc", "", big=10**10)
    with alarm(30), pytest.raises(DataError, match="declares .* bytes .* but the file has"):
        Dataset.open(str(path))


def test_fifo_and_device_refused_before_opening(tmp_path, synth_pair):
    fifo = tmp_path / "data.fifo"
    os.mkfifo(fifo)
    with alarm(20):
        for bad in (fifo, Path("/dev/zero")):
            with pytest.raises(UserError, match="not a regular file"):
                Dataset.open(str(bad))
        with pytest.raises(ConfigError, match="FIFO"):
            load_config(str(fifo))
    # both commands in one process (a hang would end it at the timeout all the same)
    tr, ev = run_cli_batch([("rnntrain", "train", config(tmp_path, fifo),
                             f"run.dir={tmp_path / 'r'}"),
                            ("rnntrain", "eval", fifo, synth_pair[1])], timeout=120)
    assert_clean_error(tr, str(fifo), "FIFO (named pipe), not a regular file")
    assert_clean_error(ev, str(fifo), "is a FIFO")


def _zero_seq_nc(path):
    with netCDF4.Dataset(str(path), "w") as ds:
        for d, v in (("numSeqs", 0), ("numTimesteps", 0), ("inputPattSize", 3),
                     ("numLabels", 2), ("maxLabelLength", 2), ("maxTargStringLength", 4)):
            ds.createDimension(d, v)
        ds.createVariable("inputs", "f4", ("numTimesteps", "inputPattSize"))
        ds.createVariable("seqLengths", "i4", ("numSeqs",))
        ds.createVariable("labels", "S1", ("numLabels", "maxLabelLength"))[:] = \
            np.array([[b"a", b"\0"], [b"b", b"\0"]])
        ds.createVariable("targetStrings", "S1", ("numSeqs", "maxTargStringLength"))
    return path


def test_zero_sequences_in_train_eval_inspect(tmp_path, tiny_run):
    zero = _zero_seq_nc(tmp_path / "zero.nc")
    tr, ev = run_cli_batch([("rnntrain", "train", config(tmp_path, zero),
                             f"run.dir={tmp_path / 'r'}"),
                            ("rnntrain", "eval", tiny_run[2] / "checkpoints" / "last.pt", zero)])
    assert_clean_error(tr, str(zero), "numSeqs", "no sequences")
    assert not (tmp_path / "r").exists(), "bad data must not leave a run folder behind"
    assert_clean_error(ev, str(zero), "no sequences")
    p = run_cli("data_tools", "inspect", zero)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "no sequences" in p.stderr


def test_inspect_reports_nonfinite_inputs(tmp_path):
    parts = good_parts()
    parts["inputs"][parts["lengths"][0] + 3, 1] = np.nan   # sequence 1
    parts["inputs"][-1, 0] = np.inf                         # the last sequence
    path = write_nc(tmp_path / "nan.nc", parts)
    p = run_cli("data_tools", "inspect", path)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert "2 sequences have NaN or Inf inputs" in p.stdout and "utt1, utt5" in p.stdout


def test_config_not_utf8(tmp_path):
    p = tmp_path / "latin1.toml"
    p.write_bytes('[run]\nname = "caf\u00e9"\n'.encode("latin-1"))
    r = run_cli("rnntrain", "train", p)
    assert_clean_error(r, str(p), "not UTF-8", "line 2")


@pytest.mark.parametrize("cut", [4, 20, 30, 40])
def test_truncated_wav_header(tmp_path, cut):
    import io
    from scipy.io import wavfile
    from data_tools.audio import read_wav
    b = io.BytesIO()
    wavfile.write(b, 8000, np.zeros(800, np.int16))
    path = tmp_path / "cut.wav"
    path.write_bytes(b.getvalue()[:cut])
    with pytest.raises(UserError, match=f"{path}: cannot read as WAV"):
        read_wav(str(path))


BAD_CHECKPOINTS = ["empty", "truncated", "foreign", "stateless"]


@pytest.fixture(scope="module")
def bad_checkpoint_runs(tmp_path_factory, tiny_run):
    """A copy of the tiny run per kind of bad newest checkpoint; ``eval`` of that file and
    ``train --resume`` of the copy, all in one process (run_cli_batch)
    → {kind: (bad file, last.pt, eval result, resume result)}."""
    data, _, src = tiny_run
    d = tmp_path_factory.mktemp("badckpt")
    cases, batch = {}, []
    for kind in BAD_CHECKPOINTS:
        run = d / kind / "run"
        shutil.copytree(src, run)
        (run / "lock").unlink()
        last = run / "checkpoints" / "last.pt"
        ck = torch.load(last, weights_only=True)
        bad = run / "checkpoints" / f"step-{ck['state']['step'] + 5:08d}.pt"
        if kind == "empty":
            bad.write_bytes(b"")
        elif kind == "truncated":
            bad.write_bytes(last.read_bytes()[:1000])
        elif kind == "foreign":
            torch.save({"weights": torch.zeros(3)}, bad)
        else:
            torch.save({k: v for k, v in ck.items() if k != "state"}, bad)
        cases[kind] = (bad, last)
        batch += [("rnntrain", "eval", bad, data),
                  ("rnntrain", "train", config(d / kind, data), f"run.dir={run}",
                   "train.epochs=2", "--resume")]
    res = run_cli_batch(batch)
    return {kind: (*cases[kind], res[2 * i], res[2 * i + 1])
            for i, kind in enumerate(BAD_CHECKPOINTS)}


@pytest.mark.parametrize("kind", BAD_CHECKPOINTS)
def test_bad_checkpoints_in_eval_and_resume(bad_checkpoint_runs, kind):
    """Each one clean line in eval; --resume auto names it and falls back past it."""
    bad, last, p, resumed = bad_checkpoint_runs[kind]
    if kind == "stateless":  # eval needs no training position: it scores the weights
        assert p.returncode == 0, p.stderr[-2000:]
    else:
        assert_clean_error(p, str(bad))
    p = resumed
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-3000:]
    assert f"warning: {bad}" in p.stderr and "falling back to" in p.stderr
    assert f"resumed from {last}" in p.stderr


FULL = """
import sys
from pathlib import Path
from rnntrain.run.runlog import RunLog
log = RunLog(Path(sys.argv[1]))
try:
    log.write_text("config.toml", "x" * 5000)
except OSError as e:
    print("ERR", e.filename, e.strerror)
"""


def test_full_disk_names_the_file_and_leaves_no_temp(tmp_path):
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (2000, 2000))
    p = subprocess.run([sys.executable, "-c", FULL, str(tmp_path / "run")], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                       text=True, timeout=60, preexec_fn=limit)
    assert f"ERR {tmp_path / 'run' / 'config.toml'} File too large" in p.stdout, p
    assert not list((tmp_path / "run").glob(".*")), "a temp file was left behind"
    assert not (tmp_path / "run" / "config.toml").exists()


FULL_CKPT = """
import sys, torch
from rnntrain.errors import UserError
from rnntrain.run.checkpoint import save_atomic
try:
    save_atomic({"model": torch.zeros(10**6)}, sys.argv[1])
except UserError as e:
    print("ERR", e)
"""


def test_checkpoint_on_a_full_disk_says_file_too_large_naming_the_path(tmp_path):
    """torch.save hides the write error in '[enforce fail at inline_container.cc]';
    the line must name the path and the condition (EFBIG under RLIMIT_FSIZE: what
    ENOSPC does, made deterministic; both come through the same OSError)."""
    import resource

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
    (tmp_path / "step-1.pt").write_bytes(b"previous checkpoint")
    p = subprocess.run([sys.executable, "-c", FULL_CKPT, str(tmp_path / "step-2.pt")],
                       cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=120, preexec_fn=limit)
    out = p.stdout.strip()
    assert out.startswith(f"ERR cannot write checkpoint {tmp_path / 'step-2.pt'} (File too "
                          "large; "), p
    assert "enforce fail" not in out and "are intact" in out
    assert sorted(f.name for f in tmp_path.iterdir()) == ["step-1.pt"]
    assert (tmp_path / "step-1.pt").read_bytes() == b"previous checkpoint"


# ---------------------------------------------------------------- values

@pytest.mark.parametrize("seed", [str(2**64), str(2**32), "-1"])
def test_seed_out_of_range_is_one_line_naming_the_key(seed):
    """2**64 overflowed torch.manual_seed (a traceback); 2**32 and above would alias the
    plan generator's low 32 bits (a different seed, the same run)."""
    with pytest.raises(ConfigError, match=r"^train\.seed = -?\d+ must be"):
        load_config(None, ["data.train=x.nc", f"train.seed={seed}"])
    assert load_config(None, ["data.train=x.nc", f"train.seed={2**32 - 1}"]).train.seed == 2**32 - 1


@pytest.mark.parametrize("lr", ["inf", "nan", "-0.1", "0"])
def test_lr_must_be_finite_and_positive(lr):
    with pytest.raises(ConfigError, match="optim.lr"):
        load_config(None, ["data.train=x.nc", f"optim.lr={lr}"])


def test_threads_capped_with_warning(capsys):
    from rnntrain.compute.pool import MAX_THREADS_PER_CORE, cap_threads, usable_cores
    limit = MAX_THREADS_PER_CORE * usable_cores()
    assert cap_threads(limit, 1) == limit and capsys.readouterr().err == ""
    assert cap_threads(10000, 1) == limit
    assert "compute.threads = 10000" in capsys.readouterr().err
    assert cap_threads(10000, 2, ranks_per_node=2) == max(1, limit // 4)


@pytest.mark.parametrize("mcfg", [dict(), dict(bidirectional=False, layers=3, subsample=3),
                                  dict(cell="peephole", hidden=7)])
def test_parameter_estimate_matches_the_model(mcfg):
    from rnntrain.compute.model import build_model, count_params, estimate_params
    from rnntrain.config import ModelConfig
    m = ModelConfig(**{"hidden": 10, **mcfg})
    assert estimate_params(m, 5, 4) == count_params(build_model(m, 5, 4))


def test_model_that_cannot_fit_refused_naming_the_key(tmp_path):
    data = write_nc(tmp_path / "d.nc", good_parts())
    # within each key's bound (a value past it: test_config), too big taken together
    p = run_cli("rnntrain", "train", config(tmp_path, data), "model.hidden=16384",
                "model.layers=8", f"run.dir={tmp_path / 'r'}")
    assert_clean_error(p, "model.hidden = 16384", "parameters", "GiB")


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.text(max_size=30))
def test_config_strings_round_trip_through_toml(text):
    cfg = Config()
    cfg.run.name, cfg.data.train = text, text + "/x.nc"
    try:
        validate(cfg)
    except ConfigError as e:  # only undecodable text may be refused here
        assert "UTF-8" in str(e) or not cfg.data.train
        return
    back = tomllib.loads(to_toml(cfg))
    assert back["run"]["name"] == text and back["data"]["train"] == text + "/x.nc"


# ---------------------------------------------------------------- MPI: resume, failures

def test_resumed_plan_covers_the_epoch_exactly_once(synth_pair):
    """An epoch interrupted on 2 ranks after 3 steps, resumed on 3 ranks for 2 steps,
    then finished alone: every kept sequence is trained exactly once, against the plain
    set of kept ids (an independent count)."""
    from rnntrain.data.plan import PlanSettings, make_plan, resumed_plan
    ds = Dataset.open(str(synth_pair[0]))
    keep = ds.feasible()
    keep[::7] = False  # some left out, as infeasible ones are
    seen = []
    for parts, world, steps in (([], 2, 3), ([(2, 3)], 3, 2), ([(2, 3), (3, 2)], 1, None)):
        for r in range(world):
            plan = resumed_plan(ds, keep, PlanSettings(1500, 5), 1, r, world, parts)
            if not parts:
                assert plan == make_plan(ds, keep, 1500, 5, 1, r, world)
            for st in plan[:steps]:
                seen.extend(st.seqs)
    assert sorted(seen) == sorted(np.flatnonzero(keep).tolist())


def test_resumed_plan_unchanged_without_a_rank_change(synth_pair):
    from rnntrain.data.plan import PlanSettings, make_plan, resumed_plan
    ds = Dataset.open(str(synth_pair[0]))
    keep = ds.feasible()
    assert resumed_plan(ds, keep, PlanSettings(1500, 5), 0, 1, 2, []) == \
        make_plan(ds, keep, 1500, 5, 0, 1, 2)


def _mpiexec():
    from tests.conftest import mpiexec
    return mpiexec()


needs_mpi = pytest.mark.skipif(_mpiexec() is None, reason="mpiexec not found")


# slow (left out of the default run): by default, test_resumed_plan_covers_the_epoch_exactly_once
# checks the re-dealt plan and test_resume.py the MPI kill and resume
@pytest.mark.slow
@needs_mpi
@pytest.mark.mpi
def test_resume_on_another_rank_count_trains_each_sequence_once(tmp_path, synth_pair):
    """2 ranks, killed mid-epoch; resumed alone: the rest of the epoch is re-dealt and
    the sequences trained in epoch 1 add up to every feasible one, exactly once; the
    SIGTERM resume hint of an MPI run names the launcher and rank count."""
    cfg = _cfg(tmp_path, synth_pair)
    run = tmp_path / "run"
    two = [_mpiexec(), "-n", "2", *_train_cmd(cfg, run)]
    Paused(two, "step:5").kill()  # checkpoints at steps 2 and 4
    _wait_unowned(run)  # the ranks outlive mpiexec for a moment
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    ck = torch.load(run / "checkpoints" / "step-00000004.pt", weights_only=True)
    assert ck["state"]["world"] == 2 and ck["state"]["pos"] == 4
    # the kill may cut rank 0's last record short (the resumed session drops that tail)
    first = read_metrics(run)
    p = subprocess.run(_train_cmd(cfg, run, "train.epochs=1", "--resume"), cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resumed on 1 rank(s) from a checkpoint written on 2" in p.stderr
    assert "not bit-identical" in p.stderr
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    second = recs[len(first):]
    trained = sum(r["seqs"] for r in first if r["split"] == "train" and r["step"] <= 4) + \
        sum(r["seqs"] for r in second if r["split"] == "train" and r["epoch"] == 0)
    assert trained == int(Dataset.open(str(synth_pair[0])).feasible().sum())
    # a stop under MPI: the hint starts the same launcher with the same rank count
    run2 = tmp_path / "run2"
    e = dict(env, RNNTRAIN_TEST_PAUSE="")
    p = subprocess.Popen([_mpiexec(), "-n", "2", *_train_cmd(cfg, run2)], cwd=ROOT, env=e,
                         stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    err = []
    for line in p.stderr:
        err.append(line)
        if "step/s" in line and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            break
    err.append(p.stderr.read())
    p.wait(timeout=120)
    text = "".join(err)
    assert f"resume with: mpiexec -n 2 rnntrain train {cfg}" in text, text[-2000:]


@needs_mpi
@pytest.mark.mpi
def test_mpi_abort_leaves_status_failed_with_the_reason(tmp_path, synth_pair):
    """A rank raising at step 3 ends the job; status.json (written by rank 0) says
    failed, naming the rank and the error, not running."""
    cfg = _cfg(tmp_path, synth_pair)
    run = tmp_path / "run"
    p = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "tests/mpi_fault.py", "1",
                        "raise", "3", str(cfg), f"run.dir={run}"], cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True,
                       text=True, timeout=180)
    assert p.returncode != 0
    st = json.loads((run / "status.json").read_text())
    assert st["status"] == "failed", st
    assert "rank 1 of 2" in st["error"] and "injected fault at step 3" in st["error"]


@needs_mpi
@pytest.mark.mpi
def test_ranks_told_which_config_keys_differ_and_one_line_per_shared_mistake(tmp_path,
                                                                           tiny_run):
    """Two ranks started with different overrides (MPMD) are told the differing keys and
    each rank's value, not a weight checksum; a run folder that holds another run is
    refused on both ranks. Each case: one error line, exit 2, no MPI_Abort line, nothing
    written."""
    data, cfg, run = tiny_run
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    new = tmp_path / "new"
    cmd = [sys.executable, "-m", "rnntrain", "train", cfg, f"run.dir={new}"]
    differ = subprocess.run([_mpiexec(), "-n", "1", *cmd, "train.seed=1", ":", "-n", "1",
                             *cmd, "train.seed=2", "optim.lr=0.002"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=180)
    before = sorted(p.name for p in run.rglob("*"))
    taken = subprocess.run([_mpiexec(), "-n", "2", sys.executable, "-m", "rnntrain", "train",
                            cfg, f"run.dir={run}"], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=180)
    for p, want in ((differ, "ranks disagree on the config: optim.lr (0.001 on rank 0; "
                             "0.002 on rank 1), train.seed (1 on rank 0; 2 on rank 1); "),
                    (taken, f"run folder {run} already holds checkpoints of a run")):
        lines = [ln for ln in p.stderr.splitlines() if "error" in ln.lower() or "abort" in
                 ln.lower()]
        assert p.returncode == 2 and len(lines) == 1, p.stderr[-3000:]
        assert lines[0].startswith("rnntrain train: error: ") and want in lines[0], lines
        assert "Traceback" not in p.stderr
    assert not new.exists() and sorted(p.name for p in run.rglob("*")) == before


def test_audio_list_not_utf8_or_fifo(tmp_path):
    from data_tools.audio import read_list
    bad = tmp_path / "l.tsv"
    bad.write_bytes(b"a.wav\tyes\nb\xff.wav\tno\n")
    with pytest.raises(UserError, match=r"l.tsv line 2: not UTF-8"):
        read_list(bad)
    fifo = tmp_path / "l.fifo"
    os.mkfifo(fifo)
    with alarm(10), pytest.raises(UserError, match="FIFO"):
        read_list(fifo)


# ---------------------------------------------------------------- outputs (--out)

def test_out_never_destroys_what_it_points_at(tmp_path, tiny_run):
    """transcribe, decode, export and rnntrain-data ngram through fsutil's output helper:
    a symlink is written through to its target (the link stays), /dev/null and a FIFO
    with a reader are written through (they stay what they are), a folder, a FIFO nobody
    reads and an output that is also an input are one line and exit 2, destroying
    nothing and leaving no temp file; a dead export's temp file is removed."""
    data, _, run = tiny_run
    data_bytes = data.read_bytes()
    best = run / "checkpoints" / "best.pt"
    best_bytes = best.read_bytes()
    real, link = tmp_path / "real.tsv", tmp_path / "link.tsv"
    real.write_text("old")
    link.symlink_to(real)
    folder = tmp_path / "folder"
    folder.mkdir()
    lonely, read = tmp_path / "lonely.fifo", tmp_path / "read.fifo"
    os.mkfifo(lonely)
    os.mkfifo(read)
    got: list[bytes] = []

    def reader():
        with open(read, "rb") as fh:
            got.append(fh.read())
    t = threading.Thread(target=reader, daemon=True)
    t.start()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    onnx_link, onnx_real = tmp_path / "m.onnx", tmp_path / "store" / "m.onnx"
    onnx_real.parent.mkdir()
    onnx_link.symlink_to(onnx_real)
    stale = onnx_real.parent / f".m.onnx.tmp{dead}"    # an export killed mid-write
    stale.write_bytes(b"half")
    text = tmp_path / "lm.txt"
    text.write_text("a b\nb a\n")
    T = ("rnntrain", "transcribe", run, data, "--out")
    D = ("rnntrain", "decode", run, data, "--out")
    cases = {
        "t-link": (*T, link), "t-null": (*T, "/dev/null"), "t-fifo": (*T, read),
        "t-folder": (*T, folder), "t-input": (*T, data), "t-lonely": (*T, lonely),
        "t-model": (*T, best),
        "d-link": (*D, link), "d-folder": (*D, folder), "d-input": (*D, data),
        "d-ensemble": ("rnntrain", "decode", f"{run},{run}", data, "--out", best),
        "x-link": ("rnntrain", "export", run, "--format", "onnx", "--out", onnx_link),
        "x-input": ("rnntrain", "export", best, "--format", "onnx", "--out", best),
        "x-null": ("rnntrain", "export", run, "--format", "onnx", "--out", "/dev/null"),
        "n-input": ("data_tools", "ngram", text, "--out", text),
    }
    full = os.path.exists("/dev/full")   # a device that refuses every write (ENOSPC)
    if full:
        cases["t-full"] = (*T, "/dev/full")
    with alarm(280):
        res = dict(zip(cases, run_cli_batch(list(cases.values()), timeout=270)))
    t.join(10)
    for k in ("t-link", "t-null", "t-fifo", "d-link", "x-link", "x-null"):
        assert res[k].returncode == 0, (k, res[k].stderr[-2000:])
    assert_clean_error(res["t-folder"], str(folder), "is a folder; give a file name")
    assert_clean_error(res["d-folder"], str(folder), "is a folder; give a file name")
    for k in ("t-input", "d-input"):
        assert_clean_error(res[k], str(data), "is also an input")
    assert_clean_error(res["t-model"], str(best), "is also an input")
    assert_clean_error(res["d-ensemble"], str(best), "is also an input")  # a member's
    assert_clean_error(res["x-input"], str(best), "is also an input")
    n = res["n-input"]
    assert n.returncode == 2 and "Traceback" not in n.stderr and \
        n.stderr.strip().splitlines()[-1] == f"rnntrain-data ngram: error: --out {text}: is " \
        "also an input; writing it would destroy it: choose another name", n.stderr
    assert_clean_error(res["t-lonely"], str(lonely), "FIFO", "no process reads")
    if full:
        assert_clean_error(res["t-full"], "--out /dev/full: cannot write it (No space left")
        assert stat.S_ISCHR(os.stat("/dev/full").st_mode)
    # nothing destroyed
    assert data.read_bytes() == data_bytes and best.read_bytes() == best_bytes
    assert text.read_text() == "a b\nb a\n"
    assert link.is_symlink() and real.read_text().count("\n") == 6  # the decode's 6 lines
    assert onnx_link.is_symlink() and onnx_real.stat().st_size > 1000
    import onnx   # the metadata names the checkpoint's file, not where it lay on this machine
    meta = {p.key: p.value for p in onnx.load(str(onnx_real)).metadata_props}
    assert json.loads(meta["rnntrain.json"])["source"] == "best.pt"
    assert not stale.exists(), "the dead export's temp file was left"
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert stat.S_ISFIFO(os.stat(read).st_mode) and stat.S_ISFIFO(os.stat(lonely).st_mode)
    assert got and got[0].count(b"\n") == 6, got     # transcribe's lines reached the reader
    assert list(folder.iterdir()) == []
    left = [p.name for p in tmp_path.rglob(".*tmp*")] + \
        [p.name for p in data.parent.glob(".*tmp*")]
    assert not left, left


# ---------------------------------------------------------------- decoding inputs

def _arpa(unigrams: list[str], bigram_lines: list[str] = (), end: bool = True) -> str:
    order = 2 if bigram_lines else 1
    head = ["\\data\\", f"ngram 1={len(unigrams)}"] + \
        ([f"ngram 2={len(bigram_lines)}"] if bigram_lines else []) + ["", "\\1-grams:"]
    body = unigrams + ([""] + ["\\2-grams:"] + list(bigram_lines) if order == 2 else [])
    return "\n".join(head + body + ([""] + ["\\end\\"] if end else [])) + "\n"


def test_model_lm_and_lexicon_fifo_or_endless_refused_and_arpa_checked(tmp_path, tiny_run):
    """The MODEL of transcribe and export, --lm and --lexicon go through the same
    "regular file" check as the data (a FIFO would block, /dev/zero never end); NaN or
    Inf in an ARPA file and a file without \\end\\ are refused naming the line; nan/inf
    decoding weights and an absurd --beam are refused. One line, exit 2, each."""
    from tests.badinput import LABELS
    data, _, run = tiny_run
    fifo = tmp_path / "x.fifo"
    os.mkfifo(fifo)
    a, b, c = LABELS
    uni = [f"-0.6\t{a}\t-0.2", f"-0.6\t{b}\t-0.2", f"-0.6\t{c}", "-99\t<s>\t-0.3",
           "-0.7\t</s>", "-1.5\t<unk>"]
    good = tmp_path / "good.arpa"
    good.write_text(_arpa(uni, [f"-0.3\t{a} {b}"]))
    bad = {
        "nan-p": (_arpa(uni, [f"nan\t{a} {b}"]), "line 14: log10 P is nan"),
        "inf-bow": (_arpa([f"-0.6\t{a}\tinf"] + uni[1:], [f"-0.3\t{a} {b}"]),
                    "line 6: the back-off weight is inf"),
        "neg-inf-p": (_arpa(uni[:2] + [f"-inf\t{c}"] + uni[3:]), "line 7: log10 P is -inf"),
        "no-end": (_arpa(uni, [f"-0.3\t{a} {b}"], end=False), "no \\end\\ line"),
    }
    for name, (text, _) in bad.items():
        (tmp_path / f"{name}.arpa").write_text(text)
    E = ("rnntrain", "eval", run, data)
    cases = {
        "t-model-fifo": (("rnntrain", "transcribe", fifo, data), "model is a FIFO"),
        "t-model-zero": (("rnntrain", "transcribe", "/dev/zero", data), "model is a device"),
        "x-model-fifo": (("rnntrain", "export", fifo, "--format", "onnx", "--out",
                          tmp_path / "m.onnx"), "model is a FIFO"),
        "lm-fifo": ((*E, "--lm", fifo), "language model is a FIFO"),
        "lm-zero": ((*E, "--lm", "/dev/zero"), "language model is a device"),
        "lexicon-fifo": ((*E, "--lexicon", fifo, "--space", a), "lexicon is a FIFO"),
        **{f"arpa-{k}": ((*E, "--lm", tmp_path / f"{k}.arpa"), want)
           for k, (_, want) in bad.items()},
        "weight-nan": ((*E, "--lm", good, "--lm-weight", "nan"),
                       "--lm-weight: nan must be a finite number"),
        "bonus-inf": ((*E, "--lm", good, "--word-bonus", "inf"),
                      "--word-bonus: inf must be a finite number"),
        "label-bonus": ((*E, "--beam", "4", "--label-bonus=-inf"),
                        "--label-bonus: -inf must be a finite number"),
        "beam-huge": ((*E, "--beam", "100000"), "--beam: 100000 is more than 1024"),
        "nbest-huge": (("rnntrain", "decode", run, data, "--nbest", "100000"),
                       "--nbest: 100000 is more than 1024"),
        "good": ((*E, "--lm", good), None),
    }
    with alarm(280):
        res = dict(zip(cases, run_cli_batch([c for c, _ in cases.values()], timeout=270)))
    for k, (_, want) in cases.items():
        if want is None:
            assert res[k].returncode == 0, res[k].stderr[-2000:]
        else:
            msg = assert_clean_error(res[k], want)
            assert res[k].stdout == "", k
            if k.startswith("arpa-"):
                assert str(tmp_path / f"{k[5:]}.arpa") in msg, msg
    assert not (tmp_path / "m.onnx").exists() and stat.S_ISFIFO(os.stat(fifo).st_mode)


# ---------------------------------------------------------------- the newcomer's path

def test_training_ends_on_one_summary_line(tmp_path, tiny_run):
    """The last line names the best validation LER and its epoch (as best.pt records
    them), the test LER, where best.pt is and the wall time."""
    data, cfg, _ = tiny_run
    run = tmp_path / "run"
    p = run_cli("rnntrain", "train", cfg, f"data.val={data}", f"data.test={data}",
                "train.epochs=3", "optim.lr=0.05", f"run.dir={run}", timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stderr.strip().splitlines()[-1]
    m = re.fullmatch(r"finished 3 epoch\(s\), (\d+) steps: best validation LER ([\d.]+) at "
                     r"epoch (\d), test LER ([\d.]+); model (\S+); wall time (\d+ min )?\d+ s",
                     last)
    assert m, last
    best = torch.load(run / "checkpoints" / "best.pt", weights_only=True)["state"]
    assert float(m.group(2)) == pytest.approx(best["best_ler"], abs=5e-5)
    assert int(m.group(3)) == best["epoch"]            # saved after the epoch it scored
    assert Path(m.group(5)) == run / "checkpoints" / "best.pt"
    test = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()
            if '"test"' in x]
    assert float(m.group(4)) == pytest.approx(test[-1]["ler"], abs=5e-5)


def test_default_run_names_are_readable():
    from rnntrain.artifact.runfolder import RunFolder

    def default_run_dir(*args):
        return RunFolder.default(*args).root
    ov = ["data.train=data/synth_train.nc", "data.val=data/synth_val.nc", "model.hidden=32",
          "--train.epochs=5", "run.log_every=3"]
    name = default_run_dir(None, ov, "resolved").name
    assert re.fullmatch(r"default-synth_train-synth_val-hidden32-epochs5-[0-9a-f]{6}", name)
    assert default_run_dir("configs/yesno.toml", ['optim.lr=0.003', 'data.test="x y/t.nc"'],
                           "r").name.startswith("yesno-lr0.003-t-")
    # the hash tells apart what the short name cannot
    assert default_run_dir(None, ov, "a") != default_run_dir(None, ov, "b")


def test_run_dir_that_is_not_a_run_folder_is_refused_before_writing(tmp_path, tiny_run):
    """run.dir=/ wrote a run into /. Refused: the root, the home folder, a file, a folder
    holding other files; accepted: a new or empty folder, a previous run's (which then
    asks for --resume). Nothing is written into a refused folder (not even the lock)."""
    from rnntrain.artifact.runfolder import RunFolder

    def unsuitable_run_folder(d):
        return RunFolder(d).unsuitable()
    data, cfg, run = tiny_run
    user = tmp_path / "papers"
    user.mkdir()
    (user / "thesis.tex").write_text("x")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x")
    (tmp_path / "empty").mkdir()
    assert unsuitable_run_folder(tmp_path / "new") is None
    assert unsuitable_run_folder(tmp_path / "empty") is None
    assert unsuitable_run_folder(run) is None          # a previous run: --resume decides
    home = Path.home()
    cases = {"/": "is the root folder", str(home): "is the home folder",
             str(a_file): "is not a folder", str(user): "holds files that are not a run's "
                                                       "(thesis.tex)"}
    listing = {p: sorted(os.listdir(p)) for p in ("/", str(home), str(user))}
    res = run_cli_batch([("rnntrain", "train", cfg, f"run.dir={d}") for d in cases])
    for (d, want), r in zip(cases.items(), res):
        assert_clean_error(r, f"run.dir = {d} {want}")
    assert {p: sorted(os.listdir(p)) for p in listing} == listing
    assert a_file.read_text() == "x"


def test_out_to_a_process_substitution(tmp_path, tiny_run):
    """`transcribe --out >(cmd)` (bash's /dev/fd/N, a pipe) failed with a traceback about
    /dev/fd/63.tmpPID: the lines now reach the command."""
    if not shutil.which("bash"):
        pytest.skip("no bash")
    data, _, run = tiny_run
    got = tmp_path / "got.tsv"
    cmd = (f'"{sys.executable}" -m rnntrain transcribe "{run}" "{data}" '
           f'--out >(cat > "{got}"); rc=$?; wait; exit $rc')
    p = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                       capture_output=True, text=True, timeout=240)
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    for _ in range(50):   # cat may finish a moment after bash's wait
        if got.exists() and got.read_text().count("\n") == 6:
            break
        threading.Event().wait(0.1)
    assert got.read_text().count("\n") == 6
