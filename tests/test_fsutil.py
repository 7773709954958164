"""fsutil.atomic_write: the target is the old file or the new one, never a temp left over."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from rnntrain.fsutil import atomic_path, atomic_write, stale_temps, temp_path


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
