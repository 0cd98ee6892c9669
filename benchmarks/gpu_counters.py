"""Hardware traffic per kernel against the cost model's, on an attached GPU through Nsight Compute: each
prepared variant (`bench_cost_model.py --device gpu --store DIR` writes DIR/MODEL.pkl) run once under
`ncu`, which replays every kernel with cold caches and reads its DRAM and L2 bytes and duration; the
table puts them beside the plan's modeled DRAM (its cold figure: the kernel's DRAM plus what the L2 residency
model serves from L2, `GroupCost.l2_warm_bytes`) and L2 traffic per kernel.

    python benchmarks/gpu_counters.py --store DIR [--models bert,convnext] [--policies welder] [--json OUT]
    python benchmarks/gpu_counters.py --store DIR --program [--models lstm,nerf,bert] ...

`--program` checks the program-level L2 residency model (engine/schedule/residency.py, unmeasured until
then): the program's first run after its inputs and weights are uploaded, kernels in launch order, caches
left as the previous kernel left them (`--cache-control none`, application replay so that every metric pass
sees the same cache history); the modeled DRAM column is then the warm figure (`GroupCost.l2_warm`). An
upload passes through L2 too, so a first touch of a weight may hit there: measured bytes can fall below the
model's cold start; re-reads of weights and intermediates that the model calls warm should not reach DRAM.

Needs `ncu` (Nsight Compute) and a GPU whose counters it may read; the clocks are left as they are
(--clock-control none). Without them it says so in one line and exits 2.
"""

from __future__ import annotations

import argparse
import csv
import glob
import io
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# Nsight Compute's units -> bytes, microseconds or plain counts (2025.3 on an H200 wrote "ns" for durations).
UNITS = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9,
         "nsecond": 1e-3, "ns": 1e-3, "usecond": 1, "us": 1, "msecond": 1e3, "ms": 1e3, "%": 1, "inst": 1, "": 1}
METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_bytes.sum", "gpu__time_duration.sum",
           "sm__warps_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum")


def find_ncu() -> str | None:
    found = shutil.which("ncu") or sorted(glob.glob("/opt/nvidia/nsight-compute/*/ncu")
                                          + glob.glob("/usr/local/cuda*/bin/ncu"))
    return found if isinstance(found, str) else (found[-1] if found else None)


def worker(store: str, policy: str) -> None:
    """Under ncu: the variant's kernels launched once each (plus run_cuda's one warm-up launch)."""
    from engine.profile.bench_worker import bench_inputs
    from engine.runtime.cuda import run_cuda

    planned, compiled, _, _ = pickle.loads(Path(store).read_bytes())[policy]
    stem = Path(store).stem
    model = next((m for m in (ROOT / "samples" / "zoo" / f"{stem}.onnx", ROOT / "samples" / f"{stem}.onnx")
                  if m.exists()), Path(store).with_suffix(".onnx"))
    inputs = bench_inputs(planned, model)  # the model's .io.npz inputs, else fixed-seed ones
    run_cuda(compiled.program, planned.specs, inputs, planned.weights, repeat=1)


def counters(ncu: str, store: Path, policy: str, timeout: float, program: int = 0) -> dict[str, dict[str, float]]:
    """{kernel: {metric: value}} from the last profiled launch of each kernel. `program` N: only the first N
    launches (one run of the program), caches warm between kernels, the whole application replayed per pass."""
    warm = ["--cache-control", "none", "--replay-mode", "application", "--launch-count", str(program)] if program else []
    cmd = [ncu, "--clock-control", "none", *warm, "--csv", "--metrics", ",".join(METRICS), "-k", "regex:^k[0-9]",
           sys.executable, __file__, "--worker", str(store), "--policies", policy]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    rows = [line for line in proc.stdout.splitlines() if line.startswith('"')]
    if proc.returncode != 0 or not rows:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
        raise RuntimeError(f"ncu failed ({proc.returncode}): {' | '.join(tail)}")
    out: dict[str, dict[str, float]] = {}
    for r in csv.DictReader(io.StringIO("\n".join(rows))):
        value = float(str(r["Metric Value"]).replace(",", "") or 0)
        unit = r.get("Metric Unit", "")
        scale = UNITS.get(unit)
        if scale is None:
            raise RuntimeError(f"ncu reported {r['Metric Name']} in unit {unit!r}, which this script does not know")
        out.setdefault(r["Kernel Name"], {})[r["Metric Name"]] = value * scale
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="folder of MODEL.pkl from bench_cost_model.py --store")
    p.add_argument("--models", default="", help="comma-separated (default: every MODEL.pkl)")
    p.add_argument("--policies", default="welder")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per model and policy")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--program", action="store_true",
                   help="one run of each program with caches warm between kernels (checks the L2 residency model)")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.worker, args.policies)
        return 0
    if not args.store:
        p.error("--store DIR is required (the folder bench_cost_model.py --store wrote)")
    ncu = find_ncu()
    if ncu is None:
        print("error: ncu (Nsight Compute) not found: install it, or put it on PATH", file=sys.stderr)
        return 2
    stores = sorted(Path(args.store).glob("*.pkl"))
    wanted = [m for m in args.models.split(",") if m]
    stores = [s for s in stores if not wanted or s.stem in wanted]
    results = []
    print("| model | policy | kernel | modeled DRAM MB | ncu DRAM MB | modeled L2 MB | ncu L2 MB | modeled µs | "
          "ncu µs |\n|---|---|---|---:|---:|---:|---:|---:|---:|")
    for store in stores:
        for policy in [x for x in args.policies.split(",") if x]:
            plan = pickle.loads(store.read_bytes())[policy][1].plan
            try:
                got = counters(ncu, store, policy, args.timeout, len(plan.groups) if args.program else 0)
            except (RuntimeError, subprocess.TimeoutExpired) as err:
                print(f"| {store.stem} | {policy} | {' '.join(str(err).split())[:200]} |||||||")
                continue
            total = {"mdram": 0.0, "dram": 0.0, "ml2": 0.0, "l2": 0.0}
            for g in plan.groups:
                c, t = got.get(g.name, {}), dict(g.cost.traffic_bytes) if g.cost else {}
                if g.cost and not args.program:  # replayed alone with cold caches: nothing is warm in L2
                    t["dram"] = t.get("dram", 0) + g.cost.l2_warm_bytes
                dram = c.get("dram__bytes_read.sum", 0) + c.get("dram__bytes_write.sum", 0)
                row = {"model": store.stem, "policy": policy, "kernel": g.name, "modeled_dram": t.get("dram", 0),
                       "caches": "warm between kernels" if args.program else "cold per kernel",
                       "l2_warm": list(g.cost.l2_warm) if g.cost else [],
                       "ncu_dram": dram, "modeled_l2": t.get("l2", 0), "ncu_l2": c.get("lts__t_bytes.sum", 0),
                       "modeled_us": g.cost.modeled_us if g.cost else None, "ncu_us": c.get("gpu__time_duration.sum"),
                       "achieved_occupancy_pct": c.get("sm__warps_active.avg.pct_of_peak_sustained_active"),
                       "instructions": c.get("smsp__inst_executed.sum")}
                results.append(row)
                total["mdram"] += row["modeled_dram"]
                total["dram"] += dram
                total["ml2"] += row["modeled_l2"]
                total["l2"] += row["ncu_l2"]
                print(f"| {store.stem} | {policy} | {g.name} | {row['modeled_dram'] / 1e6:.3f} | {dram / 1e6:.3f} | "
                      f"{row['modeled_l2'] / 1e6:.3f} | {row['ncu_l2'] / 1e6:.3f} | {row['modeled_us'] or 0:.1f} | "
                      f"{row['ncu_us'] or 0:.1f} |")
            print(f"| {store.stem} | {policy} | **all {len(plan.groups)}** | {total['mdram'] / 1e6:.3f} | "
                  f"{total['dram'] / 1e6:.3f} | {total['ml2'] / 1e6:.3f} | {total['l2'] / 1e6:.3f} | | |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
