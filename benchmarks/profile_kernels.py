"""One zoo model's program per kernel beside onnxruntime's per-node profile: what to optimise first.
Prints the policy's kernels by measured time (median of --repeat launches through run_cpu), each with its
contraction phases as the kernel IR describes them, then onnxruntime's nodes by time
(SessionOptions.enable_profiling, median over --runs runs), both on OMP_NUM_THREADS threads.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/profile_kernels.py mobilenetv2 [--policy welder]
        [--device host] [--tune K] [--top 15] [--repeat 15] [--runs 50]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "samples" / "zoo"
sys.path.insert(0, str(ROOT))


def ort_nodes(model: Path, inputs: dict, threads: int, runs: int) -> list[tuple[float, str, str]]:
    """(median µs, op type, node name) of every onnxruntime node, slowest first."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.enable_profiling = True
    so.intra_op_num_threads = threads
    so.profile_file_prefix = str(Path(tempfile.mkdtemp(prefix="tw-ortprof-")) / "ort")
    sess = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: inputs[i.name] for i in sess.get_inputs()}
    for _ in range(runs):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    times = collections.defaultdict(list)
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            times[(e["args"].get("op_name", "?"), e["name"].removesuffix("_kernel_time"))].append(e["dur"])
    return sorted(((statistics.median(v), op, name) for (op, name), v in times.items()), reverse=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", help="a zoo model name (samples/zoo/NAME.onnx)")
    p.add_argument("--policy", default="welder")
    p.add_argument("--device", default="host")
    p.add_argument("--tune", type=int, default=None, help="K: the plan tuned by measurement")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--repeat", type=int, default=15, help="launches per kernel (median)")
    p.add_argument("--runs", type=int, default=50, help="onnxruntime runs profiled (median per node)")
    args = p.parse_args()
    model = ZOO / f"{args.model}.onnx"
    if not model.is_file():
        print(f"error: no zoo model '{args.model}' ({model} not found)", file=sys.stderr)
        return 2
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs
    from engine.runtime.cpu import compile_program_c, run_cpu
    from engine.schedule.pipeline import plan_model

    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    graph = load_graph(model)
    inputs = bench_inputs(graph, model)
    device = get_device(args.device)
    planned, plan = plan_model(graph, args.policy, device, tune=args.tune)
    program = generate(plan, planned, device, target="c")
    _, prof = run_cpu(compile_program_c(program), planned.specs, inputs, planned.weights, repeat=args.repeat)
    total = sum(k.us for k in prof.kernels)
    print(f"{args.model} {args.policy}{f' --tune {args.tune}' if args.tune else ''} on {device.name}, "
          f"{threads} thread(s): {len(prof.kernels)} kernels, {total:.1f} us (sum of per-kernel medians)")
    for kt in sorted(prof.kernels, key=lambda k: -k.us)[:args.top]:
        kernel = program.kernel(kt.kernel)
        print(f"  {kt.us:8.1f} us  {kt.kernel}")
        for seg in kernel.segments:
            for ph in seg.phases:
                if ph.conv is not None or ph.gemm is not None:
                    print(f"             {ph.stage}: {(ph.conv or ph.gemm).describe()}")
    nodes = ort_nodes(model, inputs, threads, args.runs)
    print(f"onnxruntime: {len(nodes)} nodes, {sum(n[0] for n in nodes):.1f} us (sum of per-node medians, "
          "profiling on)")
    for us, op, name in nodes[:args.top]:
        print(f"  {us:8.1f} us  {op:14s} {name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
