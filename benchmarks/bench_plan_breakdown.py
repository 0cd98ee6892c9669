"""Where cold planning time goes, and what cutting the tile search would buy: per model and device, the
welder plan made in a fresh process with the schedule cache off (every tile search runs), its wall time
split into the welder walk, the stitch plan it is held against (`welder.at_least_stitch`) and the rest,
and — across all of it — the seconds spent building candidate kernels (`generate.build_kernel`),
counting them (`count.count_kernel`) and taking floors (`floor.floor_us`), with the number of
connection trials, tile-search passes and kernels built. Those three parts are disjoint (none calls
another); "other" is the rest of the wall time (the walk's bookkeeping, regions, validity rules).

`--variant` re-runs each cell with a shortcut that is NOT in the engine, to bound what it could buy:
- `cap=N`: each tile-search pass stops once N candidates are costed (the rest of its pool, whatever its
  floor, is not tried) — plans may change;
- `tight`: the floor charges a contraction's multiply-adds at the per-element rate rather than the
  fastest the device has (no longer a floor on a CPU, where tiled GEMMs run near peak) — plans change;
- `shared-pools`: the stitch plan's searches share the welder walk's answers even where its pool adds
  split rows (the engine shares them where it does not: `tiles.splits_rows`) — plans may change where a
  split row would win;
- `tree=DIR`: base, planned by the engine in DIR (another checkout: `git worktree add DIR REV`), to set a
  change beside the code before it in one run.
The modeled total of the plan is printed beside the time, so a variant's cost in plan quality shows;
"speed vs first": the first variant's wall time over this one's (list base first); "costed": candidates the
tile-search passes cost (a typical-tile estimate each), "tied": those of them that model exactly the time of
their pass's best, other than the first such (ties the rank breaks by traffic and pool order).

    .venv/bin/python benchmarks/bench_plan_breakdown.py [MODEL|zoo|samples,...] [--devices host,a100]
        [--variant base] [--variant cap=4] [--variant tree=/tmp/before] ... [--rounds 3]

`--rounds N` plans each cell N times, the variants in turn (their order reversed every other round), and
prints the run of median wall time, and the median CPU seconds of the planning process ("cpu s": less
sensitive than the wall clock to other jobs on a shared machine; the counts are the same every run: the plan
is deterministic).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}

_CHILD = r"""
import json, sys, time
from engine.device import get_device
from engine.frontend.importer import load_graph
from engine.schedule.pipeline import plan_model
import engine.codegen.count as count_mod
import engine.codegen.generate as gen
import engine.schedule.build as build
import engine.schedule.floor as floor
import engine.schedule.policies.welder as welder
import engine.schedule.tiles as tiles

model, device_name, variant = sys.argv[1:4]
spent = {"walk": 0.0, "stitch": 0.0, "build": 0.0, "count": 0.0, "floor": 0.0}
calls = {"trials": 0, "passes": 0, "builds": 0, "floors": 0}


def timed(module, name, bucket=None, counter=None):
    assert hasattr(module, name), f"{module.__name__}.{name} is gone: update bench_plan_breakdown.py"
    inner = getattr(module, name)

    def wrapper(*a, **k):
        if counter:
            calls[counter] += 1
        if bucket is None:
            return inner(*a, **k)
        t = time.perf_counter()
        try:
            return inner(*a, **k)
        finally:
            spent[bucket] += time.perf_counter() - t
    setattr(module, name, wrapper)
    return inner


timed(welder, "welder_walk", "walk")
timed(welder, "at_least_stitch", "stitch")
timed(gen, "build_kernel", "build", "builds")
timed(count_mod, "count_kernel", "count")
timed(tiles, "floor_us", "floor", "floors")
timed(build, "_try_level", None, "trials")
timed(tiles, "_search_pass", None, "passes")

# Candidates the passes cost, and how many of them model exactly the time of their pass's best (ties, which the
# rank breaks by traffic and pool order: a pass costs them all).
calls.update(costed=0, tied=0)
costing: list = []
assert hasattr(tiles, "estimate_group"), "tiles.estimate_group is gone: update bench_plan_breakdown.py"
estimate, search_pass = tiles.estimate_group, tiles._search_pass


def counted_estimate(*a, **k):
    cost = estimate(*a, **k)
    if costing and not k.get("exact"):
        costing[-1].append(cost.modeled_us)
    return cost


def counted_pass(*a, **k):
    costing.append([])
    try:
        return search_pass(*a, **k)
    finally:
        got = costing.pop()
        calls["costed"] += len(got)
        calls["tied"] += sum(1 for x in got if x == min(got)) - 1 if got else 0


tiles.estimate_group, tiles._search_pass = counted_estimate, counted_pass

if variant.startswith("cap="):
    cap, kth = int(variant[4:]), tiles._kth_best
    tiles._kth_best = lambda scored, k: -float("inf") if len(scored) >= max(cap, k) else kth(scored, k)
elif variant == "tight":
    work = floor._segment_work

    def tight(graph, members, seg, conns, tile, device, *rest):
        got = list(work(graph, members, seg, conns, tile, device, *rest))
        _, macs, other, _ = floor.work_floor(graph, seg, conns, got[4]) if tile.row_split == 1 else (0.0,) * 4
        rate = device.elementwise_flops or device.peak_fp32_flops
        got[2] = (macs + other) / rate * tile.blocks / max(1, tile.row_split)
        return tuple(got)
    floor._segment_work = tight
elif variant == "shared-pools":
    search = tiles.search_group

    def shared(graph, stages, conns, device, mode, *a, **k):
        return search(graph, stages, conns, device, "tiles" if mode == "stitch" else mode, *a, **k)
    tiles.search_group = build.search_group = shared
elif variant != "base":
    raise SystemExit(f"unknown variant {variant!r}")

device, graph = get_device(device_name), load_graph(model)
t0, c0 = time.perf_counter(), time.process_time()
_, plan = plan_model(graph, "welder", device)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
print(json.dumps({"wall": wall, "cpu": cpu, "spent": spent, "calls": calls, "kernels": len(plan.groups),
                  "modeled_us": sum(g.cost.modeled_us for g in plan.groups if g.cost)}))
"""


def models_of(spec: str) -> list[Path]:
    out: list[Path] = []
    for part in spec.split(","):
        out += sorted(SETS[part].glob("*.onnx")) if part in SETS else [Path(part)]
    return out


def cell(model: Path, device: str, variant: str) -> dict:
    tree = Path(variant[5:]) if variant.startswith("tree=") else ROOT
    env = dict(os.environ, TILEWEAVE_SCHEDULE_CACHE="off", PYTHONPATH=str(tree))
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(model.resolve()), device,
                           "base" if variant.startswith("tree=") else variant], capture_output=True, text=True, env=env,
                          cwd=tree)
    if proc.returncode:
        raise SystemExit(f"{model.stem} on {device} ({variant}): {(proc.stderr.strip().splitlines() or ['failed'])[-1]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def variant_ok(text: str) -> str:
    if text in ("base", "tight", "shared-pools") or (text.startswith("cap=") and text[4:].isdigit() and int(text[4:]) > 0):
        return text
    if text.startswith("tree="):
        if not (Path(text[5:]) / "engine" / "schedule" / "tiles.py").is_file():
            raise argparse.ArgumentTypeError(f"{text[5:]!r} is not a tileweave checkout (no engine/schedule/tiles.py): "
                                             "make one with git worktree add DIR REV")
        return text
    raise argparse.ArgumentTypeError(f"unknown variant {text!r}: use base, cap=N (N >= 1), tight, shared-pools "
                                     "or tree=DIR")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="?", default="samples/bert12.onnx,zoo")
    p.add_argument("--devices", default="host")
    p.add_argument("--variant", action="append", type=variant_ok,
                   help="base (default), cap=N, tight, shared-pools or tree=DIR; repeatable")
    p.add_argument("--rounds", type=int, default=1, help="plans per cell, the median wall time printed (default 1)")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    variants = args.variant or ["base"]
    print("| model | device | variant | wall s | cpu s | walk | stitch | rest | builds s | counts s | floors s | other s "
          "| trials | passes | kernels built | floors | plan kernels | modeled us | speed vs first | cpu vs first | costed | tied |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for model in models_of(args.models):
        for device in args.devices.split(","):
            runs: dict[str, list[dict]] = {v: [] for v in variants}
            for k in range(args.rounds):
                for variant in (variants if k % 2 == 0 else variants[::-1]):
                    runs[variant].append(cell(model, device, variant))
            base_wall = base_cpu = None
            for variant in variants:
                r = sorted(runs[variant], key=lambda x: x["wall"])[(len(runs[variant]) - 1) // 2]
                cpu = sorted(x["cpu"] for x in runs[variant])[(len(runs[variant]) - 1) // 2]
                s, c = r["spent"], r["calls"]
                parts = s["build"] + s["count"] + s["floor"]
                base_wall = r["wall"] if base_wall is None else base_wall
                base_cpu = cpu if base_cpu is None else base_cpu
                print(f"| {model.stem} | {device} | {variant} | {r['wall']:.2f} | {cpu:.2f} | {s['walk']:.2f} | {s['stitch']:.2f} | "
                      f"{r['wall'] - s['walk'] - s['stitch']:.2f} | {s['build']:.2f} | {s['count']:.2f} | "
                      f"{s['floor']:.2f} | {r['wall'] - parts:.2f} | {c['trials']} | {c['passes']} | {c['builds']} | "
                      f"{c['floors']} | {r['kernels']} | {r['modeled_us']:.1f} | {base_wall / r['wall']:.2f}x | {base_cpu / cpu:.2f}x | "
                      f"{c['costed']} | {c['tied']} |",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
