"""What two per-element rates buy the host cost model, and which pair fits: a study. The model charges math ops
(E.OP_FLOPS: exp, erf, tanh, sigmoid, sin, cos, div, sqrt, ...) and idle vector lanes at `elementwise_flops`,
which the host probe measures on a chain of math functions, and plain arithmetic at `plain_flops` (a chain of
adds, products, ...); a device without plain_flops charges all of it at the one rate, as the model did before
(zoo bert's stitched layer norms: 79 µs modeled, 11 measured on a Zen 3, benchmarks/NOTES.md "tworate"). This
script splits each measured kernel's per-element flops into math, plain and idle-lane flops, recharges them at
a math rate T and a plain rate P, and prints Spearman's rho and the median factor per model, for the device's
own rates and for the best (T, P) of a grid.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/fit_cpu_rates.py CM.json [--device host] [--math 3,5,7,9]
        [--plain 8,16,24,32,48]

CM.json: `bench_cost_model.py --json` of the same commit and device (its plans are made again here, from the
schedule cache, and a kernel whose modeled time differs from the file's is left out). An approximation, said
plainly: each kernel's compute term is scaled by (new compute / old compute) summed over its segments, and
its time recomposed as max(memory, compute) with the file's wave quantisation, launch and barrier terms —
not estimate_group run per segment.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def split_flops(uses) -> tuple[float, float, float, float]:
    """(tiled, math + idle lanes, plain) flops of one kernel's whole grid, from its segments' SegmentUse, as
    cost.estimate_group charges them (idle lanes at the math rate)."""
    tiled = math_flops = plain = 0.0
    for u in uses:
        per_grid = u.tile.blocks / max(1, u.tile.row_split)
        tiled += u.flops_tiled * per_grid
        math_flops += (u.flops_math + u.flops_idle_lanes) * per_grid
        plain += (u.flops_fp32 - u.flops_tiled - u.flops_math) * per_grid
    return tiled, math_flops, plain


def recharge(row: dict, peak: float, rates: tuple[float, float], t: float, p: float) -> float:
    """The kernel's modeled µs with its per-element flops at math rate `t` and plain rate `p` in place of
    the device's (`rates`: math, plain)."""
    terms = row["terms"]
    compute, memory = terms["compute"], terms["dram"] + terms["l2"] + terms["shared"]
    tiled, m, plain = row["flops"]
    old = tiled / peak + m / rates[0] + plain / rates[1]
    if compute <= 0 or old <= 0:
        return row["modeled"]
    new = compute * (tiled / peak + m / t + plain / p) / old
    busiest = max(memory, compute)
    scale = (busiest + terms["wave_quantization"]) / busiest if busiest else 1.0
    fixed = row["modeled"] - busiest - terms["wave_quantization"]  # launch, barriers, segment serialisation
    return max(0.01, fixed + scale * max(memory, new))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("cm", type=Path)
    ap.add_argument("--device", default="host")
    ap.add_argument("--math", default="3,4,5,6,7,9,12", help="math rates to try, GFLOP/s")
    ap.add_argument("--plain", default="8,12,16,24,32,48,64", help="plain rates to try, GFLOP/s")
    args = ap.parse_args()

    from bench_cost_model import spearman

    from engine.api import load_graph
    from engine.device import get_device
    from engine.schedule.cost import at_kernel_block, segment_use
    from engine.schedule.pipeline import plan_model
    from engine.tilegraph.tilegraph import segments_of

    device = get_device(args.device)
    peak = device.peak_fp32_flops
    one_rate = device.elementwise_flops or device.peak_fp32_flops
    rates = (one_rate, device.plain_flops or one_rate)
    rows, skipped = [], 0
    for entry in json.loads(args.cm.read_text()):
        graph0 = load_graph(ROOT / "samples" / "zoo" / f"{entry['model']}.onnx")
        for policy, cell in entry["cells"].items():
            graph, plan = plan_model(graph0, policy, device)
            conns = {e.key: e.conn for e in plan.edges}
            measured = {k["name"]: k for k in cell["kernels"]}
            for g in plan.groups:
                k = measured.get(g.name)
                if k is None or g.cost is None or abs(g.cost.modeled_us - k["modeled_us"]) > 1e-3 * k["modeled_us"] + 1e-3:
                    skipped += k is not None
                    continue
                segs = segments_of(graph, g.stages, conns)
                uses = [segment_use(graph, s, conns, t, None, True, device) for s, t in zip(segs, at_kernel_block(g.segments))]
                rows.append({"model": entry["model"], "modeled": k["modeled_us"], "measured": k["measured_us"],
                             "terms": k["terms_us"], "flops": split_flops(uses)})

    def score(t: float, p: float) -> tuple[float, float, dict]:
        per, mod_all, mea_all = {}, [], []
        for model in sorted({r["model"] for r in rows}):
            mine = [r for r in rows if r["model"] == model]
            mod = [recharge(r, peak, rates, t, p) for r in mine]
            mea = [r["measured"] for r in mine]
            per[model] = (spearman(mod, mea), math.exp(statistics.median(abs(math.log(a / b)) for a, b in zip(mea, mod))))
            mod_all += mod
            mea_all += mea
        return (spearman(mod_all, mea_all),
                math.exp(statistics.median(abs(math.log(a / b)) for a, b in zip(mea_all, mod_all))), per)

    tiled, m, plain = (sum(r["flops"][i] for r in rows) for i in range(3))
    print(f"{len(rows)} kernels ({skipped} left out: modeled time differs from the file's); flops: tiled "
          f"{tiled / 1e9:.2f} G, math and idle lanes {m / 1e9:.2f} G, plain {plain / 1e9:.2f} G; device: GEMM peak {peak / 1e9:.1f}, "
          f"math {rates[0] / 1e9:.2f}, plain {rates[1] / 1e9:.2f} GFLOP/s\n")
    grid = [(t * 1e9, p * 1e9) for t in map(float, args.math.split(",")) for p in map(float, args.plain.split(","))]
    best = min(grid, key=lambda tp: score(*tp)[1])
    cases = [("the device's rates", *rates), ("best of the grid", *best)]
    models = sorted({r["model"] for r in rows})
    print("| rates (GFLOP/s) | all: ρ | all: factor | " + " | ".join(f"{m} ρ / factor" for m in models) + " |")
    print("|---|---:|---:|" + "---|" * len(models))
    for label, t, p in cases:
        rho, factor, per = score(t, p)
        cells = " | ".join(f"{per[m][0]:.2f} / {per[m][1]:.2f}x" for m in models)
        print(f"| {label}: math {t / 1e9:.1f}, plain {p / 1e9:.1f} | {rho:.3f} | {factor:.3f}x | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
