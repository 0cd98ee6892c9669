"""CPU backend: a Program in, its C source compiled to one shared library, NumPy buffers in, outputs and
a per-kernel Profile out. Intermediates live in one arena laid out by the static memory plan."""

from __future__ import annotations

import ctypes
import math
import statistics
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.codegen.ccompile import UNIT_SYMBOL, compile_c_kernels, load_library
from engine.codegen.kir import PROGRAM_ENTRY, Program
from engine.codegen.targets import render_c, render_c_units
from engine.errors import ShapeError
from engine.limits import call_bounded
from engine.profile.profile import KernelTime, Profile
from engine.runtime.memory import ALIGN

LINE = 64  # bytes of a cache line: where every host buffer starts
LABEL = "measured on CPU (C backend)"


@dataclass(frozen=True)
class CpuModule:
    """A compiled program: the library and the C source it was built from."""

    program: Program
    source: str
    library: object  # ctypes.CDLL
    path: str = ""  # the shared library's file (what a bounded run's worker process opens)

    def function(self, kernel: str):
        fn = getattr(self.library, kernel)
        fn.restype = None
        fn.argtypes = [ctypes.c_void_p] * len(self.program.kernel(kernel).params)
        return fn


def build_program_c(program: Program, *, time_limit: float | None = None, poll=None) -> tuple[str, Path]:
    """(C source, shared library) of `program`, linked from per-kernel units (compile_c_kernels) — the one
    build of a program, whoever asks (a run, the tune, the benchmarks): they share its cache entry. The C
    compiler may take `time_limit` seconds, `poll` may cancel it (see compile_c)."""
    source = render_c(program)
    path = compile_c_kernels(source, name=program.name, units=lambda: render_c_units(program, UNIT_SYMBOL),
                             timeout=time_limit, poll=poll)
    return source, path


def compile_program_c(program: Program, *, time_limit: float | None = None, poll=None) -> CpuModule:
    """`build_program_c`, opened."""
    source, path = build_program_c(program, time_limit=time_limit, poll=poll)
    return CpuModule(program, source, load_library(path), str(path))


def aligned_empty(nbytes: int, align: int = ALIGN) -> np.ndarray:
    """`nbytes` uninitialised bytes whose first lies on an `align`-byte boundary."""
    raw = np.empty(nbytes + align, dtype=np.uint8)
    start = -raw.ctypes.data % align
    return raw[start:start + nbytes]


def aligned_array(shape: tuple[int, ...], dtype, align: int = LINE) -> np.ndarray:
    """An uninitialised C-contiguous array of `shape` whose data starts on an `align`-byte boundary."""
    dtype = np.dtype(dtype)
    count = math.prod(shape)
    return aligned_empty(max(count, 1) * dtype.itemsize, align).view(dtype)[:count].reshape(shape)


def aligned(arr: np.ndarray, align: int = LINE) -> np.ndarray:
    """`arr` (C-contiguous) where its data starts on an `align`-byte boundary, else an aligned copy. NumPy
    gives 16-byte alignment: a weight loaded from ONNX, or the arena, could start anywhere in a cache line,
    from one process to the next, and a 64-byte vector load of it then straddled two lines (welder's zoo
    programs with every weight 16 bytes past a line: 2-8 % slower, benchmarks/bench_alignment.py)."""
    if arr.ctypes.data % align == 0:
        return arr
    out = aligned_array(arr.shape, arr.dtype, align)
    out[...] = arr
    return out


def bind_buffers(program: Program, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
                 weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor a launch touches -> a C-contiguous array starting on a cache line (`aligned`; inputs
    checked, intermediates in the arena, whose offsets keep the memory plan's alignment)."""
    env: dict[str, np.ndarray] = {}
    for name in program.inputs:
        if name not in inputs:
            raise ShapeError(f"missing input '{name}' (expected {', '.join(program.inputs)})")
        spec = graph_specs[name]
        arr = np.ascontiguousarray(inputs[name], dtype=spec.dtype.np)
        if arr.shape != spec.shape:
            raise ShapeError(f"input '{name}' has shape {list(arr.shape)}, expected {list(spec.shape)}")
        env[name] = aligned(arr)
    for name in program.constants:
        env[name] = aligned(np.ascontiguousarray(weights[name], dtype=graph_specs[name].dtype.np))
    for name in program.outputs:
        if name not in env:
            env[name] = aligned_array(graph_specs[name].shape, graph_specs[name].dtype.np)
    arena = aligned_empty(max(program.memory.arena_bytes, 1))
    for a in program.memory.allocations:
        spec = graph_specs[a.tensor]
        env[a.tensor] = arena[a.offset:a.offset + a.nbytes].view(spec.dtype.np).reshape(spec.shape)
    return env


def run_cpu(module: CpuModule, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
            weights: Mapping[str, np.ndarray], *, repeat: int = 1,
            library: Mapping | None = None, time_limit: float | None = None,
            poll=None) -> tuple[dict[str, np.ndarray], Profile]:
    """Run every launch in order (each `repeat` times, timing the median); outputs by ONNX name.

    `library` (stage name -> Stage) runs kernels that are exactly one contraction stage through NumPy
    BLAS instead of the generated GEMM/conv (as AStitch leaves GEMMs to cuBLAS). With `time_limit`
    (seconds) or `poll` the program runs in a worker process (engine/limits.py:call_bounded), killed
    when it outlives the limit (TimeLimitError) or when `poll` raises (a cancel)."""
    if time_limit is not None or poll is not None:
        return call_bounded(_run_cpu_file, module.program, module.path, graph_specs, inputs, weights,
                            repeat=repeat, library=library, seconds=time_limit, poll=poll,
                            what=f"the CPU run of {module.program.name}")
    program = module.program
    env = bind_buffers(program, graph_specs, inputs, weights)
    times = []
    for launch, call in zip(program.launches, launch_calls(module, env, library)):
        samples = []
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            call()
            samples.append((time.perf_counter() - t0) * 1e6)
        times.append(KernelTime(launch.kernel, statistics.median(samples), len(samples)))
    outs = {name: env[t].copy() for name, t in zip(program.output_names, program.outputs)}
    label = LABEL if not library else LABEL.replace(")", ", contractions through NumPy BLAS)")
    return outs, Profile(label, "cpu", tuple(times))


def _run_cpu_file(program: Program, path: str, graph_specs: Mapping, inputs: Mapping[str, np.ndarray],
                  weights: Mapping[str, np.ndarray], *, repeat: int, library: Mapping | None):
    """run_cpu in a bounded run's worker: the library opened again from its file."""
    return run_cpu(CpuModule(program, "", load_library(path), path), graph_specs, inputs, weights, repeat=repeat,
                   library=library)


def program_call(module: CpuModule, env: dict[str, np.ndarray]):
    """One argument-free callable that runs every launch in order over the buffers of `bind_buffers`
    through the program's C entry (targets.program_entry: one ctypes call, where `launch_calls` makes
    one per launch at ~0.45 µs of Python each). What `tileweave bench` and a tune's whole-program check
    time. The pointer array is built here, once: `env`'s buffers must outlive the callable."""
    program = module.program
    fn = getattr(module.library, PROGRAM_ENTRY)
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p]
    tensors = program.launch_tensors
    pointers = (ctypes.c_void_p * max(1, len(tensors)))(*[env[t].ctypes.data for t in tensors])

    def call(fn=fn, pointers=pointers):
        fn(pointers)
    return call


def launch_calls(module: CpuModule, env: dict[str, np.ndarray], library: Mapping | None = None) -> list:
    """One argument-free callable per launch, in launch order, over the buffers of `bind_buffers`
    (what run_cpu times one by one; a whole program runs through `program_call`)."""
    program = module.program
    calls = []
    for launch in program.launches:
        call = _library_call(program.kernel(launch.kernel), env, library) if library else None
        if call is None:
            fn = module.function(launch.kernel)
            args = [env[t].ctypes.data for t in launch.args]

            def call(fn=fn, args=args):
                fn(*args)
        calls.append(call)
    return calls


def _library_call(kernel, env: dict, stages: Mapping):
    from engine.ir.graph import StageKind
    from engine.runtime.reference import eval_stage

    if len(kernel.stages) != 1 or stages[kernel.stages[0]].kind != StageKind.CONTRACTION:
        return None
    stage = stages[kernel.stages[0]]
    phases = [p for seg in kernel.segments for p in seg.phases]
    if len(phases) == 1 and phases[0].conv is not None:
        # Dense: im2col + BLAS (measured 3-6x faster than the generated direct conv, whose plan tiles
        # hold one output channel). Otherwise the generated direct conv: a depthwise 3x3 on 192x56x56
        # took 1.0 ms generated, 4.6 ms as NumPy tap slices, 93 ms through einsum (one thread).
        return _im2col_call(kernel, phases[0].conv, env, stage.name)

    def call():
        env[stage.name][...] = eval_stage(stage, env)
    return call


def _plain_load(e, kernel):
    """(tensor, index) of a factor that is one load of a whole kernel parameter, else None."""
    from engine.codegen.kir import Scope
    from engine.ir import expr as E

    if not isinstance(e, E.Load):
        return None
    buf = kernel.buffer(e.tensor)
    return (buf.tensor, e.index) if buf.scope == Scope.GLOBAL else None


def _im2col_call(kernel, conv, env: dict, out: str):
    """A lone dense convolution through NumPy: the padded input's sliding windows (a strided view,
    no copy) gathered into columns and multiplied with the weight matrix by BLAS. Geometry comes from
    the kernel's Conv (index expressions), not ONNX attributes; None for a depthwise conv or factors
    that are not plain loads in NCHW order."""
    from numpy.lib.stride_tricks import sliding_window_view

    from engine.ir import index as I

    if conv.depthwise:
        return None
    xl, wl = _plain_load(conv.x, kernel), _plain_load(conv.w, kernel)
    if xl is None or wl is None or len(xl[1]) != 4 or len(wl[1]) != 4:
        return None
    (xt, xi), (wt, wi) = xl, wl
    chan = I.var(conv.chan_vars[0]) if len(conv.chan_vars) == 1 else None
    taps = tuple(I.var(v) if v else I.const(0) for v in conv.tap_vars)
    offsets = []
    for ix, v in zip(xi[2:], conv.window_vars):
        if ix.vars() != {v} or ix.terms[0][1] != 1:
            return None
        offsets.append(ix.const)
    if chan is None or xi[0] != I.var("i0") or xi[1] != chan or wi != (I.var("i1"), chan, *taps):
        return None
    x, w, y = env[xt], env[wt], env[out]
    n, c_in, h, wd = x.shape
    _, co, ho, wo = y.shape
    (sh, sw), (kh, kw), (dh, dw) = conv.strides, conv.taps, conv.dilations
    span = ((ho - 1) * sh + (kh - 1) * dh + 1, (wo - 1) * sw + (kw - 1) * dw + 1)
    pads = [(max(0, -o), max(0, o + s - size)) for o, s, size in zip(offsets, span, (h, wd))]
    starts = [o + p[0] for o, p in zip(offsets, pads)]
    wmat = np.ascontiguousarray(w.reshape(co, -1))
    out = y.reshape(n, co, ho * wo) if y.flags.c_contiguous else None  # a view of y, or None

    def call():
        xp = np.pad(x, ((0, 0), (0, 0), *pads)) if any(a or b for a, b in pads) else x
        xp = xp[:, :, starts[0]:starts[0] + span[0], starts[1]:starts[1] + span[1]]
        win = sliding_window_view(xp, ((kh - 1) * dh + 1, (kw - 1) * dw + 1), axis=(2, 3))
        win = win[:, :, ::sh, ::sw, ::dh, ::dw]  # [n, c, ho, wo, kh, kw]
        cols = win.transpose(0, 1, 4, 5, 2, 3).reshape(n, c_in * kh * kw, ho * wo)
        if out is not None:  # straight into the output (a 1x1 conv's columns are the input itself)
            np.matmul(wmat, cols, out=out)
        else:
            y[...] = np.matmul(wmat, cols).reshape(n, co, ho, wo)
    return call
