"""Policies of one model timed side by side on the CPU backend: per model one worker process plans
(for the device preset), compiles and checks every policy, then times onnxruntime and each policy's
program round-robin, repeat by repeat, in that one process, so the ratios between policies are not
at the mercy of the machine's drift between processes (bench_zoo.py runs each policy in its own
worker, minutes apart: on this shared 2-core machine onnxruntime's own time moved 1.8x between two
cells of one model). Prints a Markdown table of medians, the ratio of each policy to the first, and beside
them each plan's modeled µs on the device preset (a GPU's, not this CPU's: the model's ratio is shown next
to the measured one so the two can be compared, not because they should agree).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_side_by_side.py [--set zoo|samples] [--models a,b]
        [--policies unfused,welder,welder+tune] [--tune 3] [--runs 25] [--device a100|host] [--timeout 600]
        [--json OUT.json]

A policy named P+tune is P's plan tuned by measurement on the device (`--tune K`); with --device host the
plans are made for this CPU.

OMP_NUM_THREADS (default 1 here: two-thread whole-program times on this machine are dominated by
libgomp barrier waits) is used for both sides: onnxruntime's intra-op threads too.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "samples" / "zoo"
sys.path.insert(0, str(ROOT))


def work(job: dict) -> dict:
    """In the worker: every policy planned, compiled, checked; then round-robin timing."""
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs, max_rel_error, ort_session
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls
    from engine.schedule.pipeline import plan_model

    model, threads = Path(job["model"]), int(job["threads"])
    graph = load_graph(model)
    inputs = bench_inputs(graph, model)
    sess = ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(names, inputs)))
    device = get_device(job["device"])
    cells, runs, keep = {}, {}, []
    for policy in job["policies"]:
        # P+tune: P's plan tuned by measurement on the device (engine/schedule/tune.py); tuning's own
        # timings are taken before the round-robin below, which times every program afresh.
        tune = job["tune"] if policy.endswith("+tune") else None
        planned, plan = plan_model(graph, policy.removesuffix("+tune"), device, tune=tune)
        program = generate(plan, planned, device, target="c")
        env = bind_buffers(program, planned.specs, inputs, planned.weights)
        keep.append(env)  # the calls hold raw pointers into these arrays
        calls = launch_calls(compile_program_c(program), env)
        for call in calls:
            call()
        got = {name: env[t] for name, t in zip(program.output_names, program.outputs)}
        cells[policy] = {"kernels": len(program.launches), "modeled_us": plan.modeled_us,
                         "max_rel_err": max_rel_error(got, want), "samples": []}
        runs[policy] = calls
    ort = []
    for k in range(int(job["runs"]) + 2):  # two warm-up rounds
        t0 = time.perf_counter()
        sess.run(names, inputs)
        if k >= 2:
            ort.append((time.perf_counter() - t0) * 1e3)
        for policy, calls in runs.items():
            t0 = time.perf_counter()
            for call in calls:
                call()
            if k >= 2:
                cells[policy]["samples"].append((time.perf_counter() - t0) * 1e3)
    for c in cells.values():
        c["ms"] = statistics.median(c.pop("samples"))
    return {"ort_ms": statistics.median(ort), "policies": cells}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", choices=("zoo", "samples"), default="zoo",
                   help="the real-model zoo (samples/zoo/) or our own samples (samples/)")
    p.add_argument("--models", default="", help="comma-separated names from the set (default: all)")
    p.add_argument("--policies", default="unfused,welder")
    p.add_argument("--runs", type=int, default=25)
    p.add_argument("--device", default="a100", help="what the plans are made for (host: this CPU, measured)")
    p.add_argument("--tune", type=int, default=3, help="K for the P+tune policies (default 3)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per model (planning included)")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("result " + json.dumps(work(json.loads(args.worker))))
        return
    folder = ZOO if args.set == "zoo" else ZOO.parent
    catalog = json.loads((folder / "catalog.json").read_text())
    names = [e["name"] for e in catalog] if not args.models else args.models.split(",")
    policies = args.policies.split(",")
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GOMP_SPINCOUNT=os.environ.get("GOMP_SPINCOUNT", "10000"))
    head = " | ".join(f"{pol} ms" for pol in policies)
    ratios = " | ".join(f"{pol} ÷ {policies[0]}" for pol in policies[1:])
    modeled = " | ".join(f"{pol} modeled µs" for pol in policies)
    if len(policies) == 2:
        modeled += f" | modeled {policies[1]} ÷ {policies[0]}"
    print(f"| model | ort ms | {head} | {ratios} | {modeled} | max rel err |")
    print("|---|---:|" + "---:|" * (3 * len(policies) - 1 + (len(policies) == 2)) + "---:|")
    out = {}
    for name in names:
        job = {"model": str(folder / f"{name}.onnx"), "policies": policies, "runs": args.runs,
               "device": args.device, "threads": threads, "tune": args.tune}
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                                  text=True, env=env, timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("result ")]
            if not lines:
                print(f"| {name} | error: {(proc.stderr.strip().splitlines() or ['?'])[-1][:100]} |", flush=True)
                continue
            r = json.loads(lines[-1][len("result "):])
        except subprocess.TimeoutExpired:
            print(f"| {name} | timeout ({args.timeout:g} s) |", flush=True)
            continue
        out[name] = r
        cells = r["policies"]
        ms = " | ".join(f"{cells[pol]['ms']:.3f}" for pol in policies)
        rat = " | ".join(f"{cells[pol]['ms'] / cells[policies[0]]['ms']:.2f}" for pol in policies[1:])
        mod = " | ".join(f"{cells[pol]['modeled_us']:.1f}" for pol in policies)
        if len(policies) == 2:  # the model's ratio beside the measured one
            mod += f" | {cells[policies[1]]['modeled_us'] / cells[policies[0]]['modeled_us']:.2f}"
        err = max(c["max_rel_err"] for c in cells.values())
        print(f"| {name} | {r['ort_ms']:.3f} | {ms} | {rat} | {mod} | {err:.1e} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
