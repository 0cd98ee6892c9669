"""Policies of one model timed side by side on the CPU backend: per model one worker process plans
(for the device preset), compiles and checks every policy, then times onnxruntime and each policy's
program round-robin, repeat by repeat, in that one process, so the ratios between policies are not
at the mercy of the machine's drift between processes (bench_zoo.py runs each policy in its own
worker, minutes apart: on this shared 2-core machine onnxruntime's own time moved 1.8x between two
cells of one model). Prints a Markdown table of medians (--stat min: minima), the ratio of each policy to the first, and beside
them each plan's modeled µs on the device preset (a GPU's, not this CPU's: the model's ratio is shown next
to the measured one so the two can be compared, not because they should agree).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_side_by_side.py [--set zoo|samples] [--models a,b]
        [--policies unfused,welder,welder+tune] [--tune 3] [--runs 25] [--device a100|host] [--timeout 600]
        [--against CHECKOUT] [--stat median|min] [--json OUT.json]

A policy named P+tune is P's plan tuned by measurement on the device (`--tune K`); with --device host the
plans are made for this CPU. `--against CHECKOUT` (another tileweave checkout, e.g. a `git worktree` of
the base commit) adds each policy as that checkout plans, generates and compiles it (in a process of its
own, importing its engine), named P@before and timed in the same round-robin, so a code change is
measured before and after in one run.

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
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "samples" / "zoo"
sys.path.insert(0, str(ROOT))


def build(job: dict) -> dict:
    """In a process importing another checkout's engine (`--against`): each policy planned, generated
    and compiled there; out comes what the timing worker needs to run it without that engine: the
    library, the launches, the arena plan, every tensor's shape and dtype, the constants (an .npz)."""
    import numpy as np

    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.runtime.cpu import compile_program_c
    from engine.schedule.pipeline import plan_model

    graph = load_graph(Path(job["model"]))
    device = get_device(job["device"])
    out = {}
    for policy in job["policies"]:
        tune = job["tune"] if policy.endswith("+tune") else None
        planned, plan = plan_model(graph, policy.removesuffix("+tune"), device, tune=tune)
        program = generate(plan, planned, device, target="c")
        module = compile_program_c(program)
        consts = Path(job["scratch"]) / f"{policy}.npz"
        np.savez(consts, **{f"c{i}": planned.weights[t] for i, t in enumerate(program.constants)})
        tensors = {*program.inputs, *program.constants, *program.outputs, *(a.tensor for a in program.memory.allocations)}
        out[policy] = {
            "library": module.path, "modeled_us": plan.modeled_us, "constants_npz": str(consts),
            "inputs": list(program.inputs), "constants": list(program.constants), "outputs": list(program.outputs),
            "output_names": list(program.output_names), "arena_bytes": program.memory.arena_bytes,
            "allocations": [[a.tensor, a.offset, a.nbytes] for a in program.memory.allocations],
            "specs": {t: [list(planned.specs[t].shape), planned.specs[t].dtype.np.str] for t in tensors},
            "launches": [[ln.kernel, list(ln.args)] for ln in program.launches]}
    return out


def built_calls(built: dict, inputs: dict) -> tuple[list, dict, dict]:
    """(one argument-free call per launch, the buffers they hold pointers into, outputs by ONNX name) of
    a policy `build` compiled in another checkout."""
    import ctypes

    import numpy as np

    specs = {t: (tuple(shape), np.dtype(dt)) for t, (shape, dt) in built["specs"].items()}
    env = {t: np.ascontiguousarray(inputs[t], dtype=specs[t][1]) for t in built["inputs"]}
    with np.load(built["constants_npz"]) as consts:
        env.update({t: np.ascontiguousarray(consts[f"c{i}"]) for i, t in enumerate(built["constants"])})
    for t in built["outputs"]:
        if t not in env:
            env[t] = np.empty(*specs[t])
    arena = np.empty(max(built["arena_bytes"], 1), dtype=np.uint8)
    env["\0arena"] = arena
    for t, offset, nbytes in built["allocations"]:
        env[t] = arena[offset:offset + nbytes].view(specs[t][1]).reshape(specs[t][0])
    lib = ctypes.CDLL(built["library"])
    calls = []
    for kernel, args in built["launches"]:
        fn = getattr(lib, kernel)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * len(args)
        ptrs = [env[t].ctypes.data for t in args]
        calls.append(lambda fn=fn, ptrs=ptrs: fn(*ptrs))
    outs = {name: env[t] for name, t in zip(built["output_names"], built["outputs"])}
    return calls, env, outs


def reference(job: dict) -> tuple:
    """In a worker: (graph, inputs, onnxruntime session, its output names, its outputs, device) of the job's
    model, the session on the job's threads (also bench_pool.py's start)."""
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.profile.bench_worker import bench_inputs, ort_session

    model, threads = Path(job["model"]), int(job["threads"])
    graph = load_graph(model)
    inputs = bench_inputs(graph, model)
    sess = ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    return graph, inputs, sess, names, dict(zip(names, sess.run(names, inputs))), get_device(job["device"])


def work(job: dict) -> dict:
    """In the worker: every policy planned, compiled, checked; then round-robin timing."""
    from engine.codegen.generate import generate
    from engine.profile.bench_worker import max_rel_error
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls
    from engine.schedule.pipeline import plan_model

    graph, inputs, sess, names, want, device = reference(job)
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
    for policy, built in job.get("built", {}).items():  # --against: that checkout's programs
        calls, env, got = built_calls(built, inputs)
        keep.append(env)
        for call in calls:
            call()
        cells[f"{policy}@before"] = {"kernels": len(calls), "modeled_us": built["modeled_us"],
                                     "max_rel_err": max_rel_error(got, want), "samples": []}
        runs[f"{policy}@before"] = calls
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
        samples = c.pop("samples")
        c.update(median_ms=statistics.median(samples), min_ms=min(samples))
        c["ms"] = c[f"{job.get('stat', 'median')}_ms"]
    stat = min if job.get("stat") == "min" else statistics.median
    return {"ort_ms": stat(ort), "ort_median_ms": statistics.median(ort), "ort_min_ms": min(ort), "policies": cells}


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
    p.add_argument("--stat", choices=("median", "min"), default="median",
                   help="what the table shows of each program's rounds (the JSON holds both); min: the round least "
                        "disturbed by other jobs on a shared machine")
    p.add_argument("--against", metavar="CHECKOUT",
                   help="also time each policy as another tileweave checkout builds it (P@before)")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--build", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:  # the job on stdin: with --against it holds the built programs (mobilevit's: > 128 KB, over
        # Linux's limit for one command-line argument)
        print("result " + json.dumps(work(json.loads(sys.stdin.read() if args.worker == "-" else args.worker))))
        return
    if args.build:
        job = json.loads(args.build)
        sys.path.insert(0, job["root"])  # that checkout's engine, imported first
        print("result " + json.dumps(build(job)))
        return
    folder = ZOO if args.set == "zoo" else ZOO.parent
    catalog = json.loads((folder / "catalog.json").read_text())
    names = [e["name"] for e in catalog] if not args.models else args.models.split(",")
    policies = args.policies.split(",")
    shown = policies + [f"{pol}@before" for pol in policies] if args.against else policies
    against = Path(args.against).resolve() if args.against else None
    if against is not None and not (against / "engine" / "__init__.py").is_file():
        print(f"error: --against {args.against}: not a tileweave checkout (no engine/__init__.py)", file=sys.stderr)
        raise SystemExit(2)
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), GOMP_SPINCOUNT=os.environ.get("GOMP_SPINCOUNT", "10000"))
    head = " | ".join(f"{pol} ms" for pol in shown)
    if against is not None:  # each policy against onnxruntime, after and before
        ratios = " | ".join(f"{pol} ÷ ort" for pol in shown)
        modeled = " | ".join(f"{pol} modeled µs" for pol in policies)
        ncols = 3 * len(policies) + len(shown)
    else:
        ratios = " | ".join(f"{pol} ÷ {policies[0]}" for pol in policies[1:])
        modeled = " | ".join(f"{pol} modeled µs" for pol in policies)
        if len(policies) == 2:
            modeled += f" | modeled {policies[1]} ÷ {policies[0]}"
        ncols = 3 * len(policies) - 1 + (len(policies) == 2)
    print(f"| model | ort ms | {head} | {ratios} | {modeled} | max rel err |")
    print("|---|---:|" + "---:|" * ncols + "---:|")
    out = {}
    for name in names:
        job = {"model": str(folder / f"{name}.onnx"), "policies": policies, "runs": args.runs,
               "device": args.device, "threads": threads, "tune": args.tune, "stat": args.stat}
        try:
            if against is not None:
                scratch = tempfile.mkdtemp(prefix="tw-against-")
                proc = subprocess.run([sys.executable, __file__, "--build", json.dumps(
                    job | {"root": str(against), "scratch": scratch})], capture_output=True, text=True, env=env,
                    timeout=args.timeout)
                lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("result ")]
                if not lines:
                    print(f"| {name} | error in {against}: {(proc.stderr.strip().splitlines() or ['?'])[-1][:100]} |",
                          flush=True)
                    continue
                job["built"] = json.loads(lines[-1][len("result "):])
            proc = subprocess.run([sys.executable, __file__, "--worker", "-"], input=json.dumps(job),
                                  capture_output=True, text=True, env=env, timeout=args.timeout)
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
        ms = " | ".join(f"{cells[pol]['ms']:.3f}" for pol in shown)
        if against is not None:
            rat = " | ".join(f"{cells[pol]['ms'] / r['ort_ms']:.2f}" for pol in shown)
        else:
            rat = " | ".join(f"{cells[pol]['ms'] / cells[policies[0]]['ms']:.2f}" for pol in policies[1:])
        mod = " | ".join(f"{cells[pol]['modeled_us']:.1f}" for pol in policies)
        if len(policies) == 2 and against is None:  # the model's ratio beside the measured one
            mod += f" | {cells[policies[1]]['modeled_us'] / cells[policies[0]]['modeled_us']:.2f}"
        err = max(c["max_rel_err"] for c in cells.values())
        print(f"| {name} | {r['ort_ms']:.3f} | {ms} | {rat} | {mod} | {err:.1e} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
