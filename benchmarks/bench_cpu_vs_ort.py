"""CPU backend (generated C, OpenMP) vs onnxruntime on every sample, same thread count, both in one run.

`OMP_NUM_THREADS=2 GOMP_SPINCOUNT=10000 OPENBLAS_THREAD_TIMEOUT=4 .venv/bin/python benchmarks/bench_cpu_vs_ort.py
[--runs 20] [--samples a,b] [--no-library]` — the two settings make libgomp's and OpenBLAS's idle threads sleep
soon after a parallel region, so the library rows (OpenMP kernels and BLAS calls alternating) do not run with
each pool's spinning threads holding the cores the other needs.
Prints a Markdown table (median of --runs after warm-up) and the achieved bandwidth of the fused
memory-bound kernels against a STREAM-like copy measured in the same run. Whole-model samples get two
rows: the policy's generated kernels (contractions as generated tiled GEMM/conv code, what the CUDA path
runs) and the library mode (stitch policy, each lone contraction through NumPy BLAS, as AStitch leaves
GEMMs to cuBLAS), both against the same onnxruntime time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "engine" / "codegen"))
sys.path.insert(1, str(ROOT))  # this checkout's engine, before tests/ (whose engine/ is only test folders)
sys.path.append(str(ROOT / "tests"))  # sample_io imports support from there


def _median_us(fn, runs: int) -> float:
    fn()  # warm-up (page faults, OpenMP thread pool, BLAS)
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(samples)


def stream_copy_gbs(threads: int) -> float:
    """Bytes moved (read + write) per second by an OpenMP copy between two arrays of 4x the last-level cache,
    the best of the probe's reps (`host.measure_bandwidths`): the machine's ceiling."""
    from engine.host import measure_bandwidths

    return measure_bandwidths(threads, passes=1)["copy_bw"] / 1e9


def bench(name: str, policy: str, runs: int, threads: int, library: bool = False, ort_us: float | None = None) -> dict:
    """One sample under one policy, ours and onnxruntime timed in this process. With `library`, kernels
    that are one lone contraction run through NumPy BLAS (AStitch's split: the stitch policy leaves
    every GEMM/conv alone in its kernel); `ort_us` reuses onnxruntime's time from the previous row."""
    import onnxruntime as ort
    from plans import policy_plan
    from sample_io import SAMPLES, load_sample, rel_error

    from engine.codegen.generate import generate
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls, run_cpu

    graph, inputs, expected = load_sample(name)
    plan = policy_plan(graph, policy)
    program = generate(plan, graph, "a100", target="c")
    module = compile_program_c(program)
    library = graph.stage_map if library else None
    outs, _ = run_cpu(module, graph.specs, inputs, graph.weights, library=library)
    err = max(rel_error(outs[k], expected[k]) for k in expected)

    env = bind_buffers(program, graph.specs, inputs, graph.weights)
    from engine.runtime.cpu import _library_call

    calls = launch_calls(module, env, library)
    blas = sum(_library_call(program.kernel(launch.kernel), env, library) is not None
               for launch in program.launches) if library else 0

    def run_all():
        for c in calls:
            c()

    ours = _median_us(run_all, runs)
    if ort_us is not None:
        return {"name": name, "policy": policy, "kernels": len(program.kernels), "ours_us": ours, "ort_us": ort_us,
                "ratio": ours / ort_us, "err": err, "blas": blas, "gbs": graph.min_dram_bytes / ours / 1e3}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(SAMPLES / f"{name}.onnx"), opts, providers=["CPUExecutionProvider"])
    feeds = {k: v for k, v in inputs.items()}
    theirs = _median_us(lambda: sess.run(None, feeds), runs)
    moved = graph.min_dram_bytes
    return {"name": name, "policy": policy, "kernels": len(program.kernels), "ours_us": ours,
            "ort_us": theirs, "ratio": ours / theirs, "err": err, "blas": blas,
            "gbs": moved / ours / 1e3}


def main(argv=None) -> int:
    from sample_io import CATALOG

    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--policy", default="welder")
    p.add_argument("--samples", default="")
    p.add_argument("--no-library", action="store_true",
                   help="skip the library rows (whole models under stitch with contractions through BLAS)")
    args = p.parse_args(argv)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    names = args.samples.split(",") if args.samples else [e["name"] for e in CATALOG if e["category"] != "scale"]
    copy = stream_copy_gbs(threads)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"STREAM-like copy: {copy:.1f} GB/s ({threads} threads); load average at start {load}\n")
    print("| sample | category | policy | kernels | contractions | ours µs | onnxruntime µs | ours/ort | "
          "GB/s (min traffic) | % of copy | max rel err |")
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    cat = {e["name"]: e["category"] for e in CATALOG}
    for name in names:
        rows = [bench(name, args.policy, args.runs, threads)]
        if cat[name] == "whole-model" and not args.no_library:
            rows.append(bench(name, "stitch", args.runs, threads, library=True, ort_us=rows[0]["ort_us"]))
        for r in rows:
            how = f"BLAS ({r['blas']} kernels)" if r["blas"] else "generated"
            print(f"| {name} | {cat[name]} | {r['policy']} | {r['kernels']} | {how} | "
                  f"{r['ours_us']:.0f} | {r['ort_us']:.0f} | {r['ratio']:.2f} | {r['gbs']:.1f} | "
                  f"{100 * r['gbs'] / copy:.0f}% | {r['err']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
