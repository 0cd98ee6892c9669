"""The C backend's thread pool (tw_parallel_for in engine/codegen/targets.py's C header): every tile of
every loop runs exactly once, with more threads than cores, from two Python threads at once, and a
multi-loop program run many times on random inputs matches onnxruntime (no timing asserted)."""

from __future__ import annotations

import ctypes
import dataclasses
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "codegen"))
from plans import policy_plan  # noqa: E402
from sample_io import SAMPLES, load_sample, random_feeds, rel_error  # noqa: E402

from engine.codegen.ccompile import compile_c, load_library  # noqa: E402
from engine.codegen.ctarget import for_c  # noqa: E402
from engine.codegen.generate import generate  # noqa: E402
from engine.codegen.targets import C_HEADER  # noqa: E402
from engine.runtime.cpu import compile_program_c, run_cpu  # noqa: E402

THREADS = 7  # more than this machine's cores: workers are descheduled mid-loop, and late

# Each loop: a random tile count and claim size (0: one even share per thread); every tile adds one to
# its counter, the caller then checks each counter is exactly one (a chunk run twice, a chunk not run,
# or a chunk not finished when tw_parallel_for returned all show) and clears them.
_CHECK_C = C_HEADER + r"""
static _Thread_local int tw_is_caller;
static atomic_long tw_by_workers;
static void tw_count(void* args, int t0, int t1) {
    int* counts = *(int**)args;
    for (int t = t0; t < t1; ++t) {
        for (volatile int spin = 0; spin < 300; ++spin) { }  /* a tile of work, so workers get chunks */
        counts[t] += 1;
    }
    if (!tw_is_caller) atomic_fetch_add(&tw_by_workers, t1 - t0);
}
void tw_use_threads(int threads) { tw_pool_threads_wanted = threads; }
int tw_pool_workers(void) { return tw_pool.nworkers; }
int tw_pool_asleep(void) { return atomic_load(&tw_pool.sleepers); }
long tw_tiles_by_workers(void) { return atomic_load(&tw_by_workers); }
int tw_check(int loops, unsigned seed, int cap) {
    int* counts = calloc((size_t)cap, sizeof(int));
    int bad = 0;
    tw_is_caller = 1;
    for (int l = 0; l < loops; ++l) {
        seed = seed * 1103515245u + 12345u;
        const int n = 1 + (int)((seed >> 8) % (unsigned)cap), chunk = (int)((seed >> 20) % 5u);
        tw_parallel_for(n, chunk, tw_count, &counts);
        for (int t = 0; t < n; ++t) { bad += counts[t] != 1; counts[t] = 0; }
    }
    free(counts);
    return bad;
}
"""


def test_every_tile_runs_once_per_loop_with_more_threads_than_cores(tmp_path):
    path = compile_c(_CHECK_C, name="pool_check")
    lib = load_library(path)
    lib.tw_check.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_int]
    lib.tw_use_threads(THREADS)
    rng = np.random.default_rng(7)
    assert lib.tw_check(20000, int(rng.integers(1 << 31)), 64) == 0
    assert lib.tw_pool_workers() == THREADS - 1  # the pool did start its workers (the caller is the 7th)
    lib.tw_tiles_by_workers.restype = ctypes.c_long
    assert lib.tw_tiles_by_workers() > 0  # and they ran chunks: the check covered their claims
    # Two Python threads at once (ctypes lets go of the GIL): one runs on the pool, the other on its own.
    bad: list[int] = []
    callers = [threading.Thread(target=lambda s=s: bad.append(lib.tw_check(5000, s, 300))) for s in (11, 12, 13)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert bad == [0, 0, 0]
    # The library loaded twice (a copy at another path: its own pool, hidden symbols), both at once.
    twin = load_library(shutil.copy(path, tmp_path / "twin.so"))
    twin.tw_check.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_int]
    twin.tw_use_threads(3)
    bad = []
    callers = [threading.Thread(target=lambda lib=lib, s=s: bad.append(lib.tw_check(5000, s, 100)))
               for lib, s in ((lib, 21), (twin, 22), (twin, 23))]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert bad == [0, 0, 0] and twin.tw_pool_workers() == 2


def test_idle_workers_yield_then_sleep(tmp_path):
    """After a loop a worker pauses, then yields its core for a bounded time (TW_POOL_YIELD_US), then
    sleeps on the futex: an idle program costs no CPU. Built with a 0.2 s yield phase, so the workers
    are seen awake (yielding) 5 ms after a loop — the pauses alone last ~0.1 ms — and asleep once it has
    passed."""
    lib = load_library(compile_c("#define TW_POOL_YIELD_US 200000\n" + _CHECK_C, name="pool_idle"))
    lib.tw_check.argtypes = [ctypes.c_int, ctypes.c_uint, ctypes.c_int]
    lib.tw_use_threads(3)
    assert lib.tw_check(200, 5, 64) == 0 and lib.tw_pool_workers() == 2
    time.sleep(0.005)
    assert lib.tw_pool_asleep() < 2  # 5 ms after the last loop: yielding, not both asleep
    deadline = time.monotonic() + 30
    while lib.tw_pool_asleep() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert lib.tw_pool_asleep() == 2
    assert lib.tw_check(200, 6, 64) == 0  # woken by the next loop


@pytest.mark.parametrize("loops", ["pool", "omp"])
def test_multi_loop_program_on_random_inputs_matches_onnxruntime(loops, monkeypatch):
    """vit_block's welder program (five kernels, seven parallel loops) with every guided loop claiming
    one tile at a time (the most claims, so the most races), run 40 times on one thread and 2 x 20
    times from two Python threads at once, on fresh random inputs each time."""
    monkeypatch.setenv("OMP_NUM_THREADS", str(THREADS))  # read by the pool when it starts
    monkeypatch.setenv("TILEWEAVE_C_LOOPS", loops)
    graph = load_sample("vit_block")[0]
    program = for_c(generate(policy_plan(graph, "welder"), graph))
    one = lambda s: dataclasses.replace(s, chunk=1) if s.omp == "guided" else s  # noqa: E731
    program = dataclasses.replace(program, kernels=tuple(
        dataclasses.replace(k, segments=tuple(one(s) for s in k.segments)) for k in program.kernels))
    assert sum(s.loops == loops for k in program.kernels for s in k.segments) >= 5
    module = compile_program_c(program)
    sess = ort.InferenceSession(str(SAMPLES / "vit_block.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    errors: list[float] = []

    def runs(seed: int, n: int) -> None:
        for k in range(n):
            feeds = random_feeds(graph, seed * 1000 + k)
            got, _ = run_cpu(module, graph.specs, feeds, graph.weights)
            want = dict(zip(names, sess.run(names, feeds)))
            errors.append(max(rel_error(got[o], want[o]) for o in names))

    runs(1, 40)
    callers = [threading.Thread(target=runs, args=(s, 20)) for s in (2, 3)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(errors) == 80 and max(errors) <= 1e-4, max(errors)


def test_a_bad_loop_runtime_is_one_line(monkeypatch):
    from engine.codegen.ctarget import schedule_segments
    from engine.errors import BackendError

    graph = load_sample("gelu_chain")[0]
    kernel = generate(policy_plan(graph, "welder"), graph).kernels[0]
    monkeypatch.setenv("TILEWEAVE_C_LOOPS", "threads")
    with pytest.raises(BackendError) as info:
        schedule_segments(kernel)
    assert "TILEWEAVE_C_LOOPS='threads'" in str(info.value) and "\n" not in str(info.value)
