"""What running beside onnxruntime does to our programs: per policy, the whole C program and its first kernel
timed three ways in one worker process — "alone" (the program's runs back to back), "round-robin" (the
policies' programs in turn, as bench_side_by_side.py times them, without onnxruntime) and "beside ort"
(onnxruntime runs before each round, as `tileweave bench` and bench_side_by_side.py time them); then
onnxruntime itself alone and right after the first policy's program. Each
program library has its own thread pool (engine/codegen/targets.py, tw_parallel_for) whose workers spin
TW_POOL_SPIN pauses after a loop, yield their core up to TW_POOL_YIELD_US and then sleep on a futex, so a program that starts with a parallel loop
after something else ran pays its worker's wake-up; one whose first kernels are serial does not.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_interleave.py decoder_kv --policies stitch,welder --runs 41

MODEL is a zoo name (samples/zoo/MODEL.onnx) or a path. Prints one Markdown row per mode and policy: program µs
(fastest round, median) and the first kernel's median µs; then the welder ÷ first policy ratios per mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

from zoo_model import zoo_model

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--policies", default="stitch,welder")
    ap.add_argument("--runs", type=int, default=41)
    ap.add_argument("--device", default="host")
    args = ap.parse_args()
    from benchmarks.bench_side_by_side import reference
    from engine.codegen.generate import generate
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls
    from engine.schedule.pipeline import plan_model

    model = zoo_model(args.model)
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    graph, inputs, sess, names, _, device = reference({"model": str(model), "threads": threads, "device": args.device})
    policies = [p for p in args.policies.split(",") if p]
    programs, keep = {}, []
    for policy in policies:
        planned, plan = plan_model(graph, policy, device)
        program = generate(plan, planned, device, target="c")
        env = bind_buffers(program, planned.specs, inputs, planned.weights)
        keep.append(env)  # the calls hold raw pointers into these arrays
        programs[policy] = launch_calls(compile_program_c(program), env)

    def run(calls, first: list) -> float:
        t0 = time.perf_counter()
        calls[0]()
        first.append(time.perf_counter() - t0)
        for call in calls[1:]:
            call()
        return time.perf_counter() - t0

    print(f"{model.stem}, {threads} thread(s), {args.runs} timed rounds after 2 warm-up rounds\n")
    print("| mode | policy | program µs, fastest | program µs, median | first kernel µs, median |")
    print("|---|---|---:|---:|---:|")
    medians: dict[str, dict[str, float]] = {}
    for mode in ("alone", "round-robin", "beside ort"):
        total = {p: [] for p in policies}
        first = {p: [] for p in policies}
        if mode == "alone":
            for p in policies:
                for k in range(args.runs + 2):
                    t = run(programs[p], first[p])
                    if k >= 2:
                        total[p].append(t)
        else:
            for k in range(args.runs + 2):
                if mode == "beside ort":
                    sess.run(names, inputs)
                for p in policies:
                    t = run(programs[p], first[p])
                    if k >= 2:
                        total[p].append(t)
        for p in policies:
            medians.setdefault(mode, {})[p] = statistics.median(total[p])
            print(f"| {mode} | {p} | {min(total[p]) * 1e6:.1f} | {statistics.median(total[p]) * 1e6:.1f} | "
                  f"{statistics.median(first[p][2:]) * 1e6:.1f} |")
    # onnxruntime timed alone (its runs back to back) and right after our first policy's program (as
    # `tileweave bench` alternated them before it settled each side: engine/schedule/measure.settle).
    ours = programs[policies[0]]
    for mode in ("alone", f"after {policies[0]}"):
        times = []
        for k in range(args.runs + 2):
            if mode != "alone":
                for call in ours:
                    call()
            t0 = time.perf_counter()
            sess.run(names, inputs)
            if k >= 2:
                times.append(time.perf_counter() - t0)
        print(f"| onnxruntime {mode} | | {min(times) * 1e6:.1f} | {statistics.median(times) * 1e6:.1f} | |")
    if len(policies) > 1:
        base = policies[0]
        print()
        for mode, m in medians.items():
            print(f"{mode}: " + ", ".join(f"{p} ÷ {base} {m[p] / m[base]:.2f}" for p in policies[1:]) + " (medians)")


if __name__ == "__main__":
    main()
