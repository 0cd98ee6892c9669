"""The issue-12 table from `tileweave bench --json` output: per model onnxruntime's median and each policy's
ms and ratio, the medians and worst ratios per policy (item 6), and item 4's paired comparison of welder
(and welder+tune) with the better of unfused and stitch.

    OMP_NUM_THREADS=2 .venv/bin/tileweave bench samples/zoo/*.onnx --policy unfused --policy stitch \
        --policy welder --policy welder+tune --tune 3 --runs 21 --json > run.json
    .venv/bin/python benchmarks/bench_table.py run.json [more.json ...]

Item 4, paired: `tileweave bench` times every policy of a model in the same rounds, so round k of welder and
round k of the better other policy (the lower median of unfused and stitch) ran side by side. The per-round
ratio welder_k / other_k has its median and a 90 % bootstrap interval of that median (2,000 resamples of the
rounds, fixed seed). *behind*: the whole interval is over 1 (slower beyond this run's noise); *ahead*: the
whole interval under 1; *level* otherwise; *same program* where both print the same C source (runs of
`tileweave bench` that record it). The interval covers round-to-round noise, not where each program's buffers
landed in memory (one program on other buffers measured up to 1.12x apart: benchmarks/NOTES.md placement).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from engine.profile.bench import paired_ratio as paired

OTHERS = ("unfused", "stitch")


def verdict(lo: float, hi: float) -> str:
    return "behind" if lo > 1.0 else "ahead" if hi < 1.0 else "level"


def _f(value, fmt: str) -> str:
    return "–" if value is None else f"{value:{fmt}}"


def tables(result: dict) -> str:
    models = result["models"]
    policies = list(dict.fromkeys(p for m in models for p in m["policies"]))
    m = result["machine"]
    out = [f"{m['cpu']}, {m['threads']} threads, onnxruntime {m['onnxruntime']}, load at start "
           f"{m['load_average']}; {result['runs']} rounds, plans for {result['device']}", "",
           "| model | ort ms | " + " | ".join(f"{p} ms" for p in policies) + " | "
           + " | ".join(f"{p} ÷ ort" for p in policies) + " |",
           "|---|---:|" + "---:|" * (2 * len(policies))]
    for model in models:
        cells = model["policies"]
        out.append(f"| {model['name']} | {_f(model['ort_ms'], '.3f')} | "
                   + " | ".join(_f(cells.get(p, {}).get("ms"), ".3f") for p in policies) + " | "
                   + " | ".join(_f(cells.get(p, {}).get("ratio"), ".2f") for p in policies) + " |")
    out.append("")
    for p in policies:
        ratios = [mo["policies"][p]["ratio"] for mo in models if mo["policies"].get(p, {}).get("ratio") is not None]
        if ratios:
            worst = max(models, key=lambda mo: mo["policies"].get(p, {}).get("ratio") or 0)
            out.append(f"- {p}: median {statistics.median(ratios):.2f}x onnxruntime, at most {max(ratios):.2f}x "
                       f"({worst['name']}), over {len(ratios)} models")
    for ours in [p for p in policies if p.split("+")[0] == "welder"]:
        out += ["", f"Item 4, {ours} against the better of unfused and stitch (per-round ratios, paired):", "",
                "| model | better other | its ms | ours ms | median ratio | 90 % interval | verdict |",
                "|---|---|---:|---:|---:|---:|---|"]
        counts: dict[str, int] = {}
        for model in models:
            cells = model["policies"]
            if not cells.get(ours, {}).get("ms_samples"):
                continue
            others = [p for p in OTHERS if cells.get(p, {}).get("ms_samples")]
            if not others:
                continue
            best = min(others, key=lambda p: cells[p]["ms"])
            med, lo, hi = paired(cells[ours]["ms_samples"], cells[best]["ms_samples"])
            v = "same program" if best in cells[ours].get("same_program_as", ()) else verdict(lo, hi)
            counts[v] = counts.get(v, 0) + 1
            out.append(f"| {model['name']} | {best} | {cells[best]['ms']:.3f} | {cells[ours]['ms']:.3f} | "
                       f"{med:.3f} | {lo:.3f}-{hi:.3f} | {v} |")
        out += ["", f"{ours}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items()))]
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="`tileweave bench --json` output files")
    args = p.parse_args(argv)
    for k, path in enumerate(args.runs):
        if k:
            print()
        print(f"### {Path(path).name}\n")
        print(tables(json.loads(Path(path).read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
