"""Every file the data tools read whole is a regular file of bounded size
(``rnntrain.fsutil.read_text``): a FIFO would block forever, /dev/zero never ends. Each
case runs the real ``rnntrain-data`` command line on a real FIFO or device and expects one
line naming the file, exit 2, and nothing written."""
from __future__ import annotations

import os

import pytest

from rnntrain.errors import UserError
from rnntrain.fsutil import read_bytes, read_text
from tests.conftest import run_cli_batch


def _one_line(r):
    assert r.returncode == 2, (r.args, r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_read_text_bounds_and_names(tmp_path):
    p = tmp_path / "t.txt"
    p.write_bytes("one\ntwo é\n".encode())
    assert read_text(p, "text file") == "one\ntwo é\n"
    with pytest.raises(UserError, match=r"t.txt: text file is larger than 5 bytes"):
        read_bytes(p, "text file", limit=5)
    assert read_bytes(p, limit=len("one\ntwo é\n".encode())) == "one\ntwo é\n".encode()
    p.write_bytes(b"fine\nstill fine\nbad \xff here\n")
    with pytest.raises(UserError, match=r"t.txt line 3: not UTF-8 text \(byte 0xff\)"):
        read_text(p)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(UserError, match=r"fifo: text file is a FIFO \(named pipe\), not a "
                                        r"regular file"):
        read_text(tmp_path / "fifo", "text file")
    with pytest.raises(UserError, match=r"/dev/zero: file is a device, not a regular file"):
        read_bytes("/dev/zero")
    with pytest.raises(UserError, match=r"nope: list file not found"):
        read_text(tmp_path / "nope", "list file")


def test_data_tools_refuse_fifos_and_devices(tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    (tmp_path / "t.txt").write_text("a b c\na b\n")
    (tmp_path / "lm.arpa").write_text(
        "\\data\\\nngram 1=3\n\n\\1-grams:\n-99\t<s>\n-0.5\t</s>\n-0.5\t<unk>\n\n\\end\\\n")
    out = tmp_path / "out"
    kd = tmp_path / "kaldi"
    kd.mkdir()
    (kd / "wav.scp").write_text(f"u1 {fifo}\n")
    (kd / "text").write_text("u1 yes\n")
    kt = tmp_path / "kaldi_text_fifo"
    kt.mkdir()
    (kt / "wav.scp").write_text(f"u1 {tmp_path / 'a.wav'}\n")
    os.mkfifo(kt / "text")
    cases = {  # case → (command line, what the one line must say)
        "ngram text FIFO": (["ngram", fifo, "--out", out], f"{fifo}: text file is a FIFO"),
        "ngram /dev/zero": (["ngram", "/dev/zero", "--out", out],
                            "/dev/zero: text file is a device"),
        "perplexity text FIFO": (["perplexity", tmp_path / "lm.arpa", fifo],
                                 f"{fifo}: text file is a FIFO"),
        "faker-text --exclude FIFO": (["faker-text", "--out", out, "--count", "3",
                                       "--exclude", fifo], f"{fifo}: list file is a FIFO"),
        "render-lines --text FIFO": (["render-lines", "--out", out, "--count", "1",
                                      "--text", fifo], f"{fifo}: --text file is a FIFO"),
        "rnnlib-config FIFO": (["rnnlib-config", fifo], f"{fifo}: RNNLIB config is a FIFO"),
        "audio --list FIFO": (["audio", "--list", fifo, "--out", out],
                              f"{fifo}: list file is a FIFO"),
        "images --list /dev/zero": (["images", "--list", "/dev/zero", "--out", out],
                                    "/dev/zero: list file is a device"),
        # issue 31: this said "file not found"
        "kaldi wav.scp names a FIFO": (["kaldi", kd, "--out", out],
                                       f"{kd / 'wav.scp'} line 1 (utterance 'u1'): {fifo}: "
                                       f"file is a FIFO (named pipe), not a regular file"),
        "kaldi text is a FIFO": (["kaldi", kt, "--out", out],
                                 f"{kt / 'text'}: Kaldi table is a FIFO"),
    }
    results = run_cli_batch([("data_tools", *map(str, argv)) for argv, _ in cases.values()],
                            timeout=120)
    for (name, (argv, want)), r in zip(cases.items(), results):
        line = _one_line(r)
        assert want in line, (name, line)
    assert not out.exists()
