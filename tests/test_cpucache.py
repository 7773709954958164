"""compute.cpucache: the large-block cache behind torch's CPU allocator ("capped"), built
with the system's C++ compiler on first use; without one "capped" trains on glibc's settings
alone and says so in one line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT, run_cli

COMPILER = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
needs_cxx = pytest.mark.skipif(not COMPILER or not sys.platform.startswith("linux"),
                               reason="no C++ compiler (or not Linux): the cache is not built")


def _run(code: str, *args, env=None, timeout=180):
    p = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=ROOT,
                       capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


# Tensors of assorted large sizes, each filled with its own value, checked after the others
# were allocated and freed; a freed block serves the next request of its size (a hit) and
# its pages are not faulted in again (minor faults, getrusage: a fresh block of 24 MiB
# costs ~6,000); the bound: the resident size never passes base's peak (the process
# without the cache's free blocks) + the slack by more than the block being handed out.
REUSE = """
import json, resource, torch
from rnntrain.compute import cpucache
assert cpucache.install(threshold=2**20) is None
MiB = 2**20
def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
ok = True
for rnd in range(3):
    ts = [torch.full((m * MiB // 4,), float(m)) for m in (3, 5, 9, 17, 24, 40)]
    junk = [torch.ones(m * MiB // 4) for m in (7, 30)]
    del junk
    # min and max: no large temporary (a comparison's bool tensor would be one more block)
    ok &= all(float(t.min()) == float(t.max()) == m for t, m in zip(ts, (3, 5, 9, 17, 24, 40)))
    del ts
before, f0 = cpucache.stats(), faults()
t = torch.empty(24 * MiB // 4).fill_(2.0)   # the size freed above: its pages reused
f1 = faults()
after = cpucache.stats()
del t
small = torch.ones(1000)                     # under the threshold: torch's own allocator
print(json.dumps(dict(ok=ok, before=before, after=after, faults=f1 - f0,
                      small_cached=cpucache.stats()["cached"], active=cpucache.active(),
                      small=float(small.sum()))))
"""


@needs_cxx
def test_cache_reuses_freed_blocks_by_size_and_keeps_contents():
    r = _run(REUSE)
    assert r["ok"] and r["active"] and r["small"] == 1000.0
    b, a = r["before"], r["after"]
    assert a["hits"] == b["hits"] + 1 and a["misses"] == b["misses"]
    assert r["faults"] < 24 * 2**20 / 4096 / 10, r["faults"]  # ~6,000 if mapped fresh
    assert b["misses"] <= 8  # the first round's blocks, then reuse
    assert a["rss_peak"] <= a["base_peak"] + a["slack"] + 40 * 2**20
    assert r["small_cached"] == a["cached"] + 24 * 2**20  # 1000 floats: not cached


# The bound in a process whose large blocks change size all the time (the pattern that makes
# "cache"'s heap grow): 30 rounds of one tensor of 40-98 MiB alive at a time, touched, with a
# small one pinned after each. Resident growth stays within the largest block + the slack.
BOUND = """
import json, torch
from rnntrain.compute import cpucache
assert cpucache.install(threshold=2**20, slack=16 * 2**20) is None
def rss():
    for ln in open("/proc/self/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) * 1024
start, pins, peak = rss(), [], 0
for k in range(30):
    big = torch.empty((40 + 2 * k) * 2**20, dtype=torch.uint8).fill_(1)
    pins.append(torch.ones(2**14))
    peak = max(peak, rss())
    del big
print(json.dumps(dict(grown=(rss() - start) / 2**20, peak=(peak - start) / 2**20,
                      stats=cpucache.stats())))
"""


@needs_cxx
def test_resident_size_stays_bounded_when_sizes_change():
    r = _run(BOUND)
    s = r["stats"]
    assert s["remaps"] + s["fits"] + s["hits"] >= 25, s   # every later block from the cache
    assert r["peak"] < 98 + 16 + 24, r         # one block alive, the slack, some pages
    assert s["rss_peak"] <= s["base_peak"] + s["slack"] + 98 * 2**20, s


# Two threads allocate, fill, check and free tensors of assorted large sizes at once.
THREADS = """
import json, threading, torch
from rnntrain.compute import cpucache
assert cpucache.install(threshold=2**20) is None
bad = []
def work(tid):
    for i in range(60):
        m = 1 + (i * 7 + tid * 3) % 23
        ts = [torch.full((m * 2**18,), float(tid * 1000 + i)), torch.ones(m * 2**17)]
        if not bool((ts[0] == tid * 1000 + i).all()) or float(ts[1].sum()) != m * 2**17:
            bad.append((tid, i))
threads = [threading.Thread(target=work, args=(t,)) for t in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(json.dumps(dict(bad=bad, stats=cpucache.stats())))
"""


@needs_cxx
def test_two_threads_share_the_cache():
    r = _run(THREADS)
    assert r["bad"] == []
    s = r["stats"]
    assert s["live"] == 0 and s["hits"] + s["fits"] + s["remaps"] > 100, s


# The bytes faulted in by each path's users (the cache's own books: resident at free less
# resident when handed out) against the process's minor faults (getrusage) around the same
# tensor: a fresh block faults in all it touches, a hit nothing, a block grown by mremap
# only the difference.
FAULTS = """
import json, resource, torch
from rnntrain.compute import cpucache
assert cpucache.install(threshold=2**20) is None
MiB = 2**20
def flt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt * resource.getpagesize()
def use(mib, value):
    s0, f0 = cpucache.stats(), flt()
    t = torch.empty(mib * MiB, dtype=torch.uint8).fill_(value)
    f1 = flt()
    del t
    s1 = cpucache.stats()
    return {k: s1[k] - s0[k] for k in s1} | {"minflt": f1 - f0}
print(json.dumps(dict(miss=use(8, 1), hit=use(8, 2), grown=use(12, 3))))
"""


@needs_cxx
def test_fault_books_by_path_match_the_page_faults():
    r = _run(FAULTS)
    MiB = 2**20
    miss, hit, grown = r["miss"], r["hit"], r["grown"]
    assert miss["misses"] == 1 and miss["faulted_misses"] == 8 * MiB, miss
    assert abs(miss["minflt"] - 8 * MiB) < MiB, miss            # the kernel's count agrees
    assert hit["hits"] == 1 and hit["faulted_hits"] == 0 and hit["minflt"] < MiB // 4, hit
    assert grown["remaps"] == 1 and grown["faulted_remaps"] == 4 * MiB, grown
    assert abs(grown["minflt"] - 4 * MiB) < MiB, grown
    assert grown["faulted_misses"] == grown["faulted_fits"] == 0, grown


# allocator.trim (the chunk switch) releases the cache's free blocks too, under "capped"
TRIM = """
import json, torch
from rnntrain.compute import allocator, cpucache
assert allocator.configure("capped")
t = [torch.ones(2**23) for _ in range(4)]
del t
held = cpucache.stats()["cached"]
print(json.dumps(dict(held=held, trimmed=allocator.trim(), after=cpucache.stats(),
                      note=allocator.note())))
"""


@needs_cxx
def test_trim_releases_the_cached_blocks():
    r = _run(TRIM)
    assert r["held"] == 4 * 2**25 and r["trimmed"]
    assert r["after"]["cached"] == 0 and r["after"]["released_bytes"] == r["held"]
    assert "cached by size" in r["note"]


def test_capped_without_a_compiler_trains_and_says_so(synth_pair, tmp_path):
    """No compiler and nothing built: "capped" runs on glibc's settings, with one line
    naming why, and trains the same weights as "cache". (Both on oneDNN's LSTM kernel: the
    compiled one, compute.lstm = "scan", needs the compiler too.)"""
    train, _ = synth_pair
    weights = {}
    for mode, env in (("capped", {"CXX": str(tmp_path / "no-such-c++"),
                                  "XDG_CACHE_HOME": str(tmp_path / "empty-cache")}),
                      ("cache", {})):
        run = tmp_path / mode
        p = run_cli("rnntrain", "train", f"data.train={train}", "model.layers=1",
                    "model.hidden=16", "train.epochs=1", "batch.batch_frames=600",
                    f"compute.allocator={mode}", "compute.threads=2", f"run.dir={run}",
                    "compute.lstm=onednn", env=env)
        assert p.returncode == 0, p.stderr[-2000:]
        weights[mode] = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
        if mode == "capped":
            lines = [ln for ln in p.stderr.splitlines() if ln.startswith("allocator:")]
            assert len(lines) == 1 and "without its large-block cache (no C++ compiler" in \
                lines[0], p.stderr[-2000:]
            assert "Traceback" not in p.stderr
            assert lines[0] in (run / "train.log").read_text()
            assert not (tmp_path / "empty-cache" / "rnntrain").exists() or not any(
                (tmp_path / "empty-cache" / "rnntrain").glob("*.so"))
    for k in weights["cache"]:
        assert torch.equal(weights["cache"][k], weights["capped"][k]), k


@needs_cxx
def test_build_is_atomic_and_keyed(tmp_path):
    """Two processes building into one empty cache folder at once (MPI ranks) each end
    with the same whole library, and no temporary file is left."""
    code = ("from rnntrain.compute import cpucache\nimport json, torch\n"
            "print(json.dumps(str(cpucache.build())))")
    env = dict(os.environ, PYTHONPATH=str(ROOT), XDG_CACHE_HOME=str(tmp_path))
    ps = [subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in ps]
    assert all(p.returncode == 0 for p in ps), [o[1][-1500:] for o in outs]
    paths = {json.loads(o[0].strip().splitlines()[-1]) for o in outs}
    assert len(paths) == 1
    folder = tmp_path / "rnntrain"
    assert sorted(x.name for x in folder.iterdir()) == [os.path.basename(paths.pop())]


FAKE_CXX = """#!/bin/sh
echo "_cpucache.cpp:1:10: fatal error: c10/core/Allocator.h: No such file or directory" >&2
exit 1
"""


def _train_capped(train, run, env):
    return run_cli("rnntrain", "train", f"data.train={train}", "model.layers=1",
                   "model.hidden=16", "train.epochs=1", "batch.batch_frames=600",
                   "compute.allocator=capped", "compute.threads=1", f"run.dir={run}", env=env)


@pytest.mark.parametrize("case", ["off", "compile-error", "missing-file", "foreign-file"])
def test_capped_without_its_cache_trains_and_says_why_in_one_line(case, synth_pair, tmp_path):
    """RNNTRAIN_CPUCACHE=off, a compiler that fails (a script printing an error line),
    RNNTRAIN_CPUCACHE naming a missing file or one that is no library: "capped" trains on
    glibc's settings, and the run log has one allocator line with the reason (the error
    line; the path), no traceback, and nothing is built."""
    train, _ = synth_pair
    cache = tmp_path / "empty-cache"
    env = {"XDG_CACHE_HOME": str(cache)}
    if case == "off":
        env["RNNTRAIN_CPUCACHE"], why = "off", "(RNNTRAIN_CPUCACHE=off)"
    elif case == "compile-error":
        cxx = tmp_path / "failing-c++"
        cxx.write_text(FAKE_CXX)
        cxx.chmod(0o755)
        env["CXX"] = str(cxx)
        why = (f"({cxx} failed: _cpucache.cpp:1:10: fatal error: c10/core/Allocator.h: "
               "No such file or directory)")
    elif case == "missing-file":
        missing = tmp_path / "nowhere" / "_cpucache-x.so"
        env["RNNTRAIN_CPUCACHE"] = str(missing)
        why = f"(RNNTRAIN_CPUCACHE={missing}: no such file"
    else:
        foreign = tmp_path / "not-a-library.so"
        foreign.write_text("not ELF\n")
        env["RNNTRAIN_CPUCACHE"] = str(foreign)
        why = f"({foreign}: not a large-block cache library ("  # then the loader's words
    run = tmp_path / "run"
    p = _train_capped(train, run, env)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Traceback" not in p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.startswith("allocator:")]
    assert len(lines) == 1 and lines[0].startswith(
        "allocator: capped without its large-block cache " + why), lines or p.stderr[-2000:]
    assert lines[0] in (run / "train.log").read_text()
    assert (run / "checkpoints" / "last.pt").is_file()
    assert not list(cache.rglob("_cpucache*.so"))   # (the LSTM kernel's library may be there)


# A library loaded from RNNTRAIN_CPUCACHE: the process maps that file, nothing is built in
# its (empty) cache folder, and the cache serves a freed block's size again.
PREBUILT = """
import json, sys, torch
from rnntrain.compute import cpucache
why = cpucache.install()
ts = [torch.ones(2**22) for _ in range(3)]
del ts
t = torch.ones(2**22)
maps = {ln.split()[-1] for ln in open("/proc/self/maps")
        if ln.rstrip().endswith(sys.argv[1]) or "_cpucache" in ln}
print(json.dumps(dict(why=why, active=cpucache.active(), maps=sorted(maps),
                      stats=cpucache.stats())))
"""


@needs_cxx
def test_env_path_loads_a_library_built_elsewhere_and_a_build_prunes_old_ones(tmp_path):
    """cpucache.build() into one cache folder (where old libraries of other keys lie: the
    one unused for over PRUNE_DAYS is removed, a recent one kept; a build that finds its
    library marks it used); the library copied
    elsewhere and named by RNNTRAIN_CPUCACHE is the one a process loads and runs."""
    import time
    built = tmp_path / "built"
    folder = built / "rnntrain"
    folder.mkdir(parents=True)
    old, recent = folder / "_cpucache-0000000000000000.so", folder / "_cpucache-1111.so"
    old.write_bytes(b"old")
    recent.write_bytes(b"recent")
    days = 86400
    os.utime(old, (time.time() - 31 * days,) * 2)
    os.utime(recent, (time.time() - 29 * days,) * 2)
    code = ("from rnntrain.compute import cpucache\nimport json, torch\n"
            "print(json.dumps(str(cpucache.build())))")
    lib = _run(code, env={"XDG_CACHE_HOME": str(built)}, timeout=300)
    assert os.path.dirname(lib) == str(folder)
    assert sorted(x.name for x in folder.iterdir()) == sorted(
        [os.path.basename(lib), recent.name])
    os.utime(lib, (time.time() - 40 * days,) * 2)   # found again by build: used now
    assert _run(code, env={"XDG_CACHE_HOME": str(built)}) == lib
    assert time.time() - os.path.getmtime(lib) < days
    elsewhere = tmp_path / "elsewhere" / "mycache.so"
    elsewhere.parent.mkdir()
    shutil.copy(lib, elsewhere)
    os.remove(lib)  # only the copy exists now
    empty = tmp_path / "empty-cache"
    r = _run(PREBUILT, elsewhere,
             env={"RNNTRAIN_CPUCACHE": str(elsewhere), "XDG_CACHE_HOME": str(empty)})
    assert r["why"] is None and r["active"], r
    assert r["maps"] == [str(elsewhere)], r  # that file, no other build of the cache
    assert r["stats"]["hits"] + r["stats"]["fits"] + r["stats"]["remaps"] >= 1 \
        and r["stats"]["live"] == 2**24, r
    assert not empty.exists()


# The start of the page-move scripts below: the cache installed (HEAD_FILL: its FILL
# setting from the script's first argument), minor faults and the resident size.
_HEAD = """
import json, resource, sys, torch
from rnntrain.compute import cpucache
{fill}assert cpucache.install(threshold=2**20) is None
MiB = 2**20
def flt():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
def rss():
    for ln in open("/proc/self/status"):
        if ln.startswith("VmRSS:"):
            return int(ln.split()[1]) * 1024
"""
HEAD = _HEAD.format(fill="")
HEAD_FILL = _HEAD.format(fill='cpucache.FILL = sys.argv[1] == "1"\n')


# Page moves (userfaultfd UFFDIO_MOVE): two "workspaces" per task as oneDNN's LSTM writes
# them, W (a lower layer's) and D (the upper one's), 48 MiB each: the forward writes the
# first 16 MiB, the backward (grad mode off) the next 16 MiB, D's before W's; the rest is
# never touched. From the second task on, D's backward part is moved into W's when D is
# freed, so writing W's backward part faults nothing (getrusage), and W's backward part was
# not resident while D's was written (VmRSS there: the peak), all contents as written.
MOVES = HEAD + """
def task(k):
    w = torch.empty(48 * MiB, dtype=torch.uint8)
    w[:16 * MiB].fill_(k)
    d = torch.empty(48 * MiB, dtype=torch.uint8)
    d[:16 * MiB].fill_(k + 1)
    with torch.no_grad():                           # the backward
        x = torch.empty(2 * MiB, dtype=torch.uint8).fill_(0)
        d[16 * MiB:32 * MiB].fill_(k + 2)
        peak = rss()
        ok = bool((d[:16 * MiB] == k + 1).all()) and bool((d[16 * MiB:32 * MiB] == k + 2).all())
        s0 = cpucache.stats()
        del d
        f0 = flt()
        ok &= bool((w[:16 * MiB] == k).all())
        w[16 * MiB:32 * MiB].fill_(k + 3)
        f1 = flt()
        ok &= bool((w[16 * MiB:32 * MiB] == k + 3).all()) and bool((w[:16 * MiB] == k).all())
        s1 = cpucache.stats()
        del w, x
    return dict(ok=ok, faults=f1 - f0, peak=peak,
                moved=s1["moved_bytes"] - s0["moved_bytes"])
base = rss()
out = [task(k) for k in range(4)]
print(json.dumps(dict(out=out, base=base, moves=cpucache.moves(), stats=cpucache.stats())))
"""


def _skip_without_moves():
    """Skips the test unless this kernel moves pages (a probe in a fresh process)."""
    code = ("import json, torch\nfrom rnntrain.compute import cpucache\n"
            "why = cpucache.install()\nprint(json.dumps(why or cpucache.moves()))")
    why = _run(code)
    if why is not None:
        pytest.skip(f"no page moves here: {why}")


@needs_cxx
def test_pages_written_in_a_backward_move_into_the_next_workspace():
    _skip_without_moves()
    on = _run(MOVES)
    off = _run(MOVES, env={"RNNTRAIN_CPUCACHE_MOVE": "off"})
    assert on["moves"] is None and off["moves"] == "RNNTRAIN_CPUCACHE_MOVE=off"
    assert all(t["ok"] for t in on["out"] + off["out"]), (on, off)
    pages = 16 * 2**20 // 4096
    first, *later = on["out"]
    assert first["moved"] == 0 and first["faults"] >= pages * 9 // 10, first  # no pattern yet
    for t in later:  # D's backward part moved into W's: written without a fault
        assert t["moved"] == 16 * 2**20 and t["faults"] < pages // 10, t
    assert on["stats"]["moved_bytes"] == 3 * 16 * 2**20 and on["stats"]["moving"] == 1
    assert off["stats"]["moved_bytes"] == 0 and off["stats"]["moving"] == 0
    for t in off["out"][1:]:  # without moves W is reused whole: no faults either ...
        assert t["moved"] == 0 and t["faults"] < pages // 10, t
    # ... but its backward part is resident at the peak (D's backward being written)
    for a, b in zip(on["out"][1:], off["out"][1:]):
        assert (b["peak"] - off["base"]) - (a["peak"] - on["base"]) >= 12 * 2**20, (a, b)


# Training with moves on, off and under "cache": the same weights, bit for bit. The cache's
# threshold is lowered to 64 KiB so that the tiny model's LSTM workspaces go through it and
# pages are really moved (its books say how many).
TRAIN = """
import json, sys
from rnntrain.compute import allocator, cpucache
cpucache.THRESHOLD = 64 * 1024
from rnntrain.cli import main
rc = main(sys.argv[1:])
print(json.dumps(dict(rc=rc, stats=cpucache.stats(), note=allocator.note())))
"""


@needs_cxx
def test_training_with_page_moves_changes_no_weight(synth_pair, tmp_path):
    """(On oneDNN's LSTM kernel: the moves follow its workspace's pattern, written forward
    part first; the compiled recurrence, compute.lstm = "scan", has no such workspace.)"""
    _skip_without_moves()
    train, _ = synth_pair
    weights, res = {}, {}
    for name, mode, env in (("moves", "capped", {}),
                            ("off", "capped", {"RNNTRAIN_CPUCACHE_MOVE": "off"}),
                            ("cache", "cache", {})):
        run = tmp_path / name
        res[name] = _run(TRAIN, "train", f"data.train={train}", "model.layers=2",
                         "model.hidden=32", "train.epochs=1", "batch.batch_frames=1200",
                         f"compute.allocator={mode}", "compute.threads=2", f"run.dir={run}",
                         "compute.lstm=onednn", env=env, timeout=300)
        assert res[name]["rc"] == 0
        weights[name] = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert res["moves"]["stats"]["moved_bytes"] > 0, res["moves"]
    assert "pages written in a backward moved" in res["moves"]["note"], res["moves"]
    assert res["off"]["stats"]["moved_bytes"] == 0
    assert "no page moves (RNNTRAIN_CPUCACHE_MOVE=off)" in res["off"]["note"], res["off"]
    for name in ("moves", "off"):
        for k in weights["cache"]:
            assert torch.equal(weights["cache"][k], weights[name][k]), (name, k)


# Fills: the pages a block handed out will likely touch (the pattern of the last free of
# the nearest size) that it does not hold are moved in from the cache's spare resident
# pages instead of being faulted in and zeroed by the kernel. A 20 MiB block, every page
# written, serves a 24 MiB request grown by mremap; its 4 new MiB come from an 8 MiB block
# freed before it, so writing the new tensor faults nothing (getrusage) and the resident
# size does not grow when it is handed out; live contents stay as written. Without fills
# (cpucache.FILL off) the 4 MiB are faulted in. With moves unavailable nothing is filled.
FILLS = HEAD_FILL + """
live = torch.full((6 * MiB,), 9, dtype=torch.uint8)
donor = torch.full((8 * MiB,), 7, dtype=torch.uint8)
a = torch.empty(20 * MiB, dtype=torch.uint8).fill_(1)
del donor, a                      # the donor first: the least recently freed
s0, r0 = cpucache.stats(), rss()
b = torch.empty(24 * MiB, dtype=torch.uint8)
s1, r1, f0 = cpucache.stats(), rss(), flt()
b.fill_(2)
f1 = flt()
ok = bool((b == 2).all()) and bool((live == 9).all())
print(json.dumps(dict(ok=ok, faults=f1 - f0, grew=r1 - r0, stats=cpucache.stats(),
                      d={k: s1[k] - s0[k] for k in s1})))
"""


@needs_cxx
def test_fills_move_spare_pages_into_a_block_handed_out():
    _skip_without_moves()
    on, off = _run(FILLS, "1"), _run(FILLS, "0")
    pages = 4 * 2**20 // 4096
    assert on["ok"] and off["ok"], (on, off)
    assert on["d"]["remaps"] == off["d"]["remaps"] == 1, (on, off)
    assert on["d"]["filled_bytes"] == 4 * 2**20 and on["d"]["fills"] == 1, on
    assert on["d"]["cached_resident"] == -24 * 2**20, on   # 20 MiB reused, 4 moved out
    assert on["faults"] < pages // 10, on                  # the new 4 MiB were resident
    assert abs(on["grew"]) < 2**20, on                      # moved, not faulted in
    assert off["d"]["filled_bytes"] == 0 and off["faults"] >= pages * 9 // 10, off


# At a backward's start (grad mode off) the thread's last workspace, whose backward comes
# first and has no block freed before it to give it pages, gets the pages its pattern's
# user wrote in the backward from the cache's spare pages: here a 16 MiB tensor freed in
# the forward. From the second task on (a pattern exists), writing D's backward part faults
# nothing; all contents stay as written. Without fills it faults every task.
BACKWARD_FILL = HEAD_FILL + """
def task(k):
    w = torch.empty(48 * MiB, dtype=torch.uint8)
    w[:16 * MiB].fill_(k)
    d = torch.empty(48 * MiB, dtype=torch.uint8)
    d[:16 * MiB].fill_(k + 1)
    spare = torch.empty(16 * MiB, dtype=torch.uint8).fill_(k + 4)
    del spare
    with torch.no_grad():                           # the backward
        x = torch.empty(2 * MiB, dtype=torch.uint8).fill_(0)
        f0 = flt()
        d[16 * MiB:32 * MiB].fill_(k + 2)
        f1 = flt()
        ok = bool((d[:16 * MiB] == k + 1).all()) and bool((d[16 * MiB:32 * MiB] == k + 2).all())
        del d
        w[16 * MiB:32 * MiB].fill_(k + 3)
        ok &= bool((w[:16 * MiB] == k).all()) and bool((w[16 * MiB:32 * MiB] == k + 3).all())
        ok &= bool((x == 0).all())
        del w, x
    return dict(ok=ok, faults=f1 - f0)
out = [task(k) for k in range(4)]
print(json.dumps(dict(out=out, stats=cpucache.stats())))
"""


@needs_cxx
def test_a_backward_start_fills_the_first_workspace_from_spare_pages():
    _skip_without_moves()
    on, off = _run(BACKWARD_FILL, "1"), _run(BACKWARD_FILL, "0")
    pages = 16 * 2**20 // 4096
    assert all(t["ok"] for t in on["out"] + off["out"]), (on, off)
    assert on["out"][0]["faults"] >= pages * 9 // 10, on    # no pattern yet
    for t in on["out"][1:]:
        assert t["faults"] < pages // 10, on
    for t in off["out"]:
        assert t["faults"] >= pages * 9 // 10, off
    assert on["stats"]["filled_bytes"] >= 3 * 16 * 2**20 and off["stats"]["filled_bytes"] == 0
