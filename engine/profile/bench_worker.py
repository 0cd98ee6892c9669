"""One (model, policy) of `tileweave bench`, run in its own process so a runaway plan can be killed:
a JSON job on argv in; `phase NAME` progress lines, a `plan {json}` line and one `result {json}` line out.

onnxruntime and the generated C program are timed in this one process, interleaved repeat by repeat."""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import numpy as np


def bench_inputs(graph, model: Path) -> dict[str, np.ndarray]:
    """The inputs stored beside the model (`<stem>.io.npz`, as in samples/ and samples/zoo/), else
    fixed-seed ones (seed 0)."""
    from engine.runtime.inputs import complete_inputs

    io = model.with_name(model.stem + ".io.npz")
    given = {}
    if io.is_file():
        from engine.runtime.npz import read_npz_arrays

        data = read_npz_arrays(io)
        given = {s.name: data[s.name] for s in graph.inputs if s.name in data}
    return complete_inputs(graph, given, seed=0)


def ort_session(model: Path, threads: int):
    """onnxruntime for timing beside our programs in one process. With more than one thread its workers do
    not spin-wait between runs: the benchmarks interleave onnxruntime and our OpenMP programs, and a worker
    still spinning after onnxruntime's run holds a core our next program's team needs, so each OpenMP
    barrier waits out a time slice (2 threads on 2 cores: decoder_kv's welder program 1.29 ms beside a
    spinning onnxruntime, 0.042 ms beside a parked one, onnxruntime itself 0.135 vs 0.114 ms;
    benchmarks/RESULTS.md, lead 2026-11-26)."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    if threads > 1:
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])


def max_rel_error(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> float:
    """max over outputs of max |got - want| / max |want|."""
    worst = 0.0
    for name, w in want.items():
        w64, g64 = np.asarray(w, np.float64), np.asarray(got[name], np.float64)
        if g64.shape != w64.shape:
            return float("inf")
        if w64.size:
            scale = max(float(np.abs(w64).max()), 1e-30)
            worst = max(worst, float(np.abs(g64 - w64).max()) / scale)
    return worst


def _phase(name: str) -> None:
    print(f"phase {name}", flush=True)


def run_job(job: dict) -> dict:
    """Plan, compile, check and time one model under one policy against onnxruntime."""
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.frontend.importer import load_graph
    from engine.runtime.cpu import bind_buffers, compile_program_c, program_call
    from engine.schedule.pipeline import plan_model

    model, runs, threads = Path(job["model"]), int(job["runs"]), int(job["threads"])
    _phase("import")
    graph = load_graph(model, {k: tuple(v) for k, v in job.get("shapes", {}).items()})
    inputs = bench_inputs(graph, model)
    sess = ort_session(model, threads)
    names = [o.name for o in sess.get_outputs()]
    want = dict(zip(names, sess.run(names, inputs)))

    _phase("schedule")
    started = time.perf_counter()
    device = get_device(job["device"])
    planned, plan = plan_model(graph, job["policy"], device, tune=job.get("tune"))
    schedule_s = time.perf_counter() - started
    planned_stats = {"kernels": len(plan.groups), "modeled_us": plan.modeled_us, "dram_bytes": plan.dram_bytes,
                     "min_dram_bytes": planned.min_dram_bytes, "schedule_s": schedule_s}
    print("plan " + json.dumps(planned_stats), flush=True)  # the parent keeps these if a later phase times out
    _phase("compile")
    started = time.perf_counter()
    program = generate(plan, planned, device, target="c")
    module = compile_program_c(program)
    compile_s = time.perf_counter() - started

    _phase("check")
    env = bind_buffers(program, planned.specs, inputs, planned.weights)
    ours = program_call(module, env)  # every launch in order, one call into the library

    ours()
    got = {name: env[t] for name, t in zip(program.output_names, program.outputs)}
    err = max_rel_error(got, want)

    _phase("time")
    from engine.schedule import measure

    def theirs():
        sess.run(names, inputs)

    for _ in range(2):  # warm-up: page faults, both thread pools
        theirs()
        ours()
    ort_ms, ours_ms = [], []
    for _ in range(runs):
        # Each side runs untimed first until the other's idle threads sleep (our pool's worker yields a core
        # for ~2 ms after our program: onnxruntime timed right after it measured convnext at 0.46-0.52 ms,
        # 0.33-0.37 alone; benchmarks/NOTES.md benchsettle), as a process running it alone would see it.
        measure.settle([theirs])
        t0 = time.perf_counter()
        theirs()
        t1 = time.perf_counter()
        measure.settle([ours])
        t2 = time.perf_counter()
        ours()
        t3 = time.perf_counter()
        ort_ms.append((t1 - t0) * 1e3)
        ours_ms.append((t3 - t2) * 1e3)
    return {**planned_stats, "ms": statistics.median(ours_ms), "ort_ms": statistics.median(ort_ms),
            "ms_samples": ours_ms, "ort_ms_samples": ort_ms, "max_rel_err": err,
            "kernels": len(program.launches), "compile_s": compile_s}


def main(argv: list[str] | None = None) -> int:
    job = json.loads((argv or sys.argv[1:])[0])
    try:
        result = run_job(job)
    except Exception as err:  # reported to the parent as this cell's error, not a traceback
        traceback.print_exc(file=sys.stderr)
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        result = {"error": f"{type(err).__name__}: {first}" if first else type(err).__name__}
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
