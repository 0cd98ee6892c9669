"""Executors: a PrimGraph (+ Plan) and inputs in, outputs and a Profile out, on one backend:
`reference` (NumPy over stages), `cpu` (generated C), `cuda` (generated CUDA through cuda-python),
`cuda-sim` (the same CUDA source run by the SIMT emulator, with a SimReport of its findings) or `opencl`
(the CUDA program's kernels printed as OpenCL C, on the first OpenCL device: PoCL's CPU device here)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.codegen.generate import generate
from engine.codegen.kir import Program
from engine.errors import BackendError, PlanError
from engine.flags import debug, dump
from engine.ir.graph import PrimGraph
from engine.limits import call_bounded
from engine.profile.profile import Profile
from engine.runtime.budget import Budget, check_graph_memory, check_program_memory, memory_budget
from engine.runtime.reference import run_reference
from engine.schedule.pipeline import graph_for_plan, plan_model
from engine.schedule.plan import Plan

BACKENDS = ("cpu", "cuda", "cuda-sim", "opencl", "reference")


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    profile: Profile | None
    program: Program | None = None
    sim: object | None = None  # cuda-sim: the SimReport (findings, bytes moved per kernel)


def check_plan(plan: Plan, graph: PrimGraph, device: str) -> None:
    """Refuse a plan that validate rejects, before any code is generated (first violation, one line)."""
    from engine.device import get_device
    from engine.schedule.validate import validate

    problems = validate(plan, graph, get_device(device))
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise PlanError(f"plan refused: {problems[0]}{more}", hint="fix the plan or re-plan with a policy")


def attached_preset(default: str = "a100") -> str:
    """The preset matching the attached GPU (engine/device.py: preset_for_gpu), else `default` (no GPU,
    or one no preset describes)."""
    from engine.device import preset_for_gpu
    from engine.runtime.cuda_driver import cuda_available

    ok, name = cuda_available()
    return preset_for_gpu(name, default) if ok else default


def run_model(graph: PrimGraph, inputs: Mapping[str, np.ndarray], *, backend: str = "cpu",
              policy: str = "welder", device: str | None = None, plan: Plan | None = None,
              repeat: int = 1, library: bool = False, batching: bool | None = None,
              sim_grid_cap: int | None = None, sim_resident: int = 1,
              budget: Budget | str | int | None = None, time_limit: float | None = None,
              poll=None) -> RunResult:
    """Plan (unless `plan` is given), generate and run `graph` on `backend`; outputs by ONNX name.
    `device` is what the plan is (or was) made for: default the given plan's own, else host for cpu, the
    attached GPU's preset for cuda (`attached_preset`), else a100.
    Planning goes through `plan_model` (operator batching per `batching`, default on for welder); a
    given plan runs on the graph it was made on (`graph`, or its batched form when the plan says so).
    `library` (cpu only): kernels that are a lone contraction run through NumPy BLAS.
    cuda-sim: `sim_grid_cap` caps cooperative grids (None: the emulator's default, 0: no cap),
    `sim_resident` blocks of an ordinary launch are resident at once; findings are in `RunResult.sim`.
    `budget` (a Budget, or a size for `memory_budget`; default the backend's stated budget) is checked
    on the graph first and on the generated program's arena before any buffer is bound.
    `time_limit` (seconds; see engine/limits.py) bounds the compile and, separately, the run: past it
    TimeLimitError names what ran out of time. With a limit or `poll` the run happens in a worker
    process, killed when `poll` raises (the app's Cancel) as well. `repeat`: launches timed per kernel (the
    profile keeps the median); on cuda with `repeat` > 1 the whole launch list is also timed back to back
    (`Profile.program_us`)."""
    if backend not in BACKENDS:
        raise BackendError(f"unknown backend '{backend}' (choose one of {', '.join(BACKENDS)})")
    if device is None:  # a given plan's own device; else the C backend plans for the CPU it runs on
        from engine.device import named_device

        device = "host" if backend == "cpu" else attached_preset() if backend == "cuda" else "a100"
        device = named_device(plan.device, device) if plan is not None else device
    if not isinstance(budget, Budget):
        budget = memory_budget(budget, device=device if backend in ("cuda", "cuda-sim") else None, backend=backend)
    check_graph_memory(graph, budget, backend)
    if backend == "reference":
        return RunResult(call_bounded(run_reference, graph, inputs, seconds=time_limit, poll=poll,
                                      what=f"the reference run of {graph.name}"), None)
    if backend == "cuda":
        from engine.runtime.cuda_driver import require_cuda

        require_cuda()  # before planning: no GPU means a one-line BackendError, fast
    if plan is None:
        graph, plan = plan_model(graph, policy, device, batching=batching)
    else:
        graph = graph_for_plan(plan, graph)
        check_plan(plan, graph, device)
    program = generate(plan, graph, device, target="c" if backend == "cpu" else "cuda")
    _dump_trail(plan, program)
    check_program_memory(program, graph.specs, budget)
    if backend == "cpu":
        from engine.runtime.cpu import compile_program_c, run_cpu

        outs, profile = run_cpu(compile_program_c(program, time_limit=time_limit, poll=poll), graph.specs, inputs,
                                graph.weights, repeat=repeat, library=graph.stage_map if library else None,
                                time_limit=time_limit, poll=poll)
    elif backend == "cuda-sim":
        from engine.runtime.simt import DEFAULT_GRID_CAP, run_simt

        cap = DEFAULT_GRID_CAP if sim_grid_cap is None else sim_grid_cap
        outs, report = run_simt(program, graph.specs, inputs, graph.weights, grid_cap=cap, resident=sim_resident,
                                plan=plan, time_limit=time_limit, poll=poll)
        return RunResult(outs, None, program, report)
    elif backend == "opencl":
        from engine.runtime.opencl import run_opencl

        outs, profile = call_bounded(run_opencl, program, graph.specs, inputs, graph.weights, repeat=repeat,
                                     seconds=time_limit, poll=poll, what=f"the OpenCL build and run of {program.name}")
    else:
        from engine.runtime.cuda import run_cuda

        outs, profile = run_cuda(program, graph.specs, inputs, graph.weights, device=device, repeat=repeat,
                                 time_limit=time_limit, poll=poll, program_time=repeat > 1)
    if profile is not None:
        dump("profile.json", json.dumps(profile.to_json(), indent=1))
    return RunResult(outs, profile, program)


def _dump_trail(plan: Plan, program: Program) -> None:
    """DEBUG=4 prints the generated kernels; DUMP_DIR gets the plan, program and both sources."""
    from engine.flags import DEBUG, DUMP_DIR

    if DEBUG < 4 and DUMP_DIR is None:
        return
    from engine.codegen.kir import program_to_json
    from engine.codegen.targets import render_c, render_cuda
    from engine.schedule.plan import plan_to_json

    c_src, cuda_src = render_c(program), render_cuda(program)
    debug(4, f"generated CUDA for {program.name}:\n{cuda_src}")
    dump("plan.json", json.dumps(plan_to_json(plan), indent=1, sort_keys=True))
    dump("program.json", json.dumps(program_to_json(program), indent=1))
    dump(f"{program.name}.cu", cuda_src)
    dump(f"{program.name}.c", c_src)
