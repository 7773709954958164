"""fsutil.atomic_write: the target is the old file or the new one, never a temp left over."""
from __future__ import annotations

import errno
import os
import signal
import stat
import subprocess
import sys
import threading
import time

import pytest

from rnntrain.errors import UserError
from rnntrain.fsutil import (atomic_path, atomic_write, check_output, open_output,
                             stale_temps, temp_path)
from tests.test_fuzz import alarm


def listing(folder):
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize("payload,expect", [
    (b"\x00\x01bytes", b"\x00\x01bytes"),
    ("text é\n", "text é\n".encode()),
    (lambda fh: fh.write(b"from a callback"), b"from a callback"),
])
def test_writes_whole_file_and_leaves_no_temp(tmp_path, payload, expect):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    atomic_write(target, payload)
    assert target.read_bytes() == expect
    assert listing(tmp_path) == ["out.bin"]


@pytest.mark.parametrize("exc", [OSError(28, "No space left on device"), KeyboardInterrupt()])
def test_failure_keeps_old_file_and_removes_temp(tmp_path, exc):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"old contents")

    def writer(fh):
        fh.write(b"half of the new")
        assert temp_path(target).exists()  # the temp file really was written
        raise exc

    with pytest.raises(type(exc)):
        atomic_write(target, writer)
    assert target.read_bytes() == b"old contents"
    assert listing(tmp_path) == ["ckpt.pt"]


def test_atomic_path_for_writers_that_want_a_name(tmp_path):
    target = tmp_path / "data.nc"
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".data.nc.tmp")
        tmp.write_text("new")
        assert not target.exists()  # nothing under the name until the block completes
    assert target.read_text() == "new"
    with pytest.raises(ValueError):
        with atomic_path(target) as tmp:
            tmp.write_text("broken")
            raise ValueError("converter failed")
    assert target.read_text() == "new" and listing(tmp_path) == ["data.nc"]


def test_missing_folder_is_an_error_not_a_stray_file(tmp_path):
    with pytest.raises(OSError):
        atomic_write(tmp_path / "no" / "such" / "file", b"x")
    assert listing(tmp_path) == []


def test_crash_before_rename_leaves_old_file_and_a_findable_temp(tmp_path):
    """A process killed between the fsync and the rename (the checkpoint pause point)."""
    target = tmp_path / "last.pt"
    target.write_bytes(b"old")
    code = ("import os, sys; from rnntrain.fsutil import atomic_write; "
            "atomic_write(sys.argv[1], b'new', lambda: os._exit(3))")
    r = subprocess.run([sys.executable, "-c", code, str(target)], env=_env())
    assert r.returncode == 3
    assert target.read_bytes() == b"old"
    temps = stale_temps(tmp_path, "*.pt")
    assert len(temps) == 1 and temps[0].read_bytes() == b"new"  # complete, never renamed


WRITER = """
import sys
from rnntrain.fsutil import atomic_write
path, n = sys.argv[1], int(sys.argv[2])
print("ready", flush=True)
i = 0
while True:  # alternate two large, distinguishable contents until killed
    atomic_write(path, (b"a" if i % 2 else b"b") * n)
    i += 1
"""


def test_killed_writer_leaves_old_or_new_never_partial(tmp_path):
    """SIGKILL a process rewriting the file at arbitrary moments: each time the target
    is one complete version. (A plain open-write of the target fails this.)"""
    n = 1 << 20
    target = tmp_path / "f"
    for k in range(6):
        p = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(n)], env=_env(),
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "ready"
        time.sleep(0.05 + 0.037 * k)
        p.send_signal(signal.SIGKILL)
        p.wait()
        p.stdout.close()
        if target.exists():
            data = target.read_bytes()
            assert data in (b"a" * n, b"b" * n), f"partial file of {len(data)} bytes"
    for t in stale_temps(tmp_path):  # what a killed writer may leave: hidden temp names
        assert t.name.startswith(".f.tmp")


def _env():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return dict(os.environ, PYTHONPATH=root)


# ---------------------------------------------------------------- outputs a user names

def test_symlink_output_replaces_its_target_and_keeps_the_link(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_text() == "new" and listing(tmp_path) == ["link.txt", "real.txt"]


def test_dev_null_is_written_through_not_replaced():
    before = os.stat("/dev/null")
    atomic_write("/dev/null", b"discarded")
    with atomic_path("/dev/null") as tmp:   # writers that want a name: a temp file elsewhere
        assert not str(tmp).startswith("/dev/")
        tmp.write_bytes(b"discarded too")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == \
        (before.st_ino, before.st_rdev)


def _fifo_reader(fifo, got):
    with open(fifo, "rb") as fh:   # blocks until the writer opens: this thread, not the test
        got.append(fh.read())


def test_fifo_with_a_reader_gets_the_bytes_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    got: list[bytes] = []
    t = threading.Thread(target=_fifo_reader, args=(fifo, got), daemon=True)
    t.start()
    time.sleep(0.2)   # the reader is waiting in open()
    with alarm(20):
        with open_output(fifo) as fh:
            fh.write(b"line 1\n")
            fh.write(b"line 2\n")
    t.join(20)
    assert got == [b"line 1\nline 2\n"] and stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert listing(tmp_path) == ["out.fifo"]


def test_fifo_nobody_reads_is_refused_not_a_hang(tmp_path):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    with alarm(20), pytest.raises(UserError, match="no process reads"):
        atomic_write(fifo, b"x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and listing(tmp_path) == ["out.fifo"]


def test_folder_output_refused_without_a_temp_file(tmp_path):
    (tmp_path / "d").mkdir()
    for call in (lambda: atomic_write(tmp_path / "d", b"x"),
                 lambda: check_output(tmp_path / "d")):
        with pytest.raises(UserError, match="is a folder; give a file name"):
            call()
    assert listing(tmp_path) == ["d"] and listing(tmp_path / "d") == []


def test_output_that_is_an_input_is_refused(tmp_path):
    data = tmp_path / "in.npy"
    data.write_bytes(b"input bytes")
    (tmp_path / "alias.npy").symlink_to(data)
    os.link(data, tmp_path / "hard.npy")
    for out in (data, tmp_path / "alias.npy", tmp_path / "hard.npy"):
        with pytest.raises(UserError, match="is also an input"):
            check_output(out, [str(data)])
    assert data.read_bytes() == b"input bytes"
    check_output(tmp_path / "other.npy", [str(data)])   # a new name is fine


def test_dead_writers_temp_removed_by_the_next_write(tmp_path):
    """A writer killed mid-write leaves .NAME.tmpPID; the next write of NAME removes it
    when PID is dead, keeps it when the process lives (a write in progress)."""
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    stale = tmp_path / f".m.onnx.tmp{dead}"
    stale.write_bytes(b"half an export")
    live = tmp_path / f".m.onnx.tmp{os.getppid()}"  # our parent: alive
    live.write_bytes(b"in progress")
    other = tmp_path / f".other.onnx.tmp{dead}"      # another output's: not ours to judge
    other.write_bytes(b"x")
    atomic_write(tmp_path / "m.onnx", b"model")
    assert listing(tmp_path) == sorted([live.name, other.name, "m.onnx"])


def test_write_error_hidden_by_a_library_surfaces_as_the_oserror(tmp_path):
    """torch.save reports a failed write as RuntimeError('[enforce fail at
    inline_container.cc] unexpected pos'); under a file-size limit (RLIMIT_FSIZE, EFBIG:
    what a full disk does, deterministically) the helper raises the real OSError."""
    code = ("import resource, signal, sys, torch\n"
            "from rnntrain.fsutil import atomic_write\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))\n"
            "try:\n"
            "    atomic_write(sys.argv[1], lambda fh: torch.save(torch.zeros(10**6), fh))\n"
            "except OSError as e:\n"
            "    print('ERR', e.errno, e.filename)\n")
    target = tmp_path / "ck.pt"
    r = subprocess.run([sys.executable, "-c", code, str(target)], env=_env(),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.split() == ["ERR", str(errno.EFBIG), str(target)], r.stderr[-2000:]
    assert listing(tmp_path) == []


@pytest.mark.parametrize("lines,tail", [
    ([], b""), (["a"], b""), (["a", "bb"], b'{"cut'), ([], b'{"no newline at all'),
    (["x" * 70000, "y"], b"z" * 70000),  # the last newline lies more than a block back
])
def test_drop_torn_tail_keeps_exactly_the_complete_lines(tmp_path, lines, tail):
    from rnntrain.fsutil import drop_torn_tail
    p = tmp_path / "log.jsonl"
    whole = "".join(x + "\n" for x in lines).encode()
    p.write_bytes(whole + tail)
    assert drop_torn_tail(p, block=4096) == len(tail)
    assert p.read_bytes() == whole
    assert drop_torn_tail(p) == 0 and p.read_bytes() == whole  # idempotent
    assert drop_torn_tail(tmp_path / "missing") == 0 and not (tmp_path / "missing").exists()


def test_run_log_of_a_resumed_session_starts_on_a_line_of_its_own(tmp_path):
    """A killed session left metrics.jsonl and train.log ending mid-record: the next
    session's RunLog cuts the fragments, so every line parses and none is glued on."""
    import json
    from rnntrain.run.runlog import RunLog
    run = tmp_path / "run"
    first = RunLog(run)
    first.metrics(split="train", step=1, loss=1.5)
    first.info("session one", echo=False)
    first.close()
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"split": "train", "step": 2, "lo')  # killed here
    with open(run / "train.log", "a") as fh:
        fh.write("12:00:00 half a li")
    second = RunLog(run)
    second.metrics(split="train", step=2, loss=1.25)
    second.close()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in recs] == [(1, 1.5), (2, 1.25)]
    log = (run / "train.log").read_text().splitlines()
    assert "session one" in log[0] and "half a li" not in "".join(log)
    assert "metrics.jsonl: dropped the last 33 bytes" in log[-2]
    assert "train.log: dropped the last 18 bytes" in log[-1]
