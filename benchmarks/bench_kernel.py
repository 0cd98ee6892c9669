"""One kernel of a model's program, measured alone beside its modeled time: the program planned (host or a CPU
device file), compiled and run once, then the named kernels' launches called back to back for --seconds each,
the median per kernel printed with the plan's modeled µs. --tree times another checkout's engine (a `git
archive` of a base commit), so a codegen change is measured kernel by kernel with one script.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_kernel.py vit stitch k09_mul_add_softmax_exp \
        [KERNEL ...] [--device host|FILE.json] [--seconds 3] [--tree CHECKOUT]

MODEL is a zoo name (samples/zoo/MODEL.onnx) or a path.
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
    ap.add_argument("policy")
    ap.add_argument("kernels", nargs="+")
    ap.add_argument("--device", default="host", help="host (this machine's probe) or a CPU device file")
    ap.add_argument("--seconds", type=float, default=3.0, help="back-to-back calls per kernel")
    ap.add_argument("--tree", default=str(ROOT), help="the checkout whose engine plans, compiles and runs")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree).resolve()))
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls
    from engine.schedule.pipeline import plan_model

    model = zoo_model(args.model)
    graph, device = load_graph(model), get_device(args.device)
    planned, plan = plan_model(graph, args.policy, device)
    program = generate(plan, planned, device, target="c")
    env = bind_buffers(program, planned.specs, bench_inputs(graph, model), planned.weights)
    calls = launch_calls(compile_program_c(program), env)
    for call in calls:  # every buffer written once, in program order
        call()
    names = [launch.kernel for launch in program.launches]
    modeled = {g.name: g.cost.modeled_us for g in plan.groups if g.cost}
    import engine

    print(f"{model.stem} {args.policy}, engine from {Path(engine.__file__).parent}, {args.seconds:g} s per kernel\n")
    print("| kernel | modeled µs | measured µs (median) | calls |")
    print("|---|---:|---:|---:|")
    for name in args.kernels:
        if name not in names:
            sys.exit(f"error: no kernel {name} in the {args.policy} program (it has {', '.join(dict.fromkeys(names))})")
        call, samples, start = calls[names.index(name)], [], time.perf_counter()
        while time.perf_counter() - start < args.seconds:
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e6)
        print(f"| {name} | {modeled.get(name, float('nan')):.1f} | {statistics.median(samples):.2f} | {len(samples)} |")


if __name__ == "__main__":
    main()
