"""Policies side by side on every sample: kernels, memory-intensive kernels, DRAM bytes, modeled µs
and scheduling seconds per policy, plus the bert_layer / bert12 targets. Prints a Markdown table.
Plans come from `plan_model`, the API `tileweave plan` uses: each policy with its default operator
batching (on for welder, off for the others; the "batched" column counts merged contraction sets).

    .venv/bin/python benchmarks/bench_policies.py [--device a100]"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import POLICIES

SAMPLES = Path(__file__).resolve().parents[1] / "samples"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="a100")
    args = parser.parse_args()
    device = get_device(args.device)
    names = [e["name"] for e in json.loads((SAMPLES / "catalog.json").read_text())]
    print(f"device {device.name}; modeled from datasheet figures (no GPU attached)\n")
    print("| sample | policy | batched | kernels | mem-int kernels | DRAM MB | modeled us | schedule s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    plans: dict = {}
    for name in names:
        try:
            graph = load_graph(SAMPLES / f"{name}.onnx")
        except TileweaveError as err:
            print(f"| {name} | (does not import: {str(err)[:60]}) | | | | | | |")
            continue
        for policy in POLICIES:
            started = time.perf_counter()
            planned, plan = plan_model(graph, policy, device)
            seconds = time.perf_counter() - started
            mem = sum(1 for g in plan.groups if all(planned.stage(s).is_memory_intensive for s in g.stages))
            batched = sum(1 for d in plan.decisions if "batched into" in d)
            plans[(name, policy)] = plan
            print(f"| {name} | {policy} | {batched} | {plan.kernels} | {mem} | {plan.dram_bytes / 1e6:.2f} | "
                  f"{plan.modeled_us:.1f} | {seconds:.2f} |")
    if ("bert_layer", "welder") in plans:
        w, u, e = (plans[("bert_layer", p)] for p in ("welder", "unfused", "elementwise"))
        print(f"\nbert_layer: kernels welder/unfused = {w.kernels}/{u.kernels} = {w.kernels / u.kernels:.2f} "
              f"(target <= 0.35); DRAM welder/elementwise = {w.dram_bytes / e.dram_bytes:.3f} (target <= 0.6)")
    if ("bert12", "welder") in plans:
        print(f"bert12 welder scheduled in {plans[('bert12', 'welder')].schedule_seconds:.2f} s (target <= 2.4 s)")


if __name__ == "__main__":
    main()
