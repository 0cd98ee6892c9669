"""Policies side by side on every sample: kernels, memory-intensive kernels, DRAM bytes, modeled µs
and scheduling seconds per policy, plus the bert_layer / bert12 targets. Prints a Markdown table.
Plans come from `plan_model`, the API `tileweave plan` uses: each policy with its default operator
batching (on for welder, off for the others; the "batched" column counts merged contraction sets).

With `--against TREE` (another checkout, e.g. a `git worktree` of an older commit) it times scheduling
instead: every model x device x policy planned by `tileweave plan --json --plan-out` in a fresh process
(the memo tables start empty, as for a user), this tree and TREE alternately `--repeat` times, and
prints both schedule_seconds (medians), their ratio and whether the two plans are identical (the plan
JSON but its schedule_seconds).

    .venv/bin/python benchmarks/bench_policies.py [--device a100] [--set samples|zoo]
    .venv/bin/python benchmarks/bench_policies.py --set zoo --device a100,host --against /tmp/base --repeat 2"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from engine.device import get_device
from engine.errors import TileweaveError
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model
from engine.schedule.policies import POLICIES

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"
SETS = {"samples": SAMPLES, "zoo": SAMPLES / "zoo"}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="a100", help="device, or a comma list with --against")
    parser.add_argument("--set", choices=sorted(SETS), default="samples", help="our samples or the model zoo")
    parser.add_argument("--models", help="comma list of model names (default: the whole set)")
    parser.add_argument("--policies", default=",".join(POLICIES), help="comma list (with --against)")
    parser.add_argument("--against", metavar="TREE", help="time scheduling here and in this other checkout")
    parser.add_argument("--repeat", type=int, default=1, help="runs per tree and cell (with --against)")
    args = parser.parse_args()
    folder = SETS[args.set]
    names = [e["name"] for e in json.loads((folder / "catalog.json").read_text())]
    if args.models:
        names = [n for n in names if n in args.models.split(",")]
    if args.against:
        compare_trees(folder, names, args.device.split(","), args.policies.split(","), Path(args.against), args.repeat)
        return
    device = get_device(args.device)
    print(f"device {device.name}; modeled from datasheet figures (no GPU attached)\n")
    print("| sample | policy | batched | kernels | mem-int kernels | DRAM MB | modeled us | schedule s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    plans: dict = {}
    for name in names:
        try:
            graph = load_graph(folder / f"{name}.onnx")
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


def plan_in(tree: Path, model: Path, policy: str, device: str) -> tuple[float, str]:
    """(schedule_seconds, plan JSON without its schedule_seconds) of `tileweave plan` run in `tree`'s code."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        env = {**os.environ, "PYTHONPATH": str(tree), "TILEWEAVE_SCHEDULE_CACHE": "off"}  # cold planning
        run = subprocess.run([sys.executable, "-m", "engine", "plan", str(model), "--policy", policy, "--device", device,
                              "--json", "--plan-out", str(out)], cwd=tree, env=env, capture_output=True, text=True)
        if run.returncode:
            raise SystemExit(f"error: {tree}: plan {model.name} {policy} {device}: {run.stderr.strip()[-300:]}")
        plan = json.loads(out.read_text())
    seconds = plan.pop("schedule_seconds")
    return seconds, json.dumps(plan, sort_keys=True)


def compare_trees(folder: Path, names: list[str], devices: list[str], policies: list[str], other: Path,
                  repeat: int) -> None:
    print(f"schedule seconds, fresh process per plan, medians of {repeat}: this tree ({ROOT}) vs {other}\n")
    print("| model | device | policy | kernels | old s | new s | old / new | same plan |")
    print("|---|---|---|---:|---:|---:|---:|---|")
    worst: dict[str, float] = {}
    for name in names:
        model = folder / f"{name}.onnx"
        for device in devices:
            for policy in policies:
                old, new, texts = [], [], set()
                for _ in range(repeat):  # alternate, so both trees see the same load
                    sec, text = plan_in(other, model, policy, device)
                    old.append(sec)
                    texts.add(("old", text))
                    sec, text = plan_in(ROOT, model, policy, device)
                    new.append(sec)
                    texts.add(("new", text))
                same = len({t for _, t in texts}) == 1
                o, n = statistics.median(old), statistics.median(new)
                kernels = len(json.loads(next(t for _, t in texts))["groups"])
                worst[f"{device} {policy}"] = max(worst.get(f"{device} {policy}", 0.0), n)
                print(f"| {name} | {device} | {policy} | {kernels} | {o:.2f} | {n:.2f} | {o / n:.2f} | "
                      f"{'yes' if same else 'NO'} |", flush=True)
    print("\nslowest new schedule per device and policy: " + ", ".join(f"{k} {v:.2f} s" for k, v in worst.items()))


if __name__ == "__main__":
    main()
