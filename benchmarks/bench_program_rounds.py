"""Whole programs of several policies in interleaved rounds in one process, optionally after a sleep before
each program (the C loop pool's workers then start asleep): per policy the median and the 10th / 90th
percentile of its rounds, so a bimodal program shows. Programs run launch by launch (`launch_calls`), so the
same script times a tree from before the C program entry too: run it with that tree first on the path;
--entry runs each through its C program entry in one call (`program_call`: what `tileweave bench` times).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_program_rounds.py mobilenetv2 \
        [--policies welder,elementwise,stitch,unfused] [--rounds 60] [--gap-ms 0] [--settle-ms 2.5] [--tree CHECKOUT]
        [--entry] [--device host|FILE.json]

MODEL is a zoo name (samples/zoo/MODEL.onnx) or a path. --tree imports that checkout's engine instead of
this one's (e.g. a `git worktree` of the base commit), so two trees are measured by the same script. --device
plans for a device file instead of this machine's cached probe (two trees whose probe versions differ would
otherwise plan with different figures: give both the same file, e.g. a copy of ~/.cache/tileweave/host/*.json).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from zoo_model import zoo_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("--policies", default="welder,elementwise,stitch,unfused")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--gap-ms", type=float, default=0.0, help="sleep before each program (ms)")
    ap.add_argument("--settle-ms", type=float, default=2.5,
                    help="run each program untimed this long before each timed run, so the previous program's "
                         "thread pool sleeps and its own is awake (engine/schedule/measure.py SETTLE_S); 0: off")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose engine plans, compiles and runs")
    ap.add_argument("--device", default="host", help="host (this machine's probe) or a CPU device file")
    ap.add_argument("--entry", action="store_true",
                    help="one call of the program's C entry per run (program_call), not one per launch")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls, program_call
    from engine.schedule.pipeline import plan_model

    model = zoo_model(args.model)
    graph, device = load_graph(model), get_device(args.device)
    inputs = bench_inputs(graph, model)
    programs, keep = {}, []
    for policy in [p for p in args.policies.split(",") if p]:
        planned, plan = plan_model(graph, policy, device)
        program = generate(plan, planned, device, target="c")
        env = bind_buffers(program, planned.specs, inputs, planned.weights)
        keep.append(env)  # the calls hold raw pointers into these arrays
        module = compile_program_c(program)
        programs[policy] = [program_call(module, env)] if args.entry else launch_calls(module, env)
    names = list(programs)
    samples = {p: [] for p in names}
    for r in range(args.rounds + 1):  # one untimed round first; the order rotated each round
        for j in range(len(names)):
            policy = names[(j + r) % len(names)]
            if args.gap_ms:
                time.sleep(args.gap_ms / 1e3)
            s0 = time.perf_counter()  # measure.settle's loop, here: a --tree from before it has none
            while args.settle_ms > 0:
                for call in programs[policy]:
                    call()
                if (time.perf_counter() - s0) * 1e3 >= args.settle_ms:
                    break
            t0 = time.perf_counter()
            for call in programs[policy]:
                call()
            if r:
                samples[policy].append((time.perf_counter() - t0) * 1e6)
    import engine

    how = "the C entry" if args.entry else "launch by launch"
    print(f"{model.stem}, engine from {Path(engine.__file__).parent}, {args.rounds} rounds, gap {args.gap_ms:g} ms, "
          f"settle {args.settle_ms:g} ms, {how}\n")
    print("| policy | median µs | q10 µs | q90 µs |")
    print("|---|---:|---:|---:|")
    for p in names:
        q = sorted(samples[p])
        print(f"| {p} | {statistics.median(q):.1f} | {q[len(q) // 10]:.1f} | {q[len(q) * 9 // 10]:.1f} |")


if __name__ == "__main__":
    main()
