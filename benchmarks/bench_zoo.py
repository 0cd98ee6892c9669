"""The model zoo (samples/zoo/) × four policies through `tileweave bench`'s engine (engine/profile/bench.py):
ours on the CPU backend vs onnxruntime, plus the plan's modeled DRAM bytes against the floor (inputs +
weights + outputs moved once) and the schedule time, as a Markdown table.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_zoo.py [--runs 10] [--timeout 300] [--models a,b]
        [--json out.json] [--write benchmarks/RESULTS.md]

`--write` replaces the block between `<!-- zoo:begin -->` and `<!-- zoo:end -->` in that file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from results_block import replace_block

from engine.profile.bench import POLICIES, bench_models

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "samples" / "zoo"


def _f(value, fmt: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def markdown(result: dict, families: dict[str, str], command: str) -> str:
    m = result["machine"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip() or "?"
    lines = [
        "## Model zoo: CPU backend vs onnxruntime per policy (real torch.onnx exports)", "",
        f"`{command}` (commit {commit}). {m['cpu']}, {m['cores']} cores, {m['threads']} threads for both "
        f"onnxruntime {m['onnxruntime']} (ORT_ENABLE_ALL) and OpenMP, GOMP_SPINCOUNT={m['gomp_spincount']}; "
        f"load average at start {m['load_average']}. Per model and policy one worker process plans for the "
        f"{result['device']} preset, compiles the generated C and checks it; then one process per model "
        f"times onnxruntime and every policy in the same {result['runs']} interleaved rounds (after 2 "
        f"warm-ups; medians); ratio = ours / onnxruntime's median. A cell that outlives {result['timeout_s']:g} s "
        "(planning and compiling included) is killed: *timeout (phase)*. DRAM MB is the plan's modeled "
        "DRAM traffic on the preset (cost model, datasheet figures) and *× floor* divides it by the "
        "model's floor (inputs + weights + outputs once); schedule s is `plan_model`'s wall time. The "
        "machine is shared with other developers' jobs and noisy: ratios within ~1.5× of each other "
        "are not distinguishable from one run.", "",
        "| model | family | ort ms | policy | kernels | ours ms | ours/ort | max rel err | modeled µs | "
        "DRAM MB | × floor | schedule s | compile s |",
        "|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in result["models"]:
        floor = model["min_dram_bytes"]
        for k, (policy, c) in enumerate(model["policies"].items()):
            if c["timeout"]:
                ms = f"timeout ({c['phase']})"
            elif c.get("error"):
                ms = f"error: {c['error'][:80]}"
            else:
                ms = _f(c["ms"], ".2f")
            dram = c.get("dram_bytes")
            ratio_floor = dram / floor if dram and floor else None
            lines.append(
                f"| {model['name'] if k == 0 else ''} | {families.get(model['name'], '') if k == 0 else ''} | "
                f"{_f(model['ort_ms'], '.3f') if k == 0 else ''} | {policy} | {_f(c['kernels'], 'd')} | {ms} | "
                f"{_f(c['ratio'], '.1f', '×')} | {_f(c['max_rel_err'], '.1e')} | {_f(c['modeled_us'], '.1f')} | "
                f"{_f(dram and dram / 1e6, '.2f')} | {_f(ratio_floor, '.2f')} | {_f(c.get('schedule_s'), '.2f')} | "
                f"{_f(c.get('compile_s'), '.1f')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--policies", default=",".join(POLICIES))
    p.add_argument("--device", default="a100")
    p.add_argument("--json", metavar="OUT.json", help="also write the raw result")
    p.add_argument("--write", metavar="RESULTS.md", help="put the table into this file's zoo block")
    args = p.parse_args(argv)
    catalog = json.loads((ZOO / "catalog.json").read_text())
    names = [n for n in args.models.split(",") if n] or [e["name"] for e in catalog]
    families = {e["name"]: e["family"] for e in catalog}
    result = bench_models([str(ZOO / f"{n}.onnx") for n in names], args.policies.split(","),
                          device=args.device, runs=args.runs, timeout=args.timeout,
                          progress=lambda msg: print(f"... {msg}", file=sys.stderr, flush=True))
    command = "OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_zoo.py " + " ".join(argv or sys.argv[1:])
    text = markdown(result, families, command.strip())
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.write:
        replace_block(Path(args.write), "zoo", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
