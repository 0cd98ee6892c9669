"""The worker processes of `tileweave bench`, each its own process so a runaway plan can be killed: a JSON job
on argv in; `phase NAME` progress lines (a `plan {json}` line) and one `result {json}` line out.

Two jobs: `prepare_job` plans, compiles and checks one (model, policy) and saves the plan; `time_job` (mode
"time") loads every prepared plan of one model and times them and onnxruntime in the same interleaved rounds."""

from __future__ import annotations

import hashlib
import json
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


def _load(job: dict):
    """(model path, graph, inputs, onnxruntime session) of a job."""
    from engine.frontend.importer import load_graph

    model = Path(job["model"])
    graph = load_graph(model, {k: tuple(v) for k, v in job.get("shapes", {}).items()})
    return model, graph, bench_inputs(graph, model), ort_session(model, int(job["threads"]))


def prepare_job(job: dict) -> dict:
    """Plan one model under one policy, compile it (filling the C compile cache the timing job reads), check
    its outputs against onnxruntime's and save the plan to job["plan_out"] for `time_job`."""
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.runtime.cpu import bind_buffers, compile_program_c, program_call
    from engine.schedule.pipeline import plan_model
    from engine.schedule.plan import plan_to_json

    _phase("import")
    _, graph, inputs, sess = _load(job)
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
    program_call(module, env)()  # every launch in order, one call into the library
    got = {name: env[t] for name, t in zip(program.output_names, program.outputs)}
    Path(job["plan_out"]).write_text(json.dumps(plan_to_json(plan)))
    return {**planned_stats, "max_rel_err": max_rel_error(got, want), "kernels": len(program.launches),
            "compile_s": compile_s}


ORT = "onnxruntime"  # the timing job's name for onnxruntime's side


def time_job(job: dict) -> dict:
    """onnxruntime and every prepared policy's program (job["plans"]: policy -> saved plan) timed in the same
    `runs` interleaved rounds (`measure.time_programs`: the order rotated each round, each side run untimed for
    `measure.SETTLE_S` before each timed run so the other's idle threads sleep): {"samples": {side: [ms, ...]},
    "sources": {policy: hash of its C source}, "errors": {policy: why it was not timed}}, onnxruntime under
    `ORT`. One process, one stretch of time: the policies' ratios, and their order, are
    measured side by side."""
    from engine.codegen.generate import generate
    from engine.device import get_device
    from engine.runtime.cpu import bind_buffers, compile_program_c, program_call
    from engine.schedule import measure
    from engine.schedule.pipeline import load_plan

    _phase("import")
    _, graph, inputs, sess = _load(job)
    names = [o.name for o in sess.get_outputs()]
    device = get_device(job["device"])
    _phase("compile")
    programs = {ORT: [lambda: sess.run(names, inputs)]}
    keep, sources, errors = [], {}, {}  # the calls hold raw pointers into these buffers
    for policy, path in job["plans"].items():
        try:  # prepared and checked already; a failure here is that policy's alone
            planned, plan = load_plan(path, graph)
            program = generate(plan, planned, device, target="c")
            module = compile_program_c(program)
        except Exception as err:
            traceback.print_exc(file=sys.stderr)
            errors[policy] = _one_line(err, "when timing")
            continue
        keep.append(bind_buffers(program, planned.specs, inputs, planned.weights))
        sources[policy] = hashlib.sha256(module.source.encode()).hexdigest()[:16]
        programs[policy] = [program_call(module, keep[-1])]
    _phase("time")
    for _ in range(2):  # warm-up: page faults, every thread pool
        for calls in programs.values():
            calls[0]()
    us = measure.time_programs(programs, int(job["runs"]))
    return {"samples": {side: [t / 1e3 for t in ts] for side, ts in us.items()}, "sources": sources, "errors": errors}


def _one_line(err: Exception, where: str = "") -> str:
    """`err` as the one line a cell reports: its type (and `where`), then its message's first line."""
    first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
    head = f"{type(err).__name__} {where}".strip()
    return f"{head}: {first}" if first else head


def main(argv: list[str] | None = None) -> int:
    job = json.loads((argv or sys.argv[1:])[0])
    try:
        result = time_job(job) if job.get("mode") == "time" else prepare_job(job)
    except Exception as err:  # reported to the parent as this cell's error, not a traceback
        traceback.print_exc(file=sys.stderr)
        result = {"error": _one_line(err)}
    print("result " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
