"""`tileweave bench`: models × policies in, our CPU backend vs onnxruntime out (medians, ratio, max relative
error, kernels, modeled µs, schedule seconds) as a dict in the `--json` shape, or as a text table.
Each (model, policy) is planned, compiled and checked in its own process (`bench_worker.py`) under a timeout;
then one process per model times onnxruntime and every policy in the same interleaved rounds."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path

from engine.errors import PlanError, ShapeError, TileweaveError
from engine.limits import WorkerTimeout, run_worker, worker_env

POLICIES = ("unfused", "elementwise", "stitch", "welder")
TUNED = "+tune"  # a policy cell planned with measured tuning (`welder+tune`: plan_model(..., tune=K))


def bench_threads() -> int:
    """OMP_NUM_THREADS when set, else the machine's cores: both onnxruntime and OpenMP get this many."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    if value:
        try:
            return max(1, int(value.split(",")[0]))
        except ValueError:
            raise TileweaveError(f"OMP_NUM_THREADS='{value}' is not a thread count",
                                 hint="set it to a positive integer or unset it") from None
    return os.cpu_count() or 1


def machine_info(threads: int) -> dict:
    import onnxruntime

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "threads": threads, "python": platform.python_version(),
            "onnxruntime": onnxruntime.__version__, "load_average": load,
            "gomp_spincount": os.environ.get("GOMP_SPINCOUNT", "10000")}


def check_args(models: list[str], policies: list[str], device: str, runs: int, timeout: float,
               shapes: dict | None = None) -> None:
    """Every bad argument as one TileweaveError line, before any model runs."""
    from engine.device import get_device
    from engine.frontend.importer import declared_inputs, import_onnx

    if not models:
        raise TileweaveError("no model given", hint="tileweave bench MODEL.onnx [MODEL.onnx ...]")
    bad = [p for p in policies if p.removesuffix(TUNED) not in POLICIES]
    if bad:
        raise PlanError(f"unknown policy '{bad[0]}'",
                        hint=f"use one of {', '.join(POLICIES)}, each optionally with {TUNED} (measured tuning)")
    if runs < 1:
        raise TileweaveError(f"--runs {runs} must be at least 1")
    if timeout <= 0:
        raise TileweaveError(f"--timeout {timeout:g} must be positive (seconds)")
    get_device(device)
    named = [declared_inputs(m) for m in models]  # name -> dims per model; None where it does not parse
    unknown = sorted(set(shapes or {}) - {n for names in named if names is not None for n in names})
    if unknown and all(names is not None for names in named):
        raise ShapeError(f"--shape names {', '.join(unknown)}, an input of none of the models",
                         hint="the models' inputs are: " + "; ".join(f"{Path(m).name}: {', '.join(n)}" for m, n in zip(models, named)))
    for m in models:
        import_onnx(m, model_shapes(m, shapes))  # a missing, unreadable or unsupported model: one line now


def model_shapes(model: str, shapes: dict | None) -> dict:
    """The --shape bindings of `model`'s inputs with a dynamic dimension (bench binds a name in every model
    where it is one: a static input of the same name in another model keeps its shape), and for its other
    dynamic dimensions the shapes of the arrays its .io.npz holds (the inputs it is timed on)."""
    from engine.frontend.importer import bind_from_arrays, declared_inputs

    declared = declared_inputs(model)
    own = {k: v for k, v in (shapes or {}).items()
           if declared is None or (k in declared and (declared[k] is None or None in declared[k]))}
    io = Path(model).with_name(Path(model).stem + ".io.npz")
    if not io.is_file():
        return own
    from engine.runtime.npz import read_npz_arrays

    try:
        arrays = read_npz_arrays(io)
    except TileweaveError:
        return own  # the worker reports the unreadable file where it reads the inputs
    return bind_from_arrays(model, own, arrays)


def _run(job: dict, threads: int, timeout: float) -> dict:
    """One worker process on `job`; {"timeout": True, "phase": ..., "seconds": ...} (with the plan's numbers
    when it got past scheduling) when it outlives `timeout` seconds, {"error": ...} when it fails."""
    env = worker_env() | {"OMP_NUM_THREADS": str(threads)}
    # libgomp's idle threads spin ~300k iterations by default; interleaved with onnxruntime's pool on
    # the same cores that spin would be charged to whichever side runs next.
    env.setdefault("GOMP_SPINCOUNT", "10000")
    started = time.perf_counter()
    try:  # the worker runs in its own process group: a kill on timeout takes gcc along
        code, out, err = run_worker([sys.executable, "-m", "engine.profile.bench_worker", json.dumps(job)],
                                    timeout=timeout, env=env)
    except WorkerTimeout as timed_out:
        out = timed_out.out
        phases = [ln.split(" ", 1)[1] for ln in out.splitlines() if ln.startswith("phase ")]
        plans = [json.loads(ln.split(" ", 1)[1]) for ln in out.splitlines() if ln.startswith("plan ")]
        return {**(plans[0] if plans else {}), "timeout": True, "phase": phases[-1] if phases else "start",
                "seconds": round(time.perf_counter() - started, 1)}
    for line in reversed(out.splitlines()):
        if line.startswith("result "):
            return json.loads(line[len("result "):])
    tail = (err.strip().splitlines() or [f"exit code {code}"])[-1][:200]
    return {"error": f"worker died: {tail}"}


def prepare_cell(model: str, policy: str, device: str, threads: int, timeout: float, plan_out: Path,
                 shapes: dict | None = None, tune: int = 3) -> dict:
    """Plan, compile and check one (model, policy) in its own worker process, the plan saved to `plan_out`
    for the model's timing run. A policy named P+tune is P's plan tuned by measurement over `tune` tile
    candidates per kernel."""
    tuned = policy.endswith(TUNED)
    job = {"model": str(Path(model).resolve()), "policy": policy.removesuffix(TUNED), "device": device,
           "threads": threads, "shapes": {k: list(v) for k, v in (shapes or {}).items()},
           "tune": tune if tuned else None, "plan_out": str(plan_out)}
    return _run(job, threads, timeout)


def time_cells(model: str, plans: dict[str, Path], device: str, runs: int, threads: int, timeout: float,
               shapes: dict | None = None) -> dict:
    """onnxruntime and the prepared plans of one model timed in the same interleaved rounds, in one worker
    process (`bench_worker.time_job`): {"samples": {side: [ms, ...]}}, or a timeout / error."""
    job = {"mode": "time", "model": str(Path(model).resolve()), "device": device, "runs": runs,
           "threads": threads, "shapes": {k: list(v) for k, v in (shapes or {}).items()},
           "plans": {p: str(path) for p, path in plans.items()}}
    return _run(job, threads, timeout)


def bench_models(models: list[str], policies: list[str] | None = None, *, device: str = "host",
                 runs: int = 10, timeout: float = 120.0, shapes: dict | None = None, progress=None,
                 tune: int | None = None) -> dict:
    """{"machine": {...}, "models": [{"name", "ort_ms", "policies": {policy: {"ms", "ratio",
    "max_rel_err", "kernels", ...}}}]}. Per model, each policy is planned, compiled and checked in its own
    worker process under `timeout`; then onnxruntime and every policy that got through are timed in the
    same `runs` interleaved rounds in one process (its timeout: `timeout` per program timed), so ratios and
    the policies' order are measured side by side. ort_ms is the median of onnxruntime's runs; ratio =
    ms / ort_ms; ms_q1 / ms_q3, the quartiles of our runs (with 4 runs or more), are the run's own noise. A
    cell that timed out or failed has ms/ratio None and says so ("timeout": true with the phase, or
    "error"). `shapes` binds dynamic input dimensions (as `--shape`) in every model. Policies may be named
    P+tune (measured tuning over `tune` candidates, default 3); with `tune` and no such name, every policy is
    tuned."""
    import tempfile

    from engine.schedule.tune import check_tune

    policies = list(policies or POLICIES)
    if tune is not None:
        check_tune(tune)
        if not any(p.endswith(TUNED) for p in policies):
            policies = [p + TUNED for p in policies]
    check_args(models, policies, device, runs, timeout, shapes)
    threads = bench_threads()
    result = {"machine": machine_info(threads), "device": device, "runs": runs, "timeout_s": timeout,
              "models": []}
    for model in models:
        cells: dict[str, dict] = {}
        own = model_shapes(model, shapes)
        with tempfile.TemporaryDirectory(prefix="tileweave-bench-") as tmp:
            plans = {}
            for k, policy in enumerate(policies):
                if progress:
                    progress(f"{Path(model).stem} {policy}")
                plan_out = Path(tmp) / f"plan{k}.json"
                cells[policy] = prepare_cell(model, policy, device, threads, timeout, plan_out, own, tune or 3)
                if not cells[policy].get("timeout") and not cells[policy].get("error"):
                    plans[policy] = plan_out
            if progress:
                progress(f"{Path(model).stem}: onnxruntime and {len(plans)} plans in the same rounds")
            timed = time_cells(model, plans, device, runs, threads, timeout * (1 + len(plans)), own)
        result["models"].append(_model_row(model, cells, plans, timed))
    return result


def _model_row(model: str, cells: dict[str, dict], timed_policies, timed: dict) -> dict:
    import statistics

    from engine.profile.bench_worker import ORT

    samples = timed.get("samples") or {}
    ort = samples.get(ORT) or ()
    ort_ms = statistics.median(ort) if ort else None
    policies = {}
    for policy, c in cells.items():
        ours = samples.get(policy) or ()
        if policy in timed_policies and not ours:  # prepared, then the timing run failed (for it, or for all)
            failed = (timed.get("errors") or {}).get(policy)
            if failed:
                c = {**c, "error": failed}
            elif timed.get("timeout"):
                c = {**c, "timeout": True, "phase": timed["phase"], "seconds": timed["seconds"]}
            else:
                c = {**c, "error": timed.get("error", "not timed")}
        row = {"ms": statistics.median(ours) if ours else None, "ratio": None, "max_rel_err": c.get("max_rel_err"),
               "kernels": c.get("kernels"), "modeled_us": c.get("modeled_us"), "dram_bytes": c.get("dram_bytes"),
               "schedule_s": c.get("schedule_s"), "compile_s": c.get("compile_s"), "timeout": bool(c.get("timeout"))}
        if c.get("timeout"):
            row.update(phase=c["phase"], seconds=c["seconds"])
        if c.get("error"):
            row["error"] = c["error"]
        if row["ms"] is not None and ort_ms:
            row["ratio"] = row["ms"] / ort_ms
        if len(ours) >= 4:  # the run's own noise: quartiles of our runs
            q1, _, q3 = statistics.quantiles(ours, n=4)
            row.update(ms_q1=q1, ms_q3=q3)
        if ours:
            row["ms_samples"] = list(ours)
        if (timed.get("sources") or {}).get(policy):
            row["source_sha"] = timed["sources"][policy]
        policies[policy] = row
    for policy, row in policies.items():  # policies whose plans print the same C are one program
        same = [p for p, o in policies.items() if p != policy and row.get("source_sha")
                and o.get("source_sha") == row["source_sha"]]
        if same:
            row["same_program_as"] = same
    measured = [p for p, row in policies.items() if row.get("ms_samples")]
    if len(measured) > 1:  # each policy against the model's fastest, round by round (they ran side by side)
        best = min(measured, key=lambda p: policies[p]["ms"])
        for policy in measured:
            if policy != best and best not in policies[policy].get("same_program_as", ()):
                med, lo, hi = paired_ratio(policies[policy]["ms_samples"], policies[best]["ms_samples"])
                policies[policy]["vs_fastest"] = {"policy": best, "ratio": med, "lo": lo, "hi": hi}
    floor = next((c["min_dram_bytes"] for c in cells.values() if "min_dram_bytes" in c), None)
    out = {"name": Path(model).stem, "path": str(model), "ort_ms": ort_ms, "min_dram_bytes": floor,
           "policies": policies}
    if ort:
        out["ort_ms_samples"] = list(ort)
    return out


RESAMPLES = 2000  # bootstrap resamples of the rounds behind `paired_ratio`'s interval


def paired_ratio(ours: list[float], other: list[float], seed: int = 0) -> tuple[float, float, float]:
    """Two programs timed in the same rounds: the median of the per-round ratios ours_k / other_k and the
    5th and 95th percentiles of that median over RESAMPLES bootstrap resamples of the rounds (fixed seed).
    An interval wholly over 1 (under 1): slower (faster) beyond the run's own noise."""
    import random
    import statistics

    ratios = [a / b for a, b in zip(ours, other) if b > 0]
    if not ratios:
        return math.nan, math.nan, math.nan
    rng = random.Random(seed)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(RESAMPLES))
    return statistics.median(ratios), boots[int(0.05 * RESAMPLES)], boots[int(0.95 * RESAMPLES) - 1]


def format_bench(result: dict) -> str:
    """The text table `tileweave bench` prints."""
    m = result["machine"]
    lines = [f"machine  {m['cpu']}, {m['cores']} cores; {m['threads']} threads for onnxruntime "
             f"{m['onnxruntime']} and OpenMP; load {m['load_average']}",
             f"plans    for {result['device']}; medians of {result['runs']} rounds, each running onnxruntime and "
             f"every policy once (order rotated); timeout {result['timeout_s']:g} s per model and policy", ""]
    rows = [("model", "ort ms", "policy", "kernels", "ours ms", "spread", "ours/ort", "vs fastest", "max rel err",
             "modeled us", "schedule s")]
    for model in result["models"]:
        ort = _num(model["ort_ms"], ".3f")
        for k, (policy, c) in enumerate(model["policies"].items()):
            if c["timeout"]:
                ms = f"timeout ({c['phase']})"
            elif c.get("error"):
                ms = "error"
            else:
                ms = _num(c["ms"], ".3f")
            spread = (f"±{50 * (c['ms_q3'] - c['ms_q1']) / c['ms']:.0f}%"
                      if c.get("ms_q1") is not None and c.get("ms") else "-")
            rows.append((model["name"] if k == 0 else "", ort if k == 0 else "", policy, _num(c["kernels"], "d"),
                         ms, spread, _num(c["ratio"], ".2f", "x"), _vs_fastest(model, policy),
                         _num(c["max_rel_err"], ".1e"), _num(c["modeled_us"], ".1f"), _num(c["schedule_s"], ".2f")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        lines.append("  ".join(v.ljust(w) if i in (0, 2) else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    lines += ["", "spread: half the interquartile range of our runs, as a share of the median; two policies whose "
              "times differ by less than that are within this run's noise",
              "vs fastest: the median over rounds of this policy's time over the model's fastest policy's in the same "
              "round, with a 90 % bootstrap interval (round-to-round noise only: one program bound to other buffers "
              "measured up to 1.12x apart on a sample here, docs/cli.md); \"= P\": the same C source as policy P"]
    errors = [(mo["name"], p, c["error"]) for mo in result["models"] for p, c in mo["policies"].items()
              if c.get("error")]
    lines += [""] * bool(errors) + [f"{name} {policy}: {msg}" for name, policy, msg in errors]
    return "\n".join(lines)


def _vs_fastest(model: dict, policy: str) -> str:
    c = model["policies"][policy]
    if c.get("vs_fastest"):
        v = c["vs_fastest"]
        return f"{v['ratio']:.2f}x [{v['lo']:.2f}-{v['hi']:.2f}]"
    if c.get("same_program_as"):
        return "= " + ", ".join(c["same_program_as"])
    others = [p for p, o in model["policies"].items() if p != policy and o.get("vs_fastest")]
    return "fastest" if c.get("ms") is not None and others else "-"


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"
