"""Modeled effect of the GEMM staging pass (engine/codegen/micro.py: float4 staging loads, double-buffered
shared tiles) on the zoo, a GPU preset, welder and unfused plans: modeled µs, tiled GEMM phases, how many
are double-buffered / vectorised, and the largest block shared footprint. Modeled only (no GPU here): run it
from this tree and from a checkout without the pass for the before/after.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_gemm_staging.py [--device a100] [--models bert,gpt2]"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.codegen.generate import generate
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="a100")
    parser.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    parser.add_argument("--policies", default="unfused,welder")
    args = parser.parse_args()
    device = get_device(args.device)
    names = args.models.split(",") if args.models else sorted(p.stem for p in ZOO.glob("*.onnx"))
    print(f"device {device.name}; modeled from datasheet figures (no GPU attached)\n")
    print("| model | policy | kernels | gemm phases | double-buffered | float4 a / b | max shared KiB | modeled us |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in names:
        graph = load_graph(ZOO / f"{name}.onnx")
        for policy in args.policies.split(","):
            planned, plan = plan_model(graph, policy, device)
            program = generate(plan, planned, device)
            gemms = [g for k in program.kernels for g in k.gemms]
            double = sum(getattr(g, "buffers", 1) == 2 for g in gemms)
            va = sum(getattr(g, "vec_a", 1) > 1 for g in gemms)
            vb = sum(getattr(g, "vec_b", 1) > 1 for g in gemms)
            smem = max((k.shared_bytes for k in program.kernels), default=0) / 1024
            print(f"| {name} | {policy} | {plan.kernels} | {len(gemms)} | {double} | {va} / {vb} | {smem:.1f} | "
                  f"{plan.modeled_us:.1f} |", flush=True)


if __name__ == "__main__":
    main()
