"""The host CPU as a device: probed on first use, cached per machine, a `Device` of kind "cpu" out.

Read off the machine ("detected"): cores OpenMP runs on, cache sizes, memory, the SIMD width the C compiler
targets. Timed ("measured", by a small C probe built like the C backend's kernels): STREAM-triad bandwidth
from DRAM, from the last-level cache and from L1, the FMA peak of all cores, the cost of a launch and
of a grid barrier in the loops the kernels run (flags.c_loops: the C header's thread pool — a kernel with
one pooled loop called from Python, one more pooled loop — or OpenMP's: a serial kernel's call, an OpenMP
barrier). The figures map onto the Device fields as the C target runs a plan: an SM is a core running one
block (one tile loop iteration) at a time, shared memory is a block's stack arrays (sized by the core's
private cache), "L2" is the last-level cache, a grid barrier is the end of one parallel tile loop.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import re
import time
from pathlib import Path

from engine.device import Device, KiB, MiB
from engine.errors import DeviceError
from engine.files import write_atomic

HOST = "host"
PROBE_VERSION = 9  # 4: launch and grid barrier of the loop runtime the kernels use (flags.c_loops);
#                   5: each timed figure the best of PROBE_PASSES passes; 7: the pool's figures timed before
#                   the OpenMP triads of a pass (6 was a launch figure timed from C, tried and reverted);
#                   8: the GEMM peak of the micro-kernel in named vectors where a chunk spans several (AVX2);
#                   9: vector FMAs as the x86 builtin (C0_VFMAn), and a plain-arithmetic rate (plain_flops)
_CPU_ONLY = ("kind", "vector_lanes")

# The probe: every timing takes the best of several repeats (the machine is shared; the best is the
# machine's figure, the rest is someone else's load). Bytes are STREAM's count: a triad reads two arrays
# and writes one.
_PROBE_C = r"""
#include <omp.h>
#include <stdlib.h>
/* TW_LANES: fp32 lanes of the widest vector registers the C kernels are compiled for, passed in as
   -DTW_LANES=... from ccompile.compiler_lanes (one rule for the probe and the kernels). */
typedef float vf __attribute__((vector_size(TW_LANES * 4)));

int tw_lanes(void) { return TW_LANES; }
int tw_threads(void) { return omp_get_max_threads(); }

/* Seconds of the best of `reps` triads a = b + s*c over n floats per thread-shared array (`copy`: copies
   a = b, one array read and one written), or each thread on its own slice of n/threads (`private_`: an
   L1-sized working set per core). */
double tw_triad(long n, int reps, int copy) {
    float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4), *c = aligned_alloc(64, n * 4);
    #pragma omp parallel for schedule(static)
    for (long i = 0; i < n; ++i) { a[i] = 0.f; b[i] = (float)(i & 7); c[i] = 1.f; }
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        double t0 = omp_get_wtime();
        if (copy) {
            #pragma omp parallel for schedule(static)
            for (long i = 0; i < n; ++i) a[i] = b[i];
        } else {
            #pragma omp parallel for schedule(static)
            for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
        }
        double t = omp_get_wtime() - t0;
        if (t < best) best = t;
    }
    volatile float sink = a[n / 2]; (void)sink;
    free(a); free(b); free(c);
    return best;
}

/* Each thread repeats a triad over its own n floats `inner` times per timed rep: a cache-resident
   working set, so the figure is that cache's bandwidth and not the fork's. */
double tw_triad_private(long n, int inner, int reps) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        double t = 0;
        #pragma omp parallel reduction(max: t)
        {
            float *a = aligned_alloc(64, n * 4), *b = aligned_alloc(64, n * 4), *c = aligned_alloc(64, n * 4);
            for (long i = 0; i < n; ++i) { a[i] = 0.f; b[i] = (float)(i & 7); c[i] = 1.f; }
            #pragma omp barrier
            double t0 = omp_get_wtime();
            for (int k = 0; k < inner; ++k) {
                for (long i = 0; i < n; ++i) a[i] = b[i] + 0.5f * c[i];
                __asm__ volatile("" : : "r"(a) : "memory");
            }
            t = omp_get_wtime() - t0;
            volatile float sink = a[n / 2]; (void)sink;
            free(a); free(b); free(c);
        }
        if (t < best) best = t;
    }
    return best;
}

/* Seconds for `iters` steps of 12 independent vector FMA chains on every thread (the FMA peak: enough
   chains to cover the FMA latency times the FMA ports). */
double tw_fma(long iters, int reps, float *out) {
    double best = 1e30;
    for (int r = 0; r < reps; ++r) {
        double t = 0;
        #pragma omp parallel reduction(max: t)
        {
            /* Distinct starting values: twelve equal chains would be one chain after CSE. */
            vf x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, m, s;
            for (int l = 0; l < TW_LANES; ++l) {
                float v = (float)(omp_get_thread_num() + l + 1) * 1e-3f;
                x0[l] = v; x1[l] = 2 * v; x2[l] = 3 * v; x3[l] = 4 * v; x4[l] = 5 * v; x5[l] = 6 * v;
                x6[l] = 7 * v; x7[l] = 8 * v; x8[l] = 9 * v; x9[l] = 10 * v; x10[l] = 11 * v; x11[l] = 12 * v;
                m[l] = 0.999999f; s[l] = 1e-7f * (l + 1);
            }
            #pragma omp barrier
            double t0 = omp_get_wtime();
            for (long i = 0; i < iters; ++i) {
                x0 = x0 * m + s; x1 = x1 * m + s; x2 = x2 * m + s; x3 = x3 * m + s;
                x4 = x4 * m + s; x5 = x5 * m + s; x6 = x6 * m + s; x7 = x7 * m + s;
                x8 = x8 * m + s; x9 = x9 * m + s; x10 = x10 * m + s; x11 = x11 * m + s;
            }
            t = omp_get_wtime() - t0;
            vf all = x0 + x1 + x2 + x3 + x4 + x5 + x6 + x7 + x8 + x9 + x10 + x11;
            float sum = 0.f;
            for (int l = 0; l < TW_LANES; ++l) sum += all[l];
            out[omp_get_thread_num()] += sum;  /* used, so the chains are computed */
        }
        if (t < best) best = t;
    }
    return best;
}

/* One launch of a generated kernel too small to fork threads for (the C printer runs it serially). */
void tw_empty_launch(float *out) { out[0] += 1.f; }

/* The C backend's thread pool (tw_parallel_for, from the kernels' C header): its threads, and one
   launch of a kernel with one pooled loop of a tile per thread (each adds to its own float). */
void tw_pool_use_threads(int threads) { tw_pool_threads_wanted = threads; }
static void tw_probe_tiles(void* args, int t0, int t1) {
    float* out = args;
    for (int t = t0; t < t1; ++t) out[16 * t] += 1.f;
}
void tw_pool_launch(float *out) { tw_parallel_for(omp_get_max_threads(), 1, tw_probe_tiles, out); }

/* A grid barrier of the C target (one pooled loop's end, the next one's start): seconds a pooled loop
   of 8 tiles per thread, each ~1 us of work, takes beyond its work split evenly over the threads (the
   same tiles run serially, divided by the threads): waking or reaching the workers, claims, and waiting
   for the last chunk a worker claimed. Best of up to `reps` runs of `n` loops within `budget` seconds. */
static void tw_probe_work(void* args, int t0, int t1) {
    float* out = args;
    for (int t = t0; t < t1; ++t) {
        float v = out[16 * t];
        for (int k = 0; k < 400; ++k) v = v * 0.999f + 1e-3f;  /* a dependent chain: ~1 us */
        out[16 * t] = v;
    }
}
double tw_pool_barrier(int n, int reps, double budget, float *out) {
    const int threads = omp_get_max_threads(), tiles = 8 * threads;
    double pooled = 1e30, serial = 1e30, start = omp_get_wtime();
    for (int r = 0; r < reps && (r == 0 || omp_get_wtime() - start < budget); ++r) {
        double t0 = omp_get_wtime();
        for (int k = 0; k < n; ++k) tw_parallel_for(tiles, 1, tw_probe_work, out);
        double t1 = omp_get_wtime();
        for (int k = 0; k < n; ++k) tw_probe_work(out, 0, tiles);
        double t2 = omp_get_wtime();
        if ((t1 - t0) / n < pooled) pooled = (t1 - t0) / n;
        if ((t2 - t1) / n < serial) serial = (t2 - t1) / n;
    }
    return pooled > serial / threads ? pooled - serial / threads : 0.0;
}

/* Seconds per OpenMP barrier among all threads (best of up to `reps` runs of `n` barriers, stopping once
   `budget` seconds are spent: on a machine busy with other work one barrier can wait a whole time slice). */
double tw_barrier(int n, int reps, double budget) {
    double best = 1e30, start = omp_get_wtime();
    for (int r = 0; r < reps && (r == 0 || omp_get_wtime() - start < budget); ++r) {
        double t0 = omp_get_wtime();
        #pragma omp parallel
        for (int k = 0; k < n; ++k) {
            #pragma omp barrier
        }
        double t = (omp_get_wtime() - t0) / n;
        if (t < best) best = t;
    }
    return best;
}
"""
_PROBE_OPTIONS_EXTRA = ("-ffp-contract=fast",)  # the FMA chains must fuse: the peak is an FMA peak


def host_threads() -> int:
    """The threads the C backend's OpenMP loops run on: OMP_NUM_THREADS when set, else the cores this
    process may run on."""
    value = os.environ.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise DeviceError(f"OMP_NUM_THREADS='{value}' is not a thread count",
                              hint="set it to a positive integer or unset it") from None
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)B?", text.strip(), re.IGNORECASE)
    if not m:
        return 0
    return int(m.group(1)) * {"": 1, "K": KiB, "M": MiB, "G": KiB * MiB}[m.group(2).upper()]


def cache_sizes() -> dict[int, int]:
    """Data/unified cache bytes per level as the OS reports them for cpu0 (level -> bytes; the last level
    is shared, the others private to a core)."""
    out: dict[int, int] = {}
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        if _read(index / "type") == "Instruction":
            continue
        level, size = _read(index / "level"), _size(_read(index / "size"))
        if level.isdigit() and size:
            out[int(level)] = size
    return out


def _cpuinfo() -> tuple[str, float]:
    """(model name, MHz) from /proc/cpuinfo, ("", 0.0) where it does not say."""
    text = _read(Path("/proc/cpuinfo"))
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.MULTILINE)
    mhz = re.search(r"^cpu MHz\s*:\s*([\d.]+)", text, re.MULTILINE)
    return (name.group(1).strip() if name else ""), (float(mhz.group(1)) if mhz else 0.0)


def _memory_bytes() -> int:
    m = re.search(r"^MemTotal:\s*(\d+) kB", _read(Path("/proc/meminfo")), re.MULTILINE)
    if m:
        return int(m.group(1)) * KiB
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _fingerprint(threads: int) -> str:
    from engine.codegen.ccompile import _compiler_version, _host_fingerprint, find_compiler
    from engine.flags import c_loops

    parts = [PROBE_VERSION, _host_fingerprint(), threads, _compiler_version(tuple(find_compiler())), c_loops()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def cache_path(threads: int | None = None) -> Path:
    """Where this machine's probed figures are kept (one file per CPU, thread count and compiler)."""
    from engine.flags import cache_dir

    threads = host_threads() if threads is None else threads
    return cache_dir() / "host" / f"host-{threads}t-{_fingerprint(threads)}.json"


def host_device(*, refresh: bool = False) -> Device:
    """The host CPU as a Device: the cached figures for this machine, or probed now (a few seconds)
    and cached. `refresh` probes again."""
    threads = host_threads()
    path = cache_path(threads)
    if not refresh:
        hit = _LOADED.get(path)
        if hit is not None:
            return hit
        if path.exists():
            try:
                hit = _LOADED[path] = Device.from_json(path.read_text())
                return hit
            except (DeviceError, OSError):
                pass  # a damaged or older cache file: probe again and replace it
    busy = _busy_before_probe()
    device = _LOADED[path] = probe_host(threads)
    import sys

    if busy and sys.stderr.isatty():
        # The figures are kept for every later plan: tell the user at the terminal when they were taken on
        # a busy machine (to a terminal only: scripts and test runs parse stderr for one-line errors).
        print(f"warning: host figures measured while {busy} (kept in {path}); rerun `tileweave device host "
              "--refresh` on a quiet machine for figures plans can trust", file=sys.stderr)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, device.to_json().encode())
    return device


def _busy_before_probe() -> str:
    """"" or why the machine is too busy for a probe to be trusted: the 1-minute load average at or over
    half the CPUs (other work then shares the cores the probe times: on the 2-core development machine one
    cached 2-thread probe read a per-element rate 13-15x under the machine's other 2-thread probes)."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return ""
    cpus = os.cpu_count() or 1
    return f"the load average was {load:.1f} on {cpus} CPUs" if load >= max(1.0, cpus / 2) else ""


_LOADED: dict[Path, Device] = {}  # this process's copy of each cache file it read or wrote


def _probe_library(threads: int):
    """The probe's C library, built for this machine, its functions typed; OpenMP and the pool set to `threads`."""
    from engine.codegen.ccompile import compile_c, compiler_lanes, default_options, load_library
    from engine.codegen.targets import C_HEADER

    options = default_options() + _PROBE_OPTIONS_EXTRA + (f"-DTW_LANES={compiler_lanes()}",)
    lib = load_library(compile_c(C_HEADER + _PROBE_C, name="host_probe", options=options))
    lib.tw_triad.restype = lib.tw_triad_private.restype = lib.tw_fma.restype = lib.tw_barrier.restype = ctypes.c_double
    lib.tw_triad.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    lib.tw_triad_private.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_int]
    lib.tw_fma.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_void_p]
    lib.tw_barrier.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double]
    lib.tw_empty_launch.argtypes = lib.tw_pool_launch.argtypes = [ctypes.c_void_p]
    lib.tw_empty_launch.restype = lib.tw_pool_launch.restype = None
    lib.tw_pool_barrier.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_double, ctypes.c_void_p]
    lib.tw_pool_barrier.restype = ctypes.c_double
    _set_threads(threads)
    lib.tw_pool_use_threads(threads)
    return lib


def _levels() -> tuple[int, int, int]:
    """(L1, the largest cache a core has to itself, the last-level cache) in bytes, as the OS reports them."""
    caches = cache_sizes()
    levels = sorted(caches)
    l1 = caches.get(1, 32 * KiB)
    private = caches.get(2, l1) if len(levels) > 2 else l1
    return l1, private, caches[levels[-1]] if levels else 8 * MiB


def _dram_floats(llc: int) -> int:
    """Floats per array of a DRAM-sized triad or copy: 4x the last-level cache in bytes (STREAM's rule)."""
    return max(1 << 22, 4 * llc // 4)


def measure_bandwidths(threads: int | None = None, passes: int | None = None) -> dict[str, float]:
    """The probe's bandwidths (bytes/s) measured now, each the best of `passes` passes PROBE_GAP_S apart:
    "dram_bw" (the triad by STREAM's rule: three arrays of 4x the last-level cache), "copy_bw" (a copy between
    two such arrays) and "llc_bw" (the triad over three arrays filling half of it) — for a benchmark to hold
    kernels against the machine as it is during its run, not as it was when the cached figures were probed.
    `passes`: PROBE_PASSES by default."""
    threads = threads or host_threads()
    lib = _probe_library(threads)
    l1, _, llc = _levels()
    n_dram = _dram_floats(llc)
    best: dict[str, float] = {}
    for j in range(max(1, passes or PROBE_PASSES)):
        if j:
            time.sleep(PROBE_GAP_S)
        got = _timed_figures(lib, threads, l1, llc, int(lib.tw_lanes()))
        got["copy_bw"] = 2 * 4 * n_dram / lib.tw_triad(n_dram, 5, 1)
        for key in ("dram_bw", "copy_bw", "llc_bw"):
            best[key] = max(best.get(key, 0.0), got[key])
    return best


def probe_host(threads: int) -> Device:
    """Probe the machine now (see the module docstring); OpenMP runs on `threads` threads."""
    lib = _probe_library(threads)
    l1, private, llc = _levels()
    lanes = int(lib.tw_lanes())
    name, mhz = _cpuinfo()

    figures = {}
    for j in range(PROBE_PASSES):  # each figure the best over passes a moment apart (see PROBE_PASSES)
        if j:
            time.sleep(PROBE_GAP_S)
        for key, value in _timed_figures(lib, threads, l1, llc, lanes).items():
            best = max if key.endswith("_bw") or key == "peak" else min
            figures[key] = best(figures.get(key, value), value)
    dram_bw, llc_bw, l1_bw, peak = figures["dram_bw"], figures["llc_bw"], figures["l1_bw"], figures["peak"]
    launch, barrier = figures["launch"], figures["barrier"]

    values = dict(
        name=HOST, kind="cpu", vector_lanes=lanes,
        sm_count=threads, warp_size=32, max_threads_per_block=1024, max_threads_per_sm=1024,
        max_blocks_per_sm=1, regs_per_sm=255 * 1024, max_regs_per_thread=255,
        smem_per_sm_bytes=private, max_smem_per_block_bytes=private, default_smem_per_block_bytes=private,
        reserved_smem_per_block_bytes=0, l2_bytes=llc, memory_bytes=_memory_bytes(),
        clock_hz=mhz * 1e6 if mhz else 1e9, dram_bw_bytes_per_s=dram_bw, l2_bw_bytes_per_s=max(llc_bw, dram_bw),
        smem_bw_bytes_per_s=max(l1_bw, llc_bw), peak_fp32_flops=peak, peak_fp16_tensor_flops=peak,
        launch_overhead_s=launch, grid_barrier_s=barrier, compute_capability=(0, 0), nvrtc_arch="sm_80",
    )
    detected = ("description", "sm_count", "warp_size", "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm",
                "regs_per_sm", "max_regs_per_thread", "smem_per_sm_bytes", "max_smem_per_block_bytes",
                "default_smem_per_block_bytes", "reserved_smem_per_block_bytes", "l2_bytes", "memory_bytes",
                "clock_hz", "compute_capability", "vector_lanes", "kind")
    values["source"] = {k: "detected" if k in detected else "measured" for k in values if k not in ("name", "nvrtc_arch")}
    values["source"]["clock_hz"] = "detected" if mhz else "estimate"
    values["description"] = f"{name or 'CPU'}, {threads} OpenMP thread{'s' if threads > 1 else ''}, {lanes} fp32 lanes"
    provisional = Device.from_dict(values, where="host probe")
    gemm, elementwise, plain = _codegen_rates(provisional)
    fma = values["peak_fp32_flops"]
    values |= {"peak_fp32_flops": gemm, "peak_fp16_tensor_flops": gemm, "elementwise_flops": elementwise,
               "plain_flops": plain}
    values["source"] |= {"elementwise_flops": "measured", "plain_flops": "measured"}
    values["description"] += f", FMA peak {fma / 1e9:.0f} GFLOP/s"
    return Device.from_dict(values, where="host probe")


PROBE_PASSES = 3  # the timed figures are taken this many times, PROBE_GAP_S apart, each kept at its best:
PROBE_GAP_S = 0.3  # within one pass every timing is already a best of several repeats, but interference that
#                    lasts seconds (another tenant of the VM's host) holds through them — one cached 1-thread
#                    probe on the development VM read the last-level cache at 31 GB/s where the next two read 68
#                    and 80 (2026-11-27), and the cached figures price every later plan


def _timed_figures(lib, threads: int, l1: int, llc: int, lanes: int) -> dict[str, float]:
    """One pass of the probe's timings: triad bandwidths (bytes/s) from DRAM, the last-level cache and L1,
    the FMA peak (FLOP/s), and seconds per launch and per grid barrier."""
    from engine.flags import c_loops

    # What a launch and a grid barrier cost in the loops the kernels run (flags.c_loops): the pool's
    # (a launch: a kernel with one pooled loop, called from Python; a barrier: one more pooled loop), or
    # OpenMP's (a serial kernel's call; an OpenMP barrier). Timed first, a pass being PROBE_GAP_S after the
    # last: right after the OpenMP triads below, OpenMP's own threads still spin for a while and the pool's
    # threads share the cores with them — a pooled loop's end then measured ~3 us against ~0.4 us (this VM,
    # 2 threads), and one such probe priced every grid barrier of every later plan at that.
    if c_loops() == "pool":
        out = (ctypes.c_float * (16 * 8 * max(threads, 1)))()
        barrier = lib.tw_pool_barrier(50, 20, 0.3, out)
        launch = _time_launch(lib.tw_pool_launch)
    else:
        barrier = lib.tw_barrier(200, 20, 0.3)
        launch = _time_launch(lib.tw_empty_launch)
    # DRAM: three arrays of 4x the last-level cache each (STREAM's rule); LLC: three arrays filling half of
    # it (over all threads); L1: each thread's three arrays filling half its L1, repeated.
    n_dram = _dram_floats(llc)
    dram_bw = 3 * 4 * n_dram / lib.tw_triad(n_dram, 5, 0)
    n_llc = max(1 << 12, llc // 2 // 12)
    llc_bw = 3 * 4 * n_llc / lib.tw_triad(n_llc, 40, 0)
    n_l1 = max(256, l1 // 2 // 12) // 16 * 16
    inner = max(1, (1 << 24) // n_l1)
    l1_bw = threads * 3 * 4 * n_l1 * inner / lib.tw_triad_private(n_l1, inner, 5)
    iters = 1 << 24
    sums = (ctypes.c_float * max(threads, 256))()
    peak = threads * 12 * 2 * lanes * iters / lib.tw_fma(iters, 5, sums)
    return {"dram_bw": dram_bw, "llc_bw": llc_bw, "l1_bw": l1_bw, "peak": peak, "launch": launch, "barrier": barrier}


def _codegen_rates(device: Device) -> tuple[float, float, float]:
    """FLOP/s of this machine running our own generated C, as the cost model counts and charges flops: a
    256^3 GEMM (its micro-tiles: the GEMM peak), a per-element chain of plain arithmetic (add, sub, mul,
    max: the plain rate) and one of the math models use (erf, sigmoid, tanh: the math rate, its few plain
    flops taken out at the plain rate), each the best of PROBE_PASSES timed runs PROBE_GAP_S apart."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from engine.codegen.generate import generate
    from engine.frontend.importer import import_onnx, lower
    from engine.runtime.cpu import compile_program_c, run_cpu
    from engine.runtime.inputs import make_inputs
    from engine.schedule.pipeline import plan_model

    rng = np.random.default_rng(0)
    n = 256
    gemm = helper.make_graph(
        [helper.make_node("MatMul", ["a", "b"], ["y"])], "host_probe_gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [n, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [n, n])],
        [numpy_helper.from_array(rng.standard_normal((n, n)).astype(np.float32), "b")])
    chain = helper.make_graph(
        [helper.make_node("Erf", ["x"], ["a"]), helper.make_node("Mul", ["a", "x"], ["b"]),
         helper.make_node("Sigmoid", ["x"], ["c"]), helper.make_node("Add", ["b", "c"], ["d"]),
         helper.make_node("Tanh", ["d"], ["y"])], "host_probe_elementwise",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 4096])])
    # Plain: 24 dependent operations an element, so the chain, not the 2 MB it reads and writes, sets its time.
    ops, prev = [], "x"
    for k in range(24):
        op = ("Mul", "Add", "Sub", "Max")[k % 4]
        ops.append(helper.make_node(op, [prev, "x"], [f"p{k}" if k < 23 else "y"]))
        prev = f"p{k}"
    plain = helper.make_graph(
        ops, "host_probe_plain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 4096])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 4096])])
    rates, splits = [], []
    for g, policy in ((gemm, "unfused"), (plain, "elementwise"), (chain, "elementwise")):
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        graph = lower(import_onnx(model))
        graph, plan = plan_model(graph, policy, device)
        module = compile_program_c(generate(plan, graph, device, target="c"))
        flops = sum(gr.cost.flops for gr in plan.groups if gr.cost)
        inputs = make_inputs(graph, seed=0)
        best = math.inf
        for j in range(PROBE_PASSES):
            if j:
                time.sleep(PROBE_GAP_S)
            best = min(best, sum(k.us for k in run_cpu(module, graph.specs, inputs, graph.weights, repeat=5)[1].kernels))
        rates.append(flops / (best * 1e-6))
        splits.append((flops, _math_flops(graph, plan, device), best * 1e-6))
    flops, maths, seconds = splits[2]
    plain_rate = rates[1]
    left = seconds - (flops - maths) / plain_rate  # the math chain's time less its plain flops'
    return rates[0], maths / left if maths and left > 0 else rates[2], plain_rate


def _math_flops(graph, plan, device: Device) -> float:
    """Flops of math ops (E.OP_FLOPS) in `plan`'s kernels, as cost.estimate_group charges them."""
    from engine.schedule.cost import at_kernel_block, segment_use
    from engine.tilegraph.tilegraph import segments_of

    conns = {e.key: e.conn for e in plan.edges}
    total = 0.0
    for g in plan.groups:
        segs = segments_of(graph, g.stages, conns)
        for seg, tile in zip(segs, at_kernel_block(g.segments)):
            use = segment_use(graph, seg, conns, tile, None, True, device)
            total += use.flops_math * tile.blocks / max(1, tile.row_split)
    return total


def _set_threads(threads: int) -> None:
    """Make the probe's OpenMP run on `threads` threads (what the C backend's loops will use)."""
    try:
        libgomp = ctypes.CDLL("libgomp.so.1")
        libgomp.omp_set_num_threads(ctypes.c_int(threads))
    except OSError:
        pass


def _time_launch(fn) -> float:
    """Seconds one launch of a generated kernel (`fn`, taking one float pointer) costs from Python, timed
    as the CPU backend times a kernel (a clock read on each side of one ctypes call): the median of 2,000."""
    import statistics
    import time

    import numpy as np

    out = np.zeros(16 * 1024, np.float32)  # the pool launch's tiles write every 16th float
    ptr = out.ctypes.data
    samples = []
    for _ in range(2000):
        t0 = time.perf_counter()
        fn(ptr)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
