"""cuda-sim speed and traffic: every sample x policy (the SMALL variants where make_samples has one, as the
tests run them) compiled into a fresh cache and emulated; prints a Markdown table of compile and emulation
seconds, launches, threads' global/shared bytes beside the plan's modeled DRAM/L2 bytes, and findings. Then
the emulator's cost per checked access and per barrier on hand-written kernels.

    .venv/bin/python benchmarks/bench_simt.py [--own-shapes] [--samples a,b] [--policies p,q]"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ["TILEWEAVE_CACHE"] = tempfile.mkdtemp(prefix="tw_bench_simt_")  # cold compiles, measured

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "samples"))
import make_samples as ms  # noqa: E402

from engine.codegen.generate import generate  # noqa: E402
from engine.frontend.importer import load_graph  # noqa: E402
from engine.runtime.simt import native  # noqa: E402
from engine.runtime.simt.driver import program_units, run_cuda_source, run_simt  # noqa: E402
from engine.schedule.pipeline import plan_model  # noqa: E402

POLICIES = ("unfused", "elementwise", "stitch", "welder")

ACCESSES = r"""
extern "C" __global__ void reads(const float* __restrict__ a, float* __restrict__ out) {
    extern __shared__ __align__(16) unsigned char smem[];
    float* s = (float*)(smem + 0);
    for (int e = threadIdx.x; e < 1024; e += blockDim.x) s[e] = a[e];
    __syncthreads();
    float acc = 0.0f;
    for (int k = 0; k < 4000; ++k) acc += s[(k * 7 + threadIdx.x) & 1023];
    out[blockIdx.x * blockDim.x + threadIdx.x] = acc;
}
"""
BARRIERS = r"""
extern "C" __global__ void barriers(float* __restrict__ out) {
    float v = 0.0f;
    for (int k = 0; k < 200; ++k) { v += 1.0f; __syncthreads(); }
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;
}
"""


def micro() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal(1024).astype(np.float32)
    run_cuda_source(ACCESSES, "reads", [(a, "in"), (np.empty(1024, np.float32), "out")], grid=4, block=256,
                    shared_bytes=4096)  # compile
    t0 = time.perf_counter()
    run_cuda_source(ACCESSES, "reads", [(a, "in"), (np.empty(1024, np.float32), "out")], grid=4, block=256,
                    shared_bytes=4096)
    per_access = (time.perf_counter() - t0) / (4 * 256 * 4000) * 1e9
    run_cuda_source(BARRIERS, "barriers", [(np.empty(1024, np.float32), "out")], grid=4, block=256)
    t0 = time.perf_counter()
    run_cuda_source(BARRIERS, "barriers", [(np.empty(1024, np.float32), "out")], grid=4, block=256)
    per_arrival = (time.perf_counter() - t0) / (4 * 256 * 200) * 1e9
    print(f"\nchecked shared-memory read: {per_access:.1f} ns; __syncthreads arrival (switch out and back in): "
          f"{per_arrival:.1f} ns per thread")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--own-shapes", action="store_true", help="the samples at their own shapes")
    parser.add_argument("--samples", default="", help="comma-separated sample names (default: all but bert12)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    args = parser.parse_args()
    names = args.samples.split(",") if args.samples else [s.name for s in ms.SAMPLES if s.name != "bert12"]
    tmp = Path(tempfile.mkdtemp(prefix="tw_bench_simt_models_"))
    print("| sample | shapes | policy | launches | compile s | emulate s | global MB (threads) | modeled DRAM MB "
          "| modeled L2 MB | shared MB | findings |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
    totals = [0.0, 0.0]
    for name in names:
        small = name in ms.SMALL and not args.own_shapes
        model, inputs = ms.build_small(name) if small else ms.build(next(s for s in ms.SAMPLES if s.name == name))
        if inputs is None:
            print(f"| {name} | own | - | | | | | | | | no inputs at its own shapes |")
            continue
        path = tmp / f"{name}.onnx"
        path.write_bytes(model.SerializeToString())
        graph = load_graph(path)
        for policy in args.policies.split(","):
            planned, plan = plan_model(graph, policy, "a100")
            program = generate(plan, planned, "a100", target="cuda")
            t0 = time.perf_counter()
            native.build(program_units(program), program.name)
            t1 = time.perf_counter()
            _, report = run_simt(program, planned.specs, inputs, planned.weights, plan=plan)
            t2 = time.perf_counter()
            totals[0] += t1 - t0
            totals[1] += t2 - t1
            glob = sum(k.global_bytes for k in report.kernels) / 1e6
            shared = sum(k.shared_load_bytes + k.shared_store_bytes for k in report.kernels) / 1e6
            dram = sum(k.modeled.get("dram", 0) for k in report.kernels) / 1e6
            l2 = sum(k.modeled.get("l2", 0) for k in report.kernels) / 1e6
            found = ", ".join(f"{k} {n}" for k, n in sorted(report.kinds().items())) or "none"
            print(f"| {name} | {'small' if small else 'own'} | {policy} | {report.launches} | {t1 - t0:.2f} | "
                  f"{t2 - t1:.2f} | {glob:.2f} | {dram:.2f} | {l2:.2f} | {shared:.2f} | {found} |", flush=True)
    print(f"\ntotal: compile {totals[0]:.1f} s, emulate {totals[1]:.1f} s (one process, one core)")
    micro()


if __name__ == "__main__":
    main()
