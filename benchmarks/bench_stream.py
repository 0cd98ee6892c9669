"""Fused memory-bound kernels against STREAM, both measured in one run (issue 12 item 6): for each model, the
plan for the host (`--policy`, welder by default), its C program compiled and each kernel launched --runs times
in a row (as `bench_cost_model.py` times them); for every kernel without a contraction, the least bytes it must
move — each tensor it reads from outside the kernel once, no more than its tiles touch (128 B lines), and each
tensor it writes once — over its best launch (STREAM too reports its best run), against bandwidths measured
before and after the models, the better of the two: "STREAM", the probe's DRAM triad (three arrays of 4x the
last-level cache), "copy", the probe's DRAM copy (one array read and one written, 4x the last-level cache
each: a kernel writing as much as it reads is nearer a copy, the triad's two reads per write hiding more of
the write-allocate traffic STREAM does not count) and "LLC", the probe's triad over half the last-level cache
(where a model that fits it reads from) — all three `host.measure_bandwidths`. A kernel without a contraction is memory-intensive
(AStitch's word: its operators do a few flops per element moved); the model's own verdict is a column beside it
("mem" where its memory terms, DRAM + L2 + L1, are at least its compute term: on a CPU a chain of erf / exp runs
at the per-element rate and the model may call it compute-bound). Summaries count memory-intensive kernels
reaching 70 % of STREAM, all of them and those moving at least --big MiB (a kernel of a few KB is a launch, not
a stream), and the time-weighted figure (Σ bytes / Σ best time).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_stream.py [MODEL|zoo|samples,...] [--policy welder]
        [--runs 15] [--big 1] [--kernels] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}
TARGET = 0.70  # of STREAM (issue 12 item 6)


def models_of(spec: str) -> list[Path]:
    out: list[Path] = []
    for part in spec.split(","):
        out += sorted(SETS[part].glob("*.onnx")) if part in SETS else [Path(part)]
    return out


def least_bytes(graph, group, conns: dict, device) -> int:
    """Bytes a kernel must move at least: every tensor read from outside it once (no more than its tiles'
    128 B lines cover, as the cost model caps a kernel's reads: `cost.kernel_read_bytes`) and every tensor it
    writes once."""
    from engine.schedule.cost import at_kernel_block, kernel_read_bytes, nbytes, segment_use
    from engine.tilegraph.tilegraph import segments_of

    members = set(group.stages)
    uses = [segment_use(graph, seg, conns, tile, exact=True, device=device)
            for seg, tile in zip(segments_of(graph, group.stages, conns), at_kernel_block(group.segments))]
    read = sum(b for t, b in kernel_read_bytes(graph, uses).items() if t not in members)
    written = sum(nbytes(graph, s) for s in group.stages
                  if s in graph.outputs or any(c not in members for c in graph.consumers.get(s, ())))
    return read + written


def model_rows(path: Path, policy: str, device, runs: int) -> list[dict]:
    """One row per kernel of `path`'s plan: its measured time and, without a contraction, its bytes."""
    from benchmarks.bench_cost_model import time_on_host
    from engine.frontend.importer import load_graph
    from engine.ir.graph import StageKind
    from engine.schedule.pipeline import plan_model

    planned, plan = plan_model(load_graph(path), policy, device)
    measured, _, _ = time_on_host(planned, plan, device, runs)
    conns = {e.key: e.conn for e in plan.edges}
    rows = []
    for g in plan.groups:
        terms = g.cost.terms_us if g.cost else {}
        contraction = any(planned.stage(s).kind == StageKind.CONTRACTION for s in g.stages)
        memory = sum(terms.get(k, 0.0) for k in ("dram", "l2", "shared"))
        rows.append({"model": path.stem, "kernel": g.name, "stages": len(g.stages), "contraction": contraction,
                     "model_memory_bound": not contraction and memory >= terms.get("compute", 0.0),
                     "bytes": None if contraction else least_bytes(planned, g, conns, device),
                     "measured_us": min(measured[g.name][2]), "median_us": measured[g.name][0],
                     "modeled_us": g.cost.modeled_us if g.cost else None})
    return rows


def summary(rows: list[dict], stream: float, llc: float, big: int, copy: float) -> dict:
    """Counts and fractions over memory-intensive kernels: all, those moving at least `big` bytes, and those
    the model calls memory-bound."""
    def part(sel: list[dict]) -> dict:
        if not sel:
            return {"kernels": 0}
        fracs = [r["bytes"] / (r["measured_us"] * 1e-6) / stream for r in sel]
        total = sum(r["bytes"] for r in sel) / (sum(r["measured_us"] for r in sel) * 1e-6)
        return {"kernels": len(sel), "at_target": sum(f >= TARGET for f in fracs),
                "model_memory_bound": sum(r["model_memory_bound"] for r in sel),
                "median_of_stream": statistics.median(fracs), "weighted_of_stream": total / stream,
                "weighted_of_copy": total / copy, "weighted_of_llc": total / llc}
    bound = [r for r in rows if not r["contraction"] and r["measured_us"] > 0]
    return {"all": part(bound), "big": part([r for r in bound if r["bytes"] >= big]),
            "model": part([r for r in bound if r["model_memory_bound"]])}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="?", default="zoo,samples")
    p.add_argument("--policy", default="welder")
    p.add_argument("--runs", type=int, default=15)
    p.add_argument("--big", type=float, default=1.0, help="MiB a kernel moves to count as sizeable (default 1)")
    p.add_argument("--kernels", action="store_true", help="print every memory-intensive kernel too")
    p.add_argument("--json", help="write every row and the bandwidths here")
    args = p.parse_args(argv)
    from engine.device import get_device
    from engine.host import measure_bandwidths

    missing = [m for m in models_of(args.models) if not m.exists()]
    if missing:
        print(f"error: no model {missing[0]} (give .onnx paths, zoo or samples)", file=sys.stderr)
        return 2
    device = get_device("host")
    before = measure_bandwidths()
    rows: list[dict] = []
    for model in models_of(args.models):
        rows += model_rows(model, args.policy, device, args.runs)
        print(f"# {model.stem}: {len(rows)} kernels so far", file=sys.stderr, flush=True)
    after = measure_bandwidths()
    stream, llc = max(before["dram_bw"], after["dram_bw"]), max(before["llc_bw"], after["llc_bw"])
    copy = max(before["copy_bw"], after["copy_bw"])
    big = int(args.big * 2**20)
    print(f"STREAM (DRAM triad) {stream / 1e9:.1f} GB/s, DRAM copy {copy / 1e9:.1f}, LLC triad {llc / 1e9:.1f} (the "
          f"better of before {before['dram_bw'] / 1e9:.1f} / {before['copy_bw'] / 1e9:.1f} / {before['llc_bw'] / 1e9:.1f} "
          f"and after {after['dram_bw'] / 1e9:.1f} / {after['copy_bw'] / 1e9:.1f} / {after['llc_bw'] / 1e9:.1f}); "
          f"{device.sm_count} threads; policy {args.policy}; kernels: best of {args.runs} launches; target "
          f"{TARGET:.0%} of STREAM")
    print()
    print(f"| model | kernels | memory-intensive | at {TARGET:.0%} | time-weighted, of STREAM | of LLC | "
          f"≥ {args.big:g} MiB | at {TARGET:.0%} | time-weighted, of STREAM | of LLC |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == name]
        s = summary(mine, stream, llc, big, copy)
        a, b = s["all"], s["big"]
        print(f"| {name} | {len(mine)} | {a['kernels']} | {a.get('at_target', '-')} | {_pct(a.get('weighted_of_stream'))} | "
              f"{_pct(a.get('weighted_of_llc'))} | {b['kernels']} | {b.get('at_target', '-')} | "
              f"{_pct(b.get('weighted_of_stream'))} | {_pct(b.get('weighted_of_llc'))} |")
    s = summary(rows, stream, llc, big, copy)
    for label, part in (("all memory-intensive kernels", s["all"]), (f"those moving ≥ {args.big:g} MiB", s["big"]),
                        ("those the model calls memory-bound", s["model"])):
        if part["kernels"]:
            print(f"\n{label}: {part['kernels']} ({part['model_memory_bound']} memory-bound by the model), "
                  f"{part['at_target']} at ≥ {TARGET:.0%} of STREAM; median {_pct(part['median_of_stream'])}, "
                  f"time-weighted {_pct(part['weighted_of_stream'])} of STREAM ({_pct(part['weighted_of_copy'])} of "
                  f"the copy, {_pct(part['weighted_of_llc'])} of the LLC triad)")
    if args.kernels:
        print("\n| model | kernel | stages | bytes | best us | median us | GB/s | of STREAM | of copy | of LLC | modeled us "
              "| model says |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for r in rows:
            if not r["contraction"] and r["measured_us"] > 0:
                gbs = r["bytes"] / (r["measured_us"] * 1e-6)
                print(f"| {r['model']} | {r['kernel']} | {r['stages']} | {r['bytes']} | {r['measured_us']:.1f} | "
                      f"{r['median_us']:.1f} | {gbs / 1e9:.1f} | {_pct(gbs / stream)} | {_pct(gbs / copy)} | "
                      f"{_pct(gbs / llc)} | {r['modeled_us']:.1f} | "
                      f"{'mem' if r['model_memory_bound'] else 'compute'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"stream_bw": stream, "copy_bw": copy, "llc_bw": llc, "before": before, "after": after,
                                               "policy": args.policy, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
