"""Run a persistent program: a Program, its RProgram, the graph and inputs in; outputs by ONNX name out.
CPU: the C persistent program through OpenMP. GPU: the CUDA persistent kernel launched through
cuda-python (engine/runtime/cuda_launch.py) with its grid sized by the driver's occupancy."""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from engine.codegen.kir import Program
from engine.errors import BackendError
from engine.ir.graph import PrimGraph
from engine.rprogram.model import RProgram
from engine.rprogram.persistent import persistent_c, persistent_cuda, persistent_schedule


@dataclass(frozen=True)
class PersistentRun:
    """How the CUDA persistent kernel ran: `grid` blocks for an rProgram placed on `veus` vEUs."""

    grid: int
    veus: int
    block: int
    registers: int
    resident_per_sm: int
    us: float  # median over `runs` launches (CUDA events around the launch alone)
    runs: int
    device: str

    @property
    def why(self) -> str:
        fold = f", the {self.veus} vEUs folded onto them in task order" if self.grid < self.veus else ""
        return (f"{self.grid} blocks of {self.block} threads = {self.resident_per_sm}/SM at {self.registers} "
                f"registers on {self.device} (driver occupancy){fold}")


def _host_tensors(program: Program, graph: PrimGraph, inputs: Mapping[str, np.ndarray],
                  names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Every tensor its own array: the Program's arena reuses memory by liveness over the launch order,
    which rTasks of different kernels running side by side do not follow."""
    from engine.runtime.cpu import bind_buffers

    alone = dataclasses.replace(program, memory=dataclasses.replace(program.memory, allocations=()))
    bound = bind_buffers(alone, graph.specs, inputs, graph.weights)
    return {t: bound[t] if t in bound else np.empty(graph.specs[t].shape, graph.specs[t].dtype.np) for t in names}


def run_persistent_c(program: Program, rp: RProgram, graph: PrimGraph,
                     inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Compile and run the persistent program on the CPU; outputs by ONNX output name."""
    from engine.codegen.ccompile import compile_c, load_library

    src = persistent_c(program, rp)
    lib = load_library(compile_c(src.source, name=f"{program.name}_persistent"))
    env = _host_tensors(program, graph, inputs, src.tensors)
    ptrs = (ctypes.c_void_p * len(src.tensors))(*[env[t].ctypes.data for t in src.tensors])
    fn = lib.tw_persistent
    fn.restype, fn.argtypes = None, [ctypes.c_void_p]
    fn(ptrs)
    return {name: env[t].copy() for name, t in zip(program.output_names, program.outputs)}


def run_persistent_cuda(program: Program, rp: RProgram, graph: PrimGraph, inputs: Mapping[str, np.ndarray],
                        *, repeat: int = 1, gpu=None) -> tuple[dict[str, np.ndarray], PersistentRun]:
    """Compile the persistent kernel for the attached GPU (or `gpu`), size its grid from the driver's
    occupancy at the compiled registers and shared bytes (an rProgram placed on more vEUs than that is
    folded onto the blocks that fit; a block that cannot be resident at all is refused in one line),
    launch it cooperatively where the device supports it, so a grid that is not co-resident is refused
    by the driver instead of deadlocking; outputs by ONNX output name and how it ran."""
    from engine.codegen.nvrtc import compile_cuda, supported_archs
    from engine.runtime.cuda import build_arch
    from engine.runtime.cuda_driver import attached_gpu
    from engine.runtime.cuda_launch import CudaError

    gpu = gpu or attached_gpu()
    src = persistent_cuda(program, rp)
    arch = build_arch(gpu.arch, supported_archs())
    binary = compile_cuda(src.source, name=f"{program.name}_persistent", arch=arch)
    image = binary.cubin if arch == gpu.arch else binary.ptx.encode() + b"\0"
    env = _host_tensors(program, graph, inputs, src.tensors)
    owned: list[int] = []

    def alloc(nbytes: int) -> int:
        owned.append(gpu.alloc(nbytes))
        return owned[-1]

    try:
        fn = gpu.load_function(image, src.entry)
        per_sm = gpu.resident_blocks(fn, src.block, src.shared_bytes)
        if per_sm <= 0:
            raise BackendError(f"the persistent kernel of {program.name} cannot be resident on {gpu.name}: "
                               f"{src.block} threads x {fn.registers} registers, {src.shared_bytes} B shared "
                               "memory per block (use smaller tiles for its largest kernel)")
        grid = min(src.grid, per_sm * gpu.sm_count)
        ptrs = {}
        for t in src.tensors:
            ptrs[t] = alloc(env[t].nbytes)
            if t in program.inputs or t in program.constants:
                gpu.upload(ptrs[t], env[t])
        table = np.array([ptrs[t] for t in src.tensors], dtype=np.uint64)
        sched = persistent_schedule(rp, grid)
        buf, done, order = alloc(table.nbytes), alloc(4 * src.counters), alloc(sched.nbytes)
        gpu.upload(buf, table)
        gpu.upload(order, sched)
        gpu.zero(done, 4 * src.counters)  # once: the kernel's last block zeroes them after each launch

        def run() -> None:
            gpu.launch(fn, grid, src.block, src.shared_bytes, [buf, done, order], gpu.cooperative)

        us, runs = gpu.time_launches(src.entry, run, repeat=repeat)
        outs = {}
        for name, t in zip(program.output_names, program.outputs):
            outs[name] = np.empty_like(env[t])
            gpu.download(outs[name], ptrs[t])
        gpu.unload(fn)
    except CudaError as err:
        raise BackendError(str(err)) from None
    finally:
        for ptr in owned:
            gpu.free(ptr)
    return outs, PersistentRun(grid, src.grid, src.block, fn.registers, per_sm, us, runs, gpu.name)
