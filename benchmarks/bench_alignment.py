"""Host buffers on cache lines or not: each model's program (one policy, planned for the host or a CPU device
file) run through its C entry over two bindings in interleaved rounds (the order rotated each round) — as
`bind_buffers` gives them (every buffer on a 64-byte line: `runtime.cpu.aligned`) and with every weight copied
to 16 bytes past a line (where NumPy's own allocations may fall) — and the median of each.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_alignment.py bert vit convnext [--policy welder]
        [--device host|FILE.json] [--rounds 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="+", help="zoo names (samples/zoo/NAME.onnx) or .onnx paths")
    ap.add_argument("--policy", default="welder")
    ap.add_argument("--device", default="host")
    ap.add_argument("--rounds", type=int, default=60)
    args = ap.parse_args()
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs
    from engine.runtime.cpu import aligned_empty, bind_buffers, compile_program_c, program_call
    from engine.schedule.pipeline import plan_model

    def off_line(a, offset: int = 16):
        out = aligned_empty(a.nbytes + 64)[offset:offset + a.nbytes].view(a.dtype).reshape(a.shape)
        out[...] = a
        return out

    print(f"| model | {args.policy}: lines µs | weights 16 B past a line µs | ratio |")
    print("|---|---:|---:|---:|")
    for name in args.models:
        model = Path(name) if name.endswith(".onnx") else ROOT / "samples" / "zoo" / f"{name}.onnx"
        graph = load_graph(model)
        planned, plan = plan_model(graph, args.policy, get_device(args.device))
        program = generate(plan, planned, get_device(args.device), target="c")
        module = compile_program_c(program)
        lined = bind_buffers(program, planned.specs, bench_inputs(graph, model), planned.weights)
        shifted = dict(lined) | {t: off_line(lined[t]) for t in program.constants}
        calls = [program_call(module, lined), program_call(module, shifted)]
        samples: list[list[float]] = [[], []]
        for r in range(args.rounds + 1):  # one untimed round first
            for j in (r % 2, 1 - r % 2):
                t0 = time.perf_counter()
                calls[j]()
                if r:
                    samples[j].append((time.perf_counter() - t0) * 1e6)
        a, b = (statistics.median(s) for s in samples)
        print(f"| {model.stem} | {a:.1f} | {b:.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
