"""Measured GPU runs re-read offline: the per-model table of `bench_cost_model.py --device gpu` from its saved
JSON, and what a latency (Little's law) term in the cost model would change, evaluated on those kernels.

    .venv/bin/python benchmarks/gpu_analysis.py [benchmarks/data/h200-2026-11-27] [--latency-variants] [--rate-variant]
        [--against=FILE.json.gz:POLICY]

Reads every bench*.json(.gz) in the folder (a model present twice is taken from the last file in name
order). The latency variant divides a kernel's memory terms by min(1, W·m·128 B / (L · the SM's share of L2
bytes per clock)) and its compute term by min(1, W / 8), W = warps resident per SM in its grid, for latency L
and m lines in flight per warp; the table shows each (L, m) against the model as it is (`--latency-variants`; meaningful only for runs whose
model had no latency term yet, i.e. before commit c790a82: benchmarks/data/h200-2026-11-26). The rate
variant (`--rate-variant`, for runs whose model had the latency term as a fraction of each SM's share,
benchmarks/data/h200-2026-11-27) re-evaluates each kernel with its memory terms at what the SMs its grid
occupies can draw (per SM: warps x lines in flight x 128 B per latency, at most a 64 B/clk port; times
min(blocks, SMs)), not wave quantised, and only the shared-memory and compute terms quantised (exact for
one-segment kernels; a kernel with grid barriers is taken at its widest grid). That rule is the branch
`gpurate` (`cost.memory_rate`), not main's model: benchmarks/NOTES.md `gpurate` says why.
"""

from __future__ import annotations

import gzip
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_cost_model import spearman  # noqa: E402

SM, L2_BYTES_PER_CLK, CLOCK_HZ, DRAM_BW = 132, 5120, 1.98e9, 4.8e12  # the h200 preset
POLICIES = ("unfused", "elementwise", "stitch", "welder")


def load(folder: Path) -> list[dict]:
    seen, models = set(), []
    for path in sorted(folder.glob("bench*.json*"), reverse=True):
        data = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        for m in data:
            if m["model"] not in seen:
                seen.add(m["model"])
                models.append(m)
    return sorted(models, key=lambda m: m["model"])


def _stored(k: dict) -> tuple[dict, int, float, float]:
    """(terms, warps resident per busy SM, segment serialisation, wave quantisation factor) of a measured
    kernel as its run's model saw it: what each variant below starts from."""
    t = k["terms_us"]
    warps = min(max(1, k["resident_blocks_per_sm"] or 1), -(-max(1, k["grid"]) // SM)) * max(1, -(-k["threads"] // 32))
    serial = t.get("segment_serialization", 0)
    busy = max(t["dram"], t["l2"], t["shared"], t["compute"]) + serial
    return t, warps, serial, 1 + t.get("wave_quantization", 0) / busy if busy else 1.0


def with_latency(k: dict, latency: float, lines_in_flight: float) -> float:
    t, warps, serial, quant = _stored(k)
    eff_mem = min(1.0, warps * lines_in_flight * 128 / (latency * L2_BYTES_PER_CLK / SM))
    eff_fma = min(1.0, warps / 8)
    top = max(t["dram"] / eff_mem, t["l2"] / eff_mem, t["shared"] / min(1.0, 2 * eff_fma), t["compute"] / eff_fma)
    return (top + serial) * quant + t["launch"] + t.get("grid_barrier", 0)


def with_rate(k: dict, latency: float = 600.0, lines_in_flight: float = 4.0, port: float = 64.0) -> float:
    """The kernel's modeled time with its memory terms at the rate its grid's SMs can draw, not wave quantised
    (branch gpurate's cost.memory_rate; the bytes recovered from the run's terms)."""
    t, warps, serial, quant = _stored(k)
    share = min(1.0, warps * lines_in_flight * 128 / (latency * L2_BYTES_PER_CLK / SM))  # the old term's fraction
    rate = min(SM, max(1, k["grid"])) * min(port, warps * lines_in_flight * 128 / latency) * CLOCK_HZ
    dram = t["dram"] * 1e-6 * DRAM_BW * share / min(DRAM_BW, rate) * 1e6  # bytes back from the old term
    l2 = t["l2"] * 1e-6 * L2_BYTES_PER_CLK * CLOCK_HZ * share / min(L2_BYTES_PER_CLK * CLOCK_HZ, rate) * 1e6
    top = max(dram, l2, t["shared"] * quant, t["compute"] * quant)
    return top + serial * quant + t["launch"] + t.get("grid_barrier", 0)


def with_level_latency(k: dict, latency: float = 600.0, lines_in_flight: float = 4.0) -> float:
    """The kernel's modeled time with its DRAM term's latency fraction taken against the SM's share of DRAM
    bandwidth instead of L2's (the run's model, and main's, take both against L2's: NOTES `gpurate`)."""
    t, warps, serial, quant = _stored(k)
    in_flight = warps * lines_in_flight * 128 / latency  # bytes per clock per SM
    old = min(1.0, in_flight / (L2_BYTES_PER_CLK / SM))
    new = min(1.0, in_flight / (DRAM_BW / CLOCK_HZ / SM))
    top = max(t["dram"] * old / new, t["l2"], t["shared"], t["compute"])
    return (top + serial) * quant + t["launch"] + t.get("grid_barrier", 0)


def score(models: list[dict], estimate, ranking: bool = True) -> str:
    rows = [(m["model"], p, estimate(k), k["measured_us"]) for m in models for p, c in m["cells"].items()
            for k in c["kernels"]]
    logs = [abs(math.log(b / a)) for _, _, a, b in rows]
    best = 0
    for m in models:
        tot = {p: [sum(a for n, q, a, _ in rows if n == m["model"] and q == p),
                   sum(b for n, q, _, b in rows if n == m["model"] and q == p)] for p in m["cells"]}
        best += min(tot, key=lambda p: tot[p][0]) == min(tot, key=lambda p: tot[p][1])
    logs.sort()
    return (f"ρ {spearman([r[2] for r in rows], [r[3] for r in rows]):.2f} | median factor "
            f"{math.exp(statistics.median(logs)):.2f}× | 90th percentile {math.exp(logs[int(0.9 * len(logs))]):.2f}×"
            + (f" | fastest policy right on {best} of {len(models)}" if ranking else f" | {len(rows)} kernels"))


def side_by_side(models: list[dict], path: str, policy: str, base: str = "welder") -> None:
    """`--against=FILE:POLICY`: each model of FILE (a bench JSON of other plans, e.g. a branch's welder plans
    saved as POLICY) beside this folder's `base` policy: modeled (this run's model at the compiled registers),
    kernels alone, back to back, and the ratios of the two measured times."""
    raw = Path(path).read_bytes()
    other = {m["model"]: m["cells"][policy] for m in json.loads(gzip.decompress(raw) if path.endswith(".gz") else raw)}
    mine = {m["model"]: m["cells"][base] for m in models}
    print(f"\n| model | {base} modeled / alone / back to back µs | {policy} modeled / alone / back to back µs | "
          f"alone {policy} / {base} | back to back {policy} / {base} |\n|---|---:|---:|---:|---:|")
    ratios = []
    for name in sorted(set(other) & set(mine)):
        a, b = mine[name], other[name]
        al, bl = (sum(k["measured_us"] for k in c["kernels"]) for c in (a, b))
        ratios.append((bl / al, b["program_us"] / a["program_us"]))
        print(f"| {name} | {a['modeled_total_us']:.0f} / {al:.0f} / {a['program_us']:.0f} | "
              f"{b['modeled_total_us']:.0f} / {bl:.0f} / {b['program_us']:.0f} | {ratios[-1][0]:.2f} | {ratios[-1][1]:.2f} |")
    if ratios:
        print(f"| median of {len(ratios)} | | | {statistics.median(r[0] for r in ratios):.2f} | "
              f"{statistics.median(r[1] for r in ratios):.2f} |")


def main() -> int:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    folder = Path(args[0]) if args else ROOT / "benchmarks" / "data" / "h200-2026-11-27"
    models = load(folder)
    print("| model | kernels | Spearman ρ | median factor | " + " | ".join(f"{p} modeled / measured µs" for p in POLICIES)
          + " | fastest by model | fastest measured | all four ordered as measured | max rel err | registers driver = parsed |")
    print("|---|---:|---:|---:|" + "---:|" * len(POLICIES) + "---|---|---|---:|---:|")
    for m in models:
        ks = [k for c in m["cells"].values() for k in c["kernels"]]
        same = sum(k["registers_driver"] == k["registers_parsed"] for k in ks)
        cols = " | ".join(f"{m['programs'][p][0]:.0f} / {m['programs'][p][1]:.0f}" for p in POLICIES)
        err = max(c["max_rel_err"] for c in m["cells"].values())
        print(f"| {m['model']} | {m['kernels']} | {m['rho']:.2f} | {m['median_factor']:.2f}× | {cols} | "
              f"{m['rank_model'][0]} | {m['rank_measured'][0]} | {'yes' if m['same_ranking'] else 'no'} | {err:.1e} | "
              f"{same}/{len(ks)} |")
    if any(c.get("program_us") for m in models for c in m["cells"].values()):
        print("\n| model | " + " | ".join(f"{p} modeled / kernels alone / back to back µs" for p in POLICIES)
              + " |\n|---|" + "---:|" * len(POLICIES))
        for m in models:
            print(f"| {m['model']} | " + " | ".join(
                f"{m['programs'][p][0]:.0f} / {m['programs'][p][1]:.0f} / {m['cells'][p].get('program_us') or 0:.0f}"
                for p in POLICIES) + " |")
    if any(c.get("program_us") for m in models for c in m["cells"].values()):
        print("\n| policy | programs | kernels | launch saved in a program, median µs a kernel | back to back, median µs a kernel |"
              "\n|---|---:|---:|---:|---:|")
        for p in POLICIES:
            cells = [m["cells"][p] for m in models if m["cells"][p].get("program_us")]
            alone = [sum(k["measured_us"] for k in c["kernels"]) for c in cells]
            n = [len(c["kernels"]) for c in cells]
            print(f"| {p} | {len(cells)} | {sum(n)} | "
                  f"{statistics.median((a - c['program_us']) / k for a, c, k in zip(alone, cells, n)):.1f} | "
                  f"{statistics.median(c['program_us'] / k for c, k in zip(cells, n)):.1f} |")
    for other in (a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--against=")):
        side_by_side(models, *other.split(":"))
    print("\n| cost model | all kernels |\n|---|---|")
    print(f"| as it is | {score(models, lambda k: k['modeled_us'])} |")
    for latency in (300, 600) if "--latency-variants" in sys.argv else ():
        for lines in (1, 2, 4, 8):
            print(f"| with latency {latency} cycles, {lines} lines in flight per warp | "
                  f"{score(models, lambda k, a=latency, b=lines: with_latency(k, a, b))} |")
    if "--rate-variant" in sys.argv:
        small = [dict(m, cells={p: dict(c, kernels=[k for k in c["kernels"] if k["grid"] < SM and k["modeled_us"] > 20])
                                for p, c in m["cells"].items()}) for m in models]
        for label, estimate in (("as it is", lambda k: k["modeled_us"]),
                                ("DRAM's latency fraction against the DRAM share (not in the model)", with_level_latency),
                                ("memory at the rate its grid's SMs draw (branch gpurate)", with_rate)):
            if label != "as it is":  # printed above
                print(f"| {label}, all kernels | {score(models, estimate)} |")
            print(f"| {label}, grids under {SM} blocks modeled over 20 µs | {score(small, estimate, False)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
