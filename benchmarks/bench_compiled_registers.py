"""The cost model's register formula against the registers NVRTC compiles each kernel to (read from the
CUBIN; no GPU needed), and what costing a plan at the compiled registers (`cost.at_compiled_registers`)
changes, per zoo model and policy on a GPU preset. Prints a Markdown table.

    .venv/bin/python benchmarks/bench_compiled_registers.py --device h200 --policies welder,stitch
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def row(model: Path, policy: str, device) -> str:
    from engine.codegen.api import at_compiled, compile_program
    from engine.codegen.generate import generate
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    graph, plan = plan_model(load_graph(model), policy, device)
    compiled = compile_program(generate(plan, graph, device), "cuda", archs=(device.nvrtc_arch,))
    costed = at_compiled(plan, graph, device, compiled)
    ratios, frames, moved = [], 0, 0
    for old, new, k in zip(plan.groups, costed.groups, compiled.kernels):
        ratios.append(new.cost.footprint["register"] / max(1, old.cost.footprint["register"]))
        frames += k.binaries[0].resources(k.name).local_bytes > 0
        moved += new.cost.resident_blocks_per_sm != old.cost.resident_blocks_per_sm
    return (f"| {model.stem} | {policy} | {len(ratios)} | {min(ratios):.2f} | {statistics.median(ratios):.2f} | "
            f"{max(ratios):.2f} | {moved} | {frames} | {plan.modeled_us:.1f} | {costed.modeled_us:.1f} |")


def main(argv: list[str] | None = None) -> int:
    from engine.device import get_device

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="h200", help="a GPU preset (default h200)")
    ap.add_argument("--policies", default="welder,stitch", help="comma-separated (default welder,stitch)")
    ap.add_argument("--models", default="", help="comma-separated zoo model names (default: all)")
    args = ap.parse_args(argv)
    device = get_device(args.device)
    models = sorted((ROOT / "samples" / "zoo").glob("*.onnx"))
    if args.models:
        models = [m for m in models if m.stem in args.models.split(",")]
    print(f"device {device.name}, arch {device.nvrtc_arch}\n")
    print("| model | policy | kernels | compiled / formula registers: min | median | max | kernels whose occupancy "
          "moved | kernels with a stack frame | modeled µs, formula | modeled µs, compiled |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in models:
        for policy in args.policies.split(","):
            print(row(m, policy, device), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
