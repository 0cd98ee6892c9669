"""The cost model held to measurement on the host CPU: for each model and policy, the plan made for
`--device host`, its kernels timed by the C backend (median of --runs launches each), and per model:
Spearman's rho between modeled and measured kernel times, the median |log(measured / modeled)| (as a
factor), modeled and measured program time per policy, and whether the model ranks the policies as
the measurement does. One worker process per model (planning included), so a model that hangs is
reported and the rest still run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cost_model.py [--set zoo|samples] [--models a,b]
        [--policies unfused,elementwise,stitch,welder] [--runs 9] [--timeout 900] [--json OUT.json]

The host's figures come from `tileweave device host` (probed on first use, cached); OMP_NUM_THREADS sets
the threads of both the plan (the host device's cores) and the run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}


def ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and values[order[j + 1]] == values[order[k]]:
            j += 1
        for m in range(k, j + 1):
            out[order[m]] = (k + j) / 2
        k = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


def work(job: dict) -> dict:
    """In the worker: every policy planned for the host, its kernels measured."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model
    from engine.schedule.tune import device_measure

    device = get_device("host")
    graph = load_graph(job["model"])
    out = {}
    for policy in job["policies"]:
        t0 = time.perf_counter()
        planned, plan = plan_model(graph, policy, device)
        seconds = time.perf_counter() - t0
        measured = device_measure(planned, device, job["runs"])(plan)
        out[policy] = {"schedule_s": round(seconds, 2), "kernels": [
            {"name": g.name, "stages": len(g.stages), "modeled_us": g.cost.modeled_us if g.cost else None,
             "measured_us": measured[g.name], "terms_us": g.cost.terms_us if g.cost else {}}
            for g in plan.groups]}
    return out


def summarize(name: str, cells: dict) -> dict:
    rows = [k for cell in cells.values() for k in cell["kernels"] if k["modeled_us"]]
    mod, mea = [k["modeled_us"] for k in rows], [k["measured_us"] for k in rows]
    logs = [abs(math.log(b / a)) for a, b in zip(mod, mea) if a > 0 and b > 0]
    programs = {p: (sum(k["modeled_us"] or 0 for k in c["kernels"]), sum(k["measured_us"] for k in c["kernels"]))
                for p, c in cells.items()}
    by_model = sorted(programs, key=lambda p: programs[p][0])
    by_measure = sorted(programs, key=lambda p: programs[p][1])
    return {"model": name, "kernels": len(rows), "rho": spearman(mod, mea),
            "median_factor": math.exp(statistics.median(logs)) if logs else float("nan"),
            "programs": programs, "rank_model": by_model, "rank_measured": by_measure,
            "same_ranking": by_model == by_measure, "same_best": by_model[0] == by_measure[0]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", choices=tuple(SETS), default="zoo")
    p.add_argument("--models", default="")
    p.add_argument("--policies", default="unfused,elementwise,stitch,welder")
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--timeout", type=float, default=900.0)
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(work(job)))
        return 0
    folder = SETS[args.set]
    names = [n for n in args.models.split(",") if n] or sorted(x.stem for x in folder.glob("*.onnx") if x.stem != "bert12")
    policies = [x for x in args.policies.split(",") if x]
    threads = os.environ.get("OMP_NUM_THREADS", "") or str(os.cpu_count())
    results, all_rows = [], []
    for name in names:
        job = {"model": str(folder / f"{name}.onnx"), "policies": policies, "runs": args.runs}
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                                  text=True, timeout=args.timeout, env=dict(os.environ, OMP_NUM_THREADS=threads))
        except subprocess.TimeoutExpired:
            print(f"{name}: timed out after {args.timeout:g} s", file=sys.stderr)
            continue
        if proc.returncode != 0:
            print(f"{name}: failed: {proc.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
            continue
        cells = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(summarize(name, cells) | {"cells": cells})
        all_rows += [k for c in cells.values() for k in c["kernels"] if k["modeled_us"]]
        print(f"{name}: done", file=sys.stderr)
    print(f"Host, {threads} thread(s); kernels timed as the median of {args.runs} launches.\n")
    print("| model | kernels | Spearman ρ | median factor | " + " | ".join(f"{p} modeled / measured µs" for p in policies)
          + " | ranking by model | by measurement |")
    print("|---|---:|---:|---:|" + "---:|" * len(policies) + "---|---|")
    for r in results:
        cols = " | ".join(f"{r['programs'][p][0]:.0f} / {r['programs'][p][1]:.0f}" for p in policies)
        print(f"| {r['model']} | {r['kernels']} | {r['rho']:.2f} | {r['median_factor']:.2f}x | {cols} | "
              f"{' < '.join(r['rank_model'])} | {' < '.join(r['rank_measured'])} |")
    if all_rows:
        mod, mea = [k["modeled_us"] for k in all_rows], [k["measured_us"] for k in all_rows]
        logs = [abs(math.log(b / a)) for a, b in zip(mod, mea) if a > 0 and b > 0]
        same = sum(r["same_best"] for r in results)
        print(f"\nAll {len(all_rows)} kernels: Spearman ρ {spearman(mod, mea):.2f}, median factor "
              f"{math.exp(statistics.median(logs)):.2f}x; the model picks the measured-fastest policy on {same} of "
              f"{len(results)} models, the whole ranking on {sum(r['same_ranking'] for r in results)}.")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
