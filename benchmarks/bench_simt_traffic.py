"""Issue 12 item 3 (GPU presets): the global-memory traffic the SIMT emulator counts per kernel (every load
and store the printed CUDA's threads make, before any cache) against the cost model's L2 traffic for that
kernel (`GroupCost.traffic_bytes["l2"]`: every global load and store the kernel IR counts, DRAM misses
included), on the real-model zoo. Prints per model and policy: kernels, the median and the range of
counted / modeled, the share within 1.5x, the worst kernel; then the same over every kernel.

    .venv/bin/python benchmarks/bench_simt_traffic.py [--device a100] [--policies welder,stitch] [--models a,b]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ZOO = ROOT / "samples" / "zoo"


def ratios(name: str, policy: str, device: str) -> tuple[list[tuple[str, float, int, int]], float]:
    """(kernel, counted / modeled, counted bytes, modeled bytes) per kernel with both, and emulation seconds."""
    from engine.frontend.importer import load_graph
    from engine.runtime.execute import run_model

    graph = load_graph(ZOO / f"{name}.onnx")
    data = np.load(ZOO / f"{name}.io.npz")
    inputs = {t.name: data[t.name] for t in graph.inputs}
    t0 = time.perf_counter()
    result = run_model(graph, inputs, backend="cuda-sim", policy=policy, device=device)
    seconds = time.perf_counter() - t0
    if not result.sim.ok:
        raise SystemExit(f"{name} {policy}: cuda-sim findings: {result.sim.summary_lines()[0]}")
    rows = []
    for k in result.sim.kernels:
        modeled = int(k.modeled.get("l2", 0))
        if modeled and k.global_bytes:
            rows.append((k.kernel, k.global_bytes / modeled, k.global_bytes, modeled))
    return rows, seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="a100", help="GPU preset the plans are made for (default a100)")
    ap.add_argument("--policies", default="welder,stitch")
    ap.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    args = ap.parse_args(argv)
    names = args.models.split(",") if args.models else sorted(p.stem for p in ZOO.glob("*.onnx"))
    print(f"device preset {args.device}; counted = global bytes the emulated threads loaded and stored; "
          "modeled = the plan's L2 bytes\n")
    print("| model | policy | kernels | counted / modeled: median | min | max | within 1.5x | worst kernel | "
          "counted MB | modeled MB | emulate s |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    every = []
    for name in names:
        for policy in args.policies.split(","):
            rows, seconds = ratios(name, policy, args.device)
            every += rows
            r = [x[1] for x in rows]
            worst = max(rows, key=lambda x: abs(np.log(x[1])))
            within = sum(1 / 1.5 <= x <= 1.5 for x in r)
            print(f"| {name} | {policy} | {len(r)} | {statistics.median(r):.2f} | {min(r):.2f} | {max(r):.2f} | "
                  f"{within}/{len(r)} | {worst[0]} {worst[1]:.2f}x | {sum(x[2] for x in rows) / 1e6:.2f} | "
                  f"{sum(x[3] for x in rows) / 1e6:.2f} | {seconds:.1f} |", flush=True)
    r = [x[1] for x in every]
    print(f"\nAll {len(r)} kernels: median counted / modeled {statistics.median(r):.2f}, "
          f"{sum(1 / 1.5 <= x <= 1.5 for x in r)} within 1.5x; counted {sum(x[2] for x in every) / 1e6:.1f} MB, "
          f"modeled {sum(x[3] for x in every) / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
