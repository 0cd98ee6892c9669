"""The C backend's parallel tile loops on OpenMP against the C header's thread pool (tw_parallel_for), on
a quiet machine and beside a busy process: per model one worker process plans the policy for the device
once, generates and compiles its program twice (TILEWEAVE_C_LOOPS=omp and =pool: the same plan, only the
loop runtime differs), checks both against onnxruntime, then times onnxruntime and the two programs
round-robin, round by round, in that one process — first as the machine is, then with one
`python -c 'while 1: pass'` the worker starts and kills after (a process competing for a core, as another
job on a shared machine does). Prints one Markdown table per condition: min and median of each, and each
program's ratio to onnxruntime measured in the same rounds.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/bench_pool.py [--models a,b] [--policy welder]
        [--device host] [--runs 25] [--timeout 900] [--json OUT.json]

OMP_NUM_THREADS (default 2 here) is the thread count of both runtimes and onnxruntime's intra-op threads
(not spinning: engine/profile/bench_worker.py:ort_session). GOMP_SPINCOUNT is left as the environment has
it (unset: libgomp's default); the pool pauses TW_POOL_SPIN times, yields its core for up to TW_POOL_YIELD_US,
then sleeps.
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # bench_side_by_side's worker start
RUNTIMES = ("omp", "pool")
CONDITIONS = ("quiet", "busy")


def work(job: dict) -> dict:
    """In the worker: plan once, build both runtimes' programs, check them, time each condition."""
    from bench_side_by_side import reference

    from engine.codegen.generate import generate
    from engine.profile.bench_worker import max_rel_error
    from engine.runtime.cpu import bind_buffers, compile_program_c, launch_calls
    from engine.schedule.pipeline import plan_model

    graph, inputs, sess, names, want, device = reference(job)
    planned, plan = plan_model(graph, job["policy"], device)
    runs, keep, out = {}, [], {"modeled_us": plan.modeled_us, "max_rel_err": {}, "loops": {}}
    for runtime in RUNTIMES:
        os.environ["TILEWEAVE_C_LOOPS"] = runtime  # read by ctarget.schedule_segments
        program = generate(plan, planned, device, target="c")
        env = bind_buffers(program, planned.specs, inputs, planned.weights)
        keep.append(env)  # the calls hold raw pointers into these arrays
        runs[runtime] = launch_calls(compile_program_c(program), env)
        for call in runs[runtime]:
            call()
        got = {name: env[t] for name, t in zip(program.output_names, program.outputs)}
        out["max_rel_err"][runtime] = max_rel_error(got, want)
        out["loops"][runtime] = sum(s.loops == runtime for k in program.kernels for s in k.segments)
    for condition in CONDITIONS:
        busy = None
        if condition == "busy":
            busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
            time.sleep(0.5)  # let it be scheduled
        try:
            samples = {"ort": [], **{r: [] for r in RUNTIMES}}
            for k in range(int(job["runs"]) + 2):  # two warm-up rounds
                t0 = time.perf_counter()
                sess.run(names, inputs)
                t = [(time.perf_counter() - t0) * 1e3]
                for runtime in RUNTIMES:
                    t0 = time.perf_counter()
                    for call in runs[runtime]:
                        call()
                    t.append((time.perf_counter() - t0) * 1e3)
                if k >= 2:
                    for key, v in zip(samples, t):
                        samples[key].append(v)
        finally:
            if busy is not None:
                busy.kill()
                busy.wait()
        out[condition] = {key: {"min_ms": min(v), "median_ms": statistics.median(v)} for key, v in samples.items()}
        out[condition]["load"] = os.getloadavg()[0]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="", help="comma-separated zoo names (default: all)")
    p.add_argument("--policy", default="welder")
    p.add_argument("--device", default="host", help="what the plan is made for (host: this CPU, measured)")
    p.add_argument("--runs", type=int, default=25)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per model (planning included)")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("result " + json.dumps(work(json.loads(args.worker))))
        return
    catalog = json.loads((ZOO / "catalog.json").read_text())
    known = [e["name"] for e in catalog]
    names = args.models.split(",") if args.models else known
    unknown = [n for n in names if n not in known]
    if unknown:
        print(f"error: --models: no zoo model {', '.join(unknown)} (known: {', '.join(known)})", file=sys.stderr)
        raise SystemExit(2)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    results = {}
    for name in names:
        job = {"model": str(ZOO / f"{name}.onnx"), "policy": args.policy, "runs": args.runs,
               "device": args.device, "threads": threads}
        try:
            proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                                  text=True, env=env, timeout=args.timeout)
        except subprocess.TimeoutExpired:
            print(f"{name}: timeout ({args.timeout:g} s)", flush=True)
            continue
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("result ")]
        if not lines:
            print(f"{name}: error: {(proc.stderr.strip().splitlines() or ['?'])[-1][:160]}", flush=True)
            continue
        results[name] = json.loads(lines[-1][len("result "):])
        r = results[name]
        print(f"{name}: " + "; ".join(f"{c} (load {r[c]['load']:.1f}) ort {r[c]['ort']['median_ms']:.3f} omp "
                                     f"{r[c]['omp']['median_ms']:.3f} pool {r[c]['pool']['median_ms']:.3f} ms median"
                                     for c in CONDITIONS), flush=True)
    for condition in CONDITIONS:
        print(f"\n### {condition}: {threads} threads{'' if condition == 'quiet' else ', beside one busy process'}\n")
        print("| model | ort min | omp min | pool min | omp ÷ ort (min) | pool ÷ ort (min) | pool ÷ omp (min) "
              "| ort median | omp median | pool median | omp ÷ ort (median) | pool ÷ ort (median) | pool ÷ omp (median) "
              "| load | max rel err |")
        print("|---|" + "---:|" * 14)
        for name, r in results.items():
            c = r[condition]
            cols = []
            for stat in ("min_ms", "median_ms"):
                o, m, q = c["ort"][stat], c["omp"][stat], c["pool"][stat]
                cols += [f"{o:.3f}", f"{m:.3f}", f"{q:.3f}", f"{m / o:.2f}", f"{q / o:.2f}", f"{q / m:.2f}"]
            err = max(r["max_rel_err"].values())
            print(f"| {name} | {' | '.join(cols)} | {c['load']:.1f} | {err:.1e} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
