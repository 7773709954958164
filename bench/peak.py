"""The CPU's own fp32 peak and the ISA the BLAS in use runs: the yardstick ``bench flops``
reports every throughput against.

- measured: a tight FMA loop on one core (``fma_loop_gflops``: a small C program compiled
  with the system's C compiler at bench time, 12 independent accumulators, at each vector
  width the CPU has); and ``torch.mm`` at its best square shape, best of many short
  repetitions (a busy machine preempts long ones).
- theoretical: FMA pipes x lanes x 2 x clock, the clock and the features from
  /proc/cpuinfo (``CpuInfo``, ``theoretical_gflops``). The pipe count is not in the flags:
  it is taken from the CPU family (``fma_datapath``), and the clock /proc/cpuinfo shows is
  the nominal one (boost clocks run higher), so the measured loop is the yardstick.
- which ISA the libraries dispatch: MKL's and oneDNN's verbose lines from a subprocess
  that runs a matmul and an LSTM step in fp32 and bf16 (``dispatch``, parsed by
  ``parse_verbose``).

Run alone: ``python -m bench.peak``.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

FMA_C = r"""
/* fp32 FMA throughput of one core: ACC independent accumulators c = c * a + b. */
#include <immintrin.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#if WIDTH == 512
typedef __m512 V;
#define SET1 _mm512_set1_ps
#define FMA _mm512_fmadd_ps
#define LANES 16
#else
typedef __m256 V;
#define SET1 _mm256_set1_ps
#define FMA _mm256_fmadd_ps
#define LANES 8
#endif
static double now(void) {
    struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec;
}
int main(int argc, char **argv) {
    long iters = atol(argv[1]);
    int reps = atoi(argv[2]);
    float a0 = (float)atof(argv[3]), b0 = (float)atof(argv[4]);
    V a = SET1(a0), b = SET1(b0);
    V c0 = SET1(0), c1 = SET1(1), c2 = SET1(2), c3 = SET1(3), c4 = SET1(4), c5 = SET1(5);
    V c6 = SET1(6), c7 = SET1(7), c8 = SET1(8), c9 = SET1(9), c10 = SET1(10), c11 = SET1(11);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (long k = 0; k < iters; k++) {
            c0 = FMA(c0, a, b); c1 = FMA(c1, a, b); c2 = FMA(c2, a, b); c3 = FMA(c3, a, b);
            c4 = FMA(c4, a, b); c5 = FMA(c5, a, b); c6 = FMA(c6, a, b); c7 = FMA(c7, a, b);
            c8 = FMA(c8, a, b); c9 = FMA(c9, a, b); c10 = FMA(c10, a, b); c11 = FMA(c11, a, b);
        }
        double t = now() - t0;
        if (t < best) best = t;
    }
    V all[12] = {c0, c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11};
    printf("%.6f", 2.0 * LANES * 12 * (double)iters / best / 1e9);
    for (int i = 0; i < 12; i++) {
        float o[LANES]; __builtin_memcpy(o, &all[i], sizeof o); printf(" %.9g", o[0]);
    }
    printf("\n");
    return 0;
}
"""

ACCUMULATORS = 12  # enough independent chains to cover FMA latency x pipes


@dataclass
class CpuInfo:
    """What /proc/cpuinfo says about the first CPU."""
    model: str = "unknown CPU"
    vendor: str = ""
    family: int = -1
    mhz: float = 0.0          # the clock shown (nominal on most VMs; boost runs higher)
    flags: set = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> "CpuInfo":
        info, seen = cls(), set()
        for line in text.splitlines():
            key, _, value = (s.strip() for s in line.partition(":"))
            if key in seen:
                continue  # the first processor's entry only
            seen.add(key)
            if key == "model name":
                info.model = value
            elif key == "vendor_id":
                info.vendor = value
            elif key == "cpu family" and value.isdigit():
                info.family = int(value)
            elif key == "cpu MHz":
                try:
                    info.mhz = float(value)
                except ValueError:
                    pass
            elif key == "flags":
                info.flags = set(value.split())
        return info

    @classmethod
    def read(cls) -> "CpuInfo":
        try:
            return cls.parse(Path("/proc/cpuinfo").read_text())
        except OSError:
            return cls()

    def widths(self) -> list[int]:
        """The fp32 FMA vector widths (bits) the CPU has, widest first."""
        return ([512] if "avx512f" in self.flags else []) + \
            ([256] if "fma" in self.flags and "avx" in self.flags else [])


def fma_datapath(info: CpuInfo) -> tuple[int, int, str]:
    """(FMA pipes per core, bits each, why) as the CPU family implies: the flags alone do
    not say how wide the FMA units are. AMD family 25 with AVX-512 (Zen 4) runs 512-bit
    operations through two 256-bit pipes; family 26 (Zen 5; server parts) has two 512-bit
    pipes; Intel with AVX-512 server parts two 512-bit ones; AVX2 CPUs two 256-bit ones."""
    if "avx512f" in info.flags:
        if info.vendor == "AuthenticAMD" and info.family < 26:
            return 2, 256, "AMD family 25 (Zen 4): 2 x 256-bit FMA pipes, 512-bit ops take both"
        return 2, 512, "2 x 512-bit FMA pipes (Zen 5 / Xeon server parts)"
    if "fma" in info.flags:
        return 2, 256, "2 x 256-bit FMA pipes (AVX2)"
    return 0, 0, "no FMA instructions"


def theoretical_gflops(info: CpuInfo, cores: int = 1) -> float:
    """cores x FMA pipes x fp32 lanes x 2 FLOPs x the /proc/cpuinfo clock, GFLOP/s."""
    pipes, bits, _ = fma_datapath(info)
    return cores * pipes * (bits // 32) * 2 * info.mhz / 1e3


def compile_fma_loop(width: int, folder: Path) -> Path | None:
    """The FMA loop built for ``width`` bits in ``folder``; None without a C compiler
    (or one that cannot target the width)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return None
    src, exe = folder / "fma.c", folder / f"fma{width}"
    src.write_text(FMA_C)
    arch = ["-mavx512f", "-mfma"] if width == 512 else ["-mavx2", "-mfma"]
    r = subprocess.run([cc, "-O2", *arch, f"-DWIDTH={width}", str(src), "-o", str(exe)],
                       capture_output=True, text=True)
    return exe if r.returncode == 0 else None


def run_fma_loop(exe: Path, iters: int, reps: int, a: float = 0.999999, b: float = 1e-7
                 ) -> tuple[float, list[float]]:
    """→ (GFLOP/s of the best repetition, the 12 accumulators' final lane-0 values). The
    accumulators start at 0..11 and each takes ``iters x reps`` steps c = c * a + b."""
    out = subprocess.run([str(exe), str(iters), str(reps), repr(a), repr(b)],
                         capture_output=True, text=True, check=True).stdout.split()
    return float(out[0]), [float(v) for v in out[1:]]


def fma_loop_gflops(widths: list[int], iters: int = 200_000, reps: int = 200
                    ) -> dict[int, float]:
    """One core's fp32 FMA rate per vector width, best of ``reps`` short repetitions
    (each about a millisecond: a busy machine preempts long ones); {} without a C
    compiler."""
    got = {}
    with tempfile.TemporaryDirectory() as d:
        for w in widths:
            exe = compile_fma_loop(w, Path(d))
            if exe is not None:
                got[w] = run_fma_loop(exe, iters, reps)[0]
    return got


def mm_best_gflops(sizes=(256, 384, 512, 768, 1024), reps: int = 40, threads: int = 1,
                   dtype=None) -> tuple[float, int]:
    """→ (GFLOP/s, n): ``torch.mm`` of n x n matrices at its best ``n``, best of ``reps``."""
    import torch
    dtype = dtype or torch.float32
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        best = (0.0, 0)
        for n in sizes:
            g = torch.Generator().manual_seed(0)
            a, b = (torch.randn(n, n, generator=g).to(dtype) for _ in range(2))
            c = torch.empty(n, n, dtype=dtype)
            torch.mm(a, b, out=c)
            t = float("inf")
            for _ in range(reps):
                t0 = time.perf_counter()
                torch.mm(a, b, out=c)
                t = min(t, time.perf_counter() - t0)
            best = max(best, (2.0 * n ** 3 / t / 1e9, n))
        return best
    finally:
        torch.set_num_threads(old)


_PROBE = """
import torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
torch.mm(a, a)
m = torch.nn.LSTM(40, 256, bidirectional=True)
x = torch.randn(50, 8, 40)
m(x)[0].sum().backward()
if torch.ops.mkldnn._is_mkldnn_bf16_supported():  # no bf16 LSTM on an AVX2-only CPU
    torch.mm(a.bfloat16(), a.bfloat16())
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = m(x)[0]
    y.float().sum().backward()
"""


def parse_verbose(text: str) -> dict:
    """MKL_VERBOSE / ONEDNN_VERBOSE output → {"mkl": MKL's banner (it names the code path
    on Intel CPUs; on others only "Intel(R) Architecture processors"), "onednn_isa": the
    ISA oneDNN runs, "impl": {"<primitive> <prop_kind> <src dtype>": implementation}, e.g.
    "rnn forward_training f32": "ref", "matmul forward bf16": "brg_matmul:avx512_core_bf16"}.
    Missing parts are "" / absent."""
    out = {"mkl": "", "onednn_isa": "", "impl": {}}
    for line in text.splitlines():
        if line.startswith("MKL_VERBOSE") and not out["mkl"] and "GEMM(" not in line:
            out["mkl"] = line[len("MKL_VERBOSE"):].strip()
        if not line.startswith("onednn_verbose"):
            continue
        parts = line.split(",")
        if "info" in parts[:4] and any(p.startswith("isa:") for p in parts):
            out["onednn_isa"] = next(p for p in parts if p.startswith("isa:"))[4:]
        elif "exec" in parts and "cpu" in parts:
            i = parts.index("cpu")
            prim, impl, prop = parts[i + 1], parts[i + 2], parts[i + 3]
            if prim == "reorder":
                continue
            dt = re.search(r"src(?:_layer)?:(\w+):", line)
            prop = "forward" if prop in ("undef", "forward_inference") else prop
            out["impl"].setdefault(f"{prim} {prop} {dt.group(1) if dt else '?'}", impl)
    return out


def dispatch(timeout: float = 120) -> dict:
    """``parse_verbose`` of a subprocess that runs a matmul and a BLSTM step (the reference
    model's layer width) in fp32 and bf16 with MKL_VERBOSE=1 and ONEDNN_VERBOSE=1."""
    env = dict(os.environ, MKL_VERBOSE="1", ONEDNN_VERBOSE="1")
    r = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True,
                       env=env, timeout=timeout)
    return parse_verbose(r.stdout + r.stderr)


def describe_dispatch(d: dict) -> str:
    mkl = d["mkl"] or "no MKL banner"
    impl = "; ".join(f"{k}: {v}" for k, v in sorted(d["impl"].items())) or "none seen"
    return f"MKL: {mkl}. oneDNN ISA: {d['onednn_isa'] or 'unknown'}; implementations: {impl}"


if __name__ == "__main__":
    info = CpuInfo.read()
    print(info.model, info.vendor, "family", info.family, f"{info.mhz:.0f} MHz")
    print("FMA datapath:", fma_datapath(info)[2],
          f"-> theoretical {theoretical_gflops(info):.1f} GFLOP/s per core")
    print("FMA loop:", {w: round(g, 1) for w, g in fma_loop_gflops(info.widths()).items()})
    print("torch.mm best: %.1f GFLOP/s at n=%d" % mm_best_gflops())
    print(describe_dispatch(dispatch()))
