"""Measuring a plan variant on the device in two steps that may run on different machines: compile (a plan
in, its generated program and, for the host, the shared library's bytes out: CPU work) and time (the
compiled variant in, microseconds per kernel out: the device's work)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from engine.codegen.kir import Program
from engine.device import Device
from engine.errors import BackendError
from engine.ir.graph import PrimGraph
from engine.schedule.plan import Plan

REPEAT = 7  # launches per kernel per measurement (the median is kept)
PROGRAM_ROUNDS = 31  # interleaved rounds of whole programs a tune's final check times (the median is kept)

Measure = Callable[[Plan], Mapping[str, float]]  # a plan -> microseconds per kernel (group) name


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A plan variant built for its device: the generated program, and for the host the C source and the
    shared library's bytes (so a measure worker on another machine loads what was compiled here)."""

    plan: Plan
    program: Program
    source: str = ""
    library: bytes = b""
    library_name: str = ""

    def module(self):
        """The host variant's library opened (a cpu.CpuModule), from the C compile cache; compiled on
        another machine, it is written there first (same name, same bytes: the name holds the source's hash)."""
        from engine.codegen.ccompile import load_library
        from engine.files import write_atomic
        from engine.flags import cache_dir
        from engine.runtime.cpu import CpuModule

        path = cache_dir() / "cc" / self.library_name
        if not path.exists():
            write_atomic(path, self.library)
        return CpuModule(self.program, self.source, load_library(path), str(path))


def compile_variant(graph: PrimGraph, plan: Plan, device: Device) -> Compiled:
    """Generate and compile `plan`'s kernels: the C compiler for the host (through its disk cache), NVRTC
    for the device preset's arch for a GPU (this fills the NVRTC disk cache the measuring side reads)."""
    from engine.codegen.generate import generate

    program = generate(plan, graph, device, target="c" if device.kind == "cpu" else "cuda")
    if device.kind != "cpu":
        from engine.codegen.api import at_compiled, compile_program
        from engine.codegen.nvrtc import supported_archs
        from engine.runtime.cuda import build_arch

        compiled = compile_program(program, "cuda", archs=(build_arch(device.nvrtc_arch, supported_archs()),))
        return Compiled(at_compiled(plan, graph, device, compiled), program)  # the model at the compiled registers
    from engine.runtime.cpu import build_program_c

    # The library `tileweave run` loads. Built whole here (one translation unit: gcc's inlining budget is per
    # unit), a large program came out as other machine code for the same kernels, under the same cache key,
    # and which build a later run found depended on who compiled first (benchmarks/NOTES.md `onebuild`).
    source, path = build_program_c(program)
    return Compiled(plan, program, source, path.read_bytes(), path.name)


def time_compiled(graph: PrimGraph, compiled: Compiled, device: Device, repeat: int = REPEAT, *,
                  inputs: Mapping[str, np.ndarray] | None = None, gpu=None) -> dict[str, float]:
    """Microseconds per kernel of a compiled variant, the median of `repeat` launches each: the host
    through the C backend, a GPU through the cuda launch layer (`gpu`: an opened Gpu, else the attached
    one). `inputs` default to the fixed-seed random ones."""
    from engine.runtime.inputs import make_inputs

    inputs = make_inputs(graph, seed=0) if inputs is None else inputs
    if device.kind != "cpu":
        from engine.runtime.cuda import run_cuda

        _, profile = run_cuda(compiled.program, graph.specs, inputs, graph.weights, device=device.name,
                              repeat=repeat, gpu=gpu)
        return {t.kernel: t.us for t in profile.kernels}
    from engine.runtime.cpu import run_cpu

    _, profile = run_cpu(compiled.module(), graph.specs, inputs, graph.weights, repeat=repeat)
    return {t.kernel: t.us for t in profile.kernels}


def thread_clock_ns() -> float:
    """The median cost of reading the calling thread's CPU clock twice (taken off each CPU sample)."""
    empty = []
    for _ in range(201):
        c0 = time.thread_time_ns()
        empty.append(time.thread_time_ns() - c0)
    return statistics.median(empty)


# Seconds a program runs untimed before each timed run (`time_programs`): longer than the C thread pool's
# workers keep claiming a core after their library's last loop (TW_POOL_SPIN pauses, then TW_POOL_YIELD_US =
# 2 ms of yielding, engine/codegen/targets.py). Each compiled program is its own library with its own pool,
# so a program timed right after another one shared the cores with that one's idle worker: zoo convnext's
# welder program measured 173-184 µs after another library's program and 142 after its own (NOTES poolsettle).
SETTLE_S = 0.0025


def settle(calls: Sequence[Callable[[], None]], seconds: float = SETTLE_S) -> None:
    """Run `calls` in order, again and again, untimed, for `seconds` of wall clock (at least once), before a
    timed run of them: the thread pool of whatever ran before (another library's, or onnxruntime's beside
    ours in `tileweave bench`) has gone to sleep by then and this program's own is awake (SETTLE_S)."""
    s0 = time.perf_counter_ns()
    while True:
        for call in calls:
            call()
        if time.perf_counter_ns() - s0 >= seconds * 1e9:
            break


def time_programs(programs: Mapping[str, Sequence[Callable[[], None]]], rounds: int,
                  clock: str = "wall", settle_s: float = SETTLE_S) -> dict[str, list[float]]:
    """Each program (its calls in order: `cpu.program_call`'s one, or `cpu.launch_calls`' one per launch),
    timed whole in `rounds` interleaved rounds: every round runs each program once, the order rotated by one
    each round, so load that drifts over the run falls on every program alike and none always follows the
    same one. Before each timed run the program runs untimed for `settle_s` seconds (wall clock; at least
    once), so the previous program's thread pool has gone to sleep and this one's is awake: a program is
    timed as a process running it alone would see it (SETTLE_S).
    One untimed round first. name -> µs per round, by the wall clock or (`clock` "cpu") the calling
    thread's CPU time."""
    names = list(programs)
    read = time.thread_time_ns if clock == "cpu" else time.perf_counter_ns
    spent = thread_clock_ns() if clock == "cpu" else 0.0
    out: dict[str, list[float]] = {p: [] for p in names}
    for r in range(max(1, rounds) + 1):
        for j in range(len(names)):
            name = names[(j + r) % len(names)]
            if settle_s > 0:
                settle(programs[name], settle_s)
            t0 = read()
            for call in programs[name]:
                call()
            if r:
                out[name].append(max(0.0, read() - t0 - spent) / 1e3)
    return out


ProgramMeasure = Callable[[Mapping[str, Plan]], Mapping[str, float]]  # plans by name -> µs per whole program


def host_program_measure(graph: PrimGraph, device: Device, rounds: int = PROGRAM_ROUNDS, *,
                         inputs: Mapping[str, np.ndarray] | None = None) -> ProgramMeasure:
    """Time plans' whole programs on this CPU (the host device): each compiled (`compile_variant`: the C
    compile cache serves what the kernel timings built) and run in `rounds` interleaved rounds
    (`time_programs`); the median of each. Inputs default to the fixed-seed random ones."""
    from engine.runtime.cpu import bind_buffers, program_call
    from engine.runtime.inputs import make_inputs

    inputs = make_inputs(graph, seed=0) if inputs is None else inputs

    def measure(plans: Mapping[str, Plan]) -> dict[str, float]:
        programs, envs = {}, []  # the calls hold raw pointers into the buffers: keep them alive
        for name, plan in plans.items():
            compiled = compile_variant(graph, plan, device)
            envs.append(bind_buffers(compiled.program, graph.specs, inputs, graph.weights))
            programs[name] = [program_call(compiled.module(), envs[-1])]
        return {name: statistics.median(us) for name, us in time_programs(programs, rounds).items()}
    return measure


def require_gpu_for(device: Device) -> None:
    """A one-line BackendError when `device` is a GPU and none is attached."""
    if device.kind == "cpu":
        return
    from engine.runtime.cuda_driver import require_cuda

    try:
        require_cuda()
    except BackendError as err:
        raise BackendError(f"--tune measures on the device and no GPU is attached ({err})",
                           hint="tune for this CPU with --device host, or drop --tune") from None


def device_measure(graph: PrimGraph, device: Device, repeat: int = REPEAT, *, gpu=None) -> Measure:
    """Time a plan's kernels on `device` in this process: compile, then time (see `compile_variant`,
    `time_compiled`; `gpu`: an opened Gpu, else the attached one, a one-line BackendError without one).
    Inputs are fixed-seed random values."""
    from engine.runtime.inputs import make_inputs

    inputs = make_inputs(graph, seed=0)
    if gpu is None:
        require_gpu_for(device)

    def measure(plan: Plan) -> dict[str, float]:
        return time_compiled(graph, compile_variant(graph, plan, device), device, repeat, inputs=inputs, gpu=gpu)
    return measure


@functools.cache
def codegen_version() -> str:
    """A hash of the sources that decide what a kernel compiles to and how it is timed: a change to any
    of them makes earlier measurements stale."""
    import engine

    root = Path(engine.__file__).parent
    h = hashlib.sha256()
    for path in sorted([*root.glob("codegen/*.py"), root / "runtime" / "cpu.py", root / "runtime" / "cuda.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]
