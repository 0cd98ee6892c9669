"""Issue 18 (compute every value once) on the model zoo: per model, the welder plan's kernels as the kernel
IR counts them (flops of the printed code ÷ the stages' flops computed once, the deepest loop nest around
one statement, global bytes) beside what the cost model says (modeled L2 and DRAM bytes, µs, recompute
factor) and the schedule time, as a Markdown table.

    .venv/bin/python benchmarks/bench_once.py [--policy welder] [--device a100] [--models a,b] [--emulate]

`--emulate` also runs each plan's printed CUDA under the SIMT emulator (backend cuda-sim, the model's stored
inputs) and prints, per kernel, the global bytes its threads moved beside the count and the modeled L2
bytes, the findings, and whether the outputs match the stored onnxruntime outputs.

Run against an older checkout (PYTHONPATH=that checkout) it prints the modeled columns only, where that
code has no kernel IR count (engine/codegen/count.py): the before/after comparison of benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from engine.api import load_graph
from engine.codegen.generate import generate
from engine.device import get_device
from engine.schedule.pipeline import plan_model

try:
    from engine.codegen.count import count_kernel
except ImportError:  # a checkout from before the kernel IR count
    count_kernel = None

ZOO = Path(__file__).resolve().parents[1] / "samples" / "zoo"


def measure(name: str, policy: str, device) -> dict:
    graph = load_graph(ZOO / f"{name}.onnx")
    start = time.perf_counter()
    planned, plan = plan_model(graph, policy, device)
    seconds = time.perf_counter() - start
    row = {"model": name, "kernels": plan.kernels, "schedule_s": seconds, "modeled_us": plan.modeled_us,
           "dram_mb": plan.dram_bytes / 1e6,
           "l2_mb": sum(g.cost.traffic_bytes.get("l2", 0) for g in plan.groups if g.cost) / 1e6,
           "modeled_rf": max((g.cost.recompute_factor for g in plan.groups if g.cost), default=1.0)}
    if count_kernel is None:
        return row
    program = generate(plan, planned, device)
    by = {s.name: s for s in planned.stages}
    worst, nest, glob, total, once_total = (1.0, ""), 1, 0.0, 0.0, 0.0
    for kernel in program.kernels:
        group = next(g for g in plan.groups if g.name == kernel.name)
        work = count_kernel(kernel)
        once = sum(by[s].flops for s in group.stages)
        total, once_total = total + work.flops, once_total + once
        if once and work.flops / once > worst[0]:
            worst = (work.flops / once, kernel.name)
        nest = max(nest, work.nest)
        glob += work.global_bytes
    row.update(counted_rf=worst[0], worst_kernel=worst[1], model_rf=total / max(1.0, once_total), nest=nest,
               counted_global_mb=glob / 1e6)
    return row


def emulate(name: str, policy: str, device) -> list[str]:
    """Markdown rows: per kernel, emulated global bytes (cuda-sim) vs counted vs modeled L2."""
    import numpy as np

    from engine.runtime.execute import run_model

    entry = next(e for e in json.loads((ZOO / "catalog.json").read_text()) if e["name"] == name)
    data = np.load(ZOO / entry["io"])
    inputs = {i["name"]: data[i["name"]] for i in entry["inputs"]}
    planned, plan = plan_model(load_graph(ZOO / entry["file"]), policy, device)
    start = time.perf_counter()
    ran = run_model(planned, inputs, backend="cuda-sim", plan=plan, device=device)
    seconds = time.perf_counter() - start
    worst = 0.0
    for o in entry["outputs"]:
        want = data[o["name"]]
        worst = max(worst, float(np.abs(ran.outputs[o["name"]] - want).max() / max(1e-30, np.abs(want).max())))
    counted = {k.name: count_kernel(k).global_bytes for k in generate(plan, planned, device).kernels}
    rows = []
    for k in ran.sim.kernels:
        l2 = k.modeled.get("l2", 0)
        rows.append(f"| {name} | {k.kernel} | {k.global_bytes / 1e6:.3f} | {counted.get(k.kernel, 0) / 1e6:.3f} | "
                    f"{l2 / 1e6:.3f} | {k.global_bytes / l2 if l2 else float('nan'):.2f} |")
    rows.append(f"| {name} | *program* | {sum(k.global_bytes for k in ran.sim.kernels) / 1e6:.3f} | "
                f"{sum(counted.values()) / 1e6:.3f} | {sum(k.modeled.get('l2', 0) for k in ran.sim.kernels) / 1e6:.3f} | "
                f"findings: {len(ran.sim.findings)}; max rel err {worst:.1e}; emulated in {seconds:.0f} s |")
    return rows


def _cell(row: dict, key: str, fmt: str) -> str:
    return format(row[key], fmt) if key in row else "–"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", default="welder")
    ap.add_argument("--device", default="a100")
    ap.add_argument("--models", help="comma-separated zoo names (default: all)")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--emulate", action="store_true", help="also run each plan under cuda-sim: bytes moved per kernel")
    args = ap.parse_args()
    catalog = json.loads((ZOO / "catalog.json").read_text())
    names = args.models.split(",") if args.models else [e["name"] for e in catalog]
    device = get_device(args.device)
    print("| model | kernels | counted flops ÷ once (worst kernel) | whole model | deepest nest | counted global MB "
          "| modeled L2 MB | modeled DRAM MB | modeled µs | plan's recompute_factor (max) | schedule s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in names:
        try:
            r = measure(name, args.policy, device)
        except Exception as err:  # a checkout that cannot plan or generate this model: say so, go on
            print(f"| {name} | error: {type(err).__name__}: {str(err)[:120]} |" + " |" * 9, flush=True)
            rows.append({"model": name, "error": f"{type(err).__name__}: {err}"})
            continue
        rows.append(r)
        print(f"| {name} | {r['kernels']} | {_cell(r, 'counted_rf', '.2f')} | {_cell(r, 'model_rf', '.2f')} | "
              f"{_cell(r, 'nest', ',d')} | {_cell(r, 'counted_global_mb', '.2f')} | {r['l2_mb']:.2f} | {r['dram_mb']:.2f} | {r['modeled_us']:.1f} | "
              f"{r['modeled_rf']:.2f} | {r['schedule_s']:.1f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.emulate:
        print("\n| model | kernel | emulated global MB | counted global MB | modeled L2 MB | emulated ÷ modeled |")
        print("|---|---|---:|---:|---:|---:|")
        for name in names:
            for line in emulate(name, args.policy, device):
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
