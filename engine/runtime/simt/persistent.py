"""The persistent rProgram kernel (engine/rprogram/persistent.py::persistent_cuda) under cuda-sim: its printed
source with `void** buf` bound to the tensors as checked pointers, `done` to the counters and `sched` to the
task schedule; launched as run_persistent_cuda launches it (grid folded to the blocks one wave holds)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

import numpy as np

from engine.codegen.kir import MemoryPlan, Program
from engine.device import Device, get_device, resident_blocks_per_sm
from engine.errors import BackendError
from engine.ir.graph import PrimGraph
from engine.rprogram.model import RProgram
from engine.runtime.simt import native
from engine.runtime.simt.driver import launch_kernel
from engine.runtime.simt.memory import Memory, garbage, shared_regions, smem_shift
from engine.runtime.simt.report import KernelTraffic, SimReport

ENTRY = "tw_persistent"


def resident_blocks(device: Device, threads: int, shared_bytes: int) -> int:
    """Blocks of the persistent kernel resident at once on `device` (registers unknown: not a limit)."""
    per_sm, why = resident_blocks_per_sm(device, threads, 0, shared_bytes)
    if per_sm <= 0:
        raise BackendError(f"cuda-sim: the persistent kernel cannot run on {device.name} ({why})")
    return per_sm * device.sm_count


def run_persistent_simt(program: Program, rp: RProgram, graph: PrimGraph, inputs: Mapping[str, np.ndarray], *,
                        device: Device | str | None = None, resident: int | None = None, grid: int | None = None,
                        launches: int = 1, source: str | None = None) -> tuple[dict[str, np.ndarray], SimReport]:
    """Run the persistent kernel of (program, rp) under the emulator; outputs by ONNX name and the report.

    `resident` blocks run at once (default: what `device` — default the rProgram's — holds for the
    kernel's threads and shared memory); the others start as resident ones finish, as on a GPU. `grid`
    defaults to what run_persistent_cuda launches: the rProgram's vEUs folded onto at most `resident`
    blocks (`persistent_schedule`); a larger one can deadlock, as it would on a GPU. `launches` runs the
    kernel again on the same buffers and counters without zeroing them (the kernel resets them itself),
    as repeated GPU launches do. `source` runs an edited persistent kernel instead of the printed one.
    Every tensor has its own buffer (rTasks of different kernels run side by side; the arena's reuse by
    liveness over the launch order would not hold)."""
    from engine.rprogram.persistent import persistent_cuda, persistent_schedule
    from engine.runtime.cpu import bind_buffers

    src = persistent_cuda(program, rp)
    unit = native.Unit(f"{program.name}_persistent.cu", ENTRY, source or src.source)
    lib = native.build((unit,), f"{program.name}_persistent")
    if resident is None:
        dev = get_device(device or rp.vdevice.device) if not isinstance(device, Device) else device
        resident = resident_blocks(dev, src.block, src.shared_bytes)
    grid = min(src.grid, resident) if grid is None else grid
    if resident < 1 or grid < 1 or launches < 1:
        raise BackendError(f"cuda-sim: resident blocks, grid and launches must be at least 1, got {resident}, "
                           f"{grid} and {launches}")
    env = bind_buffers(dataclasses.replace(program, memory=MemoryPlan((), 0, 0)), graph.specs, inputs,
                       graph.weights)
    given = set(program.inputs) | set(program.constants)
    mem = Memory()
    try:
        for t in src.tensors:
            if t in given:
                mem.add(t, env[t], tracked=False)
            else:
                mem.add(t, garbage(graph.specs[t].shape, graph.specs[t].dtype.np), tracked=True)
        table = np.array([[mem.arrays[t].ctypes.data, mem.handles[t]] for t in src.tensors], np.uint64)
        mem.add("buf", table.reshape(-1).view(np.uint8).reshape(len(src.tensors), 16), tracked=False, shift=4)
        mem.add("done", np.zeros(src.counters, np.uint32), tracked=False)  # zeroed once, as on a GPU
        mem.add("sched", persistent_schedule(rp, grid), tracked=False)
        args = (native.Arg * 3)(mem.arg("buf"), mem.arg("done"), mem.arg("sched"))
        regions = []
        for k in program.kernels:
            lo, hi = _function_lines(unit.lines, f"{k.name}_s0")
            regions += shared_regions(k, unit.lines, lo, hi)
        found, stats, ran, stopped = [], [0, 0, 0, 0], 0, ""
        for i in range(launches):
            rc, moved, more = launch_kernel(lib.entries[0], args, None, unit, grid=grid, block=src.block,
                                            smem=src.shared_bytes, cooperative=False, resident=resident,
                                            regions=regions, shift=smem_shift(program.kernels), launch=i,
                                            name=ENTRY)
            found += more
            stats = [a + b for a, b in zip(stats, moved)]
            ran += 1
            if rc:
                stopped = f"{ENTRY} could not finish ({resident} of {grid} blocks resident)"
                break
        outs = {name: mem.arrays[t].copy() for name, t in zip(program.output_names, program.outputs)}
    finally:
        mem.close()
    return outs, SimReport(tuple(found), (KernelTraffic(ENTRY, ran, *stats),), ran, stopped)


def _function_lines(lines: list[str], fn: str) -> tuple[int, int]:
    """Line indexes [lo, hi) of the printed function `fn` (its signature through the closing brace)."""
    sig = re.compile(rf"\b{re.escape(fn)}\(")
    lo = next((n for n, text in enumerate(lines) if sig.search(text) and text.rstrip().endswith("{")), None)
    if lo is None:
        return 0, 0
    hi = next((n for n in range(lo + 1, len(lines)) if lines[n] == "}"), len(lines))
    return lo, hi + 1
