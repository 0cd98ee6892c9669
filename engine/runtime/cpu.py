"""CPU backend: a Program in, its C source compiled to one shared library, NumPy buffers in, outputs and
a per-kernel Profile out. Intermediates live in one arena laid out by the static memory plan."""

from __future__ import annotations

import ctypes
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.codegen.ccompile import compile_c, load_library
from engine.codegen.kir import Program
from engine.codegen.targets import render_c
from engine.errors import ShapeError
from engine.profile.profile import KernelTime, Profile

LABEL = "measured on CPU (C backend)"


@dataclass(frozen=True)
class CpuModule:
    """A compiled program: the library and the C source it was built from."""

    program: Program
    source: str
    library: object  # ctypes.CDLL

    def function(self, kernel: str):
        fn = getattr(self.library, kernel)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * len(self.program.kernel(kernel).params)
        return fn


def compile_program_c(program: Program) -> CpuModule:
    source = render_c(program)
    lib = load_library(compile_c(source, name=program.name))
    return CpuModule(program, source, lib)


def bind_buffers(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor a launch touches -> a C-contiguous array (inputs checked, intermediates in the arena)."""
    env: dict[str, np.ndarray] = {}
    for name in program.inputs:
        if name not in inputs:
            raise ShapeError(f"missing input '{name}' (expected {', '.join(program.inputs)})")
        spec = graph_specs[name]
        arr = np.ascontiguousarray(inputs[name], dtype=spec.dtype.np)
        if arr.shape != spec.shape:
            raise ShapeError(f"input '{name}' has shape {list(arr.shape)}, expected {list(spec.shape)}")
        env[name] = arr
    for name in program.constants:
        env[name] = np.ascontiguousarray(weights[name], dtype=graph_specs[name].dtype.np)
    for name in program.outputs:
        if name not in env:
            env[name] = np.empty(graph_specs[name].shape, graph_specs[name].dtype.np)
    arena = np.empty(max(program.memory.arena_bytes, 1), dtype=np.uint8)
    for a in program.memory.allocations:
        spec = graph_specs[a.tensor]
        env[a.tensor] = arena[a.offset:a.offset + a.nbytes].view(spec.dtype.np).reshape(spec.shape)
    return env


def run_cpu(module: CpuModule, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray], *, repeat: int = 1,
            library: Mapping | None = None) -> tuple[dict[str, np.ndarray], Profile]:
    """Run every launch in order (each `repeat` times, timing the median); outputs by ONNX name.

    `library` (stage name -> Stage) runs kernels that are exactly one contraction stage through NumPy
    BLAS instead of the generated GEMM/conv (as AStitch leaves GEMMs to cuBLAS)."""
    program = module.program
    env = bind_buffers(program, graph_specs, inputs, weights)
    times = []
    for launch in program.launches:
        kernel = program.kernel(launch.kernel)
        call = _library_call(kernel, env, library) if library else None
        if call is None:
            fn = module.function(launch.kernel)
            args = [env[t].ctypes.data for t in launch.args]

            def call(fn=fn, args=args):
                fn(*args)
        samples = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e6)
        times.append(KernelTime(launch.kernel, statistics.median(samples), len(samples)))
    outs = {name: env[t].copy() for name, t in zip(program.output_names, program.outputs)}
    label = LABEL if not library else LABEL.replace(")", ", contractions through NumPy BLAS)")
    return outs, Profile(label, "cpu", tuple(times))


def _library_call(kernel, env: dict, stages: Mapping):
    from engine.ir.graph import StageKind
    from engine.runtime.reference import eval_stage

    if len(kernel.stages) != 1 or stages[kernel.stages[0]].kind != StageKind.CONTRACTION:
        return None
    stage = stages[kernel.stages[0]]

    def call():
        env[stage.name][...] = eval_stage(stage, env)
    return call
