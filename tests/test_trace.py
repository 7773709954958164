"""--trace: Chrome/Perfetto trace-event JSON of every thread and rank for a window of steps."""
from __future__ import annotations

import json
import threading

import pytest

from rnntrain.parallel import collectives
from rnntrain.parallel.comm import LocalComm
from rnntrain import trace
from rnntrain.data.reader import ChunkReader
from rnntrain.compute.pool import Task, WorkerPool

from conftest import mpiexec, run_cli

TINY = ["model.layers=1", "model.hidden=8", "batch.batch_frames=600", "train.epochs=1",
        "compute.threads=2", "log.every_steps=5", "data.chunk_frames=500"]


def tiny_config(tmp_path, train, val=None):
    """A small config file: the CLI takes a path (user-facing, like a real run)."""
    p = tmp_path / "tiny.toml"
    p.write_text(f'[data]\ntrain = "{train}"\n' + (f'val = "{val}"\n' if val else ""))
    return p


def _spans(doc, name, pid=None):
    return [e for e in doc["traceEvents"] if e["ph"] == "X" and e["name"] == name
            and (pid is None or e["pid"] == pid)]


def _thread_names(doc, pid=0):
    return {e["tid"]: e["args"]["name"] for e in doc["traceEvents"]
            if e["name"] == "thread_name" and e["pid"] == pid}


def test_disabled_tracer_records_nothing():
    trace.configure(None)
    assert not trace.enabled()
    with trace.span("task", index=0) as s:
        pass
    assert s is trace.span("other")  # the one shared no-op object: nothing allocated
    trace.begin_step(0)
    trace.complete("barrier wait", 0.0, 1.0)
    assert trace._events == []
    assert trace.finish(0, 1, lambda ev: [ev]) is None


def test_window_pool_and_reader_spans(tmp_path):
    """Real pool and reader threads: only the steps in the window are recorded, each on
    the thread that ran it, and each task lies inside its step's compute phase."""
    import time
    path = tmp_path / "t.json"
    trace.configure(str(path), (1, 3))
    comm = LocalComm()
    trace.attach(lambda: collectives.wait_for_all(comm))
    pool = WorkerPool(lambda w, t: time.sleep(0.002 * (t.index + 1)) or t.index, 2)
    reader = ChunkReader(lambda k: {k: k}, list(range(4)))
    try:
        for step in range(4):
            trace.begin_step(step)
            t0 = time.perf_counter()
            reader.next()
            t1 = time.perf_counter()
            pool.run([Task(i, (i,)) for i in range(3)])
            t2 = time.perf_counter()
            trace.phases(step, (t0, t1, t2, t2, t2, time.perf_counter()))
    finally:
        pool.close()
        reader.close()
    assert trace.finish(0, 1, lambda ev: collectives.gather_all(comm, ev)) == str(path)
    doc = json.loads(path.read_text())
    names = _thread_names(doc)
    steps = _spans(doc, "step")
    assert sorted(e["args"]["step"] for e in steps) == [1, 2]
    tasks = _spans(doc, "task")
    assert len(tasks) == 6 and {names[e["tid"]] for e in tasks} <= {"rnntrain-worker-0",
                                                                     "rnntrain-worker-1"}
    barrier = _spans(doc, "barrier wait")
    assert len(barrier) == 4 and {names[e["tid"]] for e in barrier} == {
        "rnntrain-worker-0", "rnntrain-worker-1"}
    assert {names[e["tid"]] for e in _spans(doc, "load chunk")} == {"rnntrain-reader"}
    assert names[_spans(doc, "compute")[0]["tid"]] == threading.main_thread().name
    for c in _spans(doc, "compute"):
        inside = [t for t in tasks if c["ts"] <= t["ts"] and
                  t["ts"] + t["dur"] <= c["ts"] + c["dur"] + 1e-3]
        assert len(inside) == 3, "every task of a step runs within its compute phase"


def test_bad_window_is_a_user_error():
    for text in ("5", "3:3", "a:b", "-1:2"):
        with pytest.raises(ValueError, match="--trace-steps"):
            trace.parse_window(text)


def _check_train_trace(doc, pid, first, last, workers):
    names = _thread_names(doc, pid)
    assert "MainThread" in names.values() and "rnntrain-reader" in names.values()
    # one CPU worker runs its tasks on the main thread (WorkerPool inline), so no barrier
    task_threads = {"MainThread"} if workers == 1 else {f"rnntrain-worker-{w}"
                                                          for w in range(workers)}
    assert task_threads <= set(names.values())
    assert {names[e["tid"]] for e in _spans(doc, "task", pid)} == task_threads
    steps = sorted(e["args"]["step"] for e in _spans(doc, "step", pid))
    assert steps == list(range(first, last))
    for phase in ("data wait", "compute", "reduce tasks", "allreduce", "update"):
        assert len(_spans(doc, phase, pid)) == last - first, phase
    assert _spans(doc, "task", pid) and (workers == 1 or _spans(doc, "barrier wait", pid))
    assert _spans(doc, "load chunk", pid), "the reader's chunk loads are traced"
    # phases of a step are contiguous and inside the step span
    for s in _spans(doc, "step", pid):
        ph = sorted((e for e in doc["traceEvents"] if e["pid"] == pid and e["ph"] == "X"
                     and e["tid"] == s["tid"] and e["args"].get("step") == s["args"]["step"]
                     and e["name"] != "step"), key=lambda e: e["ts"])
        assert [e["name"] for e in ph] == ["data wait", "compute", "reduce tasks",
                                           "allreduce", "update"]
        assert ph[0]["ts"] >= s["ts"] - 1e-3
        assert ph[-1]["ts"] + ph[-1]["dur"] <= s["ts"] + s["dur"] + 1e-2


def test_train_trace_file(synth_pair, tmp_path):
    train, val = synth_pair
    out = tmp_path / "trace.json"
    r = run_cli("rnntrain", "train", tiny_config(tmp_path, train, val), *TINY,
                f"run.dir={tmp_path / 'run'}", "--trace", out, "--trace-steps", "0:4")
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["otherData"]["ranks"] == [0]
    _check_train_trace(doc, 0, 0, 4, workers=2)


def test_train_reads_ahead_on_one_thread(synth_pair, tmp_path):
    """A real run with a validation set, 2 epochs of several chunks: every chunk of both
    epochs and both validation passes is read by one thread, in the order the loop takes
    them (epoch 1, the validation set, epoch 2, the validation set: the run's one
    ``RunReader``); the end-of-run calibration reads with a reader of its own, only after
    that thread is done."""
    from rnntrain.compute.model import total_subsample
    from rnntrain.config import load_config
    from rnntrain.data.dataset import Dataset
    from rnntrain.data.plan import BatchPlanner, PlanSettings, chunk_order
    from rnntrain.run.evaluate import eval_batches
    train, val = synth_pair
    cfg_path, out = tiny_config(tmp_path, train, val), tmp_path / "trace.json"
    over = [*TINY, "train.epochs=2", f"run.dir={tmp_path / 'run'}"]
    r = run_cli("rnntrain", "train", cfg_path, *over, "--trace", out,
                "--trace-steps", "0:100000")
    assert r.returncode == 0, r.stderr[-2000:]
    cfg = load_config(str(cfg_path), over)
    sub = total_subsample(cfg.model)
    tds = Dataset.open(str(train), cfg.data.chunk_frames)
    vds = Dataset.open(str(val), cfg.data.chunk_frames)
    planner = BatchPlanner(tds, tds.feasible(sub), PlanSettings.from_config(cfg))
    vals = [["val", k] for k in eval_batches(vds, vds.feasible(sub), cfg.batch.batch_frames)]
    want = []
    for e in range(2):
        want += [["train", k] for k in chunk_order(planner.epoch(e))] + vals
    assert len(want) > 6
    loads = sorted(_spans(json.loads(out.read_text()), "load chunk", 0), key=lambda e: e["ts"])
    # the run's reader names each chunk (source, id); calibration's own reader by id
    mine = [e for e in loads if isinstance(e["args"]["chunk"], list)]
    assert [e["args"]["chunk"] for e in mine] == want
    assert len({e["tid"] for e in mine}) == 1
    end = mine[-1]["ts"] + mine[-1]["dur"]
    assert all(e["ts"] >= end for e in loads if e not in mine)


def test_bad_trace_steps_cli(synth_pair, tmp_path):
    train, _ = synth_pair
    r = run_cli("rnntrain", "train", tiny_config(tmp_path, train), "--trace",
                tmp_path / "t.json", "--trace-steps", "4:2")
    assert r.returncode == 2
    assert "--trace-steps" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.mpi
def test_trace_merged_across_ranks(synth_pair, tmp_path):
    if mpiexec() is None:
        pytest.skip("mpiexec not available")
    import subprocess
    import sys
    from conftest import ROOT
    train, val = synth_pair
    out = tmp_path / "trace.json"
    cmd = [mpiexec(), "-n", "2", sys.executable, "-m", "rnntrain", "train",
           str(tiny_config(tmp_path, train)), *TINY, "compute.threads=1", f"run.dir={tmp_path / 'run'}",
           "--trace", str(out), "--trace-steps", "1:3"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT,
                       env={**__import__("os").environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["otherData"]["ranks"] == [0, 1]
    for pid in (0, 1):
        _check_train_trace(doc, pid, 1, 3, workers=1)
    # rank 0's metric lines carry every rank's step-time split (for `rnntrain report`)
    from rnntrain.tools.report import rank_splits
    from rnntrain.tools.runs import read_metrics
    train_recs = [r for r in read_metrics(tmp_path / "run") if r["split"] == "train"]
    assert all(len(r["ranks"]) == 2 for r in train_recs)
    assert len(rank_splits(train_recs)) == 2
    # the collective of a step ends at about the same moment on both ranks (aligned clocks)
    ends = {(e["pid"], e["args"]["step"]): e["ts"] + e["dur"] for e in _spans(doc, "allreduce")}
    for step in (1, 2):
        assert abs(ends[(0, step)] - ends[(1, step)]) < 50_000  # µs
