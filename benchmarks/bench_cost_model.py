"""The cost model held to measurement, on the host CPU or an attached GPU: for each model and policy, the
plan made for `--device` (host, or a GPU preset / `gpu` for the attached GPU's), its kernels timed by the
C backend or by CUDA events around each launch (median of --runs launches each), and per model:
Spearman's rho between modeled and measured kernel times, the median |log(measured / modeled)| (as a
factor), modeled and measured program time per policy, and whether the model ranks the policies as
the measurement does — strictly, and up to ties: two policies whose plans print the same C source are
one program ("="), and two whose measured program times overlap ("~": the fastest round of each within
the other's rounds from fastest to median) are within the run's own noise; a tied pair counts neither for
nor against the model (`rank_agreement`). On the host a policy's measured program time is its whole
program's (all launches in order, as `tileweave run` makes them), the median of --program-rounds rounds
that interleave the policies (`time_programs`; each program run untimed for SETTLE_S before each timed run, so
another library's thread pool is asleep, as in a process running that program alone): kernels timed one by
one, each launched again and again,
sum to a different figure (zoo bert's welder program at one thread: 1,753 µs summed, 1,447 whole), and
policies timed one after another see different load. Without rounds (a GPU run, or --program-rounds 0) a
round is the sum of every kernel's r-th launch. One worker process per model (planning included), so a
model that hangs is reported and the rest still run.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_cost_model.py [--set zoo|samples] [--models a,b]
        [--policies unfused,elementwise,stitch,welder] [--runs 9] [--timeout 900] [--json OUT.json]
        [--device host|gpu|PRESET] [--jobs N] [--clock wall|cpu] [--plans DIR] [--step all|prepare|time]
        [--program-rounds 21] [--tie-band R] [--rerank IN.json]

The host's figures come from `tileweave device host` (probed on first use, cached); OMP_NUM_THREADS sets
the threads of both the plan (the host device's cores) and the run. On the host each kernel is timed by the
wall clock and, in launches of its own, by the calling thread's CPU time; `--clock` picks which one the
tables use (`cpu` needs OMP_NUM_THREADS=1; on a loaded machine the wall clock charges kernels longer than a
time slice for other processes' slices). On a GPU (`--device gpu` plans for the
preset matching the attached GPU) planning and NVRTC compiling run first, --jobs models at a time (CPU
work, pickled to a temporary folder), then each model's kernels are timed alone on the GPU, one process
per model; the GPU rows also carry each output's error against onnxruntime (inputs from the model's
.io.npz) and each kernel's registers as the driver reports them beside the CUBIN parser's count.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SETS = {"zoo": ROOT / "samples" / "zoo", "samples": ROOT / "samples"}


def ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share the mean of their positions)."""
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    k = 0
    while k < len(order):
        j = k
        while j + 1 < len(order) and values[order[j + 1]] == values[order[k]]:
            j += 1
        for m in range(k, j + 1):
            out[order[m]] = (k + j) / 2
        k = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    if len(a) < 3:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ma, mb = statistics.fmean(ra), statistics.fmean(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    var = math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))
    return cov / var if var else float("nan")


def planned_policies(job: dict, device):
    """(policy, planned graph, plan, schedule seconds) for each of job["policies"] on job["model"]."""
    from engine.frontend.importer import load_graph
    from engine.schedule.pipeline import plan_model

    graph = load_graph(job["model"])
    for policy in job["policies"]:
        saved = Path(job.get("plans") or "/nonexistent") / f"{Path(job['model']).stem}.{policy}.json"
        t0 = time.perf_counter()
        if saved.exists():  # a plan saved by `tileweave plan --plan-out`: not planned again if for this preset
            from engine.schedule.pipeline import load_plan

            planned, plan = load_plan(saved, graph)
            if plan.device == device.name:
                yield policy, planned, plan, plan.schedule_seconds
                continue
            print(f"{saved} was planned for {plan.device}, not {device.name}: planning", file=sys.stderr)
        planned, plan = plan_model(graph, policy, device)
        yield policy, planned, plan, time.perf_counter() - t0


def prepare(job: dict) -> dict:
    """GPU, first step (CPU work): every policy planned for the preset and compiled with NVRTC; the
    planned graphs and compiled variants pickled to job["store"]."""
    import pickle

    from engine.device import get_device
    from engine.schedule.measure import compile_variant

    device = get_device(job["device"])
    out = {}
    for policy, planned, plan, seconds in planned_policies(job, device):
        t0 = time.perf_counter()
        out[policy] = (planned, compile_variant(planned, plan, device), seconds, time.perf_counter() - t0)
    Path(job["store"]).write_bytes(pickle.dumps(out))
    return {p: {"schedule_s": round(v[2], 2), "compile_s": round(v[3], 2)} for p, v in out.items()}


def time_on_gpu(job: dict) -> dict:
    """GPU, second step: each prepared variant's kernels timed on the attached GPU — each kernel alone (its
    launch included, `runs` launches after a warm-up), then the whole launch list back to back — its outputs
    checked against onnxruntime (outputs of the timed run), its registers read from the driver."""
    import pickle

    from engine.codegen.targets import render_cuda
    from engine.device import get_device
    from engine.profile.bench_worker import bench_inputs, max_rel_error, ort_session
    from engine.runtime.cuda import load_program, run_cuda
    from engine.runtime.cuda_driver import attached_gpu

    device = get_device(job["device"])
    prepared = pickle.loads(Path(job["store"]).read_bytes())
    gpu = attached_gpu()
    sess = ort_session(Path(job["model"]), 4)
    names = [o.name for o in sess.get_outputs()]
    out = {}
    for policy, (planned, compiled, schedule_s, compile_s) in prepared.items():
        program = compiled.program
        inputs = bench_inputs(planned, Path(job["model"]))  # the model's .io.npz inputs (random, not zeros)
        want = dict(zip(names, sess.run(names, {k: v for k, v in inputs.items()
                                                if k in {i.name for i in sess.get_inputs()}})))
        got, profile = run_cuda(program, planned.specs, inputs, planned.weights, device=device.name,
                                repeat=job["runs"], gpu=gpu, program_time=True)
        measured = {t.kernel: t.us for t in profile.kernels}
        meta, functions = load_program(gpu, program, gpu.arch)  # registers as the driver reports them
        parsed = {k["name"]: k.get("resources", {}).get(gpu.arch, {}).get("registers") for k in meta["kernels"]}
        driver = {name: fn.registers for name, fn in functions.items()}
        for fn in functions.values():
            gpu.unload(fn)
        plan = compiled.plan
        shape = {k.name: {"threads": k.threads, "segments": len(k.segments)} for k in compiled.program.kernels}
        for launch in meta["launches"]:
            shape.get(launch["kernel"], {}).update(grid=launch["grid"], shared_bytes=launch["shared_bytes"],
                                                   cooperative=launch["cooperative"])
        out[policy] = {"schedule_s": round(schedule_s, 2), "compile_s": round(compile_s, 2),
                       "max_rel_err": max_rel_error(got, want), "gpu": gpu.name, "program_us": profile.program_us,
                       "source_sha": hashlib.sha256(render_cuda(compiled.program).encode()).hexdigest()[:16],
                       "modeled_total_us": plan.modeled_us, "dram_bytes": plan.dram_bytes, "kernels": [
            {"name": g.name, "stages": len(g.stages), "modeled_us": g.cost.modeled_us if g.cost else None,
             "measured_us": measured[g.name], "terms_us": g.cost.terms_us if g.cost else {},
             "registers_driver": driver.get(g.name), "registers_parsed": parsed.get(g.name),
             "traffic_bytes": g.cost.traffic_bytes if g.cost else {}, "flops": g.cost.flops if g.cost else 0,
             "resident_blocks_per_sm": g.cost.resident_blocks_per_sm if g.cost else None,
             "waves": g.cost.waves if g.cost else None} | shape.get(g.name, {})
            for g in plan.groups]}
    return out


def time_on_host(planned, plan, device, runs: int) -> tuple[dict[str, tuple[float, float, list, list]], str, tuple]:
    """(kernel name -> (wall µs, CPU µs, wall samples, CPU samples), the program's C source hash, (the program's
    call — its C entry, every launch in one call: `program_call` — and what it points into) for
    `time_programs`: the call holds raw pointers into the bound buffers, which must outlive it). Each time is
    the median of `runs` launches (the samples, in launch order, are kept: the program's time per round is
    the sum of its kernels' k-th samples, `program_rounds`): the wall clock around the call
    as the C backend's profile takes it, and, in launches of their own, the calling thread's CPU time
    (CLOCK_THREAD_CPUTIME_ID), which leaves out the time the thread waited while another process ran.
    With one OpenMP thread the kernel runs on the calling thread, so its CPU time is all the kernel's; on
    a loaded machine (load 4-10 on 2 cores) the wall clock of a kernel longer than a scheduler time slice
    includes other processes' slices that the median of short kernels escapes. Reading the thread's CPU
    clock is a system call (~0.6 µs, against ~0.07 for the wall clock): its median cost between two reads
    is taken off each CPU sample."""
    from engine.runtime.cpu import bind_buffers, launch_calls, program_call
    from engine.runtime.inputs import make_inputs
    from engine.schedule.measure import compile_variant, thread_clock_ns

    compiled = compile_variant(planned, plan, device)
    module = compiled.module()
    env = bind_buffers(compiled.program, planned.specs, make_inputs(planned, seed=0), planned.weights)
    clock_ns = thread_clock_ns()
    out = {}
    calls = launch_calls(module, env)
    for launch, call in zip(compiled.program.launches, calls):
        wall, cpu = [], []
        for _ in range(max(1, runs)):
            w0 = time.perf_counter_ns()
            call()
            wall.append((time.perf_counter_ns() - w0) / 1e3)
        for _ in range(max(1, runs)):
            c0 = time.thread_time_ns()
            call()
            cpu.append(max(0.0, time.thread_time_ns() - c0 - clock_ns) / 1e3)
        out[launch.kernel] = (statistics.median(wall), statistics.median(cpu), wall, cpu)
    return out, hashlib.sha256(compiled.source.encode()).hexdigest()[:16], ([program_call(module, env)], (module, env))


def work(job: dict) -> dict:
    """In the worker: every policy planned for the host, its kernels measured (wall and CPU clock; "measured_us"
    is the one --clock names), then the policies' whole programs timed in interleaved rounds (`time_programs`;
    "program_samples_us", "program_us" their median)."""
    from engine.device import get_device
    from engine.schedule.measure import time_programs

    if job.get("step") == "prepare":
        return prepare(job)
    if job.get("step") == "time":
        return time_on_gpu(job)
    device = get_device("host")
    out, programs = {}, {}
    for policy, planned, plan, seconds in planned_policies(job, device):
        measured, source, programs[policy] = time_on_host(planned, plan, device, job["runs"])
        pick = 1 if job.get("clock") == "cpu" else 0
        out[policy] = {"schedule_s": round(seconds, 2), "source_sha": source, "kernels": [
            {"name": g.name, "stages": len(g.stages), "modeled_us": g.cost.modeled_us if g.cost else None,
             "measured_us": measured[g.name][pick], "wall_us": measured[g.name][0], "cpu_us": measured[g.name][1],
             "samples_us": [round(x, 3) for x in measured[g.name][2 + pick]],
             "terms_us": g.cost.terms_us if g.cost else {}}
            for g in plan.groups]}
    if job.get("program_rounds"):
        calls = {p: v[0] for p, v in programs.items()}
        for policy, samples in time_programs(calls, job["program_rounds"], job.get("clock", "wall")).items():
            out[policy] |= {"program_samples_us": [round(x, 3) for x in samples],
                            "program_us": statistics.median(samples)}
    return out


def program_rounds(cell: dict) -> list[float]:
    """A policy's program time per round: the whole program's rounds where they were timed
    (`time_programs`), else round r is the sum of its kernels' r-th timed launches (each kernel is launched
    `runs` times in a row, so such a round is not one run of the program, but the spread of these sums is the
    spread the program's time has in the run). [] when no samples were kept."""
    if cell.get("program_samples_us"):
        return cell["program_samples_us"]
    samples = [k.get("samples_us") or [] for k in cell["kernels"]]
    if not samples or not all(samples):
        return []
    return [sum(x) for x in zip(*samples)]


def measured_program(cell: dict) -> float:
    """A policy's measured program µs as the ranking takes it: the median of its whole-program rounds where
    they were timed (host: `time_programs`), else the sum of its kernels' medians."""
    if cell.get("program_samples_us"):
        return statistics.median(cell["program_samples_us"])
    return sum(k["measured_us"] for k in cell["kernels"])


def measured_tie(a: list[float], b: list[float]) -> bool:
    """Two programs' measurements are tied when they are within the run's own noise: the fastest round of
    each lies within the other's spread, taken as its rounds from the fastest to the median (the slower
    half is where other processes' time slices land on a loaded machine: one such round would tie
    anything) — the two spans [min, median] overlap. Without rounds nothing is tied."""
    if not a or not b:
        return False
    return min(a) <= statistics.median(b) and min(b) <= statistics.median(a)


def tie_classes(cells: dict, band: float = 1.0) -> dict[tuple[str, str], str]:
    """Each tied pair of policies (both orders) -> why: "program" where their plans print to the same C
    source (the same kernels: welder's plan is the stitch plan, `welder.at_least_stitch`), "noise" where
    their measured program times overlap (`measured_tie`), "placement" where their measured medians are
    within a factor `band` of each other (--tie-band: the same programs measured in two runs minutes apart
    differed by over 10 % in 10 of 48 cells, RESULTS thirteenth-ranking; 1.0, the default, ties nothing so)."""
    rounds = {p: program_rounds(c) for p, c in cells.items()}
    out = {}
    for a in cells:
        for b in cells:
            if a == b:
                continue
            sa, sb = cells[a].get("source_sha"), cells[b].get("source_sha")
            if sa and sa == sb:
                out[a, b] = "program"
            elif measured_tie(rounds[a], rounds[b]):
                out[a, b] = "noise"
            elif band > 1.0 and _within(measured_program(cells[a]), measured_program(cells[b]), band):
                out[a, b] = "placement"
    return out


def _within(a: float, b: float, band: float) -> bool:
    return a > 0 and b > 0 and max(a, b) / min(a, b) < band


def rank_agreement(programs: dict[str, tuple[float, float]], ties: dict) -> dict:
    """Whether the model orders the policies as the measurement does, strictly and up to ties.
    `programs`: policy -> (modeled, measured) program µs; `ties`: `tie_classes`. Strict: the two sorted
    orders are equal, and the model's cheapest is the measured fastest. Up to ties: every pair of policies
    that is not tied is ordered the same way by both (a pair the model gives the same time is not ordered
    by it: that agrees only if the pair is tied), and the model's cheapest is the measured fastest or
    tied with it. Pairs with the same program are tied in the model too (one program, one time)."""
    by_model = sorted(programs, key=lambda p: programs[p][0])
    by_measure = sorted(programs, key=lambda p: programs[p][1])
    pairs = [(a, b) for i, a in enumerate(by_model) for b in by_model[i + 1:]]
    wrong = [(a, b) for a, b in pairs if (a, b) not in ties
             and (programs[a][0] > programs[b][0]) - (programs[a][0] < programs[b][0])
             != (programs[a][1] > programs[b][1]) - (programs[a][1] < programs[b][1])]
    best = by_model[0]
    return {"rank_model": by_model, "rank_measured": by_measure, "same_ranking": by_model == by_measure,
            "same_best": best == by_measure[0], "wrong_pairs": wrong, "same_ranking_ties": not wrong,
            "same_best_ties": best == by_measure[0] or (best, by_measure[0]) in ties,
            "ties": {f"{a}={b}": why for (a, b), why in ties.items() if a < b}}


def ranking_text(order: list[str], ties: dict) -> str:
    """`order` joined by "=" (same program), "~" (measured within noise) or "<" between neighbours."""
    out = order[0]
    for a, b in zip(order, order[1:]):
        why = ties.get((a, b))
        out += {"program": " = ", "noise": " ~ ", "placement": " ≈ "}.get(why, " < ") + b
    return out


def summarize(name: str, cells: dict, band: float = 1.0) -> dict:
    rows = [k for cell in cells.values() for k in cell["kernels"] if k["modeled_us"]]
    mod, mea = [k["modeled_us"] for k in rows], [k["measured_us"] for k in rows]
    logs = [abs(math.log(b / a)) for a, b in zip(mod, mea) if a > 0 and b > 0]
    programs = {p: (sum(k["modeled_us"] or 0 for k in c["kernels"]), measured_program(c)) for p, c in cells.items()}
    kernel_sums = {p: sum(k["measured_us"] for k in c["kernels"]) for p, c in cells.items()}
    ties = tie_classes(cells, band)
    return {"model": name, "kernels": len(rows), "rho": spearman(mod, mea),
            "median_factor": math.exp(statistics.median(logs)) if logs else float("nan"),
            "programs": programs, "kernel_sums": kernel_sums, "tie_pairs": [[a, b, why] for (a, b), why in ties.items()]} \
        | rank_agreement(programs, ties)


def run_worker(job: dict, timeout: float, threads: str) -> dict | str:
    """One worker process for `job`: its JSON result, or a one-line reason it has none."""
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", json.dumps(job)], capture_output=True,
                              text=True, timeout=timeout, env=dict(os.environ, OMP_NUM_THREADS=threads))
    except subprocess.TimeoutExpired:
        return f"timed out after {timeout:g} s"
    if proc.returncode != 0:
        return f"failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gpu_device(name: str) -> str:
    """`gpu` -> the preset matching the attached GPU; a preset as it is. Exits when no GPU is attached."""
    from engine.device import preset_for_gpu
    from engine.runtime.cuda_driver import cuda_available

    ok, detail = cuda_available()
    if not ok:
        raise SystemExit(f"error: --device {name} times kernels on a GPU and none is usable: {detail}")
    print(f"GPU: {detail}", file=sys.stderr)
    return preset_for_gpu(detail) if name == "gpu" else name


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", choices=tuple(SETS), default="zoo")
    p.add_argument("--models", default="")
    p.add_argument("--policies", default="unfused,elementwise,stitch,welder")
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per worker process")
    p.add_argument("--device", default="host", help="host (C backend), gpu (the attached GPU's preset) or a GPU preset")
    p.add_argument("--jobs", type=int, default=1, help="GPU: models planned and compiled at once")
    p.add_argument("--store", metavar="DIR", help="GPU: keep the prepared variants here (MODEL.pkl; default a "
                                                  "temporary folder), e.g. for benchmarks/gpu_counters.py")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="host: time kernels by the wall clock (as the C backend's profile does) or by the calling "
                        "thread's CPU time, which leaves out other processes' time slices (needs OMP_NUM_THREADS=1); "
                        "both are kept in --json")
    p.add_argument("--plans", metavar="DIR", help="load DIR/MODEL.POLICY.json (saved by `tileweave plan "
                   "--plan-out` for this device) instead of planning; models without one are planned")
    p.add_argument("--step", choices=("all", "prepare", "time"), default="all",
                   help="GPU: prepare (plan + NVRTC into --store, no GPU work), time (the prepared --store), or both")
    p.add_argument("--program-rounds", type=int, default=21, metavar="R",
                   help="host: after the kernels, time each policy's whole program in R interleaved rounds and rank "
                        "the policies by its median (0: rank by the kernels' summed medians, as a GPU run does)")
    p.add_argument("--tie-band", type=float, default=1.0, metavar="R",
                   help="also tie two policies whose measured programs are within a factor R (\"≈\"; e.g. 1.10: the "
                        "same programs measured 10 %% apart or more between two runs here); default 1.0, off")
    p.add_argument("--rerank", metavar="IN.json",
                   help="measure nothing: rank again the results a run saved with --json (e.g. under --tie-band)")
    p.add_argument("--json", metavar="OUT.json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        job = json.loads(args.worker)
        print(json.dumps(work(job)))
        return 0
    folder = SETS[args.set]
    names = [n for n in args.models.split(",") if n] or sorted(x.stem for x in folder.glob("*.onnx") if x.stem != "bert12")
    policies = [x for x in args.policies.split(",") if x]
    threads = os.environ.get("OMP_NUM_THREADS", "") or str(os.cpu_count())
    if args.clock == "cpu" and threads != "1":
        print("error: --clock cpu times the calling thread, so it needs OMP_NUM_THREADS=1", file=sys.stderr)
        return 2
    on_gpu = args.device != "host"
    device = gpu_device(args.device) if on_gpu else "host"
    results, all_rows = [], []
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.store or scratch
        Path(tmp).mkdir(parents=True, exist_ok=True)
        jobs = {name: {"model": str(folder / f"{name}.onnx"), "policies": policies, "runs": args.runs,
                       "device": device, "clock": args.clock,
                       "program_rounds": 0 if on_gpu else max(0, args.program_rounds), "store": str(Path(tmp) / f"{name}.pkl"),
                       "plans": args.plans} for name in names}
        def finish(name: str, prepared) -> None:
            if isinstance(prepared, str):
                print(f"{name}: {prepared}", file=sys.stderr)
                return
            cells = run_worker(jobs[name] | ({"step": "time"} if on_gpu else {}), args.timeout, threads)
            if isinstance(cells, str):
                print(f"{name}: {cells}", file=sys.stderr)
                return
            results.append(summarize(name, cells) | {"cells": cells})
            all_rows.extend(k for c in cells.values() for k in c["kernels"] if k["modeled_us"])
            print(f"{name}: done", file=sys.stderr)
            if args.json:  # after every model, so a run cut short keeps what it measured
                Path(args.json).write_text(json.dumps(results, indent=1))

        if args.rerank:  # measure nothing: rank the results a run saved again
            for r in json.loads(Path(args.rerank).read_text()):
                results.append(summarize(r["model"], r["cells"], args.tie_band) | {"cells": r["cells"]})
                all_rows.extend(k for c in r["cells"].values() for k in c["kernels"] if k["modeled_us"])
            policies = list(results[0]["cells"]) if results else policies
        elif on_gpu and args.step == "time":  # prepared earlier (--step prepare) into --store
            for name in names:
                store = Path(jobs[name]["store"])
                finish(name, None if store.exists() else f"not prepared ({store} missing)")
        elif on_gpu:  # plan and compile in parallel (CPU only), one worker per model and policy; each model
            # timed alone as soon as all its policies are ready (unless --step prepare)
            started = time.perf_counter()
            left = {n: set(policies) for n in names}
            failed: dict[str, str] = {}
            with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
                futures = {pool.submit(run_worker, jobs[n] | {"step": "prepare", "policies": [pol],
                                                               "store": f"{jobs[n]['store']}.{pol}"},
                                       args.timeout, "1"): (n, pol) for n in names for pol in policies}
                for f in concurrent.futures.as_completed(futures):
                    name, pol = futures[f]
                    if isinstance(f.result(), str):
                        failed.setdefault(name, f"{pol}: {f.result()}")
                    left[name].discard(pol)
                    if left[name]:
                        continue
                    print(f"{name}: prepared ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
                    import pickle

                    parts = [Path(f"{jobs[name]['store']}.{q}") for q in policies]
                    if name not in failed:  # one MODEL.pkl, as gpu_counters.py reads it
                        merged = {q: v for part in parts for q, v in pickle.loads(part.read_bytes()).items()}
                        Path(jobs[name]["store"]).write_bytes(pickle.dumps(merged))
                    for part in parts:
                        part.unlink(missing_ok=True)
                    if args.step == "all":
                        finish(name, failed.get(name))
                    elif name in failed:
                        print(f"{name}: {failed[name]}", file=sys.stderr)
            if args.step == "prepare":
                return 1 if failed else 0
        else:
            for name in names:
                finish(name, None)
    where = f"{device} preset, timed on {results[0]['cells'][policies[0]].get('gpu', 'the GPU')} with CUDA events" \
        if on_gpu and results else f"Host, {threads} thread(s), {args.clock} clock"
    whole = not on_gpu and args.program_rounds > 0
    print(f"{where}; kernels timed as the median of {args.runs} launches"
          + (f"; programs as the median of {args.program_rounds} interleaved whole-program rounds" if whole else "")
          + ".\n")
    print("| model | kernels | Spearman ρ | median factor | "
          + " | ".join(f"{p} modeled / measured µs" + (" (kernels summed)" if whole else "") for p in policies)
          + " | ranking by model | by measurement | agrees: strict / up to ties |"
          + (" max rel err | registers driver = parsed | back to back µs (" + " / ".join(policies) + ") |"
             if on_gpu else ""))
    print("|---|---:|---:|---:|" + "---:|" * len(policies) + "---|---|---|" + ("---:|---:|---:|" if on_gpu else ""))
    for r in results:
        cols = " | ".join(f"{r['programs'][p][0]:.0f} / {r['programs'][p][1]:.0f}"
                          + (f" ({r['kernel_sums'][p]:.0f})" if whole else "") for p in policies)
        extra, ties = "", {(a, b): why for a, b, why in r["tie_pairs"]}
        if on_gpu:
            ks = [k for c in r["cells"].values() for k in c["kernels"]]
            same = sum(k["registers_driver"] == k["registers_parsed"] for k in ks)
            b2b = " / ".join(f"{r['cells'][p].get('program_us') or float('nan'):.0f}" for p in policies)
            extra = f" {max(c['max_rel_err'] for c in r['cells'].values()):.1e} | {same}/{len(ks)} | {b2b} |"
        print(f"| {r['model']} | {r['kernels']} | {r['rho']:.2f} | {r['median_factor']:.2f}x | {cols} | "
              f"{ranking_text(r['rank_model'], {k: v for k, v in ties.items() if v == 'program'})} | "
              f"{ranking_text(r['rank_measured'], ties)} | "
              f"{'yes' if r['same_ranking'] else 'no'} / {'yes' if r['same_ranking_ties'] else 'no'} |{extra}")
    if all_rows:
        mod, mea = [k["modeled_us"] for k in all_rows], [k["measured_us"] for k in all_rows]
        logs = [abs(math.log(b / a)) for a, b in zip(mod, mea) if a > 0 and b > 0]
        n = len(results)
        print(f"\nAll {len(all_rows)} kernels: Spearman ρ {spearman(mod, mea):.2f}, median factor "
              f"{math.exp(statistics.median(logs)):.2f}x.\nStrictly, the model picks the measured-fastest policy "
              f"on {sum(r['same_best'] for r in results)} of {n} models and the whole ranking on "
              f"{sum(r['same_ranking'] for r in results)}. Up to ties, on {sum(r['same_best_ties'] for r in results)} "
              f"and {sum(r['same_ranking_ties'] for r in results)} of {n}: two policies are tied when their plans "
              f"print the same C source (\"=\") or when their measured program times overlap (\"~\": the fastest "
              f"round of each within the other's rounds from fastest to median, a round being "
              + ("one run of the whole program, the policies interleaved" if whole else
                 f"the sum of each kernel's r-th of {args.runs} launches")
              + ")"
              + (f" or are within a factor {args.tie_band:g} of each other (\"≈\", --tie-band)" if args.tie_band > 1.0
                 else "")
              + "; a tied pair is not counted either way.")
    if args.json and not args.rerank:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
